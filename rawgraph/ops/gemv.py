"""The decode GEMV's variants: one table, from which come the kernels' names, their
`extern "C"` wrappers in kernels_cu/gemv.cu and gemv_quant.cu (generated: `python -m
rawgraph.ops.generate` rewrites them, and a test checks the files match), the `Kernel`
objects and their signatures, and the choice of variant for a weight.

A variant is a template instantiation of gemv.cuh's gemv_impl: the x tile (8 or 16 rows), the
k chunks in flight per lane, whether W is read in 128-byte row segments through a transpose
(`_t`), and the warps per block. Each exists plain (y = x W^T + residual, with the LM head's
greedy keys), with SiLU(gate) * up in the epilogue (`_silu`), and with RoPE and the cache
append (`_rope`); the three differ only in the minimum blocks per SM their launch bounds ask
ptxas to fit in registers.

Quantized weights (rawgraph.ops.quantized; kernels in gemv_quant.cu, `QUANT_VARIANTS` by
format): `e4m3` (`gemv_{f16,bf16}_e4m3_...`), FP8 codes with a float32 scale per row
(`w_scale`), a lane's 16 bytes of W 16 values widened to the activations' dtype in registers
(exact); `i4` (`gemv_..._i4_...`), 4-bit values with a scale (in the activations' dtype) and
a zero point per group of `group` values of a row, a lane's 16 bytes 32 values made T((q -
z) scale) in registers. A chunk of k is then 2 or 4 times as wide and the lane reads as much
more x: the variants hold fewer chunks in flight for the same registers.
"""

from __future__ import annotations

from dataclasses import dataclass

from rawgraph.cuda.kernel import Kernel
from rawgraph.dtypes import KERNEL_TYPES


@dataclass(frozen=True)
class Variant:
    """One GEMV instantiation, and the minimum blocks per SM of its plain, _silu and _rope
    forms (0: threads alone in the launch bounds)."""

    tile: int         # rows of x (8 or 16)
    unroll: int       # k chunks in flight per lane
    segments: bool    # W in 128-byte row segments through a shared-memory transpose
    warps: int        # per block (8 or 16)
    min_blocks: tuple[int, int, int]

    @property
    def key(self) -> tuple[int, int, bool, int]:
        """(tile, unroll, segments, warps)."""
        return self.tile, self.unroll, self.segments, self.warps

    @property
    def suffix(self) -> str:
        """The name after the dtype: n{tile}[_w{warps}]_u{unroll}[_t]."""
        return (f"n{self.tile}" + (f"_w{self.warps}" if self.warps != 8 else "")
                + f"_u{self.unroll}" + ("_t" if self.segments else ""))


VARIANTS = (  # registers are ptxas's on sm_90 under these launch bounds
    Variant(8, 8, False, 8, (2, 2, 2)),   # at most 128 registers: 2 blocks per SM
    Variant(8, 8, True, 8, (2, 2, 2)),    # the same, W in segments
    Variant(8, 4, True, 8, (3, 3, 3)),    # 80 registers: 3 blocks per SM
    Variant(8, 8, True, 16, (1, 1, 1)),   # 128 registers x 16 warps: the whole register
    #                                       file, for grids of at most one block per SM
    Variant(16, 4, True, 8, (2, 2, 2)),   # 103-120 registers: 2 blocks per SM
    Variant(16, 4, True, 16, (1, 1, 1)),  # the same registers x 16 warps, one block per SM
)
# quantized W (ptxas on sm_90 under these bounds; not yet timed on a GPU: the choices below
# follow the 16-bit table's rule by bytes of a W row)
F8_VARIANTS = (
    Variant(8, 4, False, 8, (2, 2, 2)),
    Variant(8, 4, True, 8, (2, 2, 2)),
    Variant(8, 4, True, 16, (1, 1, 1)),
    Variant(16, 2, True, 8, (2, 2, 2)),
    Variant(16, 2, True, 16, (1, 1, 1)),
)
I4_VARIANTS = (
    Variant(8, 4, False, 8, (2, 2, 2)),
    Variant(8, 2, True, 8, (2, 2, 2)),  # (4 in flight in segments spills under 128)
    Variant(8, 2, True, 16, (1, 1, 1)),
    Variant(16, 2, True, 8, (2, 2, 2)),
    Variant(16, 2, True, 16, (1, 1, 1)),
)
QUANT_VARIANTS = {"e4m3": F8_VARIANTS, "i4": I4_VARIANTS}
# a quantized weight's parameters in its kernels, in place of a 16-bit w
_QUANT_PARAMS = {"e4m3": "const unsigned char* w, const float* w_scale, ",
                 "i4": "const unsigned char* w, const {t}* w_scales, "
                       "const unsigned char* w_zeros, int group, "}
EPILOGUES = ("", "_silu", "_rope")
_PARAMS = {
    "": "const {t}* x, const {t}* w, const {t}* residual, {t}* y, int m, int n, int k, "
        "unsigned long long* row_max",
    "_silu": "const {t}* x, const {t}* w, {t}* y, int m, int n, int k, float norm_eps",
    "_rope": "const {t}* x, const {t}* w, {t}* y, int m, int n, int k, {t}* k_cache, "
             "{t}* v_cache, const int* block_tables, const int* seq_slots, "
             "const int* positions, const float* inv_freq, int q_size, int kv_size, "
             "int head_dim, int block_size, int max_blocks, float norm_eps, const {t}* bias",
}


