"""Shared fixtures; `gpu` tests skip with the reason when no CUDA device is visible."""

from __future__ import annotations

import numpy as np
import pytest

from rawgraph.cuda.device import available


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ok, why = available()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA device: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def stream():
    """A fresh non-blocking stream, synchronized at the end of the test."""
    from rawgraph.cuda.stream import new_stream

    s = new_stream()
    yield s
    s.synchronize()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
