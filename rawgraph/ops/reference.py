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
