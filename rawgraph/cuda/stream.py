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
    if isinstance(stream, (str, bytes, float)):
        raise TypeError(f"not a stream: {stream!r}")
    try:
        return int(stream)  # driver.CUstream / runtime.cudaStream_t
    except (TypeError, ValueError):
        raise TypeError(f"not a stream: {stream!r}") from None


class _Handle:
    """A raw stream handle speaking the CUDA stream protocol (what CuPy accepts)."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def cupy_stream(stream: Any = None) -> cupy.cuda.Stream:
    """CuPy's view of `stream`, to order CuPy work (copies, fills) with rawgraph's launches."""
    if isinstance(stream, cupy.cuda.Stream):
        return stream
    return cupy.cuda.Stream.from_external(_Handle(stream_handle(stream)))


def new_stream() -> cupy.cuda.Stream:
    """A non-blocking stream (capture needs a stream other than the legacy default one)."""
    return cupy.cuda.Stream(non_blocking=True)
