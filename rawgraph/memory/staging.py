"""Per-step metadata: named host fields packed into one pinned buffer, copied to the device in
one transfer, so the device buffers that graphs read keep their addresses forever."""

from __future__ import annotations

from typing import Any

import cupy
import numpy as np

from rawgraph.cuda.stream import cupy_stream


class Staging:
    """Fields `name -> (dtype, count)` in one device buffer and its pinned host mirror.

    Write the host views (`host[name]`) between `begin()` and `push(stream)`: `begin` waits
    until the previous push has read the pinned buffer, `push` copies it all in one
    host-to-device transfer on `stream`. Device views (`dev[name]`) never move. `device`:
    a uint8 device buffer of at least `Staging.size(fields)` bytes to hold the fields (an
    arena's, say); default a new one.
    """

    def __init__(self, fields: dict[str, tuple[Any, int]], device: cupy.ndarray | None = None):
        offsets, self.nbytes = _layout(fields)
        if device is None:
            device = cupy.zeros(self.nbytes, np.uint8)
        elif device.dtype != np.uint8 or device.ndim != 1 or device.size < self.nbytes:
            raise ValueError(f"device must be a 1-D uint8 buffer of at least {self.nbytes} "
                             f"bytes, got {device.dtype} {device.shape}")
        self._pinned = cupy.cuda.alloc_pinned_memory(self.nbytes)
        raw = np.frombuffer(self._pinned, np.uint8, self.nbytes)
        self.buffer = device[:self.nbytes]
        self.host: dict[str, np.ndarray] = {}
        self.dev: dict[str, cupy.ndarray] = {}
        self._offsets = {name: o for name, (_, _, o) in offsets.items()}
        for name, (dt, count, o) in offsets.items():
            self.host[name] = raw[o:o + dt.itemsize * count].view(dt)
            self.dev[name] = self.buffer[o:o + dt.itemsize * count].view(dt)
        raw[:] = 0
        self._copied = cupy.cuda.Event(block=False, disable_timing=True)
        self._copied.record()

    @staticmethod
    def size(fields: dict[str, tuple[Any, int]]) -> int:
        """Bytes the fields take (each naturally aligned, the total rounded up to 16)."""
        return _layout(fields)[1]

    def begin(self) -> dict[str, np.ndarray]:
        """Wait until the pinned buffer is free to write; returns the host views."""
        self._copied.synchronize()
        return self.host

    def offset(self, name: str) -> int:
        """Byte offset of field `name` in the buffer (fields lie in the order given)."""
        return self._offsets[name]

    def push(self, stream: Any, nbytes: int | None = None, *, start: int = 0) -> None:
        """Copy every field (or the buffer's bytes [start, nbytes): fields lie in the order
        given, `offset` finds them) to the device on `stream`, in one transfer."""
        nbytes = self.nbytes if nbytes is None else nbytes
        if not 0 <= start < nbytes <= self.nbytes:
            raise ValueError(f"bytes [{start}, {nbytes}) outside [0, {self.nbytes}] or empty")
        s = cupy_stream(stream)
        (self.buffer.data + start).copy_from_host_async(self._pinned.ptr + start,
                                                        nbytes - start, s)
        self._copied.record(s)


def _layout(fields: dict[str, tuple[Any, int]]) -> tuple[dict[str, tuple], int]:
    offsets, off = {}, 0
    for name, (dtype, count) in fields.items():
        dt = np.dtype(dtype)
        off = -(-off // dt.itemsize) * dt.itemsize  # natural alignment (uint64 seeds)
        offsets[name] = (dt, count, off)
        off += dt.itemsize * count
    return offsets, -(-off // 16) * 16
