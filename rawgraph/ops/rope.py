"""Rotary position embedding: inverse frequencies (default, linear, dynamic NTK, YaRN and
LLaMA-3 scaling, as Hugging Face computes them) and the kernel."""

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
    """rope_type 'llama3': long waves divided by `factor`, short ones kept, a smooth band
    between (factor 32, 1, 4, 8192 in LLaMA-3.2)."""

    factor: float = 32.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class LinearScaling:
    """rope_type 'linear' (position interpolation): every frequency divided by `factor`."""

    factor: float


@dataclass(frozen=True)
class DynamicScaling:
    """rope_type 'dynamic' (dynamic NTK): the default frequencies up to
    `max_position_embeddings`; past it Hugging Face raises the base with the context, which a
    paged cache of keys rotated earlier cannot follow, so models refuse longer contexts."""

    factor: float


@dataclass(frozen=True)
class YarnScaling:
    """rope_type 'yarn': frequencies blended between interpolated (/ factor) and original
    across a ramp of dimensions, and q, k scaled by `attention()` (cos and sin in Hugging
    Face; the attention scale by its square here)."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def attention(self) -> float:
        """The factor q and k are scaled by (Hugging Face's `attention_factor`)."""
        if self.attention_factor is not None:
            return self.attention_factor

        def get(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if self.mscale and self.mscale_all_dim:
            return get(self.factor, self.mscale) / get(self.factor, self.mscale_all_dim)
        return get(self.factor)


RopeScaling = Llama3Scaling | LinearScaling | DynamicScaling | YarnScaling


def attention_factor(scaling: RopeScaling | None) -> float:
    """How much RoPE scales q and k (1 but for YaRN): the attention scale takes its square."""
    return scaling.attention() if isinstance(scaling, YarnScaling) else 1.0


def inv_freq(head_dim: int, theta: float = 10000.0,
             scaling: RopeScaling | None = None) -> np.ndarray:
    """(head_dim / 2,) float32 inverse frequencies, as Hugging Face computes them."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    f = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim)
    f = f.astype(np.float32)
    if scaling is None or isinstance(scaling, DynamicScaling):
        return f
    if isinstance(scaling, LinearScaling):
        return (f / np.float32(scaling.factor)).astype(np.float32)
    if isinstance(scaling, YarnScaling):
        return _yarn(head_dim, theta, scaling)
    return _llama3(f, scaling)


def _llama3(f: np.ndarray, s: Llama3Scaling) -> np.ndarray:
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / f
    scaled = np.where(wavelen > low_wavelen, f / s.factor, f)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _yarn(dim: int, theta: float, s: YarnScaling) -> np.ndarray:
    def correction(rotations: float) -> float:  # the dimension that turns `rotations` times
        return dim * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi)) \
            / (2 * math.log(theta))

    low, high = correction(s.beta_fast), correction(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as Hugging Face: no zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    keep = (1 - ramp).astype(np.float32)  # 1: extrapolate (original), 0: interpolate (/ factor)
    pos = (theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim)).astype(np.float32)
    original, interpolated = 1 / pos, 1 / (np.float32(s.factor) * pos)
    return (interpolated * (1 - keep) + original * keep).astype(np.float32)


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
