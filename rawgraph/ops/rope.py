"""Rotary position embedding: inverse frequencies (with LLaMA-3 scaling) and the kernel."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rawgraph.cuda.kernel import Kernel
from rawgraph.ops import shapes
from rawgraph.symbols import Symbols

_SIG = ("{t}* q, {t}* k, const int* positions, const float* inv_freq, int n, int q_heads, "
        "int kv_heads, int head_dim, int q_stride, int k_stride")
ROPE = {"float16": Kernel("rope", "rope_f16", _SIG.format(t="__half")),
        "bfloat16": Kernel("rope", "rope_bf16", _SIG.format(t="__nv_bfloat16"))}


@dataclass(frozen=True)
class Llama3Scaling:
    """rope_scaling of type 'llama3' (factor 32, 1, 4, 8192 in LLaMA-3.2)."""

    factor: float = 32.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


def inv_freq(head_dim: int, theta: float = 10000.0,
             scaling: Llama3Scaling | None = None) -> np.ndarray:
    """(head_dim / 2,) float32 inverse frequencies, as Hugging Face computes them."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    f = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim)
    f = f.astype(np.float32)
    if scaling is None:
        return f
    s = scaling
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / f
    scaled = np.where(wavelen > low_wavelen, f / s.factor, f)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def check_freqs(freqs: Any, head_dim: int) -> None:
    """ValueError unless freqs is a float32 device array of head_dim / 2 inverse frequencies."""
    if not hasattr(freqs, "data") or np.dtype(freqs.dtype) != np.float32 \
            or freqs.shape != (head_dim // 2,):
        raise ValueError(f"inv_freq must be float32 of shape ({head_dim // 2},)")


def rope(q: Any, k: Any, positions: Any, freqs: Any, n: Any = None, *, stream: Any = None,
         symbols: Symbols | None = None) -> None:
    """Rotate q (tokens, q_heads, head_dim) and k (tokens, kv_heads, head_dim) in place."""
    if getattr(q, "ndim", 0) != 3 or getattr(k, "ndim", 0) != 3 or q.shape[2] != k.shape[2] \
            or q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must be (tokens, heads, head_dim) alike; got "
                         f"{getattr(q, 'shape', '?')} and {getattr(k, 'shape', '?')}")
    cap, q_heads, head_dim = q.shape
    if head_dim % 2 or head_dim > 512:
        raise ValueError(f"head_dim must be even and at most 512, got {head_dim}")
    dt, q_stride = shapes.rows(q, "q", q.shape[1:], align=4)
    _, k_stride = shapes.rows(k, "k", k.shape[1:], dt, align=4)
    if not hasattr(positions, "data") or np.dtype(positions.dtype) != np.int32 \
            or positions.shape != (cap,):
        raise ValueError(f"positions must be int32 of shape ({cap},)")
    check_freqs(freqs, head_dim)
    n = shapes.count(n, cap, "n", symbols)
    ROPE[dt].launch(n, 256, (q, k, positions, freqs, n, q_heads, k.shape[1], head_dim,
                             q_stride, k_stride), stream, symbols=symbols)
