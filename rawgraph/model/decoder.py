"""The decoder on the GPU: weights in an arena, a paged KV cache, static buffers, and the
per-layer kernel sequences of a batched decode step and of a prefill chunk.

`Model.launch_decode` and `Model.launch_prefill` issue the same launches whether they run
eagerly or inside a capture: every buffer is allocated up front at its largest size, and what
changes per step (token ids, positions, cache slots, block tables, lengths, sampling
parameters) lives in device memory, written by one host-to-device copy. The few sizes that
shape the launches are arguments that a graph takes as symbols and patches: the longest
context (decode), and the chunk's token count, sequence count, longest run and longest
context (prefill).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import cupy
import numpy as np

from rawgraph import ops
from rawgraph.cuda.device import multiprocessors
from rawgraph.cuda.kernel import precompile
from rawgraph.cuda.launch import labelled, programmatic
from rawgraph.cuda.stream import cupy_stream, new_stream
from rawgraph.dtypes import storage_dtype
from rawgraph.graph.capture import capture_status
from rawgraph.graph.conditional import condition_handle, if_node, set_condition_any
from rawgraph.memory.arena import Arena
from rawgraph.memory.blocks import OutOfBlocks
from rawgraph.memory.paged import BLOCK_SIZE, PagedKVCache
from rawgraph.memory.staging import Staging
from rawgraph.model import step, weights
from rawgraph.model.checkpoint import Checkpoint
from rawgraph.model.config import ModelConfig
from rawgraph.model.step import Limits, PrefillPiece, final_tokens
from rawgraph.ops.attention import default_splits
from rawgraph.ops.linear import DECODE_ROWS, keeps_row_max, plain_after
from rawgraph.ops.sampling import SamplingParams
from rawgraph.symbols import Symbols
from rawgraph.symbols import scope as symbols_scope

# Chunks of up to this many tokens run prefill attention grouped, in key runs whose count
# follows each sequence's length (`ops.prefill_attention(context=)`): their query tiles
# alone leave most of the GPU idle; above it one run loses to a block per head
# (benchmarks/NOTES.md, "Prefill").
RUNS_UP_TO = 256

# Decode attention in the programmatic chain (its combine then ends it; ops.decode_attention
# launches that plainly), so its blocks request the older tokens' K/V while the QKV
# projection ends, or launched plainly (False: the chain ends at attention). Fixed at
# capture, so a graph keeps what it was captured with. On: 1-4% off every step measured, 1B
# and 8B, B=1 to 32, 1k to 64k tokens (benchmarks/NOTES.md, "Decode attention").
CHAINED_ATTENTION = True

# prefill chunk sizes the engine captures a graph for (those below max_chunk, then max_chunk):
# a chunk of n tokens runs the kernels of the smallest that holds it, planned for that size
# (512: an 8B 512-token prompt takes 16.1 ms in the 1,024 graph, 13.1 in a 512 one; NOTES.md)
PREFILL_CHUNKS = (64, 256, 512, 1024, 2048)


@contextlib.contextmanager
def _on(stream: Any, symbols: Symbols | None) -> Iterator[None]:
    """Launches inside go to `stream` (CuPy's current stream for the block) with `symbols`
    current (None: no table, every argument fixed), so the kernel sequences below pass
    neither to each op."""
    current = contextlib.nullcontext() if stream is None else cupy_stream(stream)
    with current, symbols_scope(symbols):
        yield


def _attention_launch() -> contextlib.AbstractContextManager:
    """How decode attention launches: in the caller's chain with CHAINED_ATTENTION (if the
    caller's launches are programmatic), else plainly."""
    return contextlib.nullcontext() if CHAINED_ATTENTION else programmatic(False)


def chunk_sizes(max_chunk: int) -> tuple[int, ...]:
    """The default prefill chunk sizes of a model whose largest chunk is `max_chunk`."""
    return (*[c for c in PREFILL_CHUNKS if c < max_chunk], max_chunk)


def _sampling_fields(n: int) -> dict[str, tuple[Any, int]]:
    """Per-row fields a head reads (set per slot: `Model.set_sampling`)."""
    return {"seeds": (np.uint64, n), "temperature": (np.float32, n), "top_k": (np.int32, n),
            "top_p": (np.float32, n), "presence": (np.float32, n),
            "frequency": (np.float32, n), "repetition": (np.float32, n),
            "rules": (np.int32, n), "top_n": (np.int32, n)}


# what a slot's sampling fields hold before set_sampling: greedy, no rules, no logprobs
_NEUTRAL = {"top_p": 1.0, "repetition": 1.0, "top_n": -1}

# rows of prompt logprobs (`Model.score`) through the LM head at once
SCORE_ROWS = 64


@dataclass
class Scores:
    """Prompt log-probabilities on their way (`Model.score`): per asking piece (its index in
    the chunk, its scored rows), and the rows' entries in order, as ops.Logprobs lays them
    out: (rows, LP_STRIDE) each; entry 0 the target token."""

    spans: list[tuple[int, int]]
    lp: Any
    ids: Any


class DeviceStateError(RuntimeError):
    """The device's copy of an iteration's inputs differs from the host's
    (`Model.check_inputs`, a debug check)."""


class Model:
    """A decoder of any family in rawgraph.model.family, resident on the GPU: batched decode
    steps of up to `max_batch` rows and prefill chunks of up to `max_chunk` tokens from up to
    `max_chunk_seqs` sequences.

    Sequences live in cache slots 0 .. max_batch - 1; the caller (the engine) assigns them.
    """

    def __init__(self, cfg: ModelConfig, tensors: dict[str, np.ndarray] | None = None, *,
                 max_batch: int = 8, max_context: int = 2048, max_chunk: int = 512,
                 max_chunk_seqs: int = 8, block_size: int = BLOCK_SIZE,
                 num_blocks: int | None = None, seed: int = 0,
                 files: dict[str, Any] | None = None,
                 runs_up_to: int = RUNS_UP_TO):
        """`tensors`: checkpoint tensors in cfg.dtype storage (see rawgraph.model.checkpoint);
        None: seeded random weights made on the device (benchmarks of large presets).
        Tensors holding NaN or infinities are refused (CheckpointError naming the tensor,
        and its file from `files`, tensor name -> file, when given). `runs_up_to`: chunks
        of up to this many tokens run prefill attention grouped in key runs (`runs`; 0:
        never)."""
        if not 1 <= max_batch <= DECODE_ROWS:
            raise ValueError(f"max_batch = {max_batch}: decode steps take 1 to {DECODE_ROWS} "
                             f"rows")
        if not 1 <= max_chunk_seqs <= min(max_batch, DECODE_ROWS) or max_chunk < 1:
            raise ValueError(f"max_chunk = {max_chunk}, max_chunk_seqs = {max_chunk_seqs}: need "
                             f"max_chunk >= 1 and 1 <= max_chunk_seqs <= max_batch")
        if isinstance(runs_up_to, bool) or not isinstance(runs_up_to, int) or runs_up_to < 0:
            raise ValueError(f"runs_up_to = {runs_up_to!r}: a chunk size, an int >= 0")
        if cfg.head_dim not in ops.attention.HEAD_DIMS:
            raise ValueError(f"head_dim {cfg.head_dim} unsupported by attention "
                             f"(one of {ops.attention.HEAD_DIMS})")
        if max_context < 1 or (isinstance(cfg.rope_scaling, ops.DynamicScaling)
                               and max_context > cfg.max_position):
            raise ValueError(f"max_context = {max_context}: at least 1" + (
                f", and at most max_position_embeddings = {cfg.max_position} with dynamic "
                f"RoPE (its frequencies change past it)" if isinstance(
                    cfg.rope_scaling, ops.DynamicScaling) else ""))
        if cfg.sliding_window is not None and max_context > cfg.sliding_window:
            raise ValueError(f"max_context = {max_context} is past the model's sliding_window "
                             f"({cfg.sliding_window}): rawgraph's attention has no key window; "
                             f"a max_context of at most {cfg.sliding_window} runs exactly")
        self.cfg, self.max_batch, self.max_context = cfg, max_batch, max_context
        self.max_chunk, self.max_chunk_seqs = max_chunk, max_chunk_seqs
        self.runs_up_to = runs_up_to
        self.limits = Limits(max_batch, max_chunk, max_chunk_seqs, max_context, cfg.vocab)
        self.arena: Arena | None = None
        try:
            self._setup(tensors, seed, block_size, num_blocks, files or {})
        except BaseException:
            self.close()  # nothing half-made stays on the device
            raise

    def runs(self, chunk: int) -> int:
        """Query rows per tile when a chunk of `chunk` tokens runs prefill attention grouped
        in key runs (as many for each sequence as its length gives); 0 when it runs a block
        per (query tile, head): chunks above `runs_up_to`, and GQA groups larger than the
        tile."""
        group = self.cfg.heads // self.cfg.kv_heads
        rows = ops.attention.grouped_rows(chunk, group)
        return rows if chunk <= self.runs_up_to and group <= rows else 0

    def _setup(self, tensors: dict[str, np.ndarray] | None, seed: int, block_size: int,
               num_blocks: int | None, files: dict[str, Any]) -> None:
        cfg, max_batch, max_context = self.cfg, self.max_batch, self.max_context
        max_chunk, max_chunk_seqs = self.max_chunk, self.max_chunk_seqs
        precompile()  # all kernels on all CPUs now, not one module at a time on first use
        self._load(tensors, seed, files)
        blocks_per_seq = math.ceil(max_context / block_size)
        self.kv = PagedKVCache(layers=cfg.layers, kv_heads=cfg.kv_heads, head_dim=cfg.head_dim,
                               block_size=block_size,
                               num_blocks=num_blocks or max_batch * blocks_per_seq,
                               max_seqs=max_batch, max_blocks_per_seq=blocks_per_seq,
                               dtype=cfg.dtype)
        self.freqs = cupy.asarray(ops.inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling))
        self.dec = self._buffers(max_batch, max_batch)
        self.pre = self._buffers(max_chunk, max_chunk_seqs)
        self.dec_meta = Staging({**_sampling_fields(max_batch), "ids": (np.int32, max_batch),
                                 "pos": (np.int32, max_batch), "slots": (np.int32, max_batch)})
        s = max_chunk_seqs
        self.pre_meta = Staging({**_sampling_fields(s), "ids": (np.int32, max_chunk),
                                 "pos": (np.int32, max_chunk), "slots": (np.int32, max_chunk),
                                 "cu": (np.int32, s + 1), "seqs": (np.int32, s),
                                 "last": (np.int32, s), "last_pos": (np.int32, s),
                                 "final": (np.int32, s), "install": (np.int32, s)})
        # rules: per-slot state (counts, bias entries), installed by a sequence's first chunk
        # from what rule_meta stages (pushed only for chunks that install)
        self.rule_state = ops.RuleState(max_batch, cfg.vocab)
        cap = ops.logits.BIAS_CAP
        self.rule_meta = Staging({"nb": (np.int32, s), "ids": (np.int32, s * cap),
                                  "vals": (np.float32, s * cap), "until": (np.int32, s * cap)})
        self.score_buf: dict[str, cupy.ndarray] | None = None  # Model.score's, on first use
        self._body_stream: cupy.cuda.Stream | None = None  # captures conditional bodies
        # a mixed iteration's rows (decode rows, then a chunk's tokens): made on first use
        self.mix: dict[str, cupy.ndarray] | None = None
        self.mix_meta: Staging | None = None
        # decode attention's splits per batch size (default_splits), and their workspace
        self.splits = [default_splits(b, cfg.kv_heads, cfg.dtype, cfg.head_dim)
                       for b in range(1, max_batch + 1)]
        self.workspace = cupy.empty(max(
            ops.workspace_floats(b, cfg.heads, cfg.head_dim, s)
            for b, s in enumerate(self.splits, 1)), np.float32)
        # prefill attention's key runs: a workspace for the chunk size that needs the most
        group, sms = cfg.heads // cfg.kv_heads, multiprocessors()
        self.prefill_workspace = cupy.empty(max([0] + [
            ops.workspace_floats(c, cfg.heads, cfg.head_dim,
                                 ops.attention.prefill_runs(c, r // group, cfg.kv_heads, sms)[0])
            for c in range(1, max_chunk + 1) if (r := self.runs(c))]), np.float32)
        # per-slot sampling parameters, gathered into each step's metadata
        self.sampling = {name: np.zeros(max_batch, dt)
                         for name, (dt, _) in _sampling_fields(max_batch).items()}
        for name, v in _NEUTRAL.items():  # greedy until set_sampling says otherwise
            self.sampling[name][:] = v
        self._sampling_pushed = False
        # buffers were zeroed and constants copied on the current stream: done before any
        # other stream (the engine's) may read them
        cupy.cuda.get_current_stream().synchronize()

    @classmethod
    def from_checkpoint(cls, ck: Checkpoint, **kw: Any) -> Model:
        """The decoder of a loaded checkpoint (`rawgraph.model.checkpoint.load`); keyword
        arguments as for the constructor."""
        return cls(ck.config, ck.tensors, files=ck.files, **kw)

    def _load(self, tensors: dict[str, np.ndarray] | None, seed: int,
              files: dict[str, Any]) -> None:
        cfg, st = self.cfg, storage_dtype(self.cfg.dtype)
        if tensors is not None:
            weights.check_tensors(cfg, tensors)
        lay = weights.layout(cfg)
        self.arena = Arena(sum(2 * math.prod(s) + 256 for s, _ in lay.values()) + (1 << 20),
                           "weights")
        self.w = {}
        rng = cupy.random.default_rng(seed)
        checks: list[tuple[str, cupy.ndarray]] = []  # (source tensor, its device view)
        for name, (shape, sources) in lay.items():  # stream each tensor into its region
            view = self.w[name] = self.arena.array(name, shape, st)
            if tensors is None:
                weights.random_fill(view, rng, cfg.dtype, bias=name.endswith("bias"))
                continue
            if name.endswith("gate_up"):
                view.set(ops.stack_gate_up(*(np.asarray(tensors[src], st) for src in sources)))
                pair = view.reshape(-1, 2, ops.elementwise.GATE_UP_GROUP, shape[1])
                checks += [(sources[0], pair[:, 0]), (sources[1], pair[:, 1])]
                continue
            row = 0
            for src in sources:
                a = np.ascontiguousarray(tensors[src], st)
                view[row:row + a.shape[0]].set(a)
                checks.append((src, view[row:row + a.shape[0]]))
                row += a.shape[0]
        weights.check_finite(checks, cfg.dtype, files)  # before the norms fold into projections
        for i in range(cfg.layers):
            p = f"model.layers.{i}."
            for norm, proj in weights.NORM_FOLDS:
                ops.fold_norm(self.w[p + proj], self.w[p + norm])
        cupy.cuda.get_current_stream().synchronize()
        if cfg.tie_embeddings:
            self.w["lm_head"] = self.w["embed"]

    def _buffers(self, rows: int, seqs: int) -> dict[str, cupy.ndarray]:
        """Activations for `rows` tokens; the LM head's for `seqs` rows."""
        cfg, st = self.cfg, storage_dtype(self.cfg.dtype)
        cols = {"r": cfg.hidden, "h": cfg.hidden, "qkv": cfg.q_size + 2 * cfg.kv_size,
                "attn": cfg.q_size, "gu": 2 * cfg.intermediate, "act": cfg.intermediate}
        out = {name: cupy.zeros((rows, c), st) for name, c in cols.items()}
        # views of the fused projection: q (rows, heads, D), k and v (rows, kv_size)
        out["q"], out["k"], out["v"] = ops.qkv_views(out["qkv"], cfg.heads, cfg.head_dim)
        out["last"] = cupy.zeros((seqs, cfg.hidden), st)
        out["logits"] = cupy.zeros((seqs, cfg.vocab), st)
        out["next"] = cupy.zeros(seqs, np.int32)
        out["best"] = cupy.zeros(seqs, np.uint64)  # greedy keys: LM head -> sample (zeroed)
        out["proc"] = cupy.zeros((seqs, cfg.vocab), st)  # rows with rules: what is sampled
        out["lse"] = cupy.zeros(seqs, np.float32)
        out["lp"] = cupy.zeros((seqs, ops.LP_STRIDE), np.float32)
        out["lp_ids"] = cupy.zeros((seqs, ops.LP_STRIDE), np.int32)
        return out

    # -- host side: grow the cache, write the step's metadata, one copy ---------------------

    def blocks_needed(self, need: dict[int, int]) -> int:
        """New KV blocks that need[slot] more tokens per sequence take (ValueError past
        max_context); nothing changes."""
        return step.blocks_needed(need, self.kv.tables, self.limits)

    def grow(self, need: dict[int, int]) -> None:
        """Make room for need[slot] more tokens in each sequence, all or nothing."""
        t = self.kv.tables
        fresh = self.blocks_needed(need)
        if fresh > t.alloc.num_free:  # checked before any sequence changes
            raise OutOfBlocks(f"this step needs {fresh} new KV blocks, {t.alloc.num_free} free")
        for slot, n in need.items():
            if slot not in t.active:
                t.add(slot)
            t.append(slot, n)

    def set_sampling(self, slot: int, params: SamplingParams, bans: bool = False) -> None:
        """How the sequence in `slot` samples from now on (kept per slot, like its table);
        `bans`: it has stop ids for min_tokens to ban (installed by its first chunk)."""
        step.check_slots([slot], self.limits)
        p = self.sampling
        p["seeds"][slot], p["temperature"][slot] = params.seed, params.temperature
        p["top_k"][slot], p["top_p"][slot] = params.top_k, params.top_p
        p["presence"][slot] = params.presence_penalty
        p["frequency"][slot] = params.frequency_penalty
        p["repetition"][slot] = params.repetition_penalty
        p["rules"][slot] = params.rules(bans)
        p["top_n"][slot] = -1 if params.logprobs is None else params.logprobs
        self._sampling_pushed = False  # a continuing step copies them again

    def check_decode(self, slots: Sequence[int], tokens: Sequence[int]
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Validate a decode step's rows (ValueError naming the problem); nothing changes.
        Returns slots and tokens as arrays."""
        rows = step.decode_rows(slots, tokens, self.kv.tables, self.limits)
        return rows.slots, rows.tokens

    def prepare_decode(self, slots: Sequence[int], tokens: Sequence[int], stream: Any,
                       sampling: Sequence[SamplingParams] | None = None, *,
                       sync: bool = True) -> int:
        """Host side of one decode step: grow each sequence by its token, then copy ids,
        positions, slots, sampling parameters (and with `sync`, tables and lengths) to the
        device. Returns the step's longest context, `max_len` for `launch_decode`.

        `sampling` (one per row) replaces the slots' stored parameters (`set_sampling`);
        without it the stored ones apply. Launched with `advance=1`, the step may be continued
        on the device (`prepare_follow`). Vectorized: this runs before every step.
        """
        n = len(slots)
        sl, tok = self.check_decode(slots, tokens)
        t = self.kv.tables
        new = [s for s in slots if s not in t.active]
        for s in new:
            t.add(s)
        try:
            t.append_one(sl)
        except (ValueError, OutOfBlocks):
            for s in new:  # all or nothing
                t.free(s)
            raise
        if sampling is not None:
            for s, p in zip(slots, sampling):
                self.set_sampling(s, p)
        h = self.dec_meta.begin()
        h["ids"][:n], h["ids"][n:] = tok, 0
        h["slots"][:n], h["slots"][n:] = sl, -1  # padding rows: no cache slot, nothing written
        lens = t.lens[sl]
        h["pos"][:n], h["pos"][n:] = lens - 1, 0
        for name, arr in self.sampling.items():
            h[name][:n] = arr[sl]
        self.dec_meta.push(stream)
        self._sampling_pushed = True
        if sync:
            self.kv.sync(stream)
        return int(lens.max())

    def prepare_follow(self, slots: Sequence[int], last: step.LastStep | None,
                       stream: Any, tokens: Sequence[int] | None = None,
                       fed: Sequence[int] | None = None) -> int:
        """Host side of a decode step that continues `last` (`step.last_step` of the decode
        step before, launched with `advance=1`), its rows in their places: that step's
        sampler already made its tokens these rows' inputs and moved their positions and
        cache lengths on, on the device. Here each sequence grows by the token on its way;
        a copy runs only for what changed: a new cache block or copy-on-write (tables),
        lengths moved on the host (a prefill chunk prepared beside it) or synced since that
        step, sampling parameters set since, rows left empty or taken. A row whose sequence
        has left (finished, aborted) may be left empty (slot -1): it becomes a padding row
        in its place, so the others keep theirs and their hand-off (a padding row's position
        is not moved on, so it writes the other half of its token pair: the half holding the
        left sequence's last token stays until read).
        A row empty in `last`, or past its rows, may take a joining sequence, fed from the
        host (`tokens`: its token there, -1 in every other row) or on the device (`fed`: in
        that row the index j of its piece in the last prefill chunk, which ended its
        prompt: pre["next"][j], copied after that chunk; -1 in every other row); its
        position, slot and sampling fields are copied, its cache length synced. Returns the
        step's longest context (`max_len`). ValueError (`step.check_follow`) if the slots,
        tokens or their sequences on the host are not ones that may continue that step."""
        t = self.kv.tables
        src = np.full(len(slots), -1, np.int64) if fed is None else np.asarray(fed, np.int64)
        if len(src) != len(slots) or src.max(initial=-1) >= self.max_chunk_seqs:
            raise ValueError(f"fed {src.tolist()}: one per row, a chunk's piece index in "
                             f"[0, {self.max_chunk_seqs}) or -1")
        joins = step.check_follow(last, slots, t, self.limits, tokens, src >= 0)
        assert last is not None
        got = np.asarray(list(slots), np.int64)
        sl = got[got >= 0]
        t.append_one(sl)  # all or nothing
        was = np.full(len(got), -1, np.int64)
        was[:len(last.slots)] = last.slots
        moved = ((got < 0) & (was >= 0)) | joins  # rows left empty or taken now
        if not self._sampling_pushed or moved.any():  # continued ids and positions: kept
            h = self.dec_meta.begin()
            for name, arr in self.sampling.items():
                h[name][:len(got)] = arr[np.maximum(got, 0)]
            h["slots"][:len(got)] = got
            self.dec_meta.push(stream, self.dec_meta.offset("ids"))  # sampling, then slots
            self.dec_meta.push(stream, start=self.dec_meta.offset("slots"))
            for i in np.flatnonzero(joins):  # a joining row's id and position, alone
                h["pos"][i] = t.lens[got[i]] - 1
                names = ("pos",) if src[i] >= 0 else ("ids", "pos")
                if src[i] < 0:
                    assert tokens is not None
                    h["ids"][i] = tokens[i]
                for name in names:
                    at = self.dec_meta.offset(name) + 4 * int(i)
                    self.dec_meta.push(stream, at + 4, start=at)
            ids = self.dec_meta.dev["ids"]
            for i in np.flatnonzero(src >= 0):  # its first token, where the chunk left it
                j = int(src[i])
                ids[i:i + 1].data.copy_from_device_async(self.pre["next"][j:j + 1].data, 4,
                                                         cupy_stream(stream))
            self._sampling_pushed = True
        if (joins.any() or t.changed or t.pending_copies or t.lens_moved
                or self.kv.syncs != last.syncs):
            self.kv.sync(stream)  # host lengths now equal what the device moved on to
        return int(t.lens[sl].max())

    def prepare_prefill(self, pieces: Sequence[PrefillPiece], stream: Any, *,
                        sync: bool = True) -> tuple[int, int, int, int]:
        """Host side of one prefill chunk: grow each sequence by its piece, copy metadata
        (and with `sync`, the cache tables). Returns (n, num_seqs, max_q_len, max_len) for
        `launch_prefill`: tokens, sequences, the longest piece, the longest context after
        it. Without `sync`, call `kv.sync` before launching: a prefill and a decode step
        prepared together share one copy of the tables."""
        chunk = step.chunk(pieces, self.kv.tables, self.limits)
        installs = [(i, p) for i, p in enumerate(pieces)
                    if p.first and p.sampling.rules(bool(p.bans))]
        for _, p in installs:  # before anything changes
            step.check_rules(p, self.limits)
        self.grow(chunk.need)
        h = self.pre_meta.begin()
        row = 0
        h["cu"][:] = 0
        for name in ("last", "last_pos", "final"):  # rows past the pieces: valid, unused
            h[name][:] = 0
        for i, p in enumerate(pieces):
            m = len(p.tokens)
            h["ids"][row:row + m] = p.tokens
            h["pos"][row:row + m] = np.arange(p.start, p.start + m)
            h["slots"][row:row + m] = p.slot
            h["seqs"][i], h["last"][i], h["last_pos"][i] = p.slot, row + m - 1, p.start + m - 1
            h["final"][i] = p.final
            row += m
            h["cu"][i + 1] = row
        for i, p in enumerate(pieces):  # stored per slot: later decode steps use them too
            self.set_sampling(p.slot, p.sampling, bool(p.bans))
            for name, arr in self.sampling.items():
                h[name][i] = arr[p.slot]
        for name in self.sampling:  # the head's rows past the pieces: nothing to do
            h[name][len(pieces):] = _NEUTRAL.get(name, 0)
        h["install"][:] = 0
        for i, p in installs:
            h["install"][i] = 1 | (p.sampling.repetition_penalty != 1) << 1
        if installs:
            self._stage_rules(installs, stream)
        self.pre_meta.push(stream)
        if sync:
            self.kv.sync(stream)
        max_len = int(self.kv.tables.lens[[p.slot for p in pieces]].max())
        return chunk.tokens, chunk.seqs, chunk.max_q_len, max_len

    def _stage_rules(self, installs: list[tuple[int, PrefillPiece]], stream: Any) -> None:
        """Stage the bias entries of the pieces that start their sequences' rules: each
        logit_bias entry, and each stop id min_tokens bans (-inf below ban_until; a banned id
        with a bias keeps it after)."""
        cap, h = ops.logits.BIAS_CAP, self.rule_meta.begin()
        for i, p in installs:
            bias = dict(p.sampling.logit_bias)
            until = dict.fromkeys(p.bans, p.ban_until) if p.sampling.min_tokens else {}
            ids = sorted(set(bias) | set(until))  # step.check_rules: at most cap, in vocab
            row = slice(i * cap, i * cap + len(ids))
            h["nb"][i] = len(ids)
            h["ids"][row] = ids
            h["vals"][row] = [bias.get(t, 0.0) for t in ids]
            h["until"][row] = [until.get(t, 0) for t in ids]
        self.rule_meta.push(stream)

    def mixed_buffers(self) -> dict[str, cupy.ndarray]:
        """The activations of a mixed iteration (`launch_mixed`): max_batch decode rows, then
        max_chunk chunk tokens; made on the first call (call it outside a capture)."""
        if self.mix is None:
            rows = self.max_batch + self.max_chunk
            self.mix = self._buffers(rows, 1)  # its heads use dec's and pre's buffers
            self.mix_meta = Staging({"ids": (np.int32, rows), "pos": (np.int32, rows),
                                     "slots": (np.int32, rows)})
        return self.mix

    def prepare_mixed(self, batch: int, chunk: int, n: int, stream: Any) -> None:
        """Host side of a mixed iteration, after `prepare_prefill` and `prepare_decode` (or
        `prepare_follow`) of its parts: the rows' ids, positions and cache slots in one
        array, the decode bucket's `batch` rows (padding included; `launch_mixed` copies
        them from the step's metadata on the device over these) then the chunk's `n` tokens
        (the rest of the `chunk` rows: padding, no cache slot)."""
        self.mixed_buffers()
        assert self.mix_meta is not None
        h, d, p = self.mix_meta.begin(), self.dec_meta.host, self.pre_meta.host
        for name in ("ids", "pos", "slots"):
            h[name][:batch] = d[name][:batch]
            h[name][batch:batch + n] = p[name][:n]
            h[name][batch + n:] = -1 if name == "slots" else 0
        self.mix_meta.push(stream)

    # -- device side: the kernel sequences ----------------------------------------------------

    def _layer(self, i: int, a: dict, meta: dict, n: Any, m_max: int, attend: Any) -> None:
        """One decoder layer on rows [:n] of buffers `a` (residual stream in a["r"]; the
        tokens' slots and positions in meta); kernels chosen for up to m_max rows.
        `attend(k_cache, v_cache)` runs attention over layer i's cache, which the projection
        has appended to. Launches go to the current stream with the current symbols
        (`_on`)."""
        cfg, w, p = self.cfg, self.w, f"model.layers.{i}."
        lin = {"m": n, "m_max": m_max}
        # each norm: its weight folded into the projection after it, its scale per row
        # applied by the decode GEMV (or, on the other paths, a weightless rmsnorm into h)
        norm = {"norm_eps": cfg.rms_eps, "normed": a["h"]}
        # each part's launches labelled with the name the read chain gives its link
        # (bench.ceiling.link_parts), so a profile can set one against the other
        kc, vc = self.kv.layer(i)  # QKV, RoPE and the cache append (one kernel for decode)
        # the family's extras (None where it has none): q, k, v biases, q and k head norms
        extra = {"bias": w.get(p + "qkv_bias"), "qk_norm": w.get(p + "qk_norm"),
                 "head_eps": cfg.rms_eps}
        with labelled("qkv"):
            ops.qkv_rope(a["r"], w[p + "qkv"], a["qkv"], kc, vc, self.kv.block_tables,
                         meta["slots"], meta["pos"], self.freqs, heads=cfg.heads,
                         head_dim=cfg.head_dim, **norm, **extra, **lin)
        with labelled("attention"):
            attend(kc, vc)
        with labelled("o_proj"):
            ops.linear(a["attn"], w[p + "o_proj"], a["r"], residual=a["r"], **lin)
        gate_up, down = w[p + "gate_up"], w[p + "down_proj"]
        with labelled("gate_up"):
            ops.gate_up_silu(a["r"], gate_up, a["gu"], a["act"], **norm, **lin)
        plain = plain_after(m_max, *gate_up.shape)
        with labelled("down_proj"), programmatic(False) if plain else contextlib.nullcontext():
            ops.linear(a["act"], down, a["r"], residual=a["r"], **lin)

    def _head(self, x: Any, a: dict, meta: dict, pos: Any, rows: Any, slots: Any,
              handoff: ops.Handoff | None = None, gather: Any = None, fed: Any = None,
              host_lp: tuple[Any, Any] | None = None) -> None:
        """Final norm, LM head, log-probabilities and rules (`ops.process`: rows that ask
        alone do work), and sampling of `rows` rows of x (of x's rows gather[r]); `slots`:
        each row's sequence, `fed` (decode): the token each row was fed, counted for the
        penalties. `host_lp`: (lp, ids) of (rows, 2, LP_STRIDE) mapped host memory the
        log-probabilities go to (halves as handoff.host's), else a["lp"], a["lp_ids"]."""
        cfg, w = self.cfg, self.w
        # on the GEMV path the LM head also merges each row's greedy pick as its blocks end,
        # and sample's greedy rows read that instead of passing over the vocabulary
        best = a["best"] if keeps_row_max(a["last"].shape[0], cfg.vocab) else None
        with labelled("lm_head"):
            ops.rmsnorm(x, w["norm"], a["last"], rows=rows, eps=cfg.rms_eps, gather=gather)
            ops.linear(a["last"], w["lm_head"], a["logits"], m=rows, m_max=a["last"].shape[0],
                       row_max=best)
        lp, lp_ids = host_lp if host_lp is not None else (a["lp"], a["lp_ids"])
        out = ops.Logprobs(meta["top_n"], a["lse"], lp, lp_ids)
        rr = ops.RowRules(meta["rules"], slots, meta["presence"], meta["frequency"],
                          meta["repetition"], fed)
        with labelled("sample"):
            ops.process(a["logits"], a["proc"], pos, out, rows, row_rules=rr,
                        state=self.rule_state)
            ops.sample(a["logits"], a["next"], meta["temperature"], meta["top_k"],
                       meta["top_p"], meta["seeds"], pos, rows, row_max=best, handoff=handoff,
                       proc=a["proc"], rules=meta["rules"], logprobs=out)

    def _start_rules(self, n: Any, num_seqs: Any) -> None:
        """A chunk's rules (the current stream and symbols): the state of each sequence its
        pieces start with rules, then their prompt and bias bits."""
        m, st, staged = self.pre_meta.dev, self.rule_state, self.rule_meta.dev
        with programmatic(False):
            ops.rules_start(st, num_seqs, m["install"], m["seqs"], staged)
            ops.rules_mark(st, n, m["ids"], m["slots"], num_seqs, m["install"], m["seqs"],
                           staged)

    def launch_decode(self, batch: int, max_len: Any, stream: Any,
                      symbols: Symbols | None = None, *, pdl: bool = False, advance: Any = 0,
                      host_next: Any = None, host_lp: tuple[Any, Any] | None = None) -> None:
        """The kernels of one decode step over `batch` rows (a bucket: rows past the step's
        sequences are padding); sampled tokens land in dec["next"]. `max_len` bounds every
        row's context (int, or a symbol when captured). `pdl`: programmatic dependent
        launches (each GEMV fetches its first weights while the previous kernel ends), for
        every kernel but attention's; the results are the same bits either way.
        `advance` (0/1 or a symbol): the sampler hands each token on to a step that
        continues this one (ops.Handoff; then a replay is not idempotent: each moves the
        rows on a token). `host_next`: (batch, 2) int32 mapped host memory the tokens are
        also written to (row r's at [r, its position % 2], ops.Handoff); `host_lp`: (lp, ids)
        of (batch, 2, LP_STRIDE) mapped host memory its log-probabilities go to likewise."""
        if not 1 <= batch <= self.max_batch:
            raise ValueError(f"batch {batch} outside [1, {self.max_batch}]")
        with programmatic(pdl), _on(stream, symbols):
            self._decode(batch, max_len, advance, host_next, host_lp)

    def _decode(self, batch: int, max_len: Any, advance: Any, host_next: Any,
                host_lp: tuple[Any, Any] | None) -> None:
        cfg, a, meta = self.cfg, {k: v[:batch] for k, v in self.dec.items()}, self.dec_meta.dev
        m = {k: v[:batch] for k, v in meta.items()}
        q3 = a["q"]

        def attend(kc: Any, vc: Any) -> None:
            # The programmatic chain ends once a layer: unbroken, it ran the small-batch step
            # up to 26% slower (benchmarks/NOTES.md, "The programmatic chain"); breaking it
            # at any one kernel from attention to gate_up recovered that. It ends at
            # attention, or with CHAINED_ATTENTION at its combine (ops.decode_attention
            # launches that plainly), attention then requesting its K/V during the wait.
            with _attention_launch():
                ops.decode_attention(q3, kc, vc, self.kv.block_tables, self.kv.seq_lens,
                                     m["slots"], a["attn"].reshape(q3.shape), self.workspace,
                                     max_len, scale=cfg.attention_scale,
                                     splits=self.splits[batch - 1])

        # the step's first kernel launches plainly: eagerly it follows the last step's
        # sampler, which writes the ids, positions and lengths the QKV GEMV reads before its
        # PDL wait (its round trips overlap the wait), so nothing of this step may start
        # until that sampler ends (a graph's first node never overlaps the last launch)
        with programmatic(False), labelled("embedding"):
            ops.embedding(m["ids"], self.w["embed"], a["r"])
        for i in range(cfg.layers):
            self._layer(i, a, m, batch, batch, attend)
        handoff = ops.Handoff(m["ids"], m["slots"], self.kv.seq_lens, advance, host_next)
        self._head(a["r"], a, m, m["pos"], batch, m["slots"], handoff, fed=m["ids"],
                   host_lp=host_lp)

    def launch_prefill(self, n: Any, num_seqs: Any, max_q_len: Any, max_len: Any, stream: Any,
                       symbols: Symbols | None = None, *, chunk: int | None = None,
                       pdl: bool = False) -> None:
        """The kernels of one prefill chunk: `n` tokens of `num_seqs` sequences, the longest
        piece `max_q_len`, the longest context `max_len` (ints, or symbols when captured;
        `prepare_prefill` returns them). Kernels are chosen for a chunk of
        `chunk` tokens (default max_chunk), so an eager run launches what that chunk's graph
        does. The next token of each sequence whose piece is final (from its last position)
        lands in pre["next"]; a chunk without a final piece skips the head (captured: an IF
        node whose condition a kernel sets from the chunk's metadata). `pdl`: programmatic
        dependent launches for the layers' kernels but attention's (as in `launch_decode`;
        the head and its IF node launch plainly); the same bits either way."""
        cfg, a, m = self.cfg, self.pre, self.pre_meta.dev
        chunk = chunk or self.max_chunk
        if not 1 <= chunk <= self.max_chunk:
            raise ValueError(f"chunk {chunk} outside [1, {self.max_chunk}]")
        q3, out3 = a["q"], a["attn"].reshape(a["q"].shape)

        def attend(kc: Any, vc: Any) -> None:
            with programmatic(False):  # ends the chain once a layer, as decode's does
                self._chunk_attention(q3[:chunk], out3[:chunk], kc, vc, n, num_seqs,
                                      max_q_len, max_len, chunk)

        with programmatic(pdl), _on(stream, symbols):
            self._start_rules(n, num_seqs)
            with labelled("embedding"):
                ops.embedding(m["ids"], self.w["embed"], a["r"], n)
            for i in range(cfg.layers):
                self._layer(i, a, m, n, chunk, attend)
        self._chunk_head(num_seqs, stream, symbols, a["r"])

    def _chunk_attention(self, q: Any, out: Any, kc: Any, vc: Any, n: Any, num_seqs: Any,
                         max_q_len: Any, max_len: Any, chunk: int) -> None:
        """Prefill attention of a chunk's tokens (q, out: (chunk, heads, head_dim), row r
        the chunk's token r; the metadata in pre_meta): GQA-grouped tiles in key runs that
        follow each sequence's length up to `runs_up_to` tokens, a block per (query tile,
        head) above."""
        m, rows = self.pre_meta.dev, self.runs(chunk)
        kw = ({"rows": rows, "context": max_len, "chunk": chunk, "n": n,
               "workspace": self.prefill_workspace} if rows else
              {"rows": ops.attention.prefill_rows(chunk, self.cfg.head_dim)})
        ops.prefill_attention(q, kc, vc, self.kv.block_tables, self.kv.seq_lens, m["cu"],
                              m["seqs"], out, max_q_len, num_seqs,
                              scale=self.cfg.attention_scale, **kw)

    def _chunk_head(self, num_seqs: Any, stream: Any, symbols: Symbols | None,
                    x: Any) -> None:
        """The LM head of a chunk whose token rows are x's, if a piece is final: captured, an
        IF node whose condition a kernel sets from the chunk's metadata; eagerly, the host
        decides."""
        with programmatic(False), _on(stream, symbols):
            if capture_status(stream) == "active":
                handle = condition_handle(stream)
                set_condition_any(self.pre_meta.dev["final"], num_seqs, handle, stream)
                if self._body_stream is None:
                    self._body_stream = new_stream()
                with if_node(stream, handle, self._body_stream, name="LM head"):
                    self._prefill_head(self._body_stream, x)
            elif self.pre_meta.host["final"][:num_seqs].any():
                self._prefill_head(stream, x)

    def _prefill_head(self, stream: Any, x: Any) -> None:
        """The head of a prefill chunk over all max_chunk_seqs rows, each the last row of its
        sequence in the chunk (x's rows), gathered by the norm (fixed arguments: in a graph
        it is an IF node's body, which cannot be patched; unused rows read row 0)."""
        a, m, s = self.pre, self.pre_meta.dev, self.max_chunk_seqs
        with _on(stream, None):
            self._head(x, a, m, m["last_pos"], s, m["seqs"], gather=m["last"])

    def launch_mixed(self, batch: int, max_len: Any, n: Any, num_seqs: Any, max_q_len: Any,
                     pre_len: Any, stream: Any, symbols: Symbols | None = None, *, chunk: int,
                     pdl: bool = False, advance: Any = 0, host_next: Any = None,
                     host_lp: tuple[Any, Any] | None = None) -> None:
        """A decode step of `batch` rows (a bucket; its longest context `max_len`) and a
        prefill chunk of `n` tokens (`num_seqs`, `max_q_len` and its longest context
        `pre_len`, as `prepare_prefill` returns them) as one iteration. Every layer's
        projections run over the decode rows and the chunk's tokens together (the weights
        read once); attention by kind (decode attention over the first `batch` rows, the
        chunk's attention over the rest). The decode rows' tokens land as `launch_decode`'s
        do (dec["next"], `host_next` and `host_lp`, the hand-off with `advance`), the chunk's as
        `launch_prefill`'s (pre["next"], its head an IF node when captured). Metadata:
        `prepare_prefill`, `prepare_decode` (in that order: the decode's copy of the tables
        carries the chunk's), then `prepare_mixed`. Kernels are chosen for batch + chunk
        rows; results round as such a batch does, not as the separate step and chunk do."""
        if not 1 <= batch <= self.max_batch or not 1 <= chunk <= self.max_chunk:
            raise ValueError(f"batch {batch}, chunk {chunk}: need 1 <= batch <= "
                             f"{self.max_batch} and 1 <= chunk <= {self.max_chunk}")
        cfg, a = self.cfg, self.mixed_buffers()
        assert self.mix_meta is not None
        mm, dm = self.mix_meta.dev, self.dec_meta.dev
        q3 = a["q"]
        out3 = a["attn"].reshape(q3.shape)
        rows = batch + n

        def attend(kc: Any, vc: Any) -> None:
            with _attention_launch():  # as decode's: the chain ends once a layer
                ops.decode_attention(q3[:batch], kc, vc, self.kv.block_tables,
                                     self.kv.seq_lens, dm["slots"][:batch], out3[:batch],
                                     self.workspace, max_len, scale=cfg.attention_scale,
                                     splits=self.splits[batch - 1])
            with programmatic(False):
                self._chunk_attention(q3[batch:batch + chunk], out3[batch:batch + chunk], kc,
                                      vc, n, num_seqs, max_q_len, pre_len, chunk)

        with _on(stream, symbols):
            self._start_rules(n, num_seqs)
            # the decode rows' inputs as the device has them (a step continuing the last one
            # finds them there, moved on by its sampler), over the host's copy
            for name in ("ids", "pos", "slots"):
                dst, src = mm[name][:batch], dm[name][:batch]
                dst.data.copy_from_device_async(src.data, src.nbytes,
                                                cupy.cuda.get_current_stream())
            with labelled("embedding"):  # plain: after the copies
                ops.embedding(mm["ids"], self.w["embed"], a["r"], rows)
        with programmatic(pdl), _on(stream, symbols):
            for i in range(cfg.layers):
                self._layer(i, a, mm, rows, batch + chunk, attend)
            dec = {k: v[:batch] for k, v in self.dec.items()}
            m = {k: v[:batch] for k, v in dm.items()}
            handoff = ops.Handoff(m["ids"], m["slots"], self.kv.seq_lens, advance, host_next)
            self._head(a["r"][:batch], dec, m, m["pos"], batch, m["slots"], handoff,
                       fed=m["ids"], host_lp=host_lp)
        self._chunk_head(num_seqs, stream, symbols, a["r"][batch:])

    def score(self, pieces: Sequence[PrefillPiece], x: Any, stream: Any) -> Scores | None:
        """Queue the prompt log-probabilities of a chunk's pieces that ask
        (sampling.prompt_logprobs) on `stream`, after the chunk: each of their rows scores
        the prompt token after it (the piece's next_token for its last row; a final piece's
        last row has none: its next token is sampled). `x`: the chunk's rows after the
        layers (pre["r"], or a mixed iteration's chunk rows). Eager launches, SCORE_ROWS rows
        through the LM head at a time, the kernels of that many rows whatever the count (so a
        row's numbers do not depend on the others). None when no piece asks."""
        idx, tgt, top, spans, row = [], [], [], [], 0
        for i, p in enumerate(pieces):
            k = p.sampling.prompt_logprobs
            if k is not None:
                targets = [*p.tokens[1:], p.next_token] if not p.final else list(p.tokens[1:])
                idx += range(row, row + len(targets))
                tgt += targets
                top += [k] * len(targets)
                spans.append((i, len(targets)))
            row += len(p.tokens)
        if not spans:
            return None
        cfg, st = self.cfg, storage_dtype(self.cfg.dtype)
        pad = -len(idx) % SCORE_ROWS  # whole blocks: padding rows gather row 0, ask nothing
        n = len(idx) + pad
        if self.score_buf is None:
            self.score_buf = {"last": cupy.zeros((SCORE_ROWS, cfg.hidden), st),
                              "logits": cupy.zeros((SCORE_ROWS, cfg.vocab), st),
                              "lse": cupy.zeros(SCORE_ROWS, np.float32)}
        b = self.score_buf
        with cupy_stream(stream):
            meta = cupy.asarray(np.array([idx + [0] * pad, tgt + [-1] * pad, top + [-1] * pad],
                                         np.int32))
            lp = cupy.empty((n, ops.LP_STRIDE), np.float32)
            ids = cupy.empty((n, ops.LP_STRIDE), np.int32)
        with _on(stream, None), programmatic(False):
            for r0 in range(0, n, SCORE_ROWS):
                r1 = r0 + SCORE_ROWS
                ops.rmsnorm(x, self.w["norm"], b["last"], eps=cfg.rms_eps, gather=meta[0, r0:r1])
                ops.linear(b["last"], self.w["lm_head"], b["logits"])
                out = ops.Logprobs(meta[2, r0:r1], b["lse"], lp[r0:r1], ids[r0:r1])
                # positions only place a row's entries (one half) and time bans (no rules)
                ops.process(b["logits"], b["logits"], meta[1, r0:r1], out,
                            targets=meta[1, r0:r1])
        return Scores(spans, lp, ids)

    # -- eager conveniences -----------------------------------------------------------------

    def decode(self, slots: Sequence[int], tokens: Sequence[int], stream: Any = None,
               sampling: Sequence[SamplingParams] | None = None) -> list[int]:
        """One eager decode step: feed `tokens` to sequences `slots`; their next tokens."""
        max_len = self.prepare_decode(slots, tokens, stream, sampling)
        self.launch_decode(len(slots), max_len, stream)
        cupy_stream(stream).synchronize()
        return self.dec["next"][:len(slots)].get().tolist()

    def prefill(self, pieces: Sequence[PrefillPiece], stream: Any = None,
                chunk: int | None = None) -> list[int]:
        """One eager prefill chunk; the next token of each piece's sequence (-1 for pieces
        that are not final). Its kernels are those of `chunk` (default: the smallest of
        `chunk_sizes` holding the pieces, as the engine picks them): the skinny and the tiled
        GEMM round differently in the last bit, so a prompt prefilled with other kernels can
        decode differently where two logits nearly tie."""
        n = sum(len(p.tokens) for p in pieces)
        if chunk is None:
            chunk = next((c for c in chunk_sizes(self.max_chunk) if c >= n), self.max_chunk)
        elif not min(n, self.max_chunk) <= chunk <= self.max_chunk:
            raise ValueError(f"chunk {chunk}: at least the {n} tokens of the pieces and at "
                             f"most max_chunk = {self.max_chunk}")
        shape = self.prepare_prefill(pieces, stream)
        self.launch_prefill(*shape, stream, chunk=chunk)
        cupy_stream(stream).synchronize()
        return final_tokens(self.pre["next"][:shape[1]].get().tolist(), pieces)

    def free(self, slot: int) -> None:
        """Drop a finished sequence's cache blocks."""
        self.kv.tables.free(slot)

    def check_inputs(self, pieces: Sequence[PrefillPiece], slots: Sequence[int],
                     tokens: Sequence[int] | None = None,
                     fed: Sequence[int] | None = None) -> None:
        """Debug: the device holds what the host says an iteration about to launch reads
        (after its prepare calls, with every stream that copies synchronized): each touched
        sequence's length and table row, and the decode rows' slots, positions and ids (a
        row fed from the host: `tokens[i]`; on the device: `fed[i]`, the last chunk's
        pre["next"] entry). A step continuing the last one finds most of it where that
        step's sampler left it, the rest copied only when something changed: this is the
        check that such a copy was not skipped. DeviceStateError naming the first
        difference; nothing changes."""
        t = self.kv.tables
        lens, tab = self.kv.seq_lens.get(), self.kv.block_tables.get()
        rows = np.asarray(list(slots), np.int64)
        for s in sorted({p.slot for p in pieces} | {int(s) for s in rows if s >= 0}):
            n = -(-int(t.lens[s]) // t.block_size)
            if lens[s] != t.lens[s] or not np.array_equal(tab[s, :n], t.table[s, :n]):
                raise DeviceStateError(
                    f"slot {s}: the device has length {lens[s]}, blocks {tab[s, :n].tolist()};"
                    f" the host {t.lens[s]}, {t.table[s, :n].tolist()}")
        if not len(rows):
            return
        d = {k: self.dec_meta.dev[k][:len(rows)].get() for k in ("slots", "pos", "ids")}
        live = rows >= 0
        want = {"slots": rows, "pos": np.where(live, t.lens[np.maximum(rows, 0)] - 1, d["pos"])}
        src = np.full(len(rows), -1) if fed is None else np.asarray(list(fed))
        nxt = self.pre["next"].get()
        ids = np.where(src >= 0, nxt[np.maximum(src, 0)], d["ids"])
        if tokens is not None:
            tok = np.asarray(list(tokens))
            ids = np.where(tok >= 0, tok, ids)
        want["ids"] = ids
        for k, v in want.items():
            bad = np.flatnonzero(d[k] != v)
            if len(bad):
                i = int(bad[0])
                raise DeviceStateError(f"decode row {i} (slot {rows[i]}): the device's {k} is "
                                       f"{d[k][i]}, the host's {v[i]}")

    def close(self) -> None:
        """Release the weights arena (freed once no view remains)."""
        if self.arena is not None:
            self.arena.close()
