"""Linear layers: y = x W^T (+ residual) with W in the checkpoint's [out, in] layout.

Decode-sized inputs take bandwidth-bound kernels that read W once for all rows: the GEMV up
to 16 rows (8 for wide weights), the skinny GEMM (both operands staged in shared memory) up
to 64; larger ones (prefill) the tensor-core GEMM (wgmma on Hopper, mma.sync elsewhere),
tiled BM x BN with the tile chosen so the grid fills the GPU.
Fused forms are weights stacked at load time (QKV as one matrix, gate+up as one), the
residual add in the epilogue, and in the GEMV's epilogue the MLP's SiLU(gate) * up
(`gate_up_silu`) and the attention's RoPE + cache append (`qkv_rope`).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from rawgraph.cuda.device import compute_capability
from rawgraph.cuda.kernel import Kernel
from rawgraph.cuda.tensormap import tile_map
from rawgraph.dtypes import KERNEL_TYPES
from rawgraph.ops import shapes
from rawgraph.ops.elementwise import GATE_UP_GROUP, silu_mul
from rawgraph.ops.kv import qkv_views, rope_append, rope_append_args
from rawgraph.ops.norm import rmsnorm
from rawgraph.symbols import Symbols, cdiv

M_TILES = (8, 16)  # GEMV x tiles; 17 to 64 rows take the skinny GEMM
_SIG = "const {t}* x, const {t}* w, const {t}* residual, {t}* y, int m, int n, int k"
# (cluster, k chunks in flight per lane, W in 128-byte row segments through a transpose,
# warps per block) of the GEMV variants, by x tile (gemv.cu)
VARIANTS = {8: ((1, 8, False, 8), (1, 8, True, 8), (1, 4, True, 8), (1, 8, True, 16)),
            16: ((1, 4, False, 8), (4, 4, False, 8), (1, 4, True, 16))}
GEMV = {(dt, m, *v): Kernel("gemv", f"gemv_{s}_n{m}" + (f"_c{v[0]}" if v[0] > 1 else "") +
                            (f"_w{v[3]}" if v[3] != 8 else "") + f"_u{v[1]}" +
                            ("_t" if v[2] else ""),
                            _SIG.format(t=t) + ", unsigned long long* row_max")
        for dt, (s, t) in KERNEL_TYPES.items() for m in M_TILES for v in VARIANTS[m]}
# the same GEMVs with SiLU(gate) * up in the epilogue (the interleaved gate_up weight)
GEMV_SILU = {key: Kernel("gemv", k.name + "_silu",
                         "const {t}* x, const {t}* w, {t}* y, int m, int n, int k, "
                         "float norm_eps".format(
                             t=KERNEL_TYPES[key[0]][1]))
             for key, k in GEMV.items()}
# ... and the QKV projection's with RoPE and the cache append in the epilogue
_SIG_ROPE = ("const {t}* x, const {t}* w, {t}* y, int m, int n, int k, {t}* k_cache, "
             "{t}* v_cache, const int* block_tables, const int* seq_slots, "
             "const int* positions, const float* inv_freq, int q_size, int kv_size, "
             "int head_dim, int block_size, int max_blocks, float norm_eps")
GEMV_ROPE = {key: Kernel("gemv", k.name + "_rope", _SIG_ROPE.format(t=KERNEL_TYPES[key[0]][1]))
             for key, k in GEMV.items()}
SKINNY = {(dt, c): Kernel("skinny", f"skinny_{s}" + (f"_c{c}" if c > 1 else ""), _SIG.format(t=t))
          for dt, (s, t) in KERNEL_TYPES.items() for c in (1, 2, 4)}
SKINNY_ROWS, SKINNY_BK, SKINNY_SMEM = 64, 64, 5 * 16384  # skinny.cu: W rows per block, ring
GEMM_TILES = ((128, 256), (128, 128), (64, 128))  # (BM, BN), largest first
GEMM = {(dt, tile): Kernel("gemm", f"gemm_{s}_{tile[0]}x{tile[1]}", _SIG.format(t=t))
        for dt, (s, t) in KERNEL_TYPES.items() for tile in GEMM_TILES}
# The same tiles on Hopper's warpgroup tensor cores fed by TMA (x and W as descriptors,
# rawgraph.cuda.tensormap): 2.3-2.7x the mma.sync GEMM with cp.async loads, 1.0-1.4x more
# with TMA and a producer warp (benchmarks/NOTES.md, "Prefill")
_SIG90 = ("const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap, "
          "const {t}* residual, {t}* y, int m, int n, int k")
GEMM90 = {(dt, tile): Kernel("gemm_sm90", f"gemm90_{s}_{tile[0]}x{tile[1]}", _SIG90.format(t=t))
          for dt, (s, t) in KERNEL_TYPES.items() for tile in GEMM_TILES}
GEMM_THREADS, GEMM_STAGES, GEMM_BK = 256, 4, 32  # gemm.cu; GEMM_STAGES also gemm_sm90.cu's
# relative throughput of each tile on a busy SM (the H200, TMA GEMM, LLaMA shapes whose grids
# fill whole waves): the wider tile reads less shared memory per product
TILE_SPEED = {(128, 256): 1.0, (128, 128): 0.9, (64, 128): 0.7}
SMS = 132  # H200; steers tile and cluster choices only (any value is correct)
GEMV_ROWS = 16  # rows of W per GEMV block (gemv.cu)
FULL_GRID = 512  # blocks that keep all 132 SMs streaming
LONG_ROWS = 8192  # measured on the H200: from here grids of few blocks split k between
# more warps (16-warp blocks at one block per SM, clusters of 4 for the 16-row tile)
MID_ROWS = 4096  # rows from which one to two GEMV blocks per SM read W in segments
WIDE = 16384  # rows of W from which 9 to 16 rows of x take the skinny GEMM


def gemv_variant(n: int, k: int, tile: int = 8) -> tuple[int, int, bool, int]:
    """(cluster, chunks in flight per lane, segments, warps per block) of the GEMV for an
    (n, k) weight and an x tile; `segments`: W read in 128-byte row segments through a
    transpose in shared memory (gemv.cu), else in the mma fragments' 64-byte pieces.

    Chosen where it counts, by the decode graph's GPU time in the programmatic chain
    (benchmarks/NOTES.md, "Decode GEMV"), up to 8 rows:
    - at most one block per SM, rows of 8192 and longer: 16 warps with 8 in flight in
      segments (the whole register file: 128 KB of W in flight per SM; the warps hide each
      other's transposes);
    - at most one block per SM, shorter rows: 8 warps with 8 in flight in 64-byte pieces
      (each block prefetches 64 KB of W while the kernel before it ends, and no other warp
      would hide a transpose);
    - one to two blocks per SM: 8 in flight (2 blocks per SM), in segments for rows of 4096
      and longer (segments stream faster than pieces);
    - more than two blocks per SM: 4 in flight in segments (80 registers, 3 blocks per SM),
      whose extra warps hide the transpose.
    16 rows: 64-byte pieces, in clusters of 4 when n gives too few blocks and rows are long;
    at most one block per SM on rows of 8192 and longer, 16 warps in segments instead."""
    blocks = -(-n // GEMV_ROWS)
    if tile == 8:
        if blocks > 2 * SMS:
            return 1, 4, True, 8
        if blocks <= SMS and k >= LONG_ROWS:
            return 1, 8, True, 16
        return 1, 8, blocks > SMS and k >= MID_ROWS, 8
    if k < LONG_ROWS or blocks >= FULL_GRID:
        return 1, 4, False, 8
    return (1, 4, True, 16) if blocks <= SMS else (4, 4, False, 8)


def takes_skinny(rows: int, n: int) -> bool:
    """Whether `rows` (at most SKINNY_ROWS) rows of x through an n-row weight take the skinny
    GEMM rather than the GEMV: from 17 rows always (at 32 rows it beat the GEMV's 32-row tile
    on 10 of 12 LLaMA weights), from 9 for wide weights, whose many GEMV blocks each read all
    of x (16 rows on the H200, us: 1B gate_up 26.4 vs 22.1 for the skinny GEMM at 32 rows;
    8B gate_up 91.4 vs 72.8, LM head 384 vs 317; but 8B down_proj 37.4 vs 47.2)."""
    return rows > M_TILES[-1] or (rows > M_TILES[0] and n >= WIDE)


def skinny_cluster(n: int, k: int) -> int:
    """Blocks sharing 64 rows of W in the skinny GEMM (splitting its k tiles): the largest of
    4 and 2 that still gives at most one block per SM, else none. Measured on the H200 at
    64 rows: LLaMA-1B's o_proj (32 row blocks) 9.6 us with 4, 10.7 with 2; LLaMA-8B's
    (64 row blocks) 17.1 us with 2, 23.2 with 4."""
    blocks, ktiles = -(-n // SKINNY_ROWS), -(-k // SKINNY_BK)
    for c in (4, 2):
        if blocks * c <= SMS and c <= ktiles:
            return c
    return 1


def gemm_tile(m: int, n: int) -> tuple[int, int]:
    """(BM, BN) for an (m, n) output: the tile whose speed (TILE_SPEED) times the share of its
    last wave's SMs that have a block is highest, one block per SM counted. A 2048 x 3072
    output is 192 tiles of 128 x 256 (1.45 waves: 0.68x cuBLAS on the H200) but 384 of 128 x
    128 (2.9 waves: 0.81x); a 512 x 2048 one only 32 of 128 x 256."""
    def score(tile: tuple[int, int]) -> float:
        tiles = -(-m // tile[0]) * -(-n // tile[1])
        return TILE_SPEED[tile] * tiles / (-(-tiles // SMS) * SMS)
    return max(GEMM_TILES, key=score)  # the first (largest) of equals


def gemm_smem(tile: tuple[int, int], wgmma: bool = False) -> int:
    """Dynamic shared memory of a GEMM tile: the pipeline's stages of A and B tiles (k tiles
    of 32, or of 64 for the wgmma GEMM, whose stages also have two 8-byte barriers each)."""
    if wgmma:
        return GEMM_STAGES * ((tile[0] + tile[1]) * 128 + 16)
    return GEMM_STAGES * (tile[0] + tile[1]) * GEMM_BK * 2


@functools.cache
def hopper() -> bool:
    """Whether this device takes the wgmma GEMM (compute capability 9.0); else mma.sync."""
    return compute_capability() == (9, 0)


def gemm_launch(dt: str, tile: tuple[int, int], wgmma: bool) -> tuple[Kernel, int, int]:
    """(kernel, threads, shared memory) of the GEMM for a (BM, BN) tile: on Hopper one
    warpgroup per 64 rows of the tile and a producer warp (TMA), else 8 warps."""
    if wgmma:
        return GEMM90[dt, tile], 2 * tile[0] + 32, gemm_smem(tile, True)
    return GEMM[dt, tile], GEMM_THREADS, gemm_smem(tile)


def _operands(x: Any, w: Any, m: Any, m_max: int | None,
              symbols: Symbols | None) -> tuple[str, int, int, int, Any, int]:
    """Checks shared by the linear ops: (dtype, rows, n, k, m, the rows kernels are chosen
    for)."""
    if getattr(x, "ndim", 0) != 2 or getattr(w, "ndim", 0) != 2:
        raise ValueError(f"x must be (rows, k) and w (n, k); got {getattr(x, 'shape', '?')} and "
                         f"{getattr(w, 'shape', '?')}")
    (cap, k), (n, kw) = x.shape, w.shape
    if kw != k:
        raise ValueError(f"x has k = {k} columns but w is {w.shape} (w must be [out, in])")
    shapes.multiple(k, 8, "k")
    dt = shapes.tensor(x, "x")
    shapes.tensor(w, "w", dtype=dt)
    m = shapes.count(m, cap, "m", symbols)
    top = shapes.top(m, "m", symbols)
    if m_max is not None:
        if not top <= m_max <= cap:
            raise ValueError(f"m_max = {m_max} must lie in [{top}, {cap}] (m's bound, rows)")
        top = m_max
    return dt, cap, n, k, m, top


def path(rows: int, n: int) -> str:
    """The kernel family for up to `rows` rows of x through an n-row weight: 'gemv',
    'skinny' or 'gemm'."""
    if rows > SKINNY_ROWS:
        return "gemm"
    return "skinny" if takes_skinny(rows, n) else "gemv"


def linear(x: Any, w: Any, y: Any, *, residual: Any = None, m: Any = None,
           m_max: int | None = None, row_max: Any = None, stream: Any = None,
           symbols: Symbols | None = None) -> None:
    """y[:m] = x[:m] @ w.T (+ residual[:m]); x (rows, k), w (n, k), y (rows, n).

    `m` (default: all rows) may be symbolic; the kernel (GEMV, skinny GEMM or GEMM) and its
    row tile are chosen for the largest value m can take, so a patch never needs another
    kernel: it changes m and, for the GEMM, grid.y. `m_max` makes the choice for a larger
    bound than m's own (an eager run that must launch what a graph for m_max rows would).

    `row_max` (uint64 (rows,), zeros or `sample`'s leftovers; GEMV path only): also each
    row's greedy pick of y, merged by the blocks as they finish (an LM head whose `sample`
    then needs no pass over the logits for greedy rows; gemv.cu).
    """
    dt, cap, n, k, m, top = _operands(x, w, m, m_max, symbols)
    shapes.tensor(y, "y", (cap, n), dt, align=2)
    if residual is not None:
        shapes.tensor(residual, "residual", (cap, n), dt, align=2)
    if shapes.overlap(x, y):
        raise ValueError("y must not overlap x (other blocks still read x while y is written)")
    kind = path(top, n)
    if row_max is not None:
        shapes.row_array(row_max, "row_max", np.uint64, cap)
        if kind != "gemv":
            raise ValueError(f"row_max: only the GEMV keeps each row's pick (up to "
                             f"{M_TILES[-1]} rows), not the {kind} path of {top} rows")
    if kind == "gemm":
        shapes.multiple(n, 2, "n")  # the GEMM stores pairs of outputs
        bm, bn = gemm_tile(top, n)
        wgmma = hopper()
        kernel, threads, smem = gemm_launch(dt, (bm, bn), wgmma)
        if wgmma:  # one dimension: the kernel orders its tiles itself
            grid = (cdiv(m, bm) * -(-n // bn),)
            a, b = tile_map(x.data.ptr, cap, k, dt, bm), tile_map(w.data.ptr, n, k, dt, bn)
        else:
            grid, a, b = (-(-n // bn), cdiv(m, bm)), x, w
        kernel.launch(grid, threads, (a, b, residual, y, m, n, k), stream, smem=smem,
                      symbols=symbols)
    elif kind == "skinny":
        c = skinny_cluster(n, k)
        SKINNY[dt, c].launch(-(-n // SKINNY_ROWS) * c, 256, (x, w, residual, y, m, n, k), stream,
                             smem=SKINNY_SMEM, symbols=symbols)
    else:
        key, grid, threads = _gemv(dt, top, n, k)
        GEMV[key].launch(grid, threads, (x, w, residual, y, m, n, k, row_max), stream,
                         symbols=symbols)


def _gemv(dt: str, top: int, n: int, k: int) -> tuple[tuple, int, int]:
    """(GEMV key (dtype, x tile, *gemv_variant), grid, threads) for up to `top` rows."""
    tile = next(t for t in M_TILES if t >= top)
    c, u, seg, warps = gemv_variant(n, k, tile)
    return (dt, tile, c, u, seg, warps), -(-n // GEMV_ROWS) * c, 32 * warps


def _normed(x: Any, dt: str, norm_eps: float | None, normed: Any, m: Any, kind: str,
            stream: Any, symbols: Symbols | None) -> tuple[Any, float]:
    """(the x a projection reads, the GEMV's norm_eps argument) for a projection of
    rmsnorm(x) without its weight (norm_eps given; the weight is folded into w). The GEMV
    scales its sums by each row's 1 / rms (one kernel); the other paths normalize into
    `normed` (x's shape) first."""
    if norm_eps is None:
        return x, -1.0
    if not norm_eps >= 0:
        raise ValueError(f"norm_eps = {norm_eps}: RMSNorm's epsilon must be >= 0")
    if kind == "gemv":
        return x, float(norm_eps)
    if normed is None:
        raise ValueError("pass `normed` (x's shape): this path normalizes x ahead of the "
                         "projection")
    shapes.tensor(normed, "normed", x.shape, dt)
    if shapes.overlap(x, normed):
        raise ValueError("normed must not overlap x")
    rmsnorm(x, None, normed, rows=m, eps=norm_eps, stream=stream, symbols=symbols)
    return normed, -1.0


def qkv_rope(x: Any, w: Any, qkv: Any, k_cache: Any, v_cache: Any, block_tables: Any,
             seq_slots: Any, positions: Any, freqs: Any, *, heads: int, head_dim: int,
             m: Any = None, m_max: int | None = None, norm_eps: float | None = None,
             normed: Any = None, stream: Any = None, symbols: Symbols | None = None) -> None:
    """The attention's input projection with RoPE and the cache append of its m tokens:
    qkv[:m] = x[:m] @ w.T for the stacked q, k, v weight w ((heads + 2 kv_heads) * head_dim,
    k), then `rope_append` on qkv's q, k, v (`qkv_views`): q rotated in place, k rotated
    into k_cache (qkv keeps it as projected), v copied into v_cache.

    On the GEMV path (decode-sized m) one kernel does all of it, the append in its epilogue,
    with the same bits as the two kernels the other paths run. `m`, `m_max` as for
    `linear`; seq_slots, positions (tokens,) as for `rope_append`, and like `freqs` and
    block_tables ready before the previous kernel on the stream starts (the GEMV reads them
    while it waits for that kernel, under programmatic dependent launch).

    `norm_eps`: project rmsnorm(x) without its weight instead of x (the input norm's weight
    folded into w, `fold_norm`): the GEMV multiplies its sums by each row's 1 / rms, in the
    same kernel; the other paths first write rmsnorm(x) into `normed` (x's shape).
    """
    dt, cap, n, k, m, top = _operands(x, w, m, m_max, symbols)
    shapes.tensor(qkv, "qkv", (cap, n), dt, align=2)
    q, kn, vn = qkv_views(qkv, heads, head_dim)
    _, _, (_, _, d, _, _, block_size, max_blocks) = rope_append_args(
        q, kn, vn, k_cache, v_cache, block_tables, seq_slots, positions, freqs)
    if shapes.overlap(x, qkv):
        raise ValueError("qkv must not overlap x (other blocks still read x while it is written)")
    kind = "gemv" if path(top, n) == "gemv" and d % GEMV_ROWS == 0 else "other"
    x, eps = _normed(x, dt, norm_eps, normed, m, kind, stream, symbols)
    if kind != "gemv":
        linear(x, w, qkv, m=m, m_max=m_max, stream=stream, symbols=symbols)
        rope_append(q, kn, vn, k_cache, v_cache, block_tables, seq_slots, positions, freqs, m,
                    stream=stream, symbols=symbols)
        return
    key, grid, threads = _gemv(dt, top, n, k)
    GEMV_ROPE[key].launch(grid, threads, (x, w, qkv, m, n, k, k_cache, v_cache, block_tables,
                                          seq_slots, positions, freqs, heads * d, kn.shape[1],
                                          d, block_size, max_blocks, eps), stream,
                          symbols=symbols)


def gate_up_silu(x: Any, w: Any, gu: Any, out: Any, *, m: Any = None, m_max: int | None = None,
                 norm_eps: float | None = None, normed: Any = None, stream: Any = None,
                 symbols: Symbols | None = None) -> None:
    """out[:m] = silu(x W_gate^T) * (x W_up^T) for the MLP's fused gate_up weight w
    (2 * inter, k), rows interleaved as `stack_gate_up` stacks them; out (rows, inter).

    Decode-sized m (the GEMV) finishes each output in the GEMV's epilogue: one kernel, and
    `gu` is not touched. Otherwise the projection goes to `gu` (rows, 2 * inter) and
    silu_mul follows. Either way the same bits (both round the projection to the storage
    type first). `m`, `m_max` as for `linear`; `norm_eps`, `normed` as for `qkv_rope` (the
    post-attention norm's weight folded into w).
    """
    dt, cap, n, k, m, top = _operands(x, w, m, m_max, symbols)
    shapes.multiple(n, 2 * GATE_UP_GROUP, "gate_up rows")
    shapes.tensor(gu, "gu", (cap, n), dt)
    shapes.tensor(out, "out", (cap, n // 2), dt)
    if shapes.overlap(x, out):
        raise ValueError("out must not overlap x (other blocks still read x while it is written)")
    kind = path(top, n)
    x, eps = _normed(x, dt, norm_eps, normed, m, kind, stream, symbols)
    if kind != "gemv":
        linear(x, w, gu, m=m, m_max=m_max, stream=stream, symbols=symbols)
        silu_mul(gu, out, rows=m, stream=stream, symbols=symbols)
        return
    key, grid, threads = _gemv(dt, top, n, k)
    GEMV_SILU[key].launch(grid, threads, (x, w, out, m, n, k, eps), stream, symbols=symbols)
