"""NumPy references (float32 math, roundings where the kernels round) for every op."""

from __future__ import annotations

import numpy as np

from rawgraph.dtypes import e4m3_decode, e4m3_encode, round_to
from rawgraph.ops.sampling import GREEDY_TEMPERATURE


def add(a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    """a + b in float32, rounded to `dtype`; inputs are float32 values of `dtype`."""
    return round_to(a + b, dtype)


def silu_mul(gate_up: np.ndarray, dtype: str) -> np.ndarray:
    """T(T(silu(gate)) * up) for gate_up (rows, 2 * inter) in the interleaved layout (groups
    of 8 gate columns, each followed by its 8 up columns)."""
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    pairs = gate_up.reshape(rows, inter // 8, 2, 8).astype(np.float64)
    g, u = pairs[:, :, 0].reshape(rows, inter), pairs[:, :, 1].reshape(rows, inter)
    s = round_to((g / (1.0 + np.exp(-g))).astype(np.float32), dtype)
    return round_to(s * u.astype(np.float32), dtype)


def rmsnorm(x: np.ndarray, w: np.ndarray | None, eps: float, dtype: str,
            residual: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(out, h) with h = T(x + residual) (or x) and out = T(w * T(h / rms(h))) (w None:
    T(h / rms(h)))."""
    h = x if residual is None else round_to(x + residual, dtype)
    normed = round_to((h * inv_rms(h, eps)).astype(np.float32), dtype)
    return (normed if w is None else round_to(w * normed, dtype)), h


def inv_rms(x: np.ndarray, eps: float) -> np.ndarray:
    """1 / sqrt(mean(x^2) + eps) per row (float64), shaped to broadcast over the row."""
    return 1.0 / np.sqrt((x.astype(np.float64) ** 2).mean(axis=-1, keepdims=True) + eps)


def fold_norm(w: np.ndarray, g: np.ndarray, dtype: str) -> np.ndarray:
    """T(w * g), g broadcast over w's rows (the product is exact in float32)."""
    return round_to((w.astype(np.float32) * g.astype(np.float32)), dtype)


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


def linear(x: np.ndarray, w: np.ndarray, dtype: str,
           residual: np.ndarray | None = None, norm_eps: float | None = None) -> np.ndarray:
    """T(x @ w.T (+ residual)) with float64 accumulation; with norm_eps, of x's rows
    RMS-normalized (unrounded: the scale multiplies the sums, as the GEMV applies it)."""
    y = x.astype(np.float64) @ w.astype(np.float64).T
    if norm_eps is not None:
        y = y * inv_rms(x, norm_eps)
    if residual is not None:
        y = y + residual
    return round_to(y.astype(np.float32), dtype)


def dequantize_fp8(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """An FP8 weight's values (`ops.Fp8Weight`): e4m3 codes (n, k) times each row's scale
    (n,), in float64 (the GEMV sums the codes and scales the sum: the same product)."""
    return e4m3_decode(codes).astype(np.float64) * np.asarray(scale, np.float64)[:, None]


def dequantize_fp8_to(codes: np.ndarray, scale: np.ndarray, dtype: str) -> np.ndarray:
    """`ops.quantized.dequantize` of an FP8 weight: T(float32(code x scale)), as float32."""
    prod = e4m3_decode(codes) * np.asarray(scale, np.float32)[:, None]
    return round_to(prod.astype(np.float32), dtype)


def dequantize_int4(q: np.ndarray, scales: np.ndarray, zeros: np.ndarray, group: int,
                    dtype: str) -> np.ndarray:
    """A 4-bit weight's values (`ops.Int4Weight`, unpacked: q (n, k)) as the GEMV makes
    them: T((q - zero) * scale) per group of `group` values of a row, as float32."""
    q = np.asarray(q, np.float32)
    z = np.repeat(np.asarray(zeros, np.float32), group, axis=1)
    s = np.repeat(np.asarray(scales, np.float32), group, axis=1)
    return round_to((q - z) * s, dtype)


def linear_fp8(x: np.ndarray, codes: np.ndarray, scale: np.ndarray, dtype: str,
               residual: np.ndarray | None = None) -> np.ndarray:
    """`linear` through an FP8 weight (`dequantize_fp8`)."""
    return linear(x, dequantize_fp8(codes, scale), dtype, residual)


def quantize_fp8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`ops.quantized.quantize_fp8`: (codes uint8 (n, k), scale float32 (n,)) of w (n, k):
    each row's largest magnitude (at least 1e-12) over 448, then w / scale to the nearest
    e4m3."""
    w = np.asarray(w, np.float32)
    scale = (np.maximum(np.abs(w).max(1), np.float32(1e-12)) / np.float32(448)).astype(
        np.float32)
    return e4m3_encode(w / scale[:, None]), scale


def quantize_int4(w: np.ndarray, group: int, dtype: str
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`ops.quantized.quantize_int4` (unpacked): (q uint8 (n, k), scales float32 (n, k /
    group) holding `dtype` values, zeros uint8) of w (n, k): per group, lo and hi its least
    and largest value with 0 among them, scale = dtype((hi - lo) / 15) (1 where that is 0),
    zero = clip(rint(-lo / scale), 0, 15), q = clip(rint(w / scale) + zero, 0, 15)."""
    w = np.asarray(w, np.float32)
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    lo = np.minimum(g.min(-1), np.float32(0))
    hi = np.maximum(g.max(-1), np.float32(0))
    s = round_to(((hi - lo) / np.float32(15)).astype(np.float32), dtype)
    s = np.where(s == 0, np.float32(1), s).astype(np.float32)
    z = np.clip(np.rint(-lo / s), 0, 15).astype(np.float32)
    q = np.clip(np.rint(g / s[..., None]) + z[..., None], 0, 15)
    return q.reshape(n, k).astype(np.uint8), s, z.astype(np.uint8)


def embedding(ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    """table[ids], zero rows for ids outside the table."""
    ok = (ids >= 0) & (ids < table.shape[0])
    return np.where(ok[:, None], table[np.clip(ids, 0, table.shape[0] - 1)], 0).astype(
        table.dtype)


def rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, dtype: str) -> np.ndarray:
    """Rotate-half RoPE of x (tokens, heads, head_dim), rounded to `dtype`.

    The angle is positions * inv_freq in float32, as the kernel (and Hugging Face) compute it;
    the rotation is in float64.
    """
    half = x.shape[-1] // 2
    a = (positions.astype(np.float32)[:, None, None] * inv_freq).astype(np.float64)
    c, s = np.cos(a), np.sin(a)
    x1, x2 = x[..., :half].astype(np.float64), x[..., half:].astype(np.float64)
    out = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    return round_to(out.astype(np.float32), dtype)


def qkv_extras(q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | None,
               qk_norm: np.ndarray | None, eps: float, dtype: str
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A family's q, k, v before RoPE, as rope_append.cu finishes them: q (tokens, heads, D),
    k and v (tokens, kv_heads, D) plus their biases (q's, k's, v's end to end), rounded; then
    each head of q and k RMS-normalized (rounded) and scaled by qk_norm's q or k half
    (rounded), as Hugging Face's RMSNorm over head_dim does it."""
    if bias is not None:
        parts = np.split(bias.astype(np.float32), [q[0].size, q[0].size + k[0].size])
        q, k, v = (round_to(x + b.reshape(x.shape[1:]), dtype)
                   for x, b in zip((q, k, v), parts))
    if qk_norm is not None:
        d = q.shape[-1]
        q, k = (rmsnorm(x, qk_norm[i * d:(i + 1) * d], eps, dtype)[0]
                for i, x in enumerate((q, k)))
    return q, k, v


def argmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise argmax, smallest index on ties, NaNs skipped (0 for a row of NaNs)."""
    real = ~np.isnan(logits)
    filled = np.where(real, logits, -np.inf)
    # a row whose largest value is -inf (or NaN only): its first real entry (0 if none)
    low = filled.max(axis=1) == -np.inf
    return np.where(low, real.argmax(axis=1), filled.argmax(axis=1)).astype(np.int32)


def decode_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                     table: np.ndarray, lens: np.ndarray, slots: np.ndarray,
                     scale: float) -> np.ndarray:
    """Attention of each row's query heads over its sequence's cached tokens (float64).

    Rows with slot < 0 come back as NaN (the kernel leaves them unwritten); length 0 gives 0.
    """
    _, q_heads, d = q.shape
    kv_heads = k_cache.shape[2] // d
    out = np.full(q.shape, np.nan)
    for b, s in enumerate(slots):
        if s < 0:
            continue
        n = int(lens[s])
        if n == 0:
            out[b] = 0
            continue
        k = kv_gather(k_cache, table[s], n).reshape(n, kv_heads, d).astype(np.float64)
        v = kv_gather(v_cache, table[s], n).reshape(n, kv_heads, d).astype(np.float64)
        for h in range(q_heads):
            kh = h // (q_heads // kv_heads)
            sc = k[:, kh] @ q[b, h].astype(np.float64) * scale
            p = np.exp(sc - sc.max())
            out[b, h] = p @ v[:, kh] / p.sum()
    return out


def prefill_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                      table: np.ndarray, lens: np.ndarray, cu_seqlens: np.ndarray,
                      slots: np.ndarray, scale: float) -> np.ndarray:
    """Causal attention of each sequence's query rows over its cached tokens (float64).

    Rows of sequences with slot < 0 come back as NaN (the kernel leaves them unwritten).
    """
    _, q_heads, d = q.shape
    kv_heads = k_cache.shape[2] // d
    out = np.full(q.shape, np.nan)
    for i, s in enumerate(slots):
        b, e = int(cu_seqlens[i]), int(cu_seqlens[i + 1])
        if s < 0 or e == b:
            continue
        n = int(lens[s])
        k = kv_gather(k_cache, table[s], n).reshape(n, kv_heads, d).astype(np.float64)
        v = kv_gather(v_cache, table[s], n).reshape(n, kv_heads, d).astype(np.float64)
        pos = n - (e - b) + np.arange(e - b)  # (q_len,) positions of the query rows
        mask = np.arange(n)[None, :] > pos[:, None]  # (q_len, n) keys after the query
        for h in range(q_heads):
            kh = h // (q_heads // kv_heads)
            sc = q[b:e, h].astype(np.float64) @ k[:, kh].T * scale
            sc[mask] = -np.inf
            p = np.exp(sc - sc.max(axis=1, keepdims=True))
            out[b:e, h] = (p @ v[:, kh]) / p.sum(axis=1, keepdims=True)
    return out


def sample_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The distribution `sample` draws from for one row (float64; ties at a cut kept, as
    Hugging Face's warpers do). temperature <= 1e-6: all mass on the first maximum."""
    x = logits.astype(np.float64)
    ok = ~np.isnan(x)
    out = np.zeros_like(x)
    if temperature <= GREEDY_TEMPERATURE:
        out[int(np.argmax(np.where(ok, x, -np.inf)))] = 1.0
        return out
    keep = ok.copy()
    if 0 < top_k < x.size:
        keep &= x >= np.sort(x[ok])[::-1][min(top_k, ok.sum()) - 1]
    p = np.where(keep, np.exp((x - x[ok].max()) / temperature), 0.0)
    if top_p < 1:
        order = np.argsort(-x, kind="stable")
        mass = np.cumsum(p[order])
        last = int(np.searchsorted(mass, top_p * mass[-1]))  # first index reaching top_p
        keep &= x >= x[order[min(last, order.size - 1)]]
        p = np.where(keep, p, 0.0)
    return p / p.sum()


def logprobs(logits: np.ndarray, n: int) -> tuple[float, list[int], list[float]]:
    """One row's log-sum-exp and its n largest logits' ids and log-probabilities (larger
    first, then smaller index; NaNs skipped), as `ops.process` computes them (float64 here:
    the kernel's fp32 sum is within a few ulps of it)."""
    x = logits.astype(np.float64)
    ok = ~np.isnan(x)
    if not ok.any():
        return -np.inf, [], []
    m = x[ok].max()
    lse = m + np.log(np.exp(x[ok] - m).sum()) if np.isfinite(m) else m
    order = np.argsort(-np.where(ok, x, -np.inf), kind="stable")[:min(n, int(ok.sum()))]
    return float(lse), order.tolist(), (x[order] - lse).tolist()


def apply_rules(logits: np.ndarray, dtype: str | None, *, counts: np.ndarray,
                in_prompt: np.ndarray, presence: float = 0.0, frequency: float = 0.0,
                repetition: float = 1.0, bias: dict[int, float] | None = None,
                until: dict[int, int] | None = None, position: int = 0) -> np.ndarray:
    """A row's rules as `ops.process` applies them (kernels_cu/logits.cu): per token, in
    float32, bias (-inf while `position` < its until: min_tokens' bans), then the repetition
    penalty over tokens in the prompt or the output, then minus frequency * count and minus
    presence over output tokens; rounded to `dtype` once (None: float32)."""
    x = logits.astype(np.float32).copy()
    f32 = np.float32
    for t in set(bias or {}) | set(until or {}):
        x[t] = -np.inf if position < (until or {}).get(t, 0) else x[t] + f32((bias or {}).get(t, 0))
    rep, seen = f32(repetition), (counts > 0) | in_prompt
    if repetition != 1:
        x = np.where(seen, np.where(x > 0, x / rep, x * rep), x).astype(np.float32)
    out = counts > 0
    x = np.where(out, (x - f32(frequency) * counts.astype(np.float32)) - f32(presence), x)
    x = x.astype(np.float32)
    return x if dtype is None else round_to(x, dtype)
