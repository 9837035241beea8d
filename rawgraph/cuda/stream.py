"""Streams as rawgraph sees them: a raw handle (int) from whatever the caller holds."""

from __future__ import annotations

from typing import Any

import cupy


def stream_handle(stream: Any = None) -> int:
    """The CUstream handle of `stream`: a cupy Stream, a driver CUstream, an int, or None
    (CuPy's current stream)."""
    if stream is None:
        return int(cupy.cuda.get_current_stream().ptr)
    ptr = getattr(stream, "ptr", None)
    if ptr is not None:
        return int(ptr)
    if isinstance(stream, int):
        return stream
    try:
        return int(stream)  # driver.CUstream / runtime.cudaStream_t
    except TypeError:
        raise TypeError(f"not a stream: {stream!r}") from None


def new_stream() -> cupy.cuda.Stream:
    """A non-blocking stream (capture needs a stream other than the legacy default one)."""
    return cupy.cuda.Stream(non_blocking=True)
