"""Scratch: activation buffers shared by graphs that never run concurrently.

Each buffer is declared once with its largest size (the largest bucket's), so every graph
captured against a scratch set sees the same addresses. `copies` sets exist for work that
does run concurrently (prefill and decode on two streams). A set is taken with `acquire` and
given back with `release`; both are lock-free (single atomic list/dict operations under the
GIL) and releasing a set that is not held raises.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import cupy
import numpy as np

from rawgraph.memory.layout import ArenaFullError, Layout, align_up


class ScratchBusyError(RuntimeError):
    """Every scratch set is held."""


class Scratch:
    """`copies` identical sets of named buffers in one device allocation."""

    def __init__(self, sizes: dict[str, int], copies: int = 1, temp_bytes: int = 0,
                 name: str = "scratch"):
        if copies < 1:
            raise ValueError(f"{name}: copies must be >= 1, got {copies}")
        self.name, self.copies = name, copies
        per_set = sum(align_up(n, 256) for n in sizes.values()) + align_up(temp_bytes, 256)
        self.set_bytes = max(align_up(per_set, 256), 256)
        self.layout = Layout(self.set_bytes, f"{name} set")
        for key, n in sizes.items():
            self.layout.reserve(key, n)
        self.temp = self.layout.reserve("<capture temporaries>", temp_bytes) if temp_bytes else None
        self._mem = cupy.cuda.Memory(self.set_bytes * copies)
        self._free = list(range(copies - 1, -1, -1))
        self._held: dict[int, ScratchSet] = {}

    @property
    def nbytes(self) -> int:
        """Device bytes of all sets."""
        return self.set_bytes * self.copies

    def acquire(self, owner: str = "?") -> ScratchSet:
        """Take a free set (use as a context manager to release it)."""
        try:
            i = self._free.pop()  # atomic: two threads never get the same set
        except IndexError:
            holders = ", ".join(s.owner for s in list(self._held.values()))
            raise ScratchBusyError(f"{self.name}: no free set for {owner!r}; held by "
                                   f"{holders}") from None
        s = self._held[i] = ScratchSet(self, i, owner)
        return s

    def release(self, s: ScratchSet) -> None:
        """Give a set back; raises if it is not held (twice, or from another Scratch)."""
        if self._held.get(s.index) is not s or self._held.pop(s.index, None) is not s:
            raise ValueError(f"{self.name}: release of set {s.index} ({s.owner!r}), "
                             f"which is not held")
        self._free.append(s.index)

    def close(self) -> None:
        """Drop the allocation (freed once no view of it remains)."""
        self._mem = None


class ScratchSet:
    """One acquired set of scratch buffers."""

    def __init__(self, scratch: Scratch, index: int, owner: str):
        self.scratch, self.index, self.owner = scratch, index, owner
        self.base = index * scratch.set_bytes

    def view(self, name: str, shape: tuple | int, dtype: Any) -> cupy.ndarray:
        """Buffer `name` viewed as `shape`/`dtype` (at most its declared size)."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        r = self.scratch.layout.regions.get(name)
        if r is None:
            raise KeyError(f"{self.scratch.name}: no buffer {name!r}; "
                           f"declared: {self.scratch.layout.summary()}")
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        if nbytes > r.nbytes:
            raise ValueError(f"{self.scratch.name}: {name!r} as {shape} {np.dtype(dtype)} needs "
                             f"{nbytes:,} bytes; it was declared with {r.nbytes:,}")
        return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(self.scratch._mem,
                                                                  self.base + r.offset))

    def allocator(self) -> Callable[[int], cupy.cuda.MemoryPointer]:
        """A CuPy allocator for `capture(..., allocations=)`: bump allocation in this set's
        capture-temporaries region, from its start on every call of allocator(), so the same
        capture code gets the same addresses every time."""
        temp = self.scratch.temp
        if temp is None:
            raise ValueError(f"{self.scratch.name} was made without temp_bytes")
        top = [0]

        def alloc(nbytes: int) -> cupy.cuda.MemoryPointer:
            off = align_up(top[0], 256)
            if off + nbytes > temp.nbytes:
                raise ArenaFullError(f"{self.scratch.name}: capture temporaries need "
                                     f"{off + nbytes:,} bytes, {temp.nbytes:,} were reserved")
            top[0] = off + nbytes
            return cupy.cuda.MemoryPointer(self.scratch._mem, self.base + temp.offset + off)

        return alloc

    def __enter__(self) -> ScratchSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.scratch.release(self)
