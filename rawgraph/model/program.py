"""The decoder on the GPU: weights in an arena, a paged KV cache, static step buffers, and
the per-layer kernel sequence of a batched decode step.

`DecodeModel.launch_step` issues the same launches whether it runs eagerly or inside a
capture: every buffer is allocated up front at its largest size, and everything that changes
per step (token ids, positions, cache slots, block tables, lengths) lives in device memory,
except the longest context, which decode attention takes as `max_len` (a symbol when captured).
"""

from __future__ import annotations

import math
from typing import Any

import cupy
import numpy as np

from rawgraph import ops
from rawgraph.cuda.stream import cupy_stream
from rawgraph.dtypes import storage_dtype
from rawgraph.memory.arena import Arena
from rawgraph.memory.blocks import OutOfBlocks
from rawgraph.memory.paged import PagedKVCache
from rawgraph.model.config import LlamaConfig
from rawgraph.ops.linear import M_TILES
from rawgraph.symbols import Symbols


def layout(cfg: LlamaConfig) -> dict[str, tuple[tuple, tuple[str, ...]]]:
    """Device tensors: name -> (shape, the checkpoint tensors stacked into it). Gate and up
    are one matrix (one GEMV, one activation kernel)."""
    out: dict[str, tuple[tuple, tuple[str, ...]]] = {
        "embed": ((cfg.vocab, cfg.hidden), ("model.embed_tokens.weight",))}
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        for name in ("input_layernorm", "post_attention_layernorm"):
            out[p + name] = ((cfg.hidden,), (p + name + ".weight",))
        for name, shape in (("q_proj", (cfg.q_size, cfg.hidden)),
                            ("k_proj", (cfg.kv_size, cfg.hidden)),
                            ("v_proj", (cfg.kv_size, cfg.hidden)),
                            ("o_proj", (cfg.hidden, cfg.q_size))):
            out[p + name] = (shape, (p + "self_attn." + name + ".weight",))
        out[p + "gate_up"] = ((2 * cfg.intermediate, cfg.hidden),
                              (p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"))
        out[p + "down_proj"] = ((cfg.hidden, cfg.intermediate), (p + "mlp.down_proj.weight",))
    out["norm"] = ((cfg.hidden,), ("model.norm.weight",))
    if not cfg.tie_embeddings:
        out["lm_head"] = ((cfg.vocab, cfg.hidden), ("lm_head.weight",))
    return out


def _random_fill(view: cupy.ndarray, rng: Any, dtype: str) -> None:
    """N(0, 1/fan_in) for matrices, 1 + N(0, 0.1) for norm weights, in storage dtype."""
    if view.ndim == 1:
        x = 1.0 + 0.1 * rng.standard_normal(view.shape, np.float32)
    else:
        x = rng.standard_normal(view.shape, np.float32) * np.float32(view.shape[1] ** -0.5)
    if dtype == "bfloat16":  # round to nearest even on the device, like to_bf16_bits
        u = x.view(np.uint32)
        view[...] = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    else:
        view[...] = x.astype(np.float16)


class DecodeModel:
    """A LLaMA decoder resident on the GPU for batched decode steps of up to `max_batch` rows."""

    def __init__(self, cfg: LlamaConfig, tensors: dict[str, np.ndarray] | None = None, *,
                 max_batch: int = 8, max_context: int = 2048, block_size: int = 16,
                 num_blocks: int | None = None, seed: int = 0):
        """`tensors`: checkpoint tensors in cfg.dtype storage (see rawgraph.model.checkpoint);
        None: seeded random weights made on the device (benchmarks of large presets)."""
        if not 1 <= max_batch <= M_TILES[-1]:
            raise ValueError(f"max_batch = {max_batch}: decode steps take 1 to {M_TILES[-1]} "
                             f"rows (the GEMV path)")
        if cfg.head_dim not in ops.attention.HEAD_DIMS:
            raise ValueError(f"head_dim {cfg.head_dim} unsupported by decode attention")
        self.cfg, self.max_batch, self.max_context = cfg, max_batch, max_context
        st = storage_dtype(cfg.dtype)
        lay = layout(cfg)
        blocks_per_seq = math.ceil(max_context / block_size)
        num_blocks = num_blocks or max_batch * blocks_per_seq
        self.arena = Arena(sum(2 * math.prod(s) + 256 for s, _ in lay.values()) + (1 << 20),
                           "weights")
        self.w = {}
        rng = cupy.random.default_rng(seed)
        for name, (shape, sources) in lay.items():  # stream each tensor into its region
            view = self.w[name] = self.arena.array(name, shape, st)
            if tensors is None:
                _random_fill(view, rng, cfg.dtype)
                continue
            row = 0
            for src in sources:
                a = np.ascontiguousarray(tensors[src], st)
                view[row:row + a.shape[0]].set(a)
                row += a.shape[0]
        if cfg.tie_embeddings:
            self.w["lm_head"] = self.w["embed"]
        self.kv = PagedKVCache(layers=cfg.layers, kv_heads=cfg.kv_heads, head_dim=cfg.head_dim,
                               block_size=block_size, num_blocks=num_blocks,
                               max_seqs=max_batch, max_blocks_per_seq=blocks_per_seq,
                               dtype=cfg.dtype)
        self.freqs = cupy.asarray(ops.inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling))
        b, act = max_batch, {}
        for name, cols in (("r", cfg.hidden), ("h", cfg.hidden), ("q", cfg.q_size),
                           ("k", cfg.kv_size), ("v", cfg.kv_size), ("attn", cfg.q_size),
                           ("gu", 2 * cfg.intermediate), ("act", cfg.intermediate),
                           ("logits", cfg.vocab)):
            act[name] = cupy.zeros((b, cols), st)
        self.act = act
        # per-step metadata, one host-to-device copy: token ids, positions, cache slots
        self.meta = cupy.zeros((3, b), np.int32)
        self._staging = cupy.cuda.alloc_pinned_memory(self.meta.nbytes)
        self.host_meta = np.frombuffer(self._staging, np.int32, 3 * b).reshape(3, b)
        self._copied = cupy.cuda.Event(block=False, disable_timing=True)
        self._copied.record()
        self.next_ids = cupy.zeros(b, np.int32)
        self.workspace = cupy.empty(ops.workspace_floats(b, cfg.heads, cfg.head_dim,
                                                         max_context), np.float32)

    def set_step(self, slots: list[int], tokens: list[int], stream: Any) -> int:
        """Host side of one step: grow each sequence's cache by one token, then copy tables,
        lengths, token ids, positions and slots to the device. Returns the longest length."""
        if not 0 < len(slots) == len(tokens) <= self.max_batch or len(set(slots)) < len(slots):
            raise ValueError(f"{len(slots)} slots (distinct), {len(tokens)} tokens: need 1 to "
                             f"{self.max_batch} rows, one token each")
        if not all(0 <= s < self.max_batch for s in slots):
            raise ValueError(f"slots {slots} outside [0, {self.max_batch})")
        if not all(0 <= x < self.cfg.vocab for x in tokens):
            raise ValueError(f"token ids {tokens} outside [0, {self.cfg.vocab})")
        t = self.kv.tables
        lens = [int(t.lens[s]) if s in t.active else 0 for s in slots]
        longest = max(lens) + 1
        if longest > self.max_context:
            raise ValueError(f"context {longest} exceeds max_context = {self.max_context}")
        fresh = sum(n % self.kv.block_size == 0 for n in lens)
        if fresh > t.alloc.num_free:  # checked before any sequence changes
            raise OutOfBlocks(f"this step needs {fresh} new KV blocks, {t.alloc.num_free} free")
        self._copied.synchronize()  # the previous step's copy has read the staging buffer
        for s in slots:
            if s not in t.active:
                t.add(s)
            t.append(s, 1)
        m = self.host_meta
        m[:] = 0
        m[2] = -1  # padding rows: no cache slot
        m[0, :len(tokens)] = tokens
        m[1, :len(slots)] = [int(t.lens[s]) - 1 for s in slots]
        m[2, :len(slots)] = slots
        s = cupy_stream(stream)
        self.meta.data.copy_from_host_async(self._staging.ptr, self.meta.nbytes, s)
        self._copied.record(s)
        self.kv.sync(stream)
        return longest

    def launch_step(self, batch: int, max_len: Any, stream: Any,
                    symbols: Symbols | None = None) -> None:
        """The kernels of one decode step for `batch` rows; logits and next_ids (greedy) out.

        `max_len` bounds every row's context (int, or a symbol when captured).
        """
        cfg, w, a = self.cfg, self.w, self.act
        kw = {"stream": stream, "symbols": symbols}
        ids, pos, slots = self.meta[0, :batch], self.meta[1, :batch], self.meta[2, :batch]
        r, h = a["r"][:batch], a["h"][:batch]
        q, k, v, attn = a["q"][:batch], a["k"][:batch], a["v"][:batch], a["attn"][:batch]
        ops.embedding(ids, w["embed"], r, **kw)
        for i in range(cfg.layers):
            p = f"model.layers.{i}."
            kc, vc = self.kv.layer(i)
            ops.rmsnorm(r, w[p + "input_layernorm"], h, eps=cfg.rms_eps, **kw)
            ops.linear(h, w[p + "q_proj"], q, **kw)
            ops.linear(h, w[p + "k_proj"], k, **kw)
            ops.linear(h, w[p + "v_proj"], v, **kw)
            q3 = q.reshape(batch, cfg.heads, cfg.head_dim)
            ops.rope(q3, k.reshape(batch, cfg.kv_heads, cfg.head_dim), pos, self.freqs, **kw)
            ops.kv_append(k, v, kc, vc, self.kv.block_tables, slots, pos, **kw)
            ops.decode_attention(q3, kc, vc, self.kv.block_tables, self.kv.seq_lens, slots,
                                 attn.reshape(batch, cfg.heads, cfg.head_dim), self.workspace,
                                 max_len, **kw)
            ops.linear(attn, w[p + "o_proj"], r, residual=r, **kw)
            ops.rmsnorm(r, w[p + "post_attention_layernorm"], h, eps=cfg.rms_eps, **kw)
            ops.linear(h, w[p + "gate_up"], a["gu"][:batch], **kw)
            ops.silu_mul(a["gu"][:batch], a["act"][:batch], **kw)
            ops.linear(a["act"][:batch], w[p + "down_proj"], r, residual=r, **kw)
        ops.rmsnorm(r, w["norm"], h, eps=cfg.rms_eps, **kw)
        ops.linear(h, w["lm_head"], a["logits"][:batch], **kw)
        ops.argmax(a["logits"][:batch], self.next_ids[:batch], **kw)

    def step(self, slots: list[int], tokens: list[int], stream: Any) -> list[int]:
        """One eager decode step: feed `tokens` to sequences `slots`; their greedy next tokens."""
        longest = self.set_step(slots, tokens, stream)
        self.launch_step(len(slots), longest, stream)
        cupy_stream(stream).synchronize()
        return self.next_ids[:len(slots)].get().tolist()

    def free(self, slot: int) -> None:
        """Drop a finished sequence's cache blocks."""
        self.kv.tables.free(slot)

    def close(self) -> None:
        """Release the weights arena (freed once no view remains)."""
        self.arena.close()
