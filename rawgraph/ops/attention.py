"""Decode attention over the paged KV cache: split along the context, then combine."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rawgraph.cuda.kernel import Kernel
from rawgraph.ops import shapes
from rawgraph.symbols import Symbols, cdiv

_ATTEND = ("const {t}* q, const {t}* k_cache, const {t}* v_cache, const int* block_tables, "
           "const int* seq_lens, const int* seq_slots, float* partial, int batch, int q_heads, "
           "int kv_heads, int block_size, int max_blocks, int split_tokens, int max_splits, "
           "float scale")
_COMBINE = ("const float* partial, {t}* out, const int* seq_slots, int batch, int q_heads, "
            "int n_splits, int max_splits")
_T = {"float16": ("f16", "__half"), "bfloat16": ("bf16", "__nv_bfloat16")}
HEAD_DIMS = (64, 128)
ATTEND = {(dt, d): Kernel("decode_attention", f"decode_attention_{s}_d{d}", _ATTEND.format(t=t))
          for dt, (s, t) in _T.items() for d in HEAD_DIMS}
COMBINE = {(dt, d): Kernel("decode_attention", f"decode_attention_combine_{s}_d{d}",
                           _COMBINE.format(t=t)) for dt, (s, t) in _T.items() for d in HEAD_DIMS}
MAX_GROUP = 8


def workspace_floats(batch: int, q_heads: int, head_dim: int, max_len: int,
                     split_tokens: int = 256) -> int:
    """float32 elements of the split workspace for contexts up to max_len."""
    return batch * q_heads * math.ceil(max_len / split_tokens) * (head_dim + 2)


def _int(name: str, arr: Any, shape: tuple | None = None) -> None:
    if not hasattr(arr, "data") or np.dtype(arr.dtype) != np.int32 or not arr.flags.c_contiguous:
        raise ValueError(f"{name} must be a contiguous int32 device array")
    if shape is not None and tuple(arr.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(arr.shape)}, expected {shape}")


def decode_attention(q: Any, k_cache: Any, v_cache: Any, block_tables: Any, seq_lens: Any,
                     seq_slots: Any, out: Any, workspace: Any, max_len: Any, *,
                     scale: float | None = None, split_tokens: int = 256, stream: Any = None,
                     symbols: Symbols | None = None) -> None:
    """out[b] = softmax(q[b] K^T * scale) V over the cached tokens of sequence seq_slots[b].

    q, out: (batch, q_heads, D) with D in (64, 128); caches: one layer (num_blocks, block_size,
    kv_heads * D); lengths, tables and slots are read on the device (a slot < 0 is a padding
    row: nothing written). `max_len` (int or symbol) bounds every length: it sets how many
    splits run, and is what a graph patches as contexts grow.
    """
    if getattr(q, "ndim", 0) != 3:
        raise ValueError(f"q must be (batch, q_heads, head_dim), got {getattr(q, 'shape', '?')}")
    batch, q_heads, d = q.shape
    if d not in HEAD_DIMS:
        raise ValueError(f"head_dim {d} is not supported (use one of {HEAD_DIMS})")
    dt = shapes.tensor(q, "q")
    shapes.tensor(out, "out", q.shape, dt)
    if getattr(k_cache, "ndim", 0) != 3 or k_cache.shape[2] % d:
        raise ValueError(f"k_cache must be (num_blocks, block_size, kv_heads * {d}), got "
                         f"{getattr(k_cache, 'shape', '?')}")
    shapes.tensor(k_cache, "k_cache", dtype=dt)
    shapes.tensor(v_cache, "v_cache", k_cache.shape, dt)
    kv_heads = k_cache.shape[2] // d
    if q_heads % kv_heads or q_heads // kv_heads > MAX_GROUP:
        raise ValueError(f"q_heads = {q_heads} must be a multiple of kv_heads = {kv_heads}, "
                         f"at most {MAX_GROUP} times it")
    if getattr(block_tables, "ndim", 0) != 2:
        raise ValueError("block_tables must be (max_seqs, max_blocks)")
    _int("block_tables", block_tables)
    _int("seq_lens", seq_lens, block_tables.shape[:1])
    _int("seq_slots", seq_slots, (batch,))
    block_size = k_cache.shape[1]
    capacity = block_tables.shape[1] * block_size
    top = shapes.top(max_len, "max_len", symbols)
    if not 1 <= top <= capacity:
        raise ValueError(f"max_len reaches {top}; the block tables hold at most {capacity} "
                         f"tokens per sequence")
    max_splits = math.ceil(top / split_tokens)
    need = workspace_floats(batch, q_heads, d, top, split_tokens)
    if getattr(workspace, "dtype", None) != np.float32 or workspace.size < need:
        raise ValueError(f"workspace must be float32 with at least {need} elements "
                         f"(workspace_floats(...)); got {getattr(workspace, 'size', '?')}")
    n_splits = cdiv(max_len, split_tokens)
    s = scale if scale is not None else d**-0.5
    ATTEND[dt, d].launch((batch * kv_heads, n_splits), 128,
                         (q, k_cache, v_cache, block_tables, seq_lens, seq_slots, workspace,
                          batch, q_heads, kv_heads, block_size, block_tables.shape[1],
                          split_tokens, max_splits, float(s)), stream, symbols=symbols)
    COMBINE[dt, d].launch(batch * q_heads, d, (workspace, out, seq_slots, batch, q_heads,
                                               n_splits, max_splits), stream, symbols=symbols)

