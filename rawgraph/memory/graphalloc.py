"""Graph memory nodes for CuPy allocations made while capturing (`allocations="graph"`).

Each allocation is a cuMemAllocAsync on the capturing stream, which the driver records as a
memory-allocation node; when the array dies inside the capture block its memory is freed with
cuMemFreeAsync on that stream (a memory-free node). Memory still referenced when the block
ends is freed there too, at the end of the graph: graph allocations live inside the graph.
(CuPy's own MemoryAsyncPool queries pool attributes on every allocation, which a capture
forbids, so rawgraph allocates through the driver.)
"""

from __future__ import annotations

import cupy
from cuda.bindings import driver

from rawgraph.cuda.check import check


class _Allocation:
    """Owner of one graph allocation; freeing happens when CuPy drops its memory."""

    def __init__(self, pool: GraphAllocator, ptr: int):
        self.pool, self.ptr = pool, ptr

    def __del__(self) -> None:
        if self.pool.open and self.ptr:
            self.pool.free(self)


class GraphAllocator:
    """A CuPy allocator for one capture block (see module docstring)."""

    def __init__(self, stream: int):
        self.stream = driver.CUstream(stream)
        self.live: dict[int, _Allocation] = {}
        self.open = True

    def __call__(self, nbytes: int) -> cupy.cuda.MemoryPointer:
        ptr = int(check(driver.cuMemAllocAsync(max(nbytes, 1), self.stream),
                        f"graph allocation of {nbytes} bytes"))
        owner = self.live[ptr] = _Allocation(self, ptr)
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, nbytes, owner), 0)

    def free(self, a: _Allocation) -> None:
        """Free inside the graph (a memory-free node)."""
        if self.live.pop(a.ptr, None) is not None:
            check(driver.cuMemFreeAsync(a.ptr, self.stream), "graph free")

    def close(self) -> None:
        """Free what is still live, at the end of the graph; later drops do nothing."""
        for a in list(self.live.values()):
            self.free(a)
        self.open = False
