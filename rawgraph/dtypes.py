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


# FP8 e4m3fn (weights: rawgraph.ops.fp8, rawgraph.model.quant): 4 exponent bits, bias 7, 3
# mantissa bits, no infinities; 0x7F and 0xFF are NaN
E4M3_MAX = 448.0


def _e4m3_table() -> np.ndarray:
    """float32 value of each of the 256 e4m3fn codes (0x7F and 0xFF: NaN)."""
    code = np.arange(256)
    sign = np.where(code & 0x80, -1.0, 1.0)
    exp, man = (code >> 3) & 0xF, code & 0x7
    val = np.where(exp == 0, man / 8 * 2.0**-6, (1 + man / 8) * 2.0 ** (exp - 7.0))
    out = (sign * val).astype(np.float32)
    out[[0x7F, 0xFF]] = np.nan
    return out


E4M3 = _e4m3_table()
_POSITIVE = E4M3[:0x7F]  # codes 0x00..0x7E: 0 and the positive finite values, increasing


def e4m3_decode(bits: np.ndarray) -> np.ndarray:
    """e4m3fn codes (uint8) as float32."""
    return E4M3[np.asarray(bits, np.uint8)]


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    """float32 to the nearest e4m3fn code (ties to the even code), saturating at +-448 (as
    torch's float8_e4m3fn cast of a clamped tensor does); NaN stays NaN."""
    x = np.asarray(x, np.float32)
    a = np.minimum(np.abs(x), E4M3_MAX)
    hi = np.clip(np.searchsorted(_POSITIVE, a), 1, 0x7E)
    lo = hi - 1
    d_lo, d_hi = a - _POSITIVE[lo], _POSITIVE[hi] - a
    up = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(up, hi, lo).astype(np.uint8)
    code |= np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    return np.where(np.isnan(x), np.uint8(0x7F), code).astype(np.uint8)
