"""The decoder on the GPU: weights in an arena, a paged KV cache, activation buffers, and the
kernel sequence of an iteration (`Model.launch`): a batched decode step, a prefill chunk, or
both as one.

`Model.launch` issues the same launches whether it runs eagerly or inside a capture: every
buffer is allocated up front at its largest size, and what changes per iteration (token ids,
positions, cache slots, block tables, lengths, sampling parameters) lives in device memory,
written by one host-to-device copy (`model.inputs`). The few sizes that shape the launches
(`step.SIZES`: the longest context, a chunk's token and sequence counts, its longest piece
and context) are ints eagerly and the symbols a graph patches when captured.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Mapping, Sequence
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
from rawgraph.memory.paged import BLOCK_SIZE, PagedKVCache
from rawgraph.model import step, weights
from rawgraph.model.checkpoint import Checkpoint
from rawgraph.model.config import ModelConfig
from rawgraph.model.inputs import Inputs
from rawgraph.model.step import Limits, PrefillPiece, Shape, final_tokens
from rawgraph.ops.attention import default_splits
from rawgraph.ops.matmul import DECODE_ROWS, keeps_row_max, plain_after
from rawgraph.ops.sampling import SamplingParams
from rawgraph.ops.variant import Variants, choose, chosen
from rawgraph.symbols import Symbols
from rawgraph.symbols import scope as symbols_scope

# Chunks of up to this many tokens run prefill attention grouped, in key runs whose count
# follows each sequence's length (`ops.PrefillPlan(context=)`): their query tiles
# alone leave most of the GPU idle; above it one run loses to a block per head
# (benchmarks/NOTES.md, "Prefill").
RUNS_UP_TO = 256
# The batch-invariant mode's GEMM plans (`Variants.gemm_rows`): a decode step's projections
# planned for 128 rows (one tile of rows, k split so the tiles fill the GPU: a small batch's
# rows read W at the best rate this GEMM gives them), a chunk's for 2,048 (unsplit tiles)
INVARIANT_STEP_ROWS, INVARIANT_CHUNK_ROWS = 128, 2048

# what `Model(quantize=)` takes: the projections' quantized copies (weights.quantized_copies),
# which the decode GEMV reads (1-16 rows; more rows read the 16-bit weights)
QUANTIZE = (None, "fp8", "int4")


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
    """How decode attention launches: in the caller's chain (if the caller's launches are
    programmatic), its combine then ending it (ops.decode_attention launches that plainly),
    so its blocks request the older tokens' K/V while the QKV projection ends; or plainly,
    the chain ending at attention, with `Variants.chained_attention` off. Fixed at capture.
    On: 1-4% off every step measured, 1B and 8B, B=1 to 32, 1k to 64k tokens
    (benchmarks/NOTES.md, "Decode attention")."""
    return contextlib.nullcontext() if chosen().chained_attention else programmatic(False)


def chunk_sizes(max_chunk: int) -> tuple[int, ...]:
    """The default prefill chunk sizes of a model whose largest chunk is `max_chunk`."""
    return (*[c for c in PREFILL_CHUNKS if c < max_chunk], max_chunk)


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
                 runs_up_to: int = RUNS_UP_TO, variants: Variants | None = None,
                 batch_invariant: bool | None = None, quantize: str | None = None,
                 keep_16bit: bool = True):
        """`tensors`: checkpoint tensors in cfg.dtype storage (see rawgraph.model.checkpoint);
        None: seeded random weights made on the device (benchmarks of large presets).
        Tensors holding NaN or infinities are refused (CheckpointError naming the tensor,
        and its file from `files`, tensor name -> file, when given). `runs_up_to`: chunks
        of up to this many tokens run prefill attention grouped in key runs (`runs`; 0:
        never). `variants`: the kernel forms its launches take (`ops.variant.Variants`; None:
        those in force where it launches, the defaults unless a `choose` block says
        otherwise). `batch_invariant` (None: the environment's RAWGRAPH_BATCH_INVARIANT=1):
        every row's results the same whatever else is in its iteration
        (`set_batch_invariant`). `quantize`: each projection also quantized on the GPU once
        the norms are folded in (`ops.quantized`): "fp8", e4m3 codes and a scale per output
        row (half the bytes a decode step of 1-16 rows reads); "int4", 4-bit values with a
        scale and zero point per group of 128 (a quarter). The decode GEMV's rows read the
        copies; more rows read the 16-bit weights, kept beside
        (`weights.quantized_copies`). `keep_16bit` False (with `quantize`): the layers'
        projections are kept quantized alone (each staged, folded and quantized at load), the
        memory of the format; the paths with no quantized kernel (prefill, more than 16
        rows) dequantize a projection into a scratch buffer before reading it (one scratch
        per buffer set, as large as the largest projection). The LM head keeps its 16-bit
        copy (a scratch as large would cost as much)."""
        if quantize not in QUANTIZE:
            raise ValueError(f"quantize = {quantize!r}: one of {QUANTIZE}")
        if not keep_16bit and quantize is None:
            raise ValueError("keep_16bit = False: only with quantize (the 16-bit weights are "
                             "all a model without it has)")
        if quantize is not None and not ops.quantized.takes_quantized(
                {"fp8": "e4m3", "int4": "i4"}[quantize]):
            raise ValueError(f"quantize = {quantize!r}: its kernels need a newer GPU "
                             f"(compute capability 8.9 for fp8, 8.0 for int4)")
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
        self.runs_up_to, self.variants, self.quantize = runs_up_to, variants, quantize
        self.keep_16bit = bool(keep_16bit)
        if batch_invariant is None:
            batch_invariant = os.environ.get("RAWGRAPH_BATCH_INVARIANT") == "1"
        self.batch_invariant = bool(batch_invariant)
        self.workspace: cupy.ndarray | None = None  # decode attention's splits'
        self.prefill_workspace: cupy.ndarray | None = None  # prefill attention's key runs'
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
        tile, and every chunk of a batch-invariant model (a run's combine adds a row's keys
        in another order)."""
        group = self.cfg.heads // self.cfg.kv_heads
        rows = ops.attention.grouped_rows(chunk, group)
        runs = chunk <= self.runs_up_to and group <= rows and not self.batch_invariant
        return rows if runs else 0

    def set_batch_invariant(self, on: bool) -> None:
        """Batch-invariant mode on or off. On, a row's logits and tokens do not depend on
        what else its iteration holds (the batch, the row's place, the chunk its prompt was
        prefilled in, a prefix-cache hit, overlap): every projection takes the tiled GEMM
        planned for a fixed count of rows (`Variants.gemm_rows`: INVARIANT_STEP_ROWS for a
        decode step, INVARIANT_CHUNK_ROWS for a chunk), decode attention cuts each row's
        context by its own length alone (`ops.attention.fixed_splits`), prefill attention
        runs no key runs and one query tile, and no iteration is mixed. Other bits than the
        default mode's, and slower (`bench decode`'s invariant column). Set it before an
        engine captures graphs: a graph keeps the kernels it was captured with."""
        self.batch_invariant = bool(on)
        self._attention_buffers()

    def _attention_buffers(self) -> None:
        """Decode attention's splits per batch size and their workspace; prefill attention's
        key runs' workspace, for the chunk size that needs the most (grown, never shrunk)."""
        cfg = self.cfg
        if self.batch_invariant:
            self.splits = [ops.attention.fixed_splits(self.max_context)] * self.max_batch
        else:
            self.splits = [default_splits(b, cfg.kv_heads, cfg.dtype, cfg.head_dim)
                           for b in range(1, self.max_batch + 1)]
        need = max(ops.workspace_floats(b, cfg.heads, cfg.head_dim, s)
                   for b, s in enumerate(self.splits, 1))
        if self.workspace is None or self.workspace.size < need:
            self.workspace = cupy.empty(need, np.float32)
        group, sms = cfg.heads // cfg.kv_heads, multiprocessors()
        need = max([0] + [
            ops.workspace_floats(c, cfg.heads, cfg.head_dim,
                                 ops.attention.prefill_runs(c, r // group, cfg.kv_heads, sms)[0])
            for c in range(1, self.max_chunk + 1) if (r := self.runs(c))])
        if self.prefill_workspace is None or self.prefill_workspace.size < need:
            self.prefill_workspace = cupy.empty(need, np.float32)

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
        self.inputs = Inputs(self.limits, self.kv, self.pre["next"])
        self.rule_state = ops.RuleState(max_batch, cfg.vocab)  # per-slot rules on the device
        self.score_buf: dict[str, cupy.ndarray] | None = None  # Model.score's, on first use
        self._body_stream: cupy.cuda.Stream | None = None  # captures conditional bodies
        # a mixed iteration's rows (decode rows, then a chunk's tokens): made on first use
        self.mix: dict[str, cupy.ndarray] | None = None
        self._attention_buffers()
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
        q = self.quantize
        copies = weights.quantized_copies(cfg, q) if q else {}
        alone = self._alone(copies)  # kept quantized alone: staged one at a time
        extra = sum(weights.quantized_bytes(q, n, k) + 768  # type: ignore[arg-type]
                    for n, k in copies.values())  # each array 256-aligned
        self.arena = Arena(sum(2 * math.prod(s) + 256 for n, (s, _) in lay.items()
                               if n not in alone) + extra + (1 << 20), "weights")
        stage = cupy.empty(max(n * k for n, k in alone.values()), st) if alone else None
        self.w = {}
        rng = cupy.random.default_rng(seed)
        checks: list[tuple[str, cupy.ndarray]] = []  # (source tensor, its device view)
        for name, (shape, sources) in lay.items():  # stream each tensor into its region
            if name not in alone:
                view = self.w[name] = self.arena.array(name, shape, st)
                checks += self._fill(view, name, sources, tensors, rng)
                continue
            assert stage is not None
            view = stage[:math.prod(shape)].reshape(shape)
            # checked now (the stage is the next one's), folded, quantized; its norm came
            # before it in the layout, and is checked with the rest below
            weights.check_finite(self._fill(view, name, sources, tensors, rng), cfg.dtype,
                                 files)
            self._fold(name, view)
            self.w[name] = self._quantized(name, view, keep=False)
        weights.check_finite(checks, cfg.dtype, files)  # before the norms fold into projections
        for name in lay:
            if name not in alone:
                self._fold(name, self.w[name])
        if cfg.tie_embeddings:
            self.w["lm_head"] = self.w["embed"]
        for name in copies:  # of the weights as the projections read them: norms folded in
            if name not in alone:
                self.w[name] = self._quantized(name, self.w[name])
        cupy.cuda.get_current_stream().synchronize()
        del stage

    def _alone(self, copies: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        """Of the quantized copies, those kept without their 16-bit weight (`keep_16bit`
        False): the layers' projections, not the LM head."""
        return {} if self.keep_16bit else {n: s for n, s in copies.items() if n != "lm_head"}

    def _fill(self, view: cupy.ndarray, name: str, sources: tuple[str, ...],
              tensors: dict[str, np.ndarray] | None, rng: Any) -> list[tuple[str, Any]]:
        """Layout tensor `name` into `view`: seeded random values, or its checkpoint tensors
        (gate and up interleaved); (source tensor, its view) of each, to check finite."""
        cfg, st = self.cfg, storage_dtype(self.cfg.dtype)
        if tensors is None:
            weights.random_fill(view, rng, cfg.dtype, bias=name.endswith("bias"))
            return []
        if name.endswith("gate_up"):
            view.set(ops.stack_gate_up(*(np.asarray(tensors[src], st) for src in sources)))
            pair = view.reshape(-1, 2, ops.elementwise.GATE_UP_GROUP, view.shape[1])
            return [(sources[0], pair[:, 0]), (sources[1], pair[:, 1])]
        out, row = [], 0
        for src in sources:
            a = np.ascontiguousarray(tensors[src], st)
            view[row:row + a.shape[0]].set(a)
            out.append((src, view[row:row + a.shape[0]]))
            row += a.shape[0]
        return out

    def _fold(self, name: str, view: cupy.ndarray) -> None:
        """The norm whose output projection `name` reads, folded into it (weights.NORM_FOLDS;
        other tensors: nothing)."""
        layer, _, part = name.rpartition(".")
        for norm, proj in weights.NORM_FOLDS:
            if part == proj and layer:
                ops.fold_norm(view, self.w[f"{layer}.{norm}"])

    def _quantized(self, name: str, w16: cupy.ndarray, keep: bool = True) -> Any:
        """The quantized record of 16-bit weight `w16` (`self.quantize`'s format), in the
        arena, with `w16` as its 16-bit copy (`keep`; else none)."""
        (n, k), a = w16.shape, self.arena
        assert a is not None
        if self.quantize == "fp8":
            codes = a.array(name + ".fp8", (n, k), np.uint8)
            scale = a.array(name + ".scale", n, np.float32)
            ops.quantized.quantize_fp8(w16, codes, scale)
            return ops.fp8_weight(codes, scale, w16 if keep else None)
        g = ops.quantized.I4_GROUP
        packed = a.array(name + ".int4", (n, k // 2), np.uint8)
        scales = a.array(name + ".scales", (n, k // g), w16.dtype)
        zeros = a.array(name + ".zeros", (n, k // g), np.uint8)
        ops.quantized.quantize_int4(w16, packed, scales, zeros, g)
        return ops.int4_weight(packed, scales, zeros, g, w16 if keep else None)

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
        alone = [w.shape for w in self.w.values()
                 if isinstance(w, ops.quantized.Quantized) and w.wide is None]
        if alone:  # the projections kept quantized alone are dequantized here where needed
            out["wq"] = cupy.empty(max(n * k for n, k in alone), st)
        return out

    def mixed_buffers(self) -> dict[str, cupy.ndarray]:
        """The activations of a mixed iteration: max_batch decode rows, then max_chunk chunk
        tokens, and their metadata staging; made on the first call (call it outside a
        capture)."""
        if self.mix is None:
            self.mix = self._buffers(self.max_batch + self.max_chunk, 1)  # heads: dec's, pre's
            self.inputs.mix_staging()
        return self.mix

    # -- device side: the kernel sequences ----------------------------------------------------

    def _layer(self, i: int, a: dict, meta: dict, n: Any, m_max: int, attend: Any) -> None:
        """One decoder layer on rows [:n] of buffers `a` (residual stream in a["r"]; the
        tokens' slots and positions in meta); kernels chosen for up to m_max rows.
        `attend(cache)` runs attention over layer i's cache (`ops.Cache`), which the
        projection has appended to. Launches go to the current stream with the current symbols
        (`_on`)."""
        cfg, w, p = self.cfg, self.w, f"model.layers.{i}."
        lin = {"m": n, "m_max": m_max, "scratch": a.get("wq")}
        # each norm: its weight folded into the projection after it, its scale per row
        # applied by the decode GEMV (or, on the other paths, a weightless rmsnorm into h)
        norm = {"norm_eps": cfg.rms_eps, "normed": a["h"]}
        # each part's launches labelled with the name the read chain gives its link
        # (bench.ceiling.link_parts), so a profile can set one against the other
        cache = ops.Cache(*self.kv.layer(i), self.kv.block_tables, self.kv.seq_lens)
        # the family's extras (None where it has none): q, k, v biases, q and k head norms
        extras = ops.Extras(w.get(p + "qkv_bias"), w.get(p + "qk_norm"), cfg.rms_eps)
        with labelled("qkv"):  # QKV, RoPE and the cache append (one kernel for decode)
            ops.qkv_rope(a["r"], w[p + "qkv"], a["qkv"], cache, meta["slots"], meta["pos"],
                         self.freqs, head_dim=cfg.head_dim, extras=extras, **norm, **lin)
        with labelled("attention"):
            attend(cache)
        with labelled("o_proj"):
            ops.linear(a["attn"], w[p + "o_proj"], a["r"], residual=a["r"], **lin)
        gate_up, down = w[p + "gate_up"], w[p + "down_proj"]
        with labelled("gate_up"):
            ops.gate_up_silu(a["r"], gate_up, a["gu"], a["act"], **norm, **lin)
        plain = plain_after(m_max, *gate_up.shape, isinstance(gate_up, ops.quantized.Quantized))
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
        quantized = isinstance(w["lm_head"], ops.quantized.Quantized)
        best = a["best"] if keeps_row_max(a["last"].shape[0], cfg.vocab, quantized) else None
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
        m, st, staged = self.inputs.pre_meta.dev, self.rule_state, self.inputs.rule_meta.dev
        with programmatic(False):
            ops.rules_start(st, num_seqs, m["install"], m["seqs"], staged)
            ops.rules_mark(st, n, m["ids"], m["slots"], num_seqs, m["install"], m["seqs"],
                           staged)

    def launch(self, shape: Shape, sizes: Mapping[str, Any], stream: Any,
               symbols: Symbols | None = None, *, pdl: bool = False, host_next: Any = None,
               host_lp: tuple[Any, Any] | None = None) -> None:
        """The kernels of one iteration of `shape` (`step.Shape`): a decode step over its
        bucket of `batch` rows (rows past the step's sequences are padding), a prefill chunk
        with the kernels of `chunk` tokens, or both as one mixed iteration. `sizes`: the
        iteration's sizes (`step.SIZES`; what `inputs.prepare` returns, with `advance`),
        ints eagerly or the symbols of `step.symbols(shape)` when captured, so eager
        launches and a graph's replay issue the same kernels (the same bits).

        The decode step's tokens land in dec["next"], `host_next` ((batch, 2) int32 mapped
        host memory: row r's at [r, its position % 2], ops.Handoff) and its
        log-probabilities in `host_lp` ((lp, ids) of (batch, 2, LP_STRIDE) mapped host
        memory) likewise; with `advance` 1 the sampler hands each token on to a step that
        continues this one (then a replay is not idempotent). A chunk's next tokens (of its
        final pieces) land in pre["next"]; a chunk without a final piece skips the head
        (captured: an IF node whose condition a kernel sets from the chunk's metadata).
        In a mixed iteration every layer's projections run over the decode rows and the
        chunk's tokens together (the weights read once), attention by kind; its results
        round as such a batch does, not as the separate step and chunk do. `pdl`:
        programmatic dependent launches for every kernel but attention's and a chunk's head
        and IF node, which launch plainly (each GEMV fetches its first weights while the
        previous kernel ends); the same bits either way."""
        step.check_shape(shape, dict(sizes), self.limits)
        if self.batch_invariant and shape.kind == "mixed":
            raise ValueError(f"{shape}: a batch-invariant model launches no mixed iterations "
                             f"(their decode rows would round as the chunk's tokens do)")
        sz = {"advance": 0, **sizes}
        with self._variants():
            if shape.batch and shape.chunk:
                self._mixed(shape, sz, stream, symbols, pdl, host_next, host_lp)
            elif shape.batch:
                with programmatic(pdl), _on(stream, symbols), self._rows(INVARIANT_STEP_ROWS):
                    self._decode(shape.batch, sz["max_len"], sz["advance"], host_next,
                                 host_lp)
            else:
                with self._rows(INVARIANT_CHUNK_ROWS):
                    self._prefill(shape.chunk, sz, stream, symbols, pdl)

    def _variants(self) -> contextlib.AbstractContextManager:
        """The kernel forms launches take: this model's `variants`, if it has its own."""
        return choose(self.variants) if self.variants is not None else contextlib.nullcontext()

    def _rows(self, rows: int) -> contextlib.AbstractContextManager:
        """Batch-invariant: the projections inside planned for `rows` rows whatever their
        count (`Variants.gemm_rows`); else nothing changes."""
        return choose(gemm_rows=rows) if self.batch_invariant else contextlib.nullcontext()

    def _decode_attention(self, a: dict, slots: Any, batch: int, max_len: Any) -> Any:
        """`attend` of a layer for the first `batch` rows of buffers `a`: decode attention
        over each row's context. The programmatic chain ends once a layer: unbroken, it ran
        the small-batch step up to 26% slower (benchmarks/NOTES.md, "The programmatic
        chain"); breaking it at any one kernel from attention to gate_up recovered that. It
        ends at attention, or (`Variants.chained_attention`) at its combine, attention then
        requesting its K/V during the wait."""
        q3 = a["q"][:batch]
        out3 = a["attn"].reshape(a["q"].shape)[:batch]

        def attend(cache: ops.Cache) -> None:
            with _attention_launch():
                ops.decode_attention(q3, cache, slots, out3, self.workspace, max_len,
                                     scale=self.cfg.attention_scale,
                                     splits=self.splits[batch - 1])
        return attend

    def _chunk_attention(self, a: dict, at: int, sz: Mapping[str, Any], chunk: int) -> Any:
        """`attend` of a layer for a chunk's tokens, rows [at, at + chunk) of buffers `a`
        (row at + r the chunk's token r; the metadata in pre_meta): GQA-grouped tiles in key
        runs that follow each sequence's length up to `runs_up_to` tokens, a block per
        (query tile, head) above. It launches plainly: the chain ends once a layer, as
        decode's does."""
        m, rows = self.inputs.pre_meta.dev, self.runs(chunk)
        q = a["q"][at:at + chunk]
        out = a["attn"].reshape(a["q"].shape)[at:at + chunk]
        pieces = ops.Chunk(m["cu"], m["seqs"], sz["max_q_len"], sz["seqs"], sz["n"])
        # batch-invariant: one query tile for every chunk size
        tile = ops.attention.PREFILL_ROWS[0] if self.batch_invariant else \
            ops.attention.prefill_rows(chunk, self.cfg.head_dim)
        plan = (ops.PrefillPlan(rows, context=sz["pre_len"], chunk_size=chunk,
                                workspace=self.prefill_workspace) if rows else
                ops.PrefillPlan(tile))

        def attend(cache: ops.Cache) -> None:
            with programmatic(False):
                ops.prefill_attention(q, cache, pieces, out, plan,
                                      scale=self.cfg.attention_scale)
        return attend

    def _decode(self, batch: int, max_len: Any, advance: Any, host_next: Any,
                host_lp: tuple[Any, Any] | None) -> None:
        a = {k: v[:batch] for k, v in self.dec.items()}
        m = {k: v[:batch] for k, v in self.inputs.dec_meta.dev.items()}
        attend = self._decode_attention(self.dec, m["slots"], batch, max_len)
        # the step's first kernel launches plainly: eagerly it follows the last step's
        # sampler, which writes the ids, positions and lengths the QKV GEMV reads before its
        # PDL wait (its round trips overlap the wait), so nothing of this step may start
        # until that sampler ends (a graph's first node never overlaps the last launch)
        with programmatic(False), labelled("embedding"):
            ops.embedding(m["ids"], self.w["embed"], a["r"])
        for i in range(self.cfg.layers):
            self._layer(i, a, m, batch, batch, attend)
        self._decode_head(a["r"], batch, advance, host_next, host_lp)

    def _decode_head(self, x: Any, batch: int, advance: Any, host_next: Any,
                     host_lp: tuple[Any, Any] | None) -> None:
        """The head of a decode step's `batch` rows (x's), the hand-off to the next step."""
        dec = {k: v[:batch] for k, v in self.dec.items()}
        m = {k: v[:batch] for k, v in self.inputs.dec_meta.dev.items()}
        handoff = ops.Handoff(m["ids"], m["slots"], self.kv.seq_lens, advance, host_next)
        self._head(x, dec, m, m["pos"], batch, m["slots"], handoff, fed=m["ids"],
                   host_lp=host_lp)

    def _prefill(self, chunk: int, sz: Mapping[str, Any], stream: Any,
                 symbols: Symbols | None, pdl: bool) -> None:
        a, m = self.pre, self.inputs.pre_meta.dev
        attend = self._chunk_attention(a, 0, sz, chunk)
        with programmatic(pdl), _on(stream, symbols):
            self._start_rules(sz["n"], sz["seqs"])
            with labelled("embedding"):
                ops.embedding(m["ids"], self.w["embed"], a["r"], sz["n"])
            for i in range(self.cfg.layers):
                self._layer(i, a, m, sz["n"], chunk, attend)
        self._chunk_head(sz["seqs"], stream, symbols, a["r"])

    def _mixed(self, shape: Shape, sz: Mapping[str, Any], stream: Any,
               symbols: Symbols | None, pdl: bool, host_next: Any,
               host_lp: tuple[Any, Any] | None) -> None:
        b, c = shape.batch, shape.chunk
        a, dm = self.mixed_buffers(), self.inputs.dec_meta.dev
        mm = self.inputs.mix_staging().dev
        decode = self._decode_attention(a, dm["slots"][:b], b, sz["max_len"])
        chunk = self._chunk_attention(a, b, sz, c)

        def attend(cache: ops.Cache) -> None:
            decode(cache)
            chunk(cache)

        with _on(stream, symbols):
            self._start_rules(sz["n"], sz["seqs"])
            # the decode rows' inputs as the device has them (a step continuing the last one
            # finds them there, moved on by its sampler), over the host's copy
            for name in ("ids", "pos", "slots"):
                dst, src = mm[name][:b], dm[name][:b]
                dst.data.copy_from_device_async(src.data, src.nbytes,
                                                cupy.cuda.get_current_stream())
            with labelled("embedding"):  # plain: after the copies
                ops.embedding(mm["ids"], self.w["embed"], a["r"], b + sz["n"])
        with programmatic(pdl), _on(stream, symbols):
            for i in range(self.cfg.layers):
                self._layer(i, a, mm, b + sz["n"], b + c, attend)
            self._decode_head(a["r"][:b], b, sz["advance"], host_next, host_lp)
        self._chunk_head(sz["seqs"], stream, symbols, a["r"][b:])

    def _chunk_head(self, num_seqs: Any, stream: Any, symbols: Symbols | None,
                    x: Any) -> None:
        """The LM head of a chunk whose token rows are x's, if a piece is final: captured, an
        IF node whose condition a kernel sets from the chunk's metadata; eagerly, the host
        decides."""
        final = self.inputs.pre_meta
        with programmatic(False), _on(stream, symbols):
            if capture_status(stream) == "active":
                handle = condition_handle(stream)
                set_condition_any(final.dev["final"], num_seqs, handle, stream)
                if self._body_stream is None:
                    self._body_stream = new_stream()
                with if_node(stream, handle, self._body_stream, name="LM head"):
                    self._prefill_head(self._body_stream, x)
            elif final.host["final"][:num_seqs].any():
                self._prefill_head(stream, x)

    def _prefill_head(self, stream: Any, x: Any) -> None:
        """The head of a prefill chunk over all max_chunk_seqs rows, each the last row of its
        sequence in the chunk (x's rows), gathered by the norm (fixed arguments: in a graph
        it is an IF node's body, which cannot be patched; unused rows read row 0)."""
        a, m, s = self.pre, self.inputs.pre_meta.dev, self.max_chunk_seqs
        with _on(stream, None):
            self._head(x, a, m, m["last_pos"], s, m["seqs"], gather=m["last"])

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
        with _on(stream, None), programmatic(False), self._variants(), \
                self._rows(INVARIANT_CHUNK_ROWS):
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
        shape = Shape(batch=len(slots))
        sizes = self.inputs.prepare([], slots, tokens, sampling, decode_stream=stream)
        self.launch(shape, sizes, stream)
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
        shape = Shape(chunk=chunk)
        sizes = self.inputs.prepare(pieces, [], None, decode_stream=stream,
                                    prefill_stream=stream)
        self.launch(shape, sizes, stream)
        cupy_stream(stream).synchronize()
        return final_tokens(self.pre["next"][:len(pieces)].get().tolist(), pieces)

    def free(self, slot: int) -> None:
        """Drop a finished sequence's cache blocks."""
        self.kv.tables.free(slot)

    def close(self) -> None:
        """Release the weights arena (freed once no view remains)."""
        if self.arena is not None:
            self.arena.close()
