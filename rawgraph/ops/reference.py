"""NumPy references (float32 math, roundings where the kernels round) for every op."""

from __future__ import annotations

import numpy as np

from rawgraph.dtypes import round_to


def add(a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    """a + b in float32, rounded to `dtype`; inputs are float32 values of `dtype`."""
    return round_to(a + b, dtype)


def silu_mul(gate_up: np.ndarray, dtype: str) -> np.ndarray:
    """T(T(silu(gate)) * up) for gate_up (rows, 2 * inter)."""
    inter = gate_up.shape[1] // 2
    g, u = gate_up[:, :inter].astype(np.float64), gate_up[:, inter:].astype(np.float64)
    s = round_to((g / (1.0 + np.exp(-g))).astype(np.float32), dtype)
    return round_to(s * u.astype(np.float32), dtype)


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float, dtype: str,
            residual: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(out, h) with h = T(x + residual) (or x) and out = T(w * T(h / rms(h)))."""
    h = x if residual is None else round_to(x + residual, dtype)
    inv = 1.0 / np.sqrt((h.astype(np.float64) ** 2).mean(axis=-1, keepdims=True) + eps)
    return round_to(w * round_to((h * inv).astype(np.float32), dtype), dtype), h


def kv_append(k_cache: np.ndarray, k_new: np.ndarray, table: np.ndarray, slots: np.ndarray,
              positions: np.ndarray) -> np.ndarray:
    """The cache after writing token rows of k_new (padding slots < 0 skipped); a copy."""
    out = k_cache.copy()
    bs = k_cache.shape[1]
    for t, (s, p) in enumerate(zip(slots, positions)):
        if s >= 0 and table[s, p // bs] >= 0:
            out[table[s, p // bs], p % bs] = k_new[t]
    return out


def kv_gather(cache: np.ndarray, table: np.ndarray, length: int) -> np.ndarray:
    """The first `length` tokens of a sequence, read through its block table row."""
    bs = cache.shape[1]
    return np.stack([cache[table[t // bs], t % bs] for t in range(length)]) if length else \
        cache[:0, 0]