def name(dtype: str, v: Variant, epilogue: str = "", fmt: str | None = None) -> str:
    """The kernel's name, e.g. gemv_bf16_n16_u4_t_silu (FP8 W: gemv_bf16_e4m3_n16_...)."""
    return f"gemv_{KERNEL_TYPES[dtype][0]}{'_' + fmt if fmt else ''}_{v.suffix}{epilogue}"


def signature(dtype: str, epilogue: str = "", fmt: str | None = None) -> str:
    """The C parameter list of a form (a quantized format's: its weight's parameters)."""
    t = KERNEL_TYPES[dtype][1]
    sig = _PARAMS[epilogue].format(t=t)
    return sig.replace(f"const {t}* w, ", _QUANT_PARAMS[fmt].format(t=t)) if fmt else sig


def kernels(epilogue: str = "", fmt: str | None = None) -> dict[tuple, Kernel]:
    """Every variant of one form: (dtype, tile, unroll, segments, warps) -> Kernel."""
    return {(dt, *v.key): Kernel("gemv_quant" if fmt else "gemv", name(dt, v, epilogue, fmt),
                                 signature(dt, epilogue, fmt))
            for dt in KERNEL_TYPES for v in (QUANT_VARIANTS[fmt] if fmt else VARIANTS)}


M_TILES = (8, 16)  # GEMV x tiles; 17 to 64 rows take the skinny GEMM (ops.linear)
GEMV = kernels()
GEMV_SILU = kernels("_silu")  # the interleaved gate_up weight, SiLU(gate) * up
GEMV_ROPE = kernels("_rope")  # the QKV weight, RoPE and the cache append
# the same three forms (plain, _silu, _rope) over each quantized format's weights
GEMV_QUANT = {fmt: tuple(kernels(epi, fmt) for epi in EPILOGUES) for fmt in QUANT_VARIANTS}

SMS = 132  # H200; steers variant choices only (any value is correct)
GEMV_ROWS = 16  # rows of W per GEMV block (gemv.cuh)
LONG_ROWS = 8192  # measured on the H200: from here grids of at most one block per SM split
# k between 16 warps
MID_ROWS = 4096  # rows from which one to two GEMV blocks per SM read W in segments


def gemv_variant(n: int, k: int, tile: int = 8) -> tuple[int, bool, int]:
    """(chunks in flight per lane, segments, warps per block) of the GEMV for an (n, k)
    weight and an x tile; `segments`: W read in 128-byte row segments through a transpose
    in shared memory (gemv.cu), else in the mma fragments' 64-byte pieces.

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
    16 rows: 4 in flight in segments, 16 warps at one block per SM on rows of 8192 and
    longer, else 8 warps at two blocks per SM (ahead of 64-byte pieces at three blocks per
    SM and of clusters of 4 splitting k in the 16-row step: NOTES.md, "Decode GEMV")."""
    blocks = -(-n // GEMV_ROWS)
    if tile == 8:
        if blocks > 2 * SMS:
            return 4, True, 8
        if blocks <= SMS and k >= LONG_ROWS:
            return 8, True, 16
        return 8, blocks > SMS and k >= MID_ROWS, 8
    return 4, True, (16 if blocks <= SMS and k >= LONG_ROWS else 8)


def gemv_f8_variant(n: int, k: int, tile: int = 8) -> tuple[int, bool, int]:
    """`gemv_variant` for FP8 W (F8_VARIANTS): the 16-bit rule by a row's bytes (k of them),
    with half the chunks in flight (each chunk twice as wide). Not yet timed on a GPU."""
    blocks = -(-n // GEMV_ROWS)
    long_row = blocks <= SMS and k >= 2 * LONG_ROWS
    if tile == 8:
        return 4, long_row or blocks > 2 * SMS or k >= 2 * MID_ROWS, 16 if long_row else 8
    return 2, True, 16 if long_row else 8


def gemv_i4_variant(n: int, k: int, tile: int = 8) -> tuple[int, bool, int]:
    """`gemv_variant` for 4-bit W (I4_VARIANTS): the 16-bit rule by a row's bytes (k / 2);
    4 chunks in flight in 64-byte pieces at up to two blocks an SM, else 2. Not yet timed on
    a GPU."""
    blocks = -(-n // GEMV_ROWS)
    long_row = blocks <= SMS and k >= 4 * LONG_ROWS
    if tile == 8:
        if long_row:
            return 2, True, 16
        seg = blocks > 2 * SMS or k >= 4 * MID_ROWS
        return (2 if seg else 4), seg, 8
    return 2, True, 16 if long_row else 8


def gemv_launch(dt: str, top: int, n: int, k: int, fmt: str | None = None
                ) -> tuple[tuple, int, int]:
    """(GEMV key (dtype, x tile, *gemv_variant), grid, threads) for up to `top` rows (`fmt`:
    of a quantized format's kernels, GEMV_QUANT[fmt])."""
    tile = next(t for t in M_TILES if t >= top)
    choose = {None: gemv_variant, "e4m3": gemv_f8_variant, "i4": gemv_i4_variant}[fmt]
    u, seg, warps = choose(n, k, tile)
    return (dt, tile, u, seg, warps), -(-n // GEMV_ROWS), 32 * warps
