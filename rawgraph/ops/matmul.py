"""Linear layers: y = x W^T (+ residual) with W in the checkpoint's [out, in] layout.

Decode-sized inputs take bandwidth-bound kernels that read W once for all rows: the GEMV up
to 16 rows (8 for wide weights), the skinny GEMM (both operands staged in shared memory) up
to 64 (on Hopper wgmma fed by TMA, whose 128-row x tile can take up to 128); larger ones
(prefill) the tensor-core GEMM (wgmma on Hopper, mma.sync elsewhere), tiled BM x BN with the
tile chosen so the grid fills the GPU; where the tiles are too few (65-128 decode rows, short
chunks), Hopper's splits each tile's k among a cluster of blocks. The residual add rides in
every kernel's epilogue; the GEMV's variants are `ops.gemv`'s, its fused epilogues
`ops.fused`'s. The kernel tables here are what the .cu files' wrappers are generated from
(`python -m rawgraph.ops.generate`).
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
from rawgraph.ops.gemv import GEMV, GEMV_QUANT, M_TILES, SMS, gemv_launch
from rawgraph.ops.quantized import Quantized, check_scratch, wide
from rawgraph.ops.quantized import check as check_weight
from rawgraph.ops.variant import by_count, chosen
from rawgraph.symbols import Symbols, cdiv, smin

_SIG = "const {t}* x, const {t}* w, const {t}* residual, {t}* y, int m, int n, int k"
SKINNY = {(dt, c): Kernel("skinny", f"skinny_{s}" + (f"_c{c}" if c > 1 else ""), _SIG.format(t=t))
          for dt, (s, t) in KERNEL_TYPES.items() for c in (1, 2, 4)}
SKINNY_ROWS, SKINNY_BK, SKINNY_SMEM = 64, 64, 5 * 16384  # skinny.cu: W rows per block, ring
SKINNY_MAX = 64  # rows of x the skinny GEMM takes (skinny.cu; on Hopper wgmma_skinny_to)
# the most rows a decode step takes: the GEMV to 16, the skinny GEMM to 64, the tiled GEMM
# (the prefill path, k split where its tiles are few) beyond; the buckets of a server's
# batches 65 to 256 (LLaMA-1B at 1,024 tokens holds 256 sequences' cache in 9 GB)
DECODE_ROWS = 256
GEMM_TILES = ((128, 256), (128, 128), (64, 128))  # (BM, BN), largest first (mma.sync's)
GEMM = {(dt, tile): Kernel("gemm", f"gemm_{s}_{tile[0]}x{tile[1]}", _SIG.format(t=t))
        for dt, (s, t) in KERNEL_TYPES.items() for tile in GEMM_TILES}
# The same tiles on Hopper's warpgroup tensor cores fed by TMA (x and W as descriptors,
# rawgraph.cuda.tensormap): 2.3-2.7x the mma.sync GEMM with cp.async loads, 1.0-1.4x more
# with TMA and a producer warp (benchmarks/NOTES.md, "Prefill")
_SIG90 = ("const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap, "
          "const {t}* residual, {t}* y, int m, int n, int k")
# Split k (clusters of c blocks sharing a tile, their sums added through distributed shared
# memory) for grids short of a wave: on the 128-row tiles. At decode's 65-128 rows each busy
# SM is bound by its own loads and MMAs (a 128 x 256 tile of 128 real rows is full tensor
# work), so what pays is more SMs on the k; but the sums cross between SMs at about 28 GB/s
# an SM (H200: a block of a 128 x 256 tile in 8 spends 4 of its 11.6 us reading 112 KiB of
# its peers' sums), so the narrower tiles, fewer sums, split fewer ways for as many SMs.
# The split tiles and what a split costs a block of each, in k tiles of its main loop: the
# ring's fill and drain and the cluster's sum of its fp32 tile. Fit on the H200, with
# TILE_SPEED, to a sweep of every tile and split at 128-2,048 rows through the LLaMA-1B and
# 8B weights (CUDA graphs; benchmarks/NOTES.md, "Split k"): the plans it makes are within
# 0.14% of the sweep's best on average, 3.8% at worst (1B o at 128 rows). 128 x 96 splits
# only: its narrower sums take the 128-row projections of widths 3,072-6,144 (8B qkv 64
# tiles in 2: 17.8 us against 21.5 for 64 x 128; 1B o 22 in 5, 7.5 against 8.0 for 128 x
# 128 in 6), but unsplit it was nowhere the fastest (1B qkv at 512 rows: 128 tiles 13.8 us,
# 96 of 128 x 128 13.4).
SPLIT_COST = {(128, 256): 6.0, (128, 192): 7.0, (128, 128): 5.0, (128, 96): 5.0}
SPLIT_TILES, GEMM_SPLITS = tuple(SPLIT_COST), (1, 2, 3, 4, 5, 6, 7, 8)
SPLIT_MIN_KTILES = 4  # k tiles (of 64) each block of a split takes at least: a ring's worth
# (Whether GEMMs split at all, `Variants.split_k`, and whether the wgmma GEMM's unsplit
# tiles run in a grid of at most one wave, each block looping over tiles with its ring
# running on so a tile's loads overlap the previous tile's stores, `Variants.persistent`:
# switches of ops.variant, for A/Bs.)
# The GEMM's kernels also take y's descriptor: unsplit tiles store through it (tma_stores)
_SIG90Y = _SIG90.replace("wmap, ", "wmap, const __grid_constant__ TensorMap ymap, ")
GEMM_STAGING = 16384  # bytes of staging for those stores a warpgroup (gemm_sm90.cu kStaging)
# The wgmma GEMM's tiles: mma.sync's and one 192 columns wide (wgmma's n runs in 8s to 256,
# the stores go in 64-column boxes), whose count fills a wave where the others leave SMs
# idle (H200, CUDA graphs, us: LLaMA-8B's qkv at 512 rows, 128 tiles of 128 x 192 36.7
# against 96 of 128 x 256 43.3; gate_up 180 against 198; 1B's qkv at 2,048 rows 36.6
# against 40.1 for 384 of 128 x 128). 128 x 64 lost on every LLaMA shape at 128-2,048 rows.
GEMM90_TILES = ((128, 256), (128, 192), (128, 128), (64, 128))
# (the unsplit tiles, c = 1, and the split tiles, c = 2..8: 128 x 96 splits only)
_GEMM90_FORMS = [(tile, 1) for tile in GEMM90_TILES] + [
    (tile, c) for tile in SPLIT_TILES for c in GEMM_SPLITS[1:]]
GEMM90 = {(dt, tile, c): Kernel("gemm_sm90", f"gemm90_{s}_{tile[0]}x{tile[1]}"
                                + (f"_c{c}" if c > 1 else ""), _SIG90Y.format(t=t))
          for dt, (s, t) in KERNEL_TYPES.items() for tile, c in _GEMM90_FORMS}
# The unsplit tiles with the MLP's SiLU(gate) * up in the epilogue (ops.fused.gate_up_silu)
GEMM90_SILU = {(dt, tile): Kernel("gemm_sm90", f"gemm90_{s}_{tile[0]}x{tile[1]}_silu",
                                  _SIG90Y.format(t=t))
               for dt, (s, t) in KERNEL_TYPES.items() for tile in GEMM90_TILES}
GEMM_THREADS, GEMM_STAGES, GEMM_BK = 256, 4, 32  # gemm.cu
# The wgmma GEMM's ring slots a tile (gemm_sm90.cu's S): four on the 128 x 128-256 tiles, whose
# slots are 32-48 KiB (and their stores' staging 32), six on 128 x 96 (28 KiB), so that each
# split block holds an SM alone, as split_slots() counts; eight on 64 x 128, so its block
# holds an SM alone with 192 KiB of loads in flight rather than two blocks of four slots (H200,
# CUDA graphs, us, 8 slots against 4: LLaMA-1B's qkv at 256 rows 9.3-9.4 against 10.0-10.5,
# o at 512 9.6 against 10.0; benchmarks/NOTES.md, "Split k"). Deeper rings on the 128-row
# tiles (6-7 slots beside the staging or the split's sums) measured level or slower.
GEMM90_STAGES = {(128, 256): 4, (128, 192): 4, (128, 128): 4, (128, 96): 6, (64, 128): 8}
# relative throughput of each tile on a busy SM (the H200, TMA GEMM, LLaMA shapes whose grids
# fill whole waves): the wider tile reads less shared memory per product (64 x 128's: from
# 0.88 it would take 8B gate_up at 256 rows, 27% slower than 128 x 256)
TILE_SPEED = {(128, 256): 1.0, (128, 192): 0.94, (128, 128): 0.88, (128, 96): 0.84,
              (64, 128): 0.86}
WIDE = 16384  # rows of W from which 9 to 16 rows of x take the skinny GEMM
# The skinny GEMM on Hopper's wgmma with W and x brought by TMA (skinny_sm90.cu, issue #28):
# x-row tiles of 32, 64 or 128 rows, rings of SKINNY90_STAGES slots, from
# `Variants.wgmma_skinny_from` rows (above SKINNY_MAX: skinny.cu on every row count, as other
# GPUs take it always). Alone it is ahead of skinny.cu on every LLaMA weight at 16 to 64 rows
# (H200, us at 32 rows: 8B qkv 17.5 vs 26.9, down 33.1 vs 47.0, gate_up 65.1 vs 73.1, LM head
# 256 vs 300), and the 8B decode step at 32 rows takes 6.11 ms instead of 8.01. At 9 to 16
# rows (gate_up and the LM head; the GEMV takes the rest) it wins too once the down
# projection's GEMV behind it launches plainly (`plain_after`; benchmarks/NOTES.md, "Skinny
# GEMM"). `Variants.wgmma_skinny_to` = 128 sends 65 to 128 rows to its x tile of 128 rows (W
# read once, 3 ring slots) instead of the tiled GEMM split k ways: off (64) until `bench
# kernels --only gemv` shows it ahead there.
SKINNY90_ROWS, SKINNY90_THREADS = (32, 64, 128), 160
# ring slots per (x tile, deep): as many as two blocks an SM hold, or (deep) as one block holds
# with the SM's whole shared memory, for grids of at most one block an SM (`skinny90_deep`)
SKINNY90_STAGES = {(mx, deep): slots for mx, two, one in ((32, 8, 18), (64, 5, 13), (128, 3, 8))
                   for deep, slots in ((False, two), (True, one))}
# (cluster, deep ring) forms: unclustered both ways; clusters of 2 always deep (their grids
# hold at most one block an SM); clusters of 4 never (one block an SM, only 30 clusters of 4
# are resident on the H200, and 1B's o and down are 32 of them)
SKINNY90_FORMS = ((1, False), (1, True), (2, True), (4, False))
SKINNY90 = {(dt, mx, c, deep): Kernel(
    "skinny_sm90", f"skinny90_{s}_x{mx}" + (f"_c{c}" if c > 1 else "_d" if deep else ""),
    _SIG90.format(t=t))
    for dt, (s, t) in KERNEL_TYPES.items() for mx in SKINNY90_ROWS for c, deep in SKINNY90_FORMS}
# The same with the MLP's SiLU(gate) * up in the epilogue (ops.fused.gate_up_silu)
SKINNY90_SILU = {key: Kernel("skinny_sm90", f"{k.name}_silu", k.declaration)
                 for key, k in SKINNY90.items()}


def takes_skinny(rows: int, n: int) -> bool:
    """Whether `rows` rows of x (no more than the skinny GEMM takes) through an n-row weight
    take the skinny GEMM rather than the GEMV: from 17 rows always (at 32 rows it beat the
    GEMV's 32-row tile on 10 of 12 LLaMA weights), from 9 for wide weights, whose many GEMV
    blocks each read all of x (16 rows on the H200, us: 1B gate_up 26.4 vs 22.1 for the
    skinny GEMM at 32 rows; 8B gate_up 91.4 vs 72.8, LM head 384 vs 317; but 8B down_proj
    37.4 vs 47.2)."""
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


def skinny90_smem(mx: int, deep: bool = False) -> int:
    """Dynamic shared memory of the wgmma skinny GEMM with an x tile of `mx` rows and the
    `deep` ring or not: each ring slot's 64 W rows and mx x rows of 128 bytes and its two
    8-byte barriers, then the block's fp32 sums (mx rows of 65)."""
    return (SKINNY90_STAGES[mx, deep] * ((SKINNY_ROWS + mx) * 128 + 16)
            + mx * (SKINNY_ROWS + 1) * 4)


def skinny90_deep(n: int, c: int) -> bool:
    """Whether the wgmma skinny GEMM through an n-row weight in clusters of c takes the deep
    ring (one block an SM): in clusters of 2, and unclustered where the grid holds at most
    one block an SM (8B qkv's 96 row blocks; with two blocks' rings half of each SM's shared
    memory sat empty)."""
    return c == 2 or (c == 1 and -(-n // SKINNY_ROWS) <= SMS)


def skinny_wgmma(rows: int) -> bool:
    """Whether up to `rows` rows on the skinny path take the wgmma form (skinny_sm90.cu)."""
    v = chosen()
    return hopper() and (rows >= v.wgmma_skinny_from or rows > SKINNY_MAX or v.skinny_always)


def skinny_gemm(dt: str, top: int, x: Any, w: Any, residual: Any, y: Any, m: Any, cap: int,
                stream: Any, symbols: Symbols | None, silu: bool = False) -> None:
    """Launch the skinny GEMM for up to `top` of x's `cap` rows (`m` of them used); `silu`:
    gate_up's SiLU epilogue into y (rows, n / 2), on the wgmma form only, which also takes
    more than 128 rows in tiles of 128 (W read once a tile)."""
    (n, k), wgmma = w.shape, skinny_wgmma(top)
    kernel, blocks, threads, smem, mx = skinny_launch(dt, top, n, k, wgmma, silu)
    a, b = (tile_map(x.data.ptr, cap, k, dt, mx), tile_map(w.data.ptr, n, k, dt, SKINNY_ROWS)
            ) if mx else (x, w)
    grid = (blocks, cdiv(m, mx)) if mx and top > SKINNY90_ROWS[-1] else blocks
    kernel.launch(grid, threads, (a, b, residual, y, m, n, k), stream, smem=smem,
                  symbols=symbols)


def skinny_tile(rows: int) -> int:
    """The wgmma skinny GEMM's x tile for up to `rows` rows: the least of SKINNY90_ROWS that
    holds them, else the largest (grid.y then takes the rest in more tiles)."""
    return next((r for r in SKINNY90_ROWS if r >= rows), SKINNY90_ROWS[-1])


def skinny_launch(dt: str, rows: int, n: int, k: int, wgmma: bool, silu: bool = False
                  ) -> tuple[Kernel, int, int, int, int]:
    """(kernel, blocks, threads, shared memory, x rows a TMA box takes (0: no TMA)) of the
    skinny GEMM for up to `rows` rows of x through an (n, k) weight; `silu`: the wgmma form
    with gate_up's epilogue."""
    c = skinny_cluster(n, k)
    blocks = -(-n // SKINNY_ROWS) * c
    if wgmma:
        mx = skinny_tile(rows)
        table, deep = SKINNY90_SILU if silu else SKINNY90, skinny90_deep(n, c)
        return table[dt, mx, c, deep], blocks, SKINNY90_THREADS, skinny90_smem(mx, deep), mx
    if silu:
        raise ValueError("the SiLU epilogue is the wgmma skinny GEMM's alone")
    return SKINNY[dt, c], blocks, 256, SKINNY_SMEM, 0


def gemm_plan(m: int, n: int, k: int, slots: dict[int, int] | None = None,
              tiles: tuple[tuple[int, int], ...] = GEMM_TILES) -> tuple[tuple[int, int], int]:
    """((BM, BN), c) for an (m, n) output over k: the tile (of `tiles`), and the blocks c
    that share each tile's k, whose speed (TILE_SPEED) times the share of the GPU's SMs busy
    in its last wave is highest, one block per SM counted. A 2048 x 3072 output is 192 tiles
    of 128 x 256 (1.45 waves: 0.68x cuBLAS on the H200) but 384 of 128 x 128 (2.9 waves:
    0.81x).

    `slots` (the wgmma GEMM's; `split_slots()`): blocks of a split tile one wave holds per
    split c. Given, the SPLIT_TILES may split where their c-block clusters all fit in one wave
    and each block takes at least SPLIT_MIN_KTILES k tiles, the speed scaled by kt / (kt +
    SPLIT_COST) for the kt k tiles a block takes. The busy share counts all the SMs, not the
    wave's slots: 15 clusters of 8 fill only 120 of the H200's 132. Decode's 128 rows through
    LLaMA-8B's o_proj are 32 tiles of 128 x 128, 3 blocks each on 96 SMs (H200: 13.2 us,
    against 14.4 for 22 of 128 x 192 in 5, 17.0 for 16 of 128 x 256 in 6 and 18.1 for 64
    unsplit tiles of 64 x 128)."""
    ktiles = -(-k // 64)

    def score(plan: tuple[tuple[int, int], int]) -> float:
        (bm, bn), c = plan
        blocks = -(-m // bm) * -(-n // bn) * c
        wave = slots[c] if c > 1 and slots else SMS
        share = 1.0 if c == 1 else ktiles / c / (ktiles / c + SPLIT_COST[bm, bn])
        return TILE_SPEED[bm, bn] * share * blocks / (-(-blocks // wave) * SMS)
    plans = [(tile, 1) for tile in tiles]
    if slots:
        for bm, bn in SPLIT_TILES:
            count = -(-m // bm) * -(-n // bn)  # the tile's
            plans += [((bm, bn), c) for c in GEMM_SPLITS[1:]
                      if count * c <= slots[c] and ktiles >= SPLIT_MIN_KTILES * c]
    return max(plans, key=score)  # the first of equals: the largest tile, unsplit


def device_plan(m: int, n: int, k: int) -> tuple[tuple[int, int], int]:
    """gemm_plan on this device: the wgmma GEMM's tiles and split k (as `Variants` allow) on
    Hopper, else mma.sync's tiles; planned for `Variants.gemm_rows` rows, when set, not m."""
    v = chosen()
    m = v.gemm_rows or m
    if not hopper():
        return gemm_plan(m, n, k)
    return gemm_plan(m, n, k, split_slots() if v.split_k else None,
                     v.gemm_tiles or GEMM90_TILES)


@functools.cache
def split_slots() -> dict[int, int]:
    """Blocks of the wgmma GEMM's split tiles that one wave holds on this GPU, per split
    c > 1: resident clusters x c (a cluster's blocks share a GPC: on the H200 132, 117, 120,
    110, 102, 105, 120 for c = 2 to 8, e.g. 30 clusters of 4 but 15 of 8). Counted for the
    first of SPLIT_TILES; a block of any of them takes over half an SM's shared memory, so
    the count is theirs too."""
    tile = SPLIT_TILES[0]
    threads = 2 * tile[0] + 32
    return {c: GEMM90["float16", tile, c].resident_clusters(threads, gemm_smem(tile, True, c),
                                                            c) * c
            for c in GEMM_SPLITS[1:]}


def gemm_smem(tile: tuple[int, int], wgmma: bool = False, c: int = 1) -> int:
    """Dynamic shared memory of a GEMM tile: the pipeline's stages of A and B tiles (k tiles
    of 32, or for the wgmma GEMM GEMM90_STAGES slots of k tiles of 64 with two 8-byte
    barriers each, and on its unsplit tiles (c = 1) a staging for their stores a warpgroup)."""
    if wgmma:
        staging = tile[0] // 64 * GEMM_STAGING if c == 1 else 0
        return GEMM90_STAGES[tile] * ((tile[0] + tile[1]) * 128 + 16) + staging
    return GEMM_STAGES * (tile[0] + tile[1]) * GEMM_BK * 2


@functools.cache
def hopper() -> bool:
    """Whether this device takes the wgmma GEMM (compute capability 9.0); else mma.sync."""
    return compute_capability() == (9, 0)


def gemm90_launch(dt: str, tile: tuple[int, int], c: int, x: Any, w: Any, residual: Any,
                  y: Any, m: Any, cap: int, stream: Any, symbols: Symbols | None,
                  silu: bool = False) -> None:
    """Launch the wgmma GEMM of a (BM, BN) tile split c ways over x's first m rows (x holds
    cap), w (n, k), with `silu` the gate_up epilogue (c = 1; y then (rows, n / 2)). One grid
    dimension: the kernel orders its tiles (and a tile's c blocks) itself."""
    (bm, bn), (n, k) = tile, w.shape
    kernel, threads, smem = gemm_launch(dt, tile, c, True, silu)
    tiles = cdiv(m, bm) * -(-n // bn)
    if c > 1:  # a cluster of c blocks a tile
        grid = (tiles * c,)
    elif chosen().persistent:  # at most one wave, each block looping over the tiles
        grid = (smin(tiles, _wave(kernel, threads, smem)),)
    else:
        grid = (tiles,)
    a, b = tile_map(x.data.ptr, cap, k, dt, bm), tile_map(w.data.ptr, n, k, dt, bn)
    cols = n // 2 if silu else n
    out = tile_map(y.data.ptr, cap, cols, dt, 64) if tma_stores(y, cols) else bytes(128)
    kernel.launch(grid, threads, (a, b, out, residual, y, m, n, k), stream, smem=smem,
                  symbols=symbols)


def tma_stores(y: Any, cols: int) -> bool:
    """Whether the wgmma GEMM stores its unsplit tiles' rows of y (`cols` a row) by TMA
    (gemm_sm90.cu's tma_stores): rows of whole 16-byte units, as a descriptor needs; else
    every store is direct."""
    return y.data.ptr % 16 == 0 and cols % 8 == 0


@functools.cache
def _wave(kernel: Kernel, threads: int, smem: int) -> int:
    return kernel.resident_blocks(threads, smem)


def gemm_launch(dt: str, tile: tuple[int, int], c: int, wgmma: bool, silu: bool = False
                ) -> tuple[Kernel, int, int]:
    """(kernel, threads, shared memory) of the GEMM for a (BM, BN) tile split c ways: on
    Hopper one warpgroup per 64 rows of the tile and a producer warp (TMA), `silu` its
    gate_up epilogue (unsplit); else 8 warps (c = 1 only, no epilogue)."""
    if wgmma:
        if silu and c != 1:
            raise ValueError(f"the SiLU epilogue is the unsplit tiles' (c = {c})")
        kernel = GEMM90_SILU[dt, tile] if silu else GEMM90[dt, tile, c]
        return kernel, 2 * tile[0] + 32, gemm_smem(tile, True, c)
    if c != 1 or silu:
        raise ValueError(f"split k (c = {c}) and the SiLU epilogue are the wgmma GEMM's alone")
    return GEMM[dt, tile], GEMM_THREADS, gemm_smem(tile)


def operands(x: Any, w: Any, m: Any, m_max: int | None, symbols: Symbols | None,
             scratch: Any = None) -> tuple[str, int, int, int, Any, int]:
    """Checks shared by the linear ops: (dtype, rows, n, k, m, the rows kernels are chosen
    for); `scratch` as `linear`'s."""
    if getattr(x, "ndim", 0) != 2 or getattr(w, "ndim", 0) != 2:
        raise ValueError(f"x must be (rows, k) and w (n, k); got {getattr(x, 'shape', '?')} and "
                         f"{getattr(w, 'shape', '?')}")
    (cap, k), (n, kw) = x.shape, w.shape
    if kw != k:
        raise ValueError(f"x has k = {k} columns but w is {w.shape} (w must be [out, in])")
    shapes.multiple(k, 8, "k")
    dt = shapes.tensor(x, "x")
    check_weight(w, dt)
    m = shapes.count(m, cap, "m", symbols)
    top = shapes.top(m, "m", symbols)
    if m_max is not None:
        if not top <= m_max <= cap:
            raise ValueError(f"m_max = {m_max} must lie in [{top}, {cap}] (m's bound, rows)")
        top = m_max
    if isinstance(w, Quantized):
        check_scratch(w, scratch, dt)
        if w.wide is None and scratch is None and path(top, n, True) != "gemv":
            wide(w, top)  # raises: refused before any launch, not at the count that needs it
    return dt, cap, n, k, m, top


def plain_after(rows: int, n: int, k: int, quantized: bool = False) -> bool:
    """Whether the kernel launched right after the projection of up to `rows` rows through
    an (n, k) weight should launch plainly (not programmatically): behind a wgmma skinny
    GEMM whose grid runs past one wave (two blocks an SM), a programmatic launch costs the
    step more than it saves (8B gate_up's 448 blocks, LM heads), and behind one wave or less
    it pays (1B gate_up's 256 blocks, clustered grids): same-run A/B in benchmarks/NOTES.md,
    "The programmatic chain". Behind the other kernels the chain pays. (`quantized`: of a
    quantized weight, `path`'s.)"""
    if path(rows, n, quantized) != "skinny" or not skinny_wgmma(rows):
        return False
    return -(-n // SKINNY_ROWS) * skinny_cluster(n, k) > 2 * SMS  # its launch bounds' 2


def path(rows: int, n: int, quantized: bool = False) -> str:
    """The kernel family for up to `rows` rows of x through an n-row weight: 'gemv',
    'skinny' or 'gemm' (always, where `Variants.gemm_rows` is set), or 'skinny' always on
    Hopper under `Variants.skinny_always`. A `quantized` weight (`ops.quantized`) takes the
    GEMV up to 16 rows whatever its width: the skinny GEMM would read its 16-bit copy, or
    dequantize it first, 2-4x the bytes its GEMV reads."""
    if chosen().skinny_always and hopper():
        return "skinny"
    if chosen().gemm_rows is not None:
        return "gemm"
    if rows > SKINNY_MAX and not (rows <= chosen().wgmma_skinny_to and hopper()):
        return "gemm"
    if quantized and rows <= M_TILES[-1]:
        return "gemv"
    return "skinny" if takes_skinny(rows, n) else "gemv"


def path_of(w: Any, rows: int) -> str:
    """`path` for weight w (16-bit, or a quantized record)."""
    return path(rows, w.shape[0], isinstance(w, Quantized))


def keeps_row_max(rows: int, n: int, quantized: bool = False) -> bool:
    """Whether `linear(..., row_max=)` can keep each row's greedy pick for up to `rows` rows
    through an n-row weight (`quantized` as for `path`; the GEMV path does; `sample` then
    skips its pass for greedy rows)."""
    return path(rows, n, quantized) == "gemv"


def linear_key(rows: int, n: int, k: int, fmt: str | None = None) -> tuple:
    """What `linear` launches for `rows` rows of x through an (n, k) weight (`fmt`: a
    quantized record's format, `ops.quantized`): the path and its variant (the GEMV's x tile
    and form, the skinny GEMM's form and x tile, the GEMM's tile and split). Row counts with
    equal keys launch the same kernels."""
    kind = path(rows, n, fmt is not None)
    if kind == "gemv":
        return kind, gemv_launch("float16", rows, n, k, fmt)[0][1:]
    if kind == "skinny":
        wgmma = skinny_wgmma(rows)
        return kind, wgmma, skinny_tile(rows) if wgmma else 0
    return kind, device_plan(rows, n, k)


def linear(x: Any, w: Any, y: Any, *, residual: Any = None, m: Any = None,
           m_max: int | None = None, row_max: Any = None, scratch: Any = None,
           stream: Any = None, symbols: Symbols | None = None) -> None:
    """y[:m] = x[:m] @ w.T (+ residual[:m]); x (rows, k), w (n, k), y (rows, n); w 16-bit
    as x, or a quantized record (`ops.Fp8Weight`, `ops.Int4Weight`: its GEMV form on the
    GEMV path; elsewhere its 16-bit copy, or without one the weight dequantized into
    `scratch`, a 1-D array of x's dtype of at least n k values, `ops.quantized.wide`).

    `m` (default: all rows) may be symbolic. The kernel (GEMV, skinny GEMM or GEMM), its row
    tile and split are chosen for `m_max` rows when given (the bound the engine's graphs
    and their eager runs share: the same kernels whatever m is), else for m's value: a
    symbolic m captured over a range that reaches several variants records each, and the
    graph runs the one m's value takes (`ops.variant.by_count`), so a patched graph gives
    the bits an eager call at that m gives. Different variants round differently.

    `row_max` (uint64 (rows,), zeros or `sample`'s leftovers; GEMV path only): also each
    row's greedy pick of y, merged by the blocks as they finish (an LM head whose `sample`
    then needs no pass over the logits for greedy rows; gemv.cu).
    """
    dt, cap, n, k, m, top = operands(x, w, m, m_max, symbols, scratch)
    shapes.tensor(y, "y", (cap, n), dt, align=2)
    if residual is not None:
        shapes.tensor(residual, "residual", (cap, n), dt, align=2)
    if shapes.overlap(x, y):
        raise ValueError("y must not overlap x (other blocks still read x while y is written)")
    kind = path_of(w, top)  # the path of the most rows: fewer take the GEMV, then the skinny
    if row_max is not None:
        shapes.row_array(row_max, "row_max", np.uint64, cap)
        if kind != "gemv":
            raise ValueError(f"row_max: only the GEMV keeps each row's pick (up to "
                             f"{M_TILES[-1]} rows), not the {kind} path of {top} rows")
    if kind == "gemm":
        shapes.multiple(n, 2, "n")  # the GEMM stores pairs of outputs

    def run(rows: int) -> None:
        launch_linear(dt, rows, x, w, residual, y, m, cap, row_max, stream, symbols, scratch)
    fmt = w.fmt if isinstance(w, Quantized) else None
    by_count(m if m_max is None else m_max, run, lambda v: linear_key(v, n, k, fmt),
             stream=stream, symbols=symbols)


def launch_linear(dt: str, rows: int, x: Any, w: Any, residual: Any, y: Any, m: Any, cap: int,
                  row_max: Any, stream: Any, symbols: Symbols | None,
                  scratch: Any = None) -> None:
    """Launch what `linear` takes for `rows` rows (m of x's cap rows used; checked by
    `linear`)."""
    n, k = w.shape
    kind = path_of(w, rows)
    if kind == "gemv" and isinstance(w, Quantized):
        key, grid, threads = gemv_launch(dt, rows, n, k, w.fmt)
        GEMV_QUANT[w.fmt][0][key].launch(grid, threads, (x, *w.args(), residual, y, m, n, k,
                                                         row_max), stream, symbols=symbols)
        return
    w = wide(w, rows, scratch, stream=stream, symbols=symbols)
    if kind == "gemm":
        tile, c = device_plan(rows, n, k)
        if hopper():
            gemm90_launch(dt, tile, c, x, w, residual, y, m, cap, stream, symbols)
        else:
            kernel, threads, smem = gemm_launch(dt, tile, c, False)
            grid = (-(-n // tile[1]), cdiv(m, tile[0]))
            kernel.launch(grid, threads, (x, w, residual, y, m, n, k), stream, smem=smem,
                          symbols=symbols)
    elif kind == "skinny":
        skinny_gemm(dt, rows, x, w, residual, y, m, cap, stream, symbols)
    else:
        key, grid, threads = gemv_launch(dt, rows, n, k)
        GEMV[key].launch(grid, threads, (x, w, residual, y, m, n, k, row_max), stream,
                         symbols=symbols)
