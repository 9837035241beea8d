"""Execute every notebook here in place (top to bottom) and keep the outputs.

    PYTHONPATH=. python3 notebooks/run_all.py [name ...]

Needs a CUDA device and nbclient + ipykernel (pip install 'rawgraph[notebooks]').
Exits non-zero if a notebook fails; the others still run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def run(path: Path) -> bool:
    """Execute one notebook in place; True when every cell ran."""
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": str(HERE)}}).execute()
        ok = True
    except Exception as e:  # keep going; report which notebook failed and why
        print(f"{path.name}: FAILED: {str(e)[-2000:]}")
        ok = False
    nbformat.write(nb, path)
    print(f"{path.name}: {'ok' if ok else 'failed'} in {time.perf_counter() - t0:.1f} s")
    return ok


def main(names: list[str]) -> int:
    """Run the named notebooks (all when none)."""
    paths = [HERE / f"{n.removesuffix('.ipynb')}.ipynb" for n in names] or sorted(
        HERE.glob("[0-9]*.ipynb"))
    return 0 if all([run(p) for p in paths]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
