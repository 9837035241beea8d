"""Notebooks are valid, import rawgraph, and define no kernels or library logic of their own."""

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("[0-9]*.ipynb"))
# notebooks import from rawgraph's faces (the package and its subpackages), never a module
# inside them: what they show is the public API
IMPORT = re.compile(r"^\s*(?:from|import)\s+(rawgraph[\w.]*)", re.M)
FORBIDDEN = re.compile(r"RawKernel|RawModule|ElementwiseKernel|ReductionKernel|__global__|"
                       r"\bKernel\(|cuLaunch|cuModule")


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 3


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_valid_and_uses_the_library(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "import rawgraph" in code
    root = Path(__file__).parents[1]
    for mod in IMPORT.findall(code):
        assert (root / mod.replace(".", "/") / "__init__.py").exists(), \
            f"{path.name} imports {mod}, a module inside rawgraph; import from a package face"
    assert not FORBIDDEN.search(code), FORBIDDEN.search(code)
    assert nb.cells[0].cell_type == "markdown" and "Goal" in nb.cells[0].source
