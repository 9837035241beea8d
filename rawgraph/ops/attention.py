"""Attention over the paged KV cache: decode (one query per sequence, split along the
context, then combine) and prefill (a chunk of queries per sequence, causal, FlashAttention
style over the cache that already holds the chunk's K/V; a short chunk over a long context
optionally in key runs, combined after; on Hopper's warpgroup MMA where the device has it)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rawgraph.cuda.device import compute_capability, multiprocessors
from rawgraph.cuda.kernel import Kernel
from rawgraph.cuda.tensormap import tile_map
from rawgraph.dtypes import KERNEL_TYPES, kind_of
from rawgraph.ops import shapes
from rawgraph.ops.kv import Cache
from rawgraph.ops.variant import by_count, chosen
from rawgraph.symbols import Symbols, cdiv, smax, smin

_ATTEND = ("const {t}* q, const {t}* k_cache, const {t}* v_cache, const int* block_tables, "
           "const int* seq_lens, const int* seq_slots, float* partial, int batch, int q_heads, "
           "int kv_heads, int block_size, int max_blocks, int max_splits, int min_split, "
           "float scale, int q_stride")
_COMBINE = ("const float* partial, {t}* out, const int* seq_slots, int batch, int q_heads, "
            "int n_splits, int max_splits")
HEAD_DIMS = (64, 128)
ATTEND = {(dt, d): Kernel("decode_attention", f"decode_attention_{s}_d{d}", _ATTEND.format(t=t))
          for dt, (s, t) in KERNEL_TYPES.items() for d in HEAD_DIMS}
COMBINE = {(dt, d): Kernel("decode_attention", f"decode_attention_combine_{s}_d{d}",
                           _COMBINE.format(t=t))
           for dt, (s, t) in KERNEL_TYPES.items() for d in HEAD_DIMS}
MAX_GROUP = 16  # query heads per kv head: the 16 rows of one mma tile
MAX_SPLITS = 4096  # the combine keeps one float per split in shared memory
_PREFILL = ("const {t}* q, const {t}* k_cache, const {t}* v_cache, const int* block_tables, "
            "const int* seq_lens, const int* cu_seqlens, const int* seq_slots, {t}* out, "
            "int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks, "
            "float scale, int q_stride")
_RUNS = ", float* partial, int splits, int run_keys"
PREFILL_ROWS = (64, 128)  # query rows per block
PREFILL = {(dt, d, r): Kernel("prefill_attention", f"prefill_attention_{s}_d{d}_r{r}",
                              _PREFILL.format(t=t))
           for dt, (s, t) in KERNEL_TYPES.items() for d in HEAD_DIMS for r in PREFILL_ROWS}
# the same with each query tile's key tiles cut into runs, and the runs' combine
PREFILL_SPLIT = {(dt, d, r): Kernel("prefill_attention", f"prefill_attention_split_{s}_d{d}_r{r}",
                                    _PREFILL.format(t=t) + _RUNS)
                 for dt, (s, t) in KERNEL_TYPES.items() for d in HEAD_DIMS for r in PREFILL_ROWS}
PREFILL_COMBINE = {(dt, d): Kernel("prefill_attention", f"prefill_attention_combine_{s}_d{d}",
                                   f"const float* partial, {t}* out, const int* cu_seqlens, "
                                   "const int* seq_slots, const int* seq_lens, int num_seqs, "
                                   "int q_heads, int splits, int run_keys")
                   for dt, (s, t) in KERNEL_TYPES.items() for d in HEAD_DIMS}
# the same on Hopper's warpgroup MMA (prefill_attention_sm90.cu, sm_90a), the same contract
PREFILL90 = {(dt, d, r): Kernel("prefill_attention_sm90", f"prefill_attention_sm90_{s}_d{d}_r{r}",
                                _PREFILL.format(t=t))
             for dt, (s, t) in KERNEL_TYPES.items() for d in HEAD_DIMS for r in PREFILL_ROWS}
PREFILL90_SPLIT = {(dt, d, r): Kernel("prefill_attention_sm90",
                                      f"prefill_attention_split_sm90_{s}_d{d}_r{r}",
                                      _PREFILL.format(t=t) + _RUNS)
                   for dt, (s, t) in KERNEL_TYPES.items() for d in HEAD_DIMS
                   for r in PREFILL_ROWS}
# the same with K/V tiles brought by TMA (prefill_attention_sm90.cu's TmaKv), a layer's K and
# V cache each through a descriptor (kv_maps)
_MAPS = ", const __grid_constant__ TensorMap k_map, const __grid_constant__ TensorMap v_map"
PREFILL90T = {(dt, d, r): Kernel("prefill_attention_sm90",
                                 f"prefill_attention_tma_sm90_{s}_d{d}_r{r}",
                                 _PREFILL.format(t=t) + _MAPS)
              for dt, (s, t) in KERNEL_TYPES.items() for d in HEAD_DIMS for r in PREFILL_ROWS}
PREFILL90T_SPLIT = {(dt, d, r): Kernel("prefill_attention_sm90",
                                       f"prefill_attention_split_tma_sm90_{s}_d{d}_r{r}",
                                       _PREFILL.format(t=t) + _RUNS + _MAPS)
                    for dt, (s, t) in KERNEL_TYPES.items() for d in HEAD_DIMS
                    for r in PREFILL_ROWS}
PREFILL_KEYS = 64  # keys per tile


def prefill_wgmma() -> bool:
    """Whether prefill attention runs on wgmma here (compute capability 9.0, unless
    `Variants.prefill_wgmma` is off: mma.sync everywhere; tests run both)."""
    return chosen().prefill_wgmma and compute_capability() == (9, 0)


def prefill_tma(block_size: int) -> bool:
    """Whether prefill attention over a cache of `block_size`-token blocks brings its K/V
    tiles by TMA (`Variants.prefill_tma`, on wgmma, with block_size a power of two from 8:
    the kernel maps keys to blocks by shifts; other sizes, or the switch off, gather with
    cp.async)."""
    return (chosen().prefill_tma and prefill_wgmma() and block_size >= 8
            and block_size & (block_size - 1) == 0)


def kv_maps(k_cache: Any, v_cache: Any) -> tuple[bytes, bytes]:
    """TMA descriptors of one layer's K and V caches, (num_blocks, block_size, row) each,
    for the _tma kernels: (num_blocks x block_size, row) rows read in boxes of
    gcd(block_size, 64) rows by 64 columns (a paged block's rows never straddle two
    boxes)."""
    nb, bs, row = k_cache.shape
    box, dt = math.gcd(bs, PREFILL_KEYS), kind_of(k_cache)
    return (tile_map(k_cache.data.ptr, nb * bs, row, dt, box),
            tile_map(v_cache.data.ptr, nb * bs, row, dt, box))


def prefill_rows(max_q_len: int, head_dim: int) -> int:
    """Query rows per block: at head dim 128, 128 (each K/V tile shared by more rows) once
    chunks are long enough not to waste most of such a tile; 64 otherwise. At head dim 64,
    64-row blocks were 11-12% faster at every length measured (1,024 to 8,192 tokens, two
    runs, blocks of 16 and 64 tokens): twice the blocks, whose K/V tiles cost half as much
    at that width."""
    return 128 if max_q_len >= 256 and head_dim == 128 else 64


def prefill_smem(rows: int, head_dim: int, tma: bool = False) -> int:
    """Dynamic shared memory of prefill attention: a Q tile and two K/V tile pairs (and with
    `tma`, their two mbarriers)."""
    return (rows + 4 * PREFILL_KEYS) * head_dim * 2 + (16 if tma else 0)


DECODE_WARPS, DECODE_CHUNK = 4, 16  # warps per block, tokens per warp step


def decode_stages(head_dim: int) -> int:
    """K/V chunks each warp of decode attention keeps in its ring (kernels_cu: stages<D>);
    the same at both head dims (at 64, a fourth cost a block an SM and was slower)."""
    return 3


def decode_smem(head_dim: int) -> int:
    """Dynamic shared memory of decode attention: the 16-row query tile and every warp's ring
    of K and V chunks (whose bytes then hold the warps' partial results)."""
    chunk = DECODE_CHUNK * head_dim * 2
    return 16 * head_dim * 2 + DECODE_WARPS * decode_stages(head_dim) * 2 * chunk


SPLIT_ALIGN = DECODE_WARPS * DECODE_CHUNK  # tokens: splits are cut at whole warp steps
SPLIT_WAVES = 4  # at most this many waves of blocks from splitting
# The kernel's rule for one row (decode_attention.cu, kShortSplits and kLongSplit): up to
# SHORT_SPLITS * LONG_SPLIT tokens at most SHORT_SPLITS splits (a lone row's step there is
# bound by latency, and 16 splits beat 48 in its decode graph: benchmarks/NOTES.md, "Decode
# attention"); longer rows splits of at least LONG_SPLIT tokens, up to the `splits` given.
SHORT_SPLITS, LONG_SPLIT = 16, 256


def row_splits(length: int, splits: int, min_split: int = 0) -> int:
    """The splits the kernel cuts a row of `length` tokens into, given `splits` (max_splits)
    and `min_split` (no split shorter; 0: no bound)."""
    per = max(-(-length // splits), min(-(-length // SHORT_SPLITS), LONG_SPLIT), min_split)
    per = -(-per // SPLIT_ALIGN) * SPLIT_ALIGN
    return -(-length // per)


def fixed_splits(max_context: int, min_split: int = 0) -> int:
    """A `splits` (max_splits) under which every row of up to `max_context` tokens, with
    splits of at least `min_split` tokens, takes the splits its length alone gives whatever
    its batch: `row_splits(len, fixed_splits(max_context, P), P)` is every row's split
    length, `max(P, min(len / 16, 256))` in whole warp steps (a fixed split length, not a
    fixed count). The batch-invariant mode's, with P = 0 (the kernel's own rule: 16 splits
    up to 4,096 tokens). A P of 256 would cut a 128-row step's attention blocks and partials
    fourfold at 1,024 tokens; no GPU has measured it yet."""
    if max_context < 1 or min_split < 0:
        raise ValueError(f"max_context = {max_context}, min_split = {min_split}: at least 1 "
                         f"and 0")
    per = min(min_split, LONG_SPLIT) if min_split else LONG_SPLIT
    need = max(1 if min_split else SHORT_SPLITS, -(-max_context // per))
    if need > MAX_SPLITS:
        raise ValueError(f"max_context = {max_context} takes {need} splits of {per} tokens, "
                         f"past the combine's {MAX_SPLITS}")
    return need


def grid_splits(max_len: Any, splits: int, min_split: int = 0) -> Any:
    """Split blocks per (row, kv head) to launch when no row is longer than `max_len` (an
    int, or a symbol: the grid follows it when patched): at least `row_splits(len, splits,
    min_split)` for every len <= max_len (which does not grow monotonically with len), and
    no more than a short context needs (16 at most up to SHORT_SPLITS * LONG_SPLIT tokens,
    so the combine does not read empty splits; len / min_split at most)."""
    short = smin(SHORT_SPLITS, cdiv(max_len, SPLIT_ALIGN))  # rows <= 4096 tokens
    most = smin(splits, smax(short, cdiv(max_len, LONG_SPLIT)))  # longer: >= 256 each
    return smin(most, cdiv(max_len, min_split)) if min_split > 0 else most


def decode_splits(units: int, resident: int) -> int:
    """Splits per (row, kv head) of decode attention (the kernel's max_splits): a block per
    (row, kv head, split), `units` = rows x kv heads, `resident` = blocks the GPU runs at
    once (one wave).

    The kernel is bound by each SM's throughput, not by one block's loads, so what counts is
    that every SM stays busy to the end: the count whose blocks fill whole waves best, within
    SPLIT_WAVES waves, and the fewest splits among near-equals (each split pays a start,
    query tile and ring fill, and a partial result to combine). A sweep of fixed split
    lengths on the H200 found the best one per shape to be the one whose blocks filled whole
    waves; with this rule (LLaMA-1B / 8B heads, % of copy bandwidth, fixed 128 / 512-token
    splits before): B=8 ctx 16384 55 / 57 -> 90 / 86, B=32 ctx 4096 72 / 77 -> 86 / 83.
    Rows up to SHORT_SPLITS * LONG_SPLIT tokens take at most SHORT_SPLITS of them
    (`row_splits`).
    """
    if units < 1 or resident < 1:
        raise ValueError(f"units = {units}, resident = {resident}: both must be positive")
    counts = range(1, max(1, SPLIT_WAVES * resident // units) + 1)
    fill = {s: units * s / (-(-units * s // resident) * resident) for s in counts}
    return min(s for s in counts if fill[s] >= max(fill.values()) - 0.05)


@functools.cache
def _resident(dtype: str, head_dim: int) -> int:
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} is not supported (use one of {HEAD_DIMS})")
    return ATTEND[dtype, head_dim].resident_blocks(DECODE_WARPS * 32, decode_smem(head_dim))


def default_splits(batch: int, kv_heads: int, dtype: str, head_dim: int) -> int:
    """decode_splits on this device (its resident blocks of the attention kernel)."""
    return decode_splits(batch * kv_heads, _resident(dtype, head_dim))


def workspace_floats(rows: int, q_heads: int, head_dim: int, splits: int) -> int:
    """float32 elements of a split workspace: (rows, q_heads, splits, head_dim + 2) for `rows`
    decode rows or prefill tokens."""
    return rows * q_heads * splits * (head_dim + 2)


MAX_PREFILL_SPLITS = 64  # key runs per query tile (the combine: at most two per lane)
COMBINE_WARPS = 8  # (token, head) pairs per block of the prefill combine, a warp each
RUN_KEYS = 2 * PREFILL_KEYS  # keys a run has at least (each run pays its query tile)


def prefill_runs(chunk: int, tile: int, kv_heads: int, sms: int) -> tuple[int, int]:
    """(splits, run_keys) of grouped prefill attention for chunks of up to `chunk` tokens in
    query tiles of `tile` tokens, on `sms` SMs: each sequence takes `row_runs(len, splits,
    run_keys)` runs, by its own length alone, so its results do not depend on what else
    the chunk holds.

    splits: while one sequence's blocks without runs (query tiles x kv heads) are fewer than
    the SMs, as many runs as make two blocks an SM at most (rounded down: a third block on
    some SMs is a tail), at most MAX_PREFILL_SPLITS; else 1. run_keys: each run at least
    max(RUN_KEYS, 2 x chunk) keys: each run writes its rows' partial results and the combine
    reads them back, a cost that grows with the chunk's tokens. A whole prompt has query
    tiles enough; a short chunk far into a long prompt (16 tokens at 8,192: one tile x 8 kv
    heads on 132 SMs) does not. Forced counts on the H200 were fastest at about these
    (benchmarks/NOTES.md, "Prefill")."""
    if min(chunk, tile, kv_heads, sms) < 1:
        raise ValueError(f"chunk = {chunk}, tile = {tile}, kv_heads = {kv_heads}, sms = {sms}: "
                         f"all must be positive")
    units = -(-chunk // tile) * kv_heads
    splits = min(2 * sms // units, MAX_PREFILL_SPLITS) if units < sms else 1
    return splits, max(RUN_KEYS, 2 * chunk)


def row_runs(length: Any, splits: int, run_keys: int) -> Any:
    """Key runs of a sequence of `length` keys (int, or a symbol: then the count of runs to
    launch for sequences of up to that length), as the kernels count them (seq_runs)."""
    return smax(1, smin(splits, length // run_keys))


def _int(name: str, arr: Any, shape: tuple | None = None) -> None:
    if not hasattr(arr, "data") or np.dtype(arr.dtype) != np.int32 or not arr.flags.c_contiguous:
        raise ValueError(f"{name} must be a contiguous int32 device array")
    if shape is not None and tuple(arr.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(arr.shape)}, expected {shape}")


@dataclass(frozen=True)
class Chunk:
    """A chunk's pieces as prefill attention reads them (on the device): piece i owns query
    rows [cu_seqlens[i], cu_seqlens[i + 1]), the last tokens of the context of slot
    slots[i] (int32 each). `max_q_len` (int or symbol) bounds every piece's rows and sets
    the grid; `seqs`, the pieces in use (default: all of slots), and `n`, the query rows in
    use (default: all of q; the runs' combine grid), may be symbols too."""

    cu_seqlens: Any
    slots: Any
    max_q_len: Any
    seqs: Any = None
    n: Any = None


@dataclass(frozen=True)
class PrefillPlan:
    """How prefill attention cuts a chunk's work (default: a block per query tile and head,
    the tile by max_q_len).

    `rows`: the query tile (64 or 128). The grouped kernel, for short chunks over long
    contexts, takes `splits` and `run_keys` (each piece's key tiles cut into
    `row_runs(len, splits, run_keys)` runs, a block each, combined after), or `context`
    (int or symbol: the longest piece's context, this chunk included; it sets how many run
    blocks launch, which a graph patches per chunk) and the runs `prefill_runs` gives for
    chunks of `chunk_size` tokens (default: max_q_len's value). Runs need `workspace`,
    float32: workspace_floats(tokens, q_heads, D, splits) for the most splits taken."""

    rows: int | None = None
    splits: int | None = None
    run_keys: int = 1
    context: Any = None
    chunk_size: int | None = None
    workspace: Any = None

    def __post_init__(self) -> None:
        if self.rows is not None:
            _check_rows(self.rows)
        if self.chunk_size is not None and (type(self.chunk_size) is not int
                                            or self.chunk_size < 1):
            raise ValueError(f"chunk_size = {self.chunk_size!r}: a positive int")
        if self.run_keys != 1 and self.splits is None:
            raise ValueError("run_keys goes with splits (with context, prefill_runs sets both)")
        if self.context is not None and self.splits is not None:
            raise ValueError("pass splits or context, not both")
        if self.splits is not None and (type(self.splits) is not int
                                        or not 1 <= self.splits <= MAX_PREFILL_SPLITS):
            raise ValueError(f"splits = {self.splits!r}: an int in [1, {MAX_PREFILL_SPLITS}]")
        if type(self.run_keys) is not int or self.run_keys < 1:
            raise ValueError(f"run_keys = {self.run_keys!r}: a positive int")

    @property
    def grouped(self) -> bool:
        """Whether the grouped kernel (runs) is taken."""
        return self.splits is not None or self.context is not None


def _cache(cache: Cache, dt: str, q_heads: int, d: int, max_group: int) -> int:
    """Check one layer's paged cache and its tables; returns kv_heads."""
    if not isinstance(cache, Cache):
        raise TypeError(f"cache must be an ops.Cache, got {type(cache).__name__}")
    k_cache = cache.k
    if getattr(k_cache, "ndim", 0) != 3 or k_cache.shape[2] % d:
        raise ValueError(f"k_cache must be (num_blocks, block_size, kv_heads * {d}), got "
                         f"{getattr(k_cache, 'shape', '?')}")
    shapes.tensor(k_cache, "k_cache", dtype=dt)
    shapes.tensor(cache.v, "v_cache", k_cache.shape, dt)
    kv_heads = k_cache.shape[2] // d
    if q_heads % kv_heads or q_heads // kv_heads > max_group:
        raise ValueError(f"q_heads = {q_heads} must be a multiple of kv_heads = {kv_heads}, "
                         f"at most {max_group} times it")
    if getattr(cache.block_tables, "ndim", 0) != 2:
        raise ValueError("block_tables must be (max_seqs, max_blocks)")
    _int("block_tables", cache.block_tables)
    if cache.seq_lens is None:
        raise ValueError("attention reads each slot's length: the cache needs its seq_lens")
    _int("seq_lens", cache.seq_lens, cache.block_tables.shape[:1])
    return kv_heads


def decode_attention(q: Any, cache: Cache, seq_slots: Any, out: Any, workspace: Any,
                     max_len: Any, *, scale: float | None = None, splits: int | None = None,
                     min_split: int = 0, stream: Any = None,
                     symbols: Symbols | None = None) -> None:
    """out[b] = softmax(q[b] K^T * scale) V over the cached tokens of sequence seq_slots[b].

    q, out: (batch, q_heads, D) with D in (64, 128) (q's rows may be strided: a view into a
    fused QKV output); `cache`: one layer's; lengths, tables and slots are read on the
    device (a slot < 0 is a padding row: nothing written). Each row cuts its context into
    `row_splits(len, splits, min_split)` splits of its own (default `default_splits` for
    this batch; `min_split`: no split shorter, 0 no bound), a block each per kv head, then a
    combine. `max_len` (int or symbol) bounds every length: `grid_splits(max_len, splits,
    min_split)` split blocks run, which is what a graph patches as
    contexts grow; results do not depend on it. workspace: workspace_floats(batch, q_heads,
    D, splits) float32.
    """
    if getattr(q, "ndim", 0) != 3:
        raise ValueError(f"q must be (batch, q_heads, head_dim), got {getattr(q, 'shape', '?')}")
    batch, q_heads, d = q.shape
    if d not in HEAD_DIMS:
        raise ValueError(f"head_dim {d} is not supported (use one of {HEAD_DIMS})")
    dt, q_stride = shapes.rows(q, "q", (q_heads, d), align=2)
    shapes.tensor(out, "out", q.shape, dt)
    kv_heads = _cache(cache, dt, q_heads, d, MAX_GROUP)
    _int("seq_slots", seq_slots, (batch,))
    block_tables, block_size = cache.block_tables, cache.k.shape[1]
    capacity = block_tables.shape[1] * block_size
    top = shapes.top(max_len, "max_len", symbols)
    if not 1 <= top <= capacity:
        raise ValueError(f"max_len reaches {top}; the block tables hold at most {capacity} "
                         f"tokens per sequence")
    if splits is None:
        splits = default_splits(batch, kv_heads, dt, d)
    if type(splits) is not int or not 1 <= splits <= MAX_SPLITS:
        raise ValueError(f"splits = {splits!r}: an int in [1, {MAX_SPLITS}]")
    if type(min_split) is not int or min_split < 0:
        raise ValueError(f"min_split = {min_split!r}: an int >= 0 (tokens; 0: no bound)")
    need = workspace_floats(batch, q_heads, d, splits)
    if getattr(workspace, "dtype", None) != np.float32 or workspace.size < need:
        raise ValueError(f"workspace must be float32 with at least {need} elements "
                         f"(workspace_floats(...)); got {getattr(workspace, 'size', '?')}")
    n_splits = grid_splits(max_len, splits, min_split)
    s = scale if scale is not None else d**-0.5
    ATTEND[dt, d].launch((batch * kv_heads, n_splits), 128,
                         (q, cache.k, cache.v, block_tables, cache.seq_lens, seq_slots, workspace,
                          batch, q_heads, kv_heads, block_size, block_tables.shape[1],
                          splits, min_split, float(s), q_stride), stream,
                         smem=decode_smem(d), symbols=symbols)
    # the combine launches plainly whatever the caller's default: programmatic behind
    # attention it cost the 1B B=1 step 0.2 ms (benchmarks/NOTES.md, "The programmatic
    # chain"), and a plain launch here ends the chain once a layer when attention is in it
    COMBINE[dt, d].launch(batch * q_heads, d, (workspace, out, seq_slots, batch, q_heads,
                                               n_splits, splits), stream,
                          smem=4 * splits, pdl=False, symbols=symbols)


def grouped_rows(max_q_len: int, group: int) -> int:
    """Query rows per tile of grouped prefill attention (`group` heads of each token): 128
    once they reach 256, at any head dim."""
    return 128 if max_q_len * group >= 256 else 64


def prefill_attention(q: Any, cache: Cache, chunk: Chunk, out: Any,
                      plan: PrefillPlan = PrefillPlan(), *, scale: float | None = None,
                      stream: Any = None, symbols: Symbols | None = None) -> None:
    """Causal attention of a chunk's queries over their sequences' cached keys and values.

    q, out: (tokens, q_heads, D), D in (64, 128), q's rows possibly strided; `chunk` says
    which rows are whose (append the chunk's K/V to `cache` first). `plan` (`PrefillPlan`)
    picks the kernel and how it cuts the work.

    Two kernels. By default a block per (query tile, head). For short chunks over long
    contexts, the grouped kernel: a tile holds a GQA group's heads of rows / group tokens,
    and each piece's query tiles cut their key tiles into runs, a block each, combined
    after; each piece's count follows its own length (`row_runs`).

    The query tile and the runs are chosen by plan.chunk_size when given, else by
    max_q_len's value: a symbolic max_q_len captured over a range that reaches several
    tiles or run counts records each, and the graph runs the one its value takes
    (`ops.variant.by_count`), so a patched graph gives the bits an eager call gives. On compute
    capability 9.0 the kernels are wgmma's (`prefill_wgmma()`), elsewhere mma.sync's: same
    arguments, same results within the tests' tolerances.
    """
    if getattr(q, "ndim", 0) != 3:
        raise ValueError(f"q must be (tokens, q_heads, head_dim), got {getattr(q, 'shape', '?')}")
    if not isinstance(chunk, Chunk) or not isinstance(plan, PrefillPlan):
        raise TypeError("chunk and plan must be an ops.Chunk and an ops.PrefillPlan")
    tokens, q_heads, d = q.shape
    if d not in HEAD_DIMS:
        raise ValueError(f"head_dim {d} is not supported (use one of {HEAD_DIMS})")
    dt, q_stride = shapes.rows(q, "q", (q_heads, d))
    shapes.tensor(out, "out", q.shape, dt)
    if shapes.overlap(q, out):
        raise ValueError("out must not overlap q")
    kv_heads = _cache(cache, dt, q_heads, d, q_heads)
    seq_slots, cu_seqlens, max_q_len = chunk.slots, chunk.cu_seqlens, chunk.max_q_len
    if getattr(seq_slots, "ndim", 0) != 1:
        raise ValueError("seq_slots must be (num_seqs,)")
    _int("seq_slots", seq_slots)
    _int("cu_seqlens", cu_seqlens, (seq_slots.shape[0] + 1,))
    num_seqs = shapes.count(chunk.seqs, seq_slots.shape[0], "num_seqs", symbols)
    n = shapes.count(chunk.n, tokens, "n", symbols)
    top = shapes.top(max_q_len, "max_q_len", symbols)
    if not 1 <= top <= tokens:
        raise ValueError(f"max_q_len reaches {top}; q holds {tokens} rows")
    s = scale if scale is not None else d**-0.5
    k_cache, block_tables = cache.k, cache.block_tables
    args = (q, k_cache, cache.v, block_tables, cache.seq_lens, cu_seqlens, seq_slots, out,
            num_seqs, q_heads, kv_heads, k_cache.shape[1], block_tables.shape[1], float(s),
            q_stride)
    tma = prefill_tma(k_cache.shape[1])
    if tma:
        unsplit, split = PREFILL90T, PREFILL90T_SPLIT
    elif prefill_wgmma():
        unsplit, split = PREFILL90, PREFILL90_SPLIT
    else:
        unsplit, split = PREFILL, PREFILL_SPLIT
    maps = kv_maps(k_cache, cache.v) if tma else ()
    rows = plan.rows
    if not plan.grouped:
        def run(v: int) -> None:
            r = rows or prefill_rows(v, d)
            unsplit[dt, d, r].launch((cdiv(max_q_len, r), q_heads, num_seqs), 2 * r,
                                     (*args, *maps), stream, smem=prefill_smem(r, d, tma),
                                     symbols=symbols)
        by_count(max_q_len if rows is None else top, run, lambda v: prefill_rows(v, d),
                 stream=stream, symbols=symbols)
        return
    capacity = block_tables.shape[1] * k_cache.shape[1]
    context, workspace = plan.context, plan.workspace
    if context is not None and not 1 <= shapes.top(context, "context", symbols) <= capacity:
        raise ValueError(f"context reaches {shapes.top(context, 'context', symbols)}; the "
                         f"block tables hold at most {capacity} tokens per sequence")
    group = q_heads // kv_heads
    cut = functools.partial(_grouped_plan, rows=rows, group=group, kv_heads=kv_heads,
                            splits=plan.splits, run_keys=plan.run_keys,
                            runs=context is not None)
    # run blocks to launch: enough for the longest sequence's runs (the count is monotone)
    longest = capacity if context is None else context

    def run(v: int) -> None:
        r, s_, keys = cut(v)
        need = workspace_floats(tokens, q_heads, d, s_) if s_ > 1 else 0
        if need and (getattr(workspace, "dtype", None) != np.float32 or workspace.size < need):
            raise ValueError(f"workspace must be float32 with at least {need} elements "
                             f"(workspace_floats(tokens, q_heads, head_dim, splits)); got "
                             f"{getattr(workspace, 'size', '?')}")
        ws = workspace if need else None  # one run: never read or written
        launched = row_runs(longest, s_, keys)
        split[dt, d, r].launch((cdiv(max_q_len, r // group), kv_heads * launched, num_seqs),
                               2 * r, (*args, ws, s_, keys, *maps), stream,
                               smem=prefill_smem(r, d, tma), symbols=symbols)
        if s_ == 1:
            return
        # symbolic: a grid of one (idle) block while one run suffices; the kernel exits then
        blocks = smax(1, smin(launched - 1, 1) * cdiv(n * q_heads, COMBINE_WARPS))
        PREFILL_COMBINE[dt, d].launch(blocks, 32 * COMBINE_WARPS,
                                      (ws, out, cu_seqlens, seq_slots, cache.seq_lens,
                                       num_seqs, q_heads, s_, keys), stream, symbols=symbols)
    by_count(max_q_len if plan.chunk_size is None else plan.chunk_size, run, cut,
             stream=stream, symbols=symbols)


def _grouped_plan(chunk: int, *, rows: int | None, group: int, kv_heads: int,
                  splits: int | None, run_keys: int, runs: bool) -> tuple[int, int, int]:
    """(query tile rows, splits, run_keys) of grouped prefill attention for chunks of
    `chunk` tokens: the rows and splits given, or those `grouped_rows` and (`runs`: with a
    context) `prefill_runs` give."""
    rows = rows or grouped_rows(chunk, group)
    _check_rows(rows)
    if group > rows:
        raise ValueError(f"grouped prefill attention puts a GQA group's {group} heads in a "
                         f"tile of {rows} rows: too many")
    if runs:
        splits, run_keys = prefill_runs(chunk, rows // group, kv_heads, multiprocessors())
    return rows, splits, run_keys


def _check_rows(rows: int) -> None:
    if rows not in PREFILL_ROWS:
        raise ValueError(f"rows = {rows}: the query tile is one of {PREFILL_ROWS}")
