"""Shared fixtures; `gpu` tests skip when no CUDA device is visible, with the reason said
once (every such skip is raised here, so `pytest -ra` folds them into one line)."""

from __future__ import annotations

import contextlib
import functools
import os

import numpy as np
import pytest


@functools.cache
def _gpu() -> tuple[bool, str]:
    from rawgraph.cuda.device import available

    return available()


@functools.cache
def _precompiled() -> None:
    """Every kernels_cu module compiled at once on all CPUs before the first GPU test (a
    fresh machine otherwise compiles them one at a time as tests first launch them). A
    module that fails to compile is left to the tests that launch it to report."""
    from rawgraph.cuda.check import CompileError
    from rawgraph.cuda.kernel import precompile

    try:
        precompile()
    except CompileError:
        pass


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "gpu" in item.keywords:
        ok, why = _gpu()
        if not ok:
            pytest.skip(f"needs a CUDA device: {why}")
        _precompiled()


@pytest.fixture
def stream():
    """A fresh non-blocking stream, made CuPy's current stream for the test (inputs made
    with CuPy and the kernels under test are ordered on it), synchronized at the end."""
    from rawgraph.cuda.stream import new_stream

    s = new_stream()
    with s:
        yield s
    s.synchronize()


@pytest.fixture
def variants():
    """`variants(**changes)`: the kernel forms the rest of the test takes
    (`ops.variant.choose`), back to the defaults after it."""
    from rawgraph.ops.variant import choose

    with contextlib.ExitStack() as stack:
        yield lambda **changes: stack.enter_context(choose(**changes))


@pytest.fixture
def sanitizing() -> bool:
    """True under tests/sanitize.py (it sets RAWGRAPH_SANITIZER to the tool): a test whose
    size serves only its statistics runs smaller there, the same code on fewer rows."""
    return bool(os.environ.get("RAWGRAPH_SANITIZER"))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
