"""Mapped pinned host memory: kernels write results straight into host RAM (zero-copy), so a
step's few output values need no device-to-host copy on the stream after it."""

from __future__ import annotations

import ctypes
from typing import Any

import cupy
import numpy as np
from cuda.bindings import driver

from rawgraph.cuda.check import check
from rawgraph.cuda.device import ensure_context


class MappedArray:
    """`count` values of `dtype` in page-locked host memory mapped into the device's address
    space: kernels store through `dev` (a CuPy array), the host reads `host` (NumPy) once an
    event recorded after those kernels has completed. Small outputs only: every device
    access crosses PCIe. `close()` frees it; no work that uses it may be in flight then."""

    def __init__(self, count: int, dtype: Any = np.int32):
        ensure_context()
        dt = np.dtype(dtype)
        if count < 1:
            raise ValueError(f"count = {count}: a mapped array holds at least one value")
        nbytes = count * dt.itemsize
        flags = driver.CU_MEMHOSTALLOC_DEVICEMAP | driver.CU_MEMHOSTALLOC_PORTABLE
        self._ptr = int(check(driver.cuMemHostAlloc(nbytes, flags),
                              f"allocate {nbytes} bytes of mapped host memory"))
        dptr = int(check(driver.cuMemHostGetDevicePointer(self._ptr, 0),
                         "map the host memory into the device's address space"))
        self.host = np.frombuffer((ctypes.c_byte * nbytes).from_address(self._ptr), dt, count)
        mem = cupy.cuda.UnownedMemory(dptr, nbytes, self, device_id=cupy.cuda.Device().id)
        self.dev = cupy.ndarray((count,), dt, cupy.cuda.MemoryPointer(mem, 0))
        self.host[:] = 0

    def close(self) -> None:
        """Free the memory (the views must not be used after)."""
        if self._ptr:
            check(driver.cuMemFreeHost(self._ptr), "free mapped host memory")
            self._ptr = 0
