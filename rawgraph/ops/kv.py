"""Paged KV cache ops: append new tokens' K/V (plain, or rotated by RoPE on the way in),
gather a sequence back out densely."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from cupy.lib.stride_tricks import as_strided

from rawgraph.cuda.kernel import Kernel
from rawgraph.dtypes import KERNEL_TYPES
from rawgraph.ops import shapes
from rawgraph.ops.rope import check_freqs
from rawgraph.symbols import Symbols

_APPEND = ("const {t}* k_new, const {t}* v_new, {t}* k_cache, {t}* v_cache, "
           "const int* block_tables, const int* seq_slots, const int* positions, int n, "
           "int row, int block_size, int max_blocks, int src_stride")
_ROPE_APPEND = ("{t}* q, const {t}* k_new, const {t}* v_new, {t}* k_cache, {t}* v_cache, "
                "const int* block_tables, const int* seq_slots, const int* positions, "
                "const float* inv_freq, int n, int q_heads, int kv_heads, int head_dim, "
                "int q_stride, int kv_stride, int block_size, int max_blocks, const {t}* bias, "
                "const {t}* qk_norm, float norm_eps")
_GATHER = ("const {t}* cache, const int* block_tables, const int* seq_lens, int seq, {t}* out, "
           "int max_tokens, int row, int block_size, int max_blocks")
KV_APPEND = {dt: Kernel("kv_append", f"kv_append_{s}", _APPEND.format(t=t))
             for dt, (s, t) in KERNEL_TYPES.items()}
ROPE_APPEND = {dt: Kernel("rope_append", f"rope_append_{s}", _ROPE_APPEND.format(t=t))
               for dt, (s, t) in KERNEL_TYPES.items()}
KV_GATHER = {dt: Kernel("kv_gather", f"kv_gather_{s}", _GATHER.format(t=t))
             for dt, (s, t) in KERNEL_TYPES.items()}
BLOCK = 128
ROPE_BLOCK = 256  # rope_append.cu: a token a block, a thread a piece of pairs
NORM_PIECES = 1024  # rope_append.cu's shared sums: pieces of a token's q and k heads


@dataclass(frozen=True)
class Cache:
    """One layer's paged KV cache and its tables, as attention reads them and the QKV
    projection appends to them: `k`, `v` (num_blocks, block_size, kv_heads * D);
    `block_tables` (max_seqs, max_blocks) int32, each slot's blocks (-1: unmapped);
    `seq_lens` (max_seqs,) int32, the tokens cached per slot (read on the device; attention
    needs them, the append does not)."""

    k: Any
    v: Any
    block_tables: Any
    seq_lens: Any = None


@dataclass(frozen=True)
class Extras:
    """A family's extras to q, k and v before RoPE (rawgraph.model.family), each None where
    it has none: `bias` (q_heads D + 2 kv_heads D,), q's, k's and v's, added to each
    projected value and rounded (Qwen2); `qk_norm` (2 D,), the q and the k head norm
    weights: each head of q and k RMS-normalized with `eps` and scaled by them (Qwen3)."""

    bias: Any = None
    qk_norm: Any = None
    eps: float = 1e-6


NO_EXTRAS = Extras()  # a family without extras (LLaMA, Mistral)


def _index(arr: Any, name: str, shape: tuple) -> None:
    if not hasattr(arr, "data") or np.dtype(arr.dtype) != np.int32:
        raise ValueError(f"{name} must be an int32 device array")
    if tuple(arr.shape) != shape or not arr.flags.c_contiguous:
        raise ValueError(f"{name} has shape {tuple(arr.shape)}, expected contiguous {shape}")


def _cache(k_cache: Any, name: str) -> tuple[int, int, str]:
    if getattr(k_cache, "ndim", 0) != 3:
        raise ValueError(f"{name} must be one layer (num_blocks, block_size, row), got shape "
                         f"{getattr(k_cache, 'shape', '?')}")
    _, block_size, row = k_cache.shape
    shapes.multiple(row, 8, "row (kv_heads * head_dim)")
    return block_size, row, shapes.tensor(k_cache, name)


def _new_rows(k_new: Any, v_new: Any, cache: Cache, seq_slots: Any, positions: Any
              ) -> tuple[int, int, str, int, int]:
    """Check new tokens' K/V rows against one layer's cache and the per-token index arrays;
    returns (block_size, row, dtype, rows of k_new, row stride of k_new and v_new)."""
    if not isinstance(cache, Cache):
        raise TypeError(f"cache must be an ops.Cache, got {type(cache).__name__}")
    block_size, row, dt = _cache(cache.k, "k_cache")
    shapes.tensor(cache.v, "v_cache", cache.k.shape, dt)
    block_tables = cache.block_tables
    if getattr(k_new, "ndim", 0) != 2 or k_new.shape[1] != row:
        raise ValueError(f"k_new must be (tokens, {row}), got {getattr(k_new, 'shape', '?')}")
    _, stride = shapes.rows(k_new, "k_new", (row,), dt)
    _, v_stride = shapes.rows(v_new, "v_new", (row,), dt)
    cap = k_new.shape[0]
    if v_new.shape != k_new.shape or v_stride != stride:
        raise ValueError(f"v_new must be laid out like k_new: {tuple(k_new.shape)} with row "
                         f"stride {stride}, got {tuple(v_new.shape)} with {v_stride}")
    if getattr(block_tables, "ndim", 0) != 2:
        raise ValueError("block_tables must be (max_seqs, max_blocks)")
    _index(block_tables, "block_tables", tuple(block_tables.shape))
    _index(seq_slots, "seq_slots", (cap,))
    _index(positions, "positions", (cap,))
    return block_size, row, dt, cap, stride


def kv_append(k_new: Any, v_new: Any, cache: Cache, seq_slots: Any, positions: Any,
              n: Any = None, *, stream: Any = None, symbols: Symbols | None = None) -> None:
    """Write rows [0, n) of k_new/v_new (tokens, kv_heads D) into one layer's paged cache,
    token i at position positions[i] of slot seq_slots[i] (n may be symbolic)."""
    block_size, row, dt, cap, stride = _new_rows(k_new, v_new, cache, seq_slots, positions)
    n = shapes.count(n, cap, "n", symbols)
    tables = cache.block_tables
    KV_APPEND[dt].launch(n, BLOCK, (k_new, v_new, cache.k, cache.v, tables, seq_slots,
                                    positions, n, row, block_size, tables.shape[1], stride),
                         stream, symbols=symbols)


def qkv_views(qkv: Any, heads: int, head_dim: int) -> tuple[Any, Any, Any]:
    """The attention's stacked projection (rows, (heads + 2 kv_heads) * head_dim) as views:
    q (rows, heads, head_dim), k and v (rows, kv_heads * head_dim)."""
    if getattr(qkv, "ndim", 0) != 2:
        raise ValueError(f"qkv must be (rows, columns), got {getattr(qkv, 'shape', '?')}")
    rows, width = qkv.shape
    q_size = heads * head_dim
    kv_size = (width - q_size) // 2
    if heads < 1 or head_dim < 1 or kv_size < head_dim or width != q_size + 2 * kv_size \
            or kv_size % head_dim:
        raise ValueError(f"qkv has {width} columns: not {heads} q heads of {head_dim} and "
                         f"two equal k, v parts of whole heads")
    item = qkv.itemsize
    q = as_strided(qkv, (rows, heads, head_dim), (qkv.strides[0], head_dim * item, item))
    return q, qkv[:, q_size:q_size + kv_size], qkv[:, q_size + kv_size:]


def rope_append_args(q: Any, k_new: Any, v_new: Any, cache: Cache, seq_slots: Any,
                     positions: Any, freqs: Any) -> tuple[str, int, tuple[int, ...]]:
    """`rope_append`'s checks; (dtype, rows, (q_heads, kv_heads, head_dim, q_stride,
    kv_stride, block_size, max_blocks))."""
    block_size, row, dt, cap, stride = _new_rows(k_new, v_new, cache, seq_slots, positions)
    if getattr(q, "ndim", 0) != 3 or q.shape[0] != cap or row % q.shape[2]:
        raise ValueError(f"q must be (tokens = {cap}, q_heads, head_dim) with head_dim "
                         f"dividing {row}; got {getattr(q, 'shape', '?')}")
    q_heads, d = q.shape[1:]
    if d % 8 or d > 512:
        raise ValueError(f"head_dim must be a multiple of 8, at most 512; got {d}")
    _, q_stride = shapes.rows(q, "q", (q_heads, d), dt)
    check_freqs(freqs, d)
    return dt, cap, (q_heads, row // d, d, q_stride, stride, block_size,
                     cache.block_tables.shape[1])


def rope_append(q: Any, k_new: Any, v_new: Any, cache: Cache, seq_slots: Any, positions: Any,
                freqs: Any, n: Any = None, *, extras: Extras = NO_EXTRAS, stream: Any = None,
                symbols: Symbols | None = None) -> None:
    """RoPE and the cache append of rows [0, n) in one kernel: q (tokens, q_heads, D) is
    rotated in place, k_new (tokens, kv_heads * D) rotated into cache.k (k_new itself is not
    changed), v_new copied into cache.v. Same results as `rope` then `kv_append`.

    A family's `extras` are applied first; q (and k_new) keep their values but for q's
    rotation: the kernel adds the bias to what it reads."""
    dt, cap, sizes = rope_append_args(q, k_new, v_new, cache, seq_slots, positions, freqs)
    check_extras(dt, sizes, extras)
    n = shapes.count(n, cap, "n", symbols)
    ROPE_APPEND[dt].launch(n, ROPE_BLOCK, (q, k_new, v_new, cache.k, cache.v,
                                           cache.block_tables, seq_slots, positions, freqs, n,
                                           *sizes, extras.bias, extras.qk_norm,
                                           float(extras.eps)),
                           stream, symbols=symbols)


def check_extras(dt: str, sizes: tuple[int, ...], extras: Extras) -> None:
    """ValueError unless `extras` (bias and qk_norm each None or a device vector) fit
    q_heads, kv_heads and head_dim `sizes` (as `rope_append_args` returns them)."""
    if not isinstance(extras, Extras):
        raise TypeError(f"extras must be an ops.Extras, got {type(extras).__name__}")
    q_heads, kv_heads, d = sizes[:3]
    bias, qk_norm, norm_eps = extras.bias, extras.qk_norm, extras.eps
    if bias is not None:
        shapes.tensor(bias, "bias", ((q_heads + 2 * kv_heads) * d,), dt)
    if qk_norm is not None:
        shapes.tensor(qk_norm, "qk_norm", (2 * d,), dt)
        pieces = (q_heads + kv_heads) * d // (16 if d % 16 == 0 else 8)
        if pieces > NORM_PIECES:
            raise ValueError(f"qk_norm over {q_heads} + {kv_heads} heads of {d}: {pieces} "
                             f"pieces, rope_append.cu sums at most {NORM_PIECES}")
        if not 0 < norm_eps < 1:
            raise ValueError(f"the head norm's eps must be in (0, 1), got {norm_eps!r}")


def kv_gather(cache: Any, block_tables: Any, seq_lens: Any, seq: Any, out: Any, *,
              stream: Any = None, symbols: Symbols | None = None) -> None:
    """out[:len] = the tokens of sequence slot `seq` (length read on the device)."""
    block_size, row, dt = _cache(cache, "cache")
    if getattr(block_tables, "ndim", 0) != 2:
        raise ValueError("block_tables must be (max_seqs, max_blocks)")
    max_seqs, max_blocks = block_tables.shape
    _index(block_tables, "block_tables", (max_seqs, max_blocks))
    _index(seq_lens, "seq_lens", (max_seqs,))
    if getattr(out, "ndim", 0) != 2 or out.shape[1] != row:
        raise ValueError(f"out must be (tokens, {row}), got {getattr(out, 'shape', '?')}")
    shapes.tensor(out, "out", dtype=dt)
    if isinstance(seq, int) and not 0 <= seq < max_seqs:
        raise ValueError(f"seq = {seq} outside [0, {max_seqs})")
    KV_GATHER[dt].launch(out.shape[0], BLOCK, (cache, block_tables, seq_lens, seq, out,
                                               out.shape[0], row, block_size, max_blocks),
                         stream, symbols=symbols)
