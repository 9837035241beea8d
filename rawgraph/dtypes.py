"""Storage dtypes: fp16 as float16 arrays, bf16 as uint16 arrays holding bfloat16 bits.

NumPy and CuPy have no bfloat16, so rawgraph stores bf16 tensors as uint16 (the raw bits)
and converts on the host with round-to-nearest-even, exactly like `__float2bfloat16_rn`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

STORAGE = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(np.uint16)}
# kernel-name suffix and C element type of each dtype (kernels_cu: name_{f16,bf16}, T)
KERNEL_TYPES = {"float16": ("f16", "__half"), "bfloat16": ("bf16", "__nv_bfloat16")}


def storage_dtype(dtype: str) -> np.dtype:
    """The array dtype that stores `dtype` ('float16' or 'bfloat16')."""
    if dtype not in STORAGE:
        raise ValueError(f"unsupported dtype {dtype!r}: use one of {sorted(STORAGE)}")
    return STORAGE[dtype]


def kind_of(arr: Any) -> str:
    """'float16' or 'bfloat16' for an array in rawgraph storage (uint16 means bf16)."""
    dt = np.dtype(arr.dtype)
    for name, st in STORAGE.items():
        if dt == st:
            return name
    raise ValueError(f"unsupported dtype {dt}: rawgraph stores float16, or bfloat16 as uint16")


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), round to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def from_bf16_bits(b: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32, exactly."""
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float values to `dtype` storage (float16 array or bf16 bits)."""
    if dtype == "bfloat16":
        return to_bf16_bits(x)
    return np.asarray(x, dtype=storage_dtype(dtype))


def to_float32(x: np.ndarray, dtype: str) -> np.ndarray:
    """Storage values back to float32."""
    return from_bf16_bits(x) if dtype == "bfloat16" else np.asarray(x, dtype=np.float32)


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded through `dtype`, as float32."""
    return to_float32(to_storage(x, dtype), dtype)
