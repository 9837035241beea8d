"""The notebooks run top to bottom on the GPU (nbclient and ipykernel, when installed): any
cell's error fails the test. With RAWGRAPH_NOTEBOOKS_OUT set, each executed notebook is
written there (`notebooks/run_all.py` refreshes them in place)."""

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient", reason="nbclient runs the notebooks "
                               "(pip install 'rawgraph[notebooks]')")
pytest.importorskip("ipykernel", reason="ipykernel runs the notebooks' code")

pytestmark = pytest.mark.gpu
HERE = Path(__file__).parents[1] / "notebooks"
NOTEBOOKS = sorted(HERE.glob("[0-9]*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, monkeypatch):
    root = str(Path(__file__).parents[1])  # the kernel imports this checkout's rawgraph
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(HERE)}})
    try:
        client.execute()
    finally:
        out = os.environ.get("RAWGRAPH_NOTEBOOKS_OUT")
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, Path(out) / path.name)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, errors
