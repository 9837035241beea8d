"""Test helpers: random device tensors in rawgraph storage, poisoned outputs."""

from __future__ import annotations

import cupy
import numpy as np

from rawgraph.dtypes import storage_dtype, to_float32, to_storage

POISON = {"float16": 0x7E00, "bfloat16": 0x7FC1}  # NaN bit patterns no kernel writes


def randn(rng: np.random.Generator, shape: tuple, dtype: str, scale: float = 1.0):
    """(device array in storage dtype, its float32 values on the host)."""
    host = to_storage((rng.standard_normal(shape) * scale).astype(np.float32), dtype)
    return cupy.asarray(host), to_float32(host, dtype)


def poisoned(shape: tuple, dtype: str):
    """A device array filled with a NaN pattern: unwritten elements stay visible."""
    return cupy.full(shape, POISON[dtype], dtype=np.uint16).view(storage_dtype(dtype))


def host(arr, dtype: str) -> np.ndarray:
    """Device storage -> float32 on the host."""
    return to_float32(cupy.asnumpy(arr), dtype)
