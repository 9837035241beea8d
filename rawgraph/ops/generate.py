"""Rewrite the generated part of kernels_cu/gemv.cu (the GEMV's extern "C" wrappers) from
`rawgraph.ops.gemv`'s table: `python -m rawgraph.ops.generate [PATH]`."""

from __future__ import annotations

import sys
from pathlib import Path

from rawgraph.cuda.kernel import KERNELS_DIR
from rawgraph.ops.gemv import source


def main(argv: list[str] | None = None) -> int:
    """Write the file (default: the package's gemv.cu); 0."""
    args = sys.argv[1:] if argv is None else argv
    target = Path(args[0]) if args else KERNELS_DIR / "gemv.cu"
    target.write_text(source(target))
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
