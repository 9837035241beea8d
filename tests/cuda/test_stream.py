"""Stream handles: what rawgraph accepts as a stream, and CuPy's view of a raw handle."""

import cupy
import pytest
from cuda.bindings import driver

from rawgraph.cuda.stream import cupy_stream, stream_handle


def test_stream_handles_from_every_form():
    assert stream_handle(1234) == 1234
    assert stream_handle(driver.CUstream(4321)) == 4321
    assert stream_handle(cupy_stream(777)) == 777
    with pytest.raises(TypeError, match="not a stream"):
        stream_handle("s")


def test_cupy_stream_wraps_without_copying_streams():
    s = cupy_stream(98765)
    assert isinstance(s, cupy.cuda.Stream) and s.ptr == 98765
    assert cupy_stream(s) is s
