"""Launch planning of the ops, without a GPU: linear kernels, clusters and tiles; attention
splits."""

import importlib
import math

import pytest

from rawgraph.ops import matmul
from rawgraph.ops.attention import (
    LONG_SPLIT,
    MAX_PREFILL_SPLITS,
    RUN_KEYS,
    SHORT_SPLITS,
    SPLIT_ALIGN,
    SPLIT_WAVES,
    decode_splits,
    grid_splits,
    grouped_rows,
    prefill_rows,
    prefill_runs,
    row_runs,
    row_splits,
)
from rawgraph.ops.gemv import M_TILES, VARIANTS, gemv_f8_variant, gemv_i4_variant, gemv_variant
from rawgraph.ops.matmul import (
    GEMM90_TILES,
    GEMM_SPLITS,
    GEMM_TILES,
    SKINNY90_STAGES,
    SKINNY_ROWS,
    SPLIT_TILES,
    gemm_plan,
    gemm_smem,
    skinny90_deep,
    skinny90_smem,
    skinny_cluster,
    skinny_launch,
    takes_skinny,
)
from rawgraph.ops.norm import WARP_ROWS, rmsnorm_launch
from rawgraph.ops.variant import DEFAULT, choose
from rawgraph.symbols import Range, Symbols

WARP_ROWS_FROM = DEFAULT.norm_warp_rows_from


def test_fp8_gemv_variant_follows_the_16_bit_rule_by_a_rows_bytes():
    # an FP8 row of k codes is k bytes: the 16-bit rule's thresholds at twice the k
    assert gemv_f8_variant(2048, 16384) == (4, True, 16)  # 128 blocks, 16 KB rows
    assert gemv_f8_variant(2048, 8192) == (4, True, 8)  # 8 KB rows: segments, 8 warps
    assert gemv_f8_variant(2048, 2048) == (4, False, 8)  # short rows: 64-byte pieces
    assert gemv_f8_variant(8192, 2048) == (4, True, 8)  # 512 blocks: segments
    assert gemv_f8_variant(2048, 16384, 16) == (2, True, 16)
    assert gemv_f8_variant(4096, 4096, 16) == (2, True, 8)


def test_int4_gemv_variant_follows_the_16_bit_rule_by_a_rows_bytes():
    # a 4-bit row of k values is k / 2 bytes; 4 chunks in flight in pieces, 2 in segments
    assert gemv_i4_variant(2048, 2048) == (4, False, 8)  # 128 blocks, 1 KB rows
    assert gemv_i4_variant(2048, 16384) == (2, True, 8)  # 8 KB rows: segments
    assert gemv_i4_variant(2048, 32768) == (2, True, 16)  # 16 KB rows, one block an SM
    assert gemv_i4_variant(8192, 2048) == (2, True, 8)  # 512 blocks: segments
    assert gemv_i4_variant(4096, 4096, 16) == (2, True, 8)


def test_gemv_variant_for_long_rows_wide_blocks_and_waves():
    # up to 8 rows: 8 chunks in flight per lane up to two blocks per SM, in 64-byte pieces
    # up to one block per SM (and for rows under 4096), else in 128-byte row segments; at
    # most one block per SM with rows of 8192 and longer: 16 warps in segments; more than
    # two blocks per SM: 4 in flight in segments (80 registers: 3 blocks per SM)
    assert gemv_variant(2048, 8192) == (8, True, 16)  # 128 blocks: at most one per SM
    assert gemv_variant(2112, 8192) == (8, True, 16)  # 132 blocks: one per SM
    assert gemv_variant(2048, 8184) == (8, False, 8)  # rows just under 8192
    assert gemv_variant(4096, 14336) == (8, True, 8) == gemv_variant(4096, 4096)  # 256
    assert gemv_variant(3072, 2048) == (8, False, 8)  # 192 blocks, rows of 2048
    assert gemv_variant(2200, 8192) == (8, True, 8)  # 138 blocks: just over one per SM
    assert gemv_variant(8192, 28672) == (4, True, 8)  # 512 blocks
    assert gemv_variant(2048, 2048) == (8, False, 8)
    assert gemv_variant(16384, 2048) == (4, True, 8)
    assert gemv_variant(6144, 4096) == (4, True, 8)  # 384 blocks: one wave at 3 per SM
    assert gemv_variant(64, 264) == (8, False, 8)
    assert gemv_variant(128256, 4096) == (4, True, 8)
    # 16 rows: 4 in flight in segments; at most one block per SM with rows of 8192 and
    # longer: 16 warps, else 8 (two blocks per SM)
    assert gemv_variant(2048, 8192, 16) == (4, True, 16)  # 128 blocks
    assert gemv_variant(4096, 14336, 16) == (4, True, 8)  # 256 blocks
    assert gemv_variant(8208, 8192, 16) == (4, True, 8)  # 514 blocks
    assert gemv_variant(6144, 4096, 16) == (4, True, 8)
    assert gemv_variant(2048, 4096, 16) == (4, True, 8)  # rows under 8192
    for tile in M_TILES:  # every choice has a kernel
        for n, k in ((64, 264), (2048, 8192), (3072, 2048), (6144, 4096), (128256, 4096),
                     (2200, 8192), (2560, 8192), (4240, 2048), (520, 8192)):
            assert gemv_variant(n, k, tile) in {v.key[1:] for v in VARIANTS if v.tile == tile}


