"""Arena: one device allocation carved into named regions whose addresses never move."""

from __future__ import annotations

import math
from typing import Any

import cupy
import numpy as np

from rawgraph.memory.layout import Layout, Region


class Arena:
    """Persistent device memory (weights, KV cache, block tables, static graph inputs/outputs).

    One cudaMalloc of `capacity` bytes at construction; `array(name, shape, dtype)` carves an
    aligned region and returns a CuPy view of it. Running out raises ArenaFullError with the
    sizes asked for and available.
    """

    def __init__(self, capacity: int, name: str = "arena"):
        self.layout = Layout(capacity, name)
        self.name = name
        self._mem: cupy.cuda.Memory | None = cupy.cuda.Memory(capacity)
        self.ptr = int(self._mem.ptr)

    def region(self, name: str, nbytes: int, align: int = 256) -> Region:
        """Carve `nbytes` bytes named `name`."""
        self._alive()
        return self.layout.reserve(name, nbytes, align)

    def array(self, name: str, shape: tuple | int, dtype: Any, align: int = 256) -> cupy.ndarray:
        """A new region viewed as a C-contiguous CuPy array."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        r = self.region(name, max(nbytes, 1), align)
        return self.view(r, shape, dtype)

    def view(self, r: Region, shape: tuple, dtype: Any) -> cupy.ndarray:
        """A CuPy array over (the start of) region `r`."""
        self._alive()
        if math.prod(shape) * np.dtype(dtype).itemsize > r.nbytes:
            raise ValueError(f"{self.name}: {shape} {np.dtype(dtype)} does not fit region "
                             f"{r.name!r} of {r.nbytes:,} bytes")
        return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(self._mem, r.offset))

    def owner(self, ptr: int) -> str | None:
        """Name of the region holding device address `ptr`, if it is in this arena."""
        if self._mem is None or not self.ptr <= ptr < self.ptr + self.layout.capacity:
            return None
        r = self.layout.find(ptr - self.ptr)
        return r.name if r else None

    def stats(self) -> dict[str, int]:
        """Bytes per region, free and capacity."""
        return self.layout.stats()

    def _alive(self) -> None:
        if self._mem is None:
            raise ValueError(f"arena {self.name!r} is closed")

    def close(self) -> None:
        """Drop the arena's allocation (freed once the last view of it is gone, as in CuPy)."""
        self._mem = None

    def __enter__(self) -> Arena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
