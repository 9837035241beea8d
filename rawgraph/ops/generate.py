"""Rewrite the generated parts of kernels_cu/ from the tables in rawgraph.ops: gemv.cu's
extern "C" wrappers (`rawgraph.ops.gemv`) and skinny_sm90.cu's (`rawgraph.ops.linear`):
`python -m rawgraph.ops.generate [DIR]`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from rawgraph.cuda.kernel import KERNELS_DIR
from rawgraph.ops.gemv import source as gemv_source
from rawgraph.ops.linear import skinny90_source

GENERATED: dict[str, Callable[[Path], str]] = {"gemv.cu": gemv_source,
                                               "skinny_sm90.cu": skinny90_source}


def main(argv: list[str] | None = None) -> int:
    """Write the files (in the package's kernels_cu/, or DIR); 0."""
    args = sys.argv[1:] if argv is None else argv
    folder = Path(args[0]) if args else KERNELS_DIR
    for name, source in GENERATED.items():
        target = folder / name
        target.write_text(source(target))
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