def test_skinny_takes_17_rows_and_wide_weights_from_9():
    assert not takes_skinny(16, 8192) and takes_skinny(17, 2048)
    assert takes_skinny(9, 16384) and not takes_skinny(8, 128256)
    assert takes_skinny(64, 64) and not takes_skinny(1, 1 << 20)


def test_skinny_cluster_fills_the_sms():
    assert skinny_cluster(2048, 2048) == 4  # LLaMA-1B o_proj: 32 blocks of 64 W rows
    assert skinny_cluster(3072, 2048) == 2  # 48 blocks: 4 x 48 would not fit one per SM
    assert skinny_cluster(4096, 4096) == 2 and skinny_cluster(16384, 2048) == 1
    assert skinny_cluster(2048, 128) == 2  # two k tiles: one each
    assert skinny_cluster(2048, 64) == 1  # one k tile: nothing to split
    for n in range(SKINNY_ROWS, 40000, 1000):
        assert skinny_cluster(n, 4096) in (1, 2, 4)


def test_the_wgmma_skinny_gemm_takes_the_smallest_x_tile_and_fills_the_sm():
    # x tiles of 32, 64 and 128 rows. Grids past one block an SM (unclustered) and clusters
    # of 4: the ring, barriers and sums of two blocks fit one SM's 228 KiB (1 KiB of each
    # block reserved by the runtime), as __launch_bounds__(160, 2) says. Clusters of 2 and
    # unclustered grids of at most one block an SM: one block takes a ring as deep as the
    # 227 KiB a block may have
    for rows, mx in ((9, 32), (17, 32), (32, 32), (33, 64), (64, 64), (65, 128), (128, 128)):
        for n, k, c, deep in ((28672, 4096, 1, False), (6144, 4096, 1, True),
                              (4096, 4096, 2, True), (2048, 2048, 4, False)):
            kernel, blocks, threads, smem, got = skinny_launch("bfloat16", rows, n, k, True)
            assert skinny_cluster(n, k) == c and blocks == -(-n // 64) * c
            assert skinny90_deep(n, c) == deep and kernel.name.endswith("_d") == (deep and c == 1)
            assert got == mx and kernel.name.startswith(f"skinny90_bf16_x{mx}")
            assert threads == 160 and smem == skinny90_smem(mx, deep)
            if deep:
                assert smem <= 227 * 1024 < smem + (64 + mx) * 128 + 16 and blocks <= 132
                assert SKINNY90_STAGES[mx, True] > 2 * SKINNY90_STAGES[mx, False]
            else:
                assert 2 * (smem + 1024) <= 228 * 1024
    kernel, blocks, threads, smem, mx = skinny_launch("float16", 40, 2048, 2048, False)
    assert kernel.name == "skinny_f16_c4" and (blocks, threads, mx) == (128, 256, 0)
    # gate_up's SiLU epilogue: the same launch, the _silu kernel; skinny.cu has none
    plain, silu = (skinny_launch("bfloat16", 16, 28672, 4096, True, s) for s in (False, True))
    assert silu[0].name == plain[0].name + "_silu" and silu[1:] == plain[1:]
    with pytest.raises(ValueError, match="SiLU"):
        skinny_launch("float16", 40, 2048, 2048, False, True)


def test_the_kernel_behind_a_multi_wave_wgmma_skinny_gemm_launches_plainly(monkeypatch):
    # 9-64 rows through 8B gate_up (28672 rows: 448 blocks, past the 264 of one wave) or an
    # LM head take the wgmma skinny GEMM: what follows launches plainly. Behind 1B gate_up
    # (16384 rows: 256 blocks) and the clustered grids (one block an SM at most), the GEMV
    # (8 rows, or 9-16 through a narrow weight), the GEMM (past 64 rows) and skinny.cu (off
    # Hopper) the chain goes on
    monkeypatch.setattr(matmul, "hopper", lambda: True)
    assert matmul.plain_after(16, 28672, 4096) and matmul.plain_after(9, 128256, 2048)
    assert matmul.plain_after(32, 28672, 4096) and matmul.plain_after(64, 28672, 4096)
    assert not matmul.plain_after(32, 16384, 2048) and not matmul.plain_after(64, 16384, 2048)
    assert not matmul.plain_after(64, 4096, 14336)  # 64 blocks in clusters of 2
    assert -(-16896 // 64) == 2 * matmul.SMS and not matmul.plain_after(32, 16896, 4096)
    assert matmul.plain_after(32, 16960, 4096)  # one block past the wave
    assert not matmul.plain_after(8, 28672, 4096)  # GEMV
    assert not matmul.plain_after(16, 4096, 4096)  # GEMV
    assert not matmul.plain_after(128, 28672, 4096)  # GEMM
    with choose(wgmma_skinny_from=matmul.SKINNY_MAX + 1):
        assert not matmul.plain_after(16, 28672, 4096)  # skinny.cu
    monkeypatch.setattr(matmul, "hopper", lambda: False)
    assert not matmul.plain_after(16, 28672, 4096)


def test_65_to_128_rows_take_the_wgmma_skinny_gemm_only_where_switched_on(monkeypatch):
    # wgmma_skinny_to = 64 (the default): past 64 rows the tiled GEMM, without asking the
    # device (hopper() needs one); 128 on Hopper: the skinny GEMM's 128-row x tile
    def no_device():
        raise AssertionError("path() asked for the device")

    monkeypatch.setattr(matmul, "hopper", no_device)
    assert matmul.path(100, 4096) == "gemm" and matmul.path(64, 4096) == "skinny"
    with choose(wgmma_skinny_to=128):
        monkeypatch.setattr(matmul, "hopper", lambda: True)
        assert matmul.path(100, 4096) == matmul.path(128, 4096) == "skinny"
        assert matmul.path(129, 4096) == "gemm"
        monkeypatch.setattr(matmul, "hopper", lambda: False)
        assert matmul.path(100, 4096) == "gemm"
    monkeypatch.setattr(matmul, "hopper", lambda: True)
    assert matmul.path(100, 4096) == "gemm"  # the block's table is gone


def test_gemm_plan_weighs_tile_speed_against_the_last_wave():
    assert gemm_plan(4096, 4096, 4096) == ((128, 256), 1)
    assert gemm_plan(512, 2048, 2048) == ((64, 128), 1)  # 32 of 128 x 256 would leave SMs idle
    assert gemm_plan(2048, 3072, 2048) == ((128, 128), 1)  # 1.45 waves of 128 x 256, 2.9 of 128
    assert gemm_plan(2048, 2048, 2048) == ((128, 256), 1)  # 128 blocks: one wave
    assert gemm_plan(128, 2048, 2048) == ((64, 128), 1)  # a chunk of 128 tokens: 32 blocks
    # the wgmma GEMM's 192-wide tile where its count fills a wave: 256 tiles of 2048 x 3072
    # (1.94 waves), 128 of 512 x 6144 and 600 of 512 x 28672 (4.5 waves, against 3.4 of 256)
    assert gemm_plan(2048, 3072, 2048, tiles=GEMM90_TILES) == ((128, 192), 1)
    assert gemm_plan(512, 6144, 4096, tiles=GEMM90_TILES) == ((128, 192), 1)
    assert gemm_plan(512, 28672, 4096, tiles=GEMM90_TILES) == ((128, 192), 1)
    assert gemm_plan(4096, 4096, 4096, tiles=GEMM90_TILES) == ((128, 256), 1)
    for tile in GEMM_TILES:
        assert gemm_smem(tile) <= 227 * 1024
    for tile in GEMM90_TILES:
        assert gemm_smem(tile, True) <= 227 * 1024
    # the unsplit wgmma tiles' staging for their TMA stores (16 KiB a warpgroup) still fits
    # beside each tile's ring (GEMM90_STAGES); 64 x 128's 8 slots hold its SM alone (228 KiB
    # an SM, 1 KiB of it reserved a block), as gemm_plan counts every tile
    assert gemm_smem((128, 256), True) == 4 * (384 * 128 + 16) + 32768
    assert gemm_smem((128, 256), True, 4) == 4 * (384 * 128 + 16)
    assert gemm_smem((64, 128), True) == 8 * (192 * 128 + 16) + 16384
    for tile in GEMM90_TILES:
        assert 2 * (gemm_smem(tile, True) + 1024) > 228 * 1024
    # split_slots() counts the first split tile's clusters for all: each split tile's block
    # takes over half an SM's shared memory, so one block an SM either way
    for tile in SPLIT_TILES:
        for c in GEMM_SPLITS[1:]:
            assert 2 * (gemm_smem(tile, True, c) + 1024) > 228 * 1024


# split_slots() on the H200, c = 2..8: resident clusters x c (30 clusters of 4, 15 of 7 and
# of 8)
H200_SLOTS = {2: 132, 3: 117, 4: 120, 5: 110, 6: 102, 7: 105, 8: 120}


def test_gemm_plan_splits_k_where_the_tiles_are_short_of_a_wave():
    def plan(m, n, k):
        return gemm_plan(m, n, k, H200_SLOTS, GEMM90_TILES)

    # decode's 128 rows through LLaMA-8B's weights (H200, CUDA graphs, us): qkv 64 tiles of
    # 128 x 96 x 2 (17.8, against 20.6 for 32 of 128 x 192 x 3 and 21.5 for 96 unsplit of
    # 64 x 128), o 32 x 3 of 128 x 128 (13.2 against 14.4 for 22 of 128 x 192 x 5), down
    # 22 x 5 of 128 x 192 (38.0), gate_up's 112 tiles unsplit; LLaMA-1B's qkv 32 x 3 of
    # 128 x 96 (7.9 against 8.0 for 24 of 128 x 128 x 4), o 22 x 5 of 128 x 96 (7.5; 7.2
    # in 4) and down 22 x 5 (13.4 against 14.4 for 16 of 128 x 128 x 6)
    assert plan(128, 6144, 4096) == ((128, 96), 2)
    assert plan(128, 4096, 4096) == ((128, 128), 3)
    assert plan(128, 4096, 14336) == ((128, 192), 5)
    assert plan(128, 28672, 4096) == ((128, 256), 1)
    assert plan(128, 3072, 2048) == ((128, 96), 3)
    assert plan(128, 2048, 2048) == ((128, 96), 5)
    assert plan(128, 2048, 8192) == ((128, 96), 5)
    assert plan(128, 128256, 2048) == ((128, 256), 1)
    # 256 rows: 8B qkv 64 x 2 of 128 x 192 (24.6 against 26.5 for 128 of 128 x 96 unsplit,
    # a tile that only splits), o 128 tiles of 64 x 128 (16.5 against 18.5 for 32 x 2 of
    # 128 x 128)
    assert plan(256, 6144, 4096) == ((128, 192), 2)
    assert plan(256, 4096, 4096) == ((64, 128), 1)
    # 512 rows: the split pays only with many k tiles a block (8B down 64 x 2: 90.3 vs 98.0
    # for 128 x 128); 1B down 128 tiles of 64 x 128 (31.9 vs 32.9 for 64 x 2 of 128 x 128)
    # and o (9.6 vs 11.1 for 64 x 2); qkv 96 of 128 x 128 (13.4 vs 13.8 for 128 of 128 x 96)
    assert plan(512, 4096, 14336) == ((128, 256), 2)
    assert plan(512, 2048, 8192) == ((64, 128), 1)
    assert plan(512, 2048, 2048) == ((64, 128), 1)
    assert plan(512, 3072, 2048) == ((128, 128), 1)
    assert plan(4096, 4096, 4096) == ((128, 256), 1)
    # each block of a split takes at least SPLIT_MIN_KTILES k tiles of 64
    assert plan(128, 2048, 128) == ((64, 128), 1)
    assert gemm_plan(128, 4096, 14336, tiles=GEMM90_TILES) == ((64, 128), 1)  # no slots
    for (tile, c) in {plan(m, n, k) for m in (65, 128, 512, 4096) for n in (512, 2048, 4096,
                                                                            28672)
                      for k in (256, 4096)}:
        assert c in GEMM_SPLITS and (c == 1 or tile in SPLIT_TILES)


def test_the_wgmma_gemm_launches_one_wave_looping_over_tiles_or_its_clusters(monkeypatch):
    # gemm90_launch's kernel, grid and shared memory, the driver calls stubbed: unsplit grids
    # at most one wave (`Variants.persistent`; a block a tile without), split ones c blocks a
    # tile, the SiLU epilogue only unsplit
    from types import SimpleNamespace

    from rawgraph.cuda.kernel import Kernel

    lin = matmul
    calls = []
    monkeypatch.setattr(Kernel, "launch", lambda k, grid, threads, args, stream, smem, symbols:
                        calls.append((k.name, grid, threads, smem, args[2:])))
    monkeypatch.setattr(lin, "tile_map", lambda ptr, rows, cols, dt, box: (rows, cols, box))
    monkeypatch.setattr(lin, "_wave", lambda kernel, threads, smem: 132)
    x = SimpleNamespace(data=SimpleNamespace(ptr=0))
    w = SimpleNamespace(shape=(4100, 256), data=SimpleNamespace(ptr=0))
    y = SimpleNamespace(data=SimpleNamespace(ptr=0))
    go = lambda tile, c, m, **kw: (lin.gemm90_launch("bfloat16", tile, c, x, w, None, y, m,  # noqa: E731
                                                     4096, None, None, **kw), calls.pop())[1]
    # 4100 columns are not whole 16-byte units: a zeroed ymap, every store direct
    assert go((128, 256), 1, 4096) == ("gemm90_bf16_128x256", (132,), 288,
                                       lin.gemm_smem((128, 256), True),
                                       (bytes(128), None, y, 4096, 4100, 256))
    assert go((128, 256), 1, 129)[1] == (34,)  # 2 x 17 tiles: fewer than a wave
    assert go((128, 256), 4, 129)[:2] == ("gemm90_bf16_128x256_c4", (136,))
    assert go((64, 128), 1, 4096, silu=True)[:3] == ("gemm90_bf16_64x128_silu", (132,), 160)
    w.shape = (4096, 256)  # y's rows by TMA: its map in boxes of 64 x 64 (n / 2 with SiLU)
    assert go((128, 256), 1, 4096)[4][0] == (4096, 4096, 64)
    assert go((128, 256), 1, 4096, silu=True)[4][0] == (4096, 2048, 64)
    y.data.ptr = 8  # not 16-byte aligned
    assert go((128, 256), 1, 4096)[4][0] == bytes(128)
    w.shape = (4100, 256)
    with choose(persistent=False):
        assert go((128, 128), 1, 4096)[1] == (32 * 33,)
    with pytest.raises(ValueError, match="unsplit"):
        go((128, 256), 2, 4096, silu=True)
    with pytest.raises(ValueError, match="wgmma GEMM's alone"):
        lin.gemm_launch("bfloat16", (128, 128), 1, False, silu=True)


def test_decode_attention_splits_fill_whole_waves():
    # 8 kv heads; the H200 holds 528 blocks of the d=64 kernel (4 per SM), 264 of d=128 (2):
    # blocks just under one wave (one row: 63 splits, faster in the 1B step at 32k and 64k
    # tokens than 48); with 396 resident (3 an SM) the counts fill two and four waves at B=32
    # and 64
    assert [decode_splits(8 * b, 528) for b in (1, 4, 8, 16, 32, 64)] == [63, 16, 8, 4, 2, 1]
    assert [decode_splits(8 * b, 396) for b in (1, 4, 8, 16, 32, 64)] == [48, 12, 6, 3, 3, 3]
    assert [decode_splits(8 * b, 264) for b in (1, 4, 8, 16, 32, 64)] == [32, 8, 4, 2, 1, 1]
    for units in range(1, 2000, 7):  # never more than SPLIT_WAVES waves, at least one split
        s = decode_splits(units, 396)
        assert s == 1 or units * s <= SPLIT_WAVES * 396
    with pytest.raises(ValueError, match="positive"):
        decode_splits(0, 396)


def test_a_row_takes_16_splits_up_to_4096_tokens_then_splits_of_at_least_256():
    # a lone row's step is latency-bound up to a few thousand tokens (16 splits beat 48 in
    # the decode graph); past SHORT_SPLITS * LONG_SPLIT tokens more splits keep SMs busy
    assert [row_splits(n, 48) for n in (1, 64, 65, 1000, 4096)] == [1, 1, 2, 16, 16]
    assert [row_splits(n, 48) for n in (4097, 8192, 32768, 131072)] == [17, 32, 47, 48]
    for splits in (1, 3, 6, 16, 48, 200):
        for n in (1, 63, 64, 640, 4096, 4097, 5000, 20000, 131072):
            got = row_splits(n, splits)
            assert 1 <= got <= min(splits, -(-n // SPLIT_ALIGN))  # n_splits covers it
            if splits <= SHORT_SPLITS:  # then the rule is len / splits, as it always was
                per = math.ceil(math.ceil(n / splits) / SPLIT_ALIGN) * SPLIT_ALIGN
                assert got == -(-n // per)
            if n > SHORT_SPLITS * LONG_SPLIT:  # splits of at least LONG_SPLIT tokens
                assert got <= -(-n // LONG_SPLIT)


def test_the_grid_covers_every_row_and_launches_no_more_than_short_rows_need():
    # grid.y for rows up to max_len: every shorter row's splits fit (row_splits is not
    # monotonic: 1024 tokens take 16 splits of 64, 1025 take 9 of 128); up to 4096 tokens at
    # most 16 (the combine reads every launched split), as with a cap of 16
    for splits in (1, 3, 6, 12, 16, 24, 32, 48):
        most = 0
        for n in range(1, 20000, 37):
            most = max(most, row_splits(n, splits))
            g = grid_splits(n, splits)
            assert most <= g <= min(splits, -(-n // SPLIT_ALIGN))
            if n <= SHORT_SPLITS * LONG_SPLIT:
                assert g == min(splits, 16, -(-n // SPLIT_ALIGN))
    assert [grid_splits(n, 48) for n in (1024, 4096, 8192, 16384, 32768)] == [16, 16, 32, 48, 48]


def test_array_checks_dtype_shape_and_contiguity():
    # shapes.array (behind row_array and the sampler's hand-on checks) reads only dtype,
    # shape, data and flags: NumPy arrays stand in for device arrays here
    import numpy as np

    from rawgraph.ops import shapes

    shapes.array(np.zeros((5, 2), np.int32), "host", np.int32, (5, 2))
    shapes.array(np.zeros(7, np.int32), "lens", np.int32, (None,))
    shapes.row_array(np.zeros(3, np.uint64), "keys", np.uint64, 3)
    for arr, shape, msg in [
            (np.zeros(5, np.int32), (5, 2), r"host must be a contiguous int32 device array "
                                            r"of shape \(5, 2\), got int32 \(5,\)"),
            (np.zeros((5, 2), np.int64), (5, 2), r"got int64 \(5, 2\)"),
            (np.zeros((2, 5), np.int32).T, (5, 2), "contiguous"),
            (np.zeros((3, 3), np.int32), (None,), r"of shape \(n,\)"),
            ([1, 2], (None,), "device array")]:
        with pytest.raises(ValueError, match=msg):
            shapes.array(arr, "host", np.int32, shape)
    with pytest.raises(ValueError, match=r"keys must be .* shape \(4,\), got uint64 \(3,\)"):
        shapes.row_array(np.zeros(3, np.uint64), "keys", np.uint64, 4)


def test_prefill_runs_fill_the_gpu_only_where_query_tiles_do_not():
    # (chunk, tokens a tile, kv heads, SMs) -> (most runs, keys a run has at least): at most
    # two blocks an SM (rounded down) while one sequence's tiles are fewer than the SMs,
    # runs of at least max(128, 2 x chunk) keys
    assert RUN_KEYS == 128
    assert prefill_runs(16, 16, 8, 132) == (33, 128)  # 8 blocks: 264 // 8
    assert prefill_runs(64, 32, 8, 132) == (16, 128)  # 16 blocks
    assert prefill_runs(256, 32, 8, 132) == (4, 512)  # 64 blocks: 264 // 64, not 5
    assert prefill_runs(512, 32, 8, 132) == (2, 1024)  # 128 blocks
    assert prefill_runs(544, 32, 8, 132) == (1, 1088)  # 136 blocks: an SM each already
    assert prefill_runs(16, 16, 1, 1000)[0] == MAX_PREFILL_SPLITS
    with pytest.raises(ValueError, match="positive"):
        prefill_runs(16, 0, 8, 132)


def test_prefill_rows_128_only_at_head_dim_128_from_256_tokens():
    # head dim 64 takes 64-row blocks at every length (faster there at 1,024 to 8,192)
    assert [prefill_rows(n, 128) for n in (1, 255, 256, 8192)] == [64, 64, 128, 128]
    assert [prefill_rows(n, 64) for n in (1, 255, 256, 8192)] == [64, 64, 64, 64]
    # grouped tiles count the group's rows, at any head dim
    assert [grouped_rows(n, 4) for n in (16, 63, 64, 512)] == [64, 64, 128, 128]


def test_a_rows_runs_follow_its_own_length():
    assert [row_runs(n, 4, 512) for n in (1, 511, 512, 1024, 2047, 2048, 1 << 17)] == \
        [1, 1, 1, 2, 3, 4, 4]
    assert [row_runs(n, 33, 128) for n in (200, 1024, 4224, 8192)] == [1, 8, 33, 33]
    # as a symbol (the run blocks a graph launches for rows up to that length): the int rule
    S = Symbols(ctx=Range(1, 1 << 17))
    expr = row_runs(S.ctx, 16, 128)
    for ctx in (1, 127, 128, 1000, 4096, 8192, 1 << 17):
        assert expr.eval({"ctx": ctx}) == row_runs(ctx, 16, 128)
    # never fewer for a longer row: the longest row's count covers every row of a chunk
    counts = [row_runs(n, 16, 128) for n in range(1, 5000)]
    assert counts == sorted(counts)


def test_prefill_attention_brings_k_v_by_tma_on_hopper_for_power_of_two_paged_blocks(
        monkeypatch):
    attention = importlib.import_module("rawgraph.ops.attention")
    monkeypatch.setattr(attention, "compute_capability", lambda: (9, 0))
    assert [attention.prefill_tma(bs) for bs in (8, 16, 32, 64, 256)] == [True] * 5
    assert not attention.prefill_tma(4) and not attention.prefill_tma(12)  # part of an atom
    assert not attention.prefill_tma(24) and not attention.prefill_tma(48)  # not by shifts
    with choose(prefill_tma=False):
        assert not attention.prefill_tma(16)
    with choose(prefill_wgmma=False):  # mma.sync: it gathers
        assert not attention.prefill_tma(16)
    monkeypatch.setattr(attention, "compute_capability", lambda: (8, 9))  # mma.sync there
    assert not attention.prefill_tma(16)
    # the two mbarriers past the tiles: a Q tile and two K/V pairs of 64 keys
    assert attention.prefill_smem(128, 128, tma=True) == (128 + 256) * 256 + 16
    assert attention.prefill_smem(64, 64) == (64 + 256) * 128


def test_rmsnorm_takes_a_warp_a_row_where_its_rows_can_reach_many():
    # a block per row for decode-sized norms, a warp per row for prefill chunks; a symbolic
    # count decides by the top of its range (the graph's kernel serves every patched value)
    assert rmsnorm_launch(1) == (False, 1, 256)
    assert rmsnorm_launch(WARP_ROWS_FROM - 1) == (False, WARP_ROWS_FROM - 1, 256)
    assert rmsnorm_launch(8192) == (True, 8192 // WARP_ROWS, 32 * WARP_ROWS)
    assert rmsnorm_launch(8190)[1] == 8192 // WARP_ROWS  # a partial last block
    S = Symbols(n=Range(1, 2048))
    warp, grid, block = rmsnorm_launch(S.n, S)
    assert warp and block == 32 * WARP_ROWS and grid.eval({"n": 5}) == 2
    S = Symbols(n=Range(1, 64))
    warp, grid, block = rmsnorm_launch(S.n, S)
    assert not warp and block == 256 and grid.eval({"n": 5}) == 5


def test_a_prefill_plan_refuses_what_no_kernel_takes_when_made():
    from rawgraph.ops import PrefillPlan
    assert not PrefillPlan().grouped and not PrefillPlan(128).grouped
    assert PrefillPlan(64, splits=1).grouped and PrefillPlan(context=10).grouped
    for kw, msg in (({"rows": 32}, "rows = 32"), ({"splits": 0}, "splits = 0"),
                    ({"splits": MAX_PREFILL_SPLITS + 1}, f"splits = {MAX_PREFILL_SPLITS + 1}"),
                    ({"splits": 2, "context": 10}, "splits or context, not both"),
                    ({"run_keys": 2}, "run_keys goes with splits"),
                    ({"splits": 2, "run_keys": 0}, "run_keys = 0"),
                    ({"chunk_size": 0}, "chunk_size = 0")):
        with pytest.raises(ValueError, match=msg):
            PrefillPlan(**kw)


def test_fixed_splits_cut_each_row_by_its_own_length_whatever_the_batch():
    from rawgraph.ops.attention import MAX_SPLITS, fixed_splits
    for p in (0, 64, 128, 256, 512):
        for ctx in (1, 100, 4096, 4097, 20000, 131072):
            s = fixed_splits(ctx, p)
            lens = sorted({1, 17, 255, 256, 1024, 4095, 4096, 4097, ctx // 2 + 1, ctx} - {0})
            for n in (x for x in lens if x <= ctx):
                # the count any larger max_splits gives: a row's split length is its own,
                # max(p, min(n / 16, 256)) in whole warp steps
                assert row_splits(n, s, p) == row_splits(n, MAX_SPLITS, p)
                per = max(p, min(-(-n // SHORT_SPLITS), LONG_SPLIT))
                assert row_splits(n, s, p) == -(-n // (-(-per // SPLIT_ALIGN) * SPLIT_ALIGN))
                assert row_splits(n, s, p) <= grid_splits(n, s, p) <= s
    # the mode's rule: 16 splits up to 4,096 tokens, 256 tokens each beyond; with 256-token
    # splits 1,024 tokens take 4
    s = fixed_splits(131072)
    assert [row_splits(n, s) for n in (1024, 4096, 32768)] == [16, 16, 128]
    s = fixed_splits(131072, 256)
    assert [row_splits(n, s, 256) for n in (1024, 4096, 32768)] == [4, 16, 128]
    # the default's count follows the batch, and so do long rows' splits
    assert row_splits(20000, decode_splits(8, 132)) != row_splits(20000, decode_splits(256, 132))
    with pytest.raises(ValueError, match="past the combine's"):
        fixed_splits(MAX_SPLITS * LONG_SPLIT + 1)
    with pytest.raises(ValueError, match="at least 1"):
        fixed_splits(4096, -1)


def test_the_grid_covers_every_row_with_a_least_split_length():
    # min_split bounds each row's splits by len / min_split, and the grid with them
    for splits, p in ((17, 256), (33, 128), (9, 512), (48, 64)):
        most = 0
        for n in range(1, 20000, 37):
            most = max(most, row_splits(n, splits, p))
            g = grid_splits(n, splits, p)
            assert most <= g <= min(splits, -(-n // p))


def test_gemm_rows_send_every_count_through_one_gemm_plan(monkeypatch):
    monkeypatch.setattr(matmul, "hopper", lambda: True)
    monkeypatch.setattr(matmul, "split_slots", lambda: {c: 132 // c * c for c in GEMM_SPLITS})
    n, k = 6144, 4096
    default = {matmul.linear_key(r, n, k) for r in (1, 8, 16, 40, 128, 256, 2048)}
    assert {key[0] for key in default} == {"gemv", "skinny", "gemm"}
    with choose(gemm_rows=128):
        keys = {matmul.linear_key(r, n, k) for r in (1, 8, 16, 40, 128, 256, 2048)}
        assert keys == {("gemm", matmul.device_plan(128, n, k))}
        assert not matmul.keeps_row_max(1, 128256) and not matmul.plain_after(1, n, k)
    with choose(gemm_rows=2048):
        assert {matmul.linear_key(r, n, k) for r in (1, 300)} == {
            ("gemm", matmul.gemm_plan(2048, n, k, matmul.split_slots(), GEMM90_TILES))}


def test_skinny_always_takes_every_count_on_hopper_and_the_gemm_plan_elsewhere(monkeypatch):
    monkeypatch.setattr(matmul, "split_slots", lambda: {c: 132 // c * c for c in GEMM_SPLITS})
    n, k = 6144, 4096
    counts = (1, 8, 16, 33, 64, 65, 128, 129, 256)
    monkeypatch.setattr(matmul, "hopper", lambda: True)
    with choose(gemm_rows=128, skinny_always=True):
        keys = [matmul.linear_key(r, n, k) for r in counts]
        # one kernel family and k order (the cluster is the weight's); the x tile by count
        assert {key[:2] for key in keys} == {("skinny", True)}
        assert [key[2] for key in keys] == [32, 32, 32, 64, 64, 128, 128, 128, 128]
        assert matmul.skinny_launch("float16", 256, n, k, True)[4] == 128
        assert not matmul.keeps_row_max(1, 128256)
    monkeypatch.setattr(matmul, "hopper", lambda: False)
    with choose(gemm_rows=128, skinny_always=True):
        assert {matmul.linear_key(r, n, k) for r in counts} == {
            ("gemm", matmul.device_plan(128, n, k))}
