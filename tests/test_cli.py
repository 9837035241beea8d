"""The command line works without a GPU."""

import shutil

import pytest

from rawgraph.cli import main


def test_info_runs_anywhere(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "cuda-bindings" in out and "device" in out


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_check_kernels(capsys):
    assert main(["check-kernels"]) == 0
    assert "no spills" in capsys.readouterr().out
