"""Quantized weights in the projections: records that `ops.linear`, `qkv_rope` and
`gate_up_silu` take in place of a 16-bit (n, k) weight, and the GPU quantizers that make
them.

- `Fp8Weight` (format "e4m3", W8A16): e4m3fn codes with a float32 scale per output row.
  The GEMV widens a lane's 16 bytes of codes to 16 values of the activations' dtype T in
  registers (exact: every e4m3 value is a half and a bfloat16), sums on the tensor cores in
  fp32 as the 16-bit GEMV does, and multiplies each row's finished sum by its scale:
  y[i, r] = T(scale[r] sum_j x[i, j] e4m3(codes[r, j]) (+ residual[i, r])).
- `Int4Weight` (format "i4", W4A16): 4-bit values q with a scale s (in T) and a zero point z
  per group of `group` values of a row (group-wise, as AWQ and GPTQ store them). The GEMV
  makes a lane's 16 bytes 32 values T((q - z) s) in registers (one rounding) and sums as
  the 16-bit GEMV does: y = T(x (T((q - z) s))^T (+ residual)). Stored two values a byte in
  the order `pack_int4` writes (the one the kernel unpacks with a mask and an OR).

At one row a decode step reads its weights once, so FP8 halves the step's floor and 4-bit
quarters it. Only the GEMV's rows (decode, up to 16) have quantized kernels; the other paths
(the skinny GEMM, the tiled GEMM) take the record's 16-bit copy (`wide`) where it keeps one,
else the projection's `scratch`: the weight is dequantized into it first (`dequantize`), one
more kernel reading the quantized bytes and writing the 16-bit ones. A per-tensor scale is a
per-row scale repeated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rawgraph.cuda.device import compute_capability
from rawgraph.cuda.kernel import Kernel
from rawgraph.dtypes import KERNEL_TYPES
from rawgraph.ops import shapes
from rawgraph.ops.gemv import M_TILES

QUANT_ROWS = M_TILES[-1]  # rows of x the quantized kernels take (the GEMV's)
FP8_K = 16  # an FP8 weight's k: a multiple of this (a lane reads 16 codes at a time)
I4_K = 32  # a 4-bit weight's group: a multiple of this (a lane reads 32 values at a time)
I4_GROUP = 128  # the group `Model(quantize="int4")` quantizes in
_QUANTIZE = "const {t}* w, unsigned char* codes, float* scale, int n, int k"
_QUANTIZE4 = ("const {t}* w, unsigned char* packed, {t}* scales, unsigned char* zeros, int n, "
              "int k, int group")
QUANTIZE = {dt: Kernel("quantize", f"fp8_quantize_{s}", _QUANTIZE.format(t=t))
            for dt, (s, t) in KERNEL_TYPES.items()}
QUANTIZE4 = {dt: Kernel("quantize", f"int4_quantize_{s}", _QUANTIZE4.format(t=t))
             for dt, (s, t) in KERNEL_TYPES.items()}
QUANTIZE_THREADS = 256  # quantize.cu: a block a row; its dequantizers a thread 8 values
_DEQUANTIZE = "const unsigned char* codes, const float* scale, {t}* w, int n, int k"
_DEQUANTIZE4 = ("const unsigned char* packed, const {t}* scales, const unsigned char* zeros, "
                "{t}* w, int n, int k, int group")
DEQUANTIZE = {(fmt, dt): Kernel("quantize", f"{name}_dequantize_{s}", sig.format(t=t))
              for fmt, name, sig in (("e4m3", "fp8", _DEQUANTIZE), ("i4", "int4", _DEQUANTIZE4))
              for dt, (s, t) in KERNEL_TYPES.items()}
# a 32-bit word's nibbles (bits 0-3 first) hold values 0 2 4 6 1 3 5 7 of its 8: nibbles i and
# i + 4 are the pair (2i, 2i + 1) gemv.cuh's i4x32 unpacks into a half2
I4_NIBBLE = (0, 4, 1, 5, 2, 6, 3, 7)  # value v's nibble


@dataclass(frozen=True)
class Fp8Weight:
    """An (n, k) weight stored as FP8: `codes` uint8 (n, k), e4m3fn bit patterns (no NaN:
    0x7F / 0xFF), and `scale` float32 (n,), row r's values being codes[r] * scale[r];
    `wide`: the weight in the activations' dtype for the paths with no FP8 form (None: only
    the GEMV's rows). Build it with `fp8_weight`, which checks them."""

    codes: Any
    scale: Any
    wide: Any = None
    fmt: ClassVar[str] = "e4m3"  # gemv.GEMV_QUANT's key

    @property
    def shape(self) -> tuple[int, int]:
        """(n, k), as a 16-bit weight's."""
        return tuple(self.codes.shape)  # type: ignore[return-value]

    @property
    def ndim(self) -> int:
        """2, as a 16-bit weight's."""
        return 2

    @property
    def nbytes(self) -> int:
        """The bytes its kernels read of it: codes and scales."""
        return int(self.codes.nbytes + self.scale.nbytes)

    def args(self) -> tuple:
        """Its kernels' arguments in place of a 16-bit w."""
        return self.codes, self.scale


@dataclass(frozen=True)
class Int4Weight:
    """An (n, k) weight stored as 4-bit values q (0-15), two a byte in `packed` uint8
    (n, k / 2) (`pack_int4`'s order), with `scales` (n, k / group) in the activations'
    storage dtype and `zeros` uint8 (n, k / group): row r's value j is
    (q - zeros[r, j // group]) * scales[r, j // group]. `wide` as for `Fp8Weight`. Build it
    with `int4_weight`, which checks them."""

    packed: Any
    scales: Any
    zeros: Any
    group: int
    wide: Any = None
    fmt: ClassVar[str] = "i4"

    @property
    def shape(self) -> tuple[int, int]:
        """(n, k), as a 16-bit weight's."""
        return int(self.packed.shape[0]), 2 * int(self.packed.shape[1])

    @property
    def ndim(self) -> int:
        """2, as a 16-bit weight's."""
        return 2

    @property
    def nbytes(self) -> int:
        """The bytes its kernels read of it: values, scales and zeros."""
        return int(self.packed.nbytes + self.scales.nbytes + self.zeros.nbytes)

    def args(self) -> tuple:
        """Its kernels' arguments in place of a 16-bit w."""
        return self.packed, self.scales, self.zeros, self.group


Quantized = (Fp8Weight, Int4Weight)  # the records (isinstance)


def fp8_weight(codes: Any, scale: Any, wide: Any = None) -> Fp8Weight:
    """An `Fp8Weight` from device arrays, checked: ValueError naming what is wrong."""
    if getattr(codes, "ndim", 0) != 2:
        raise ValueError(f"codes must be (n, k), got shape {getattr(codes, 'shape', '?')}")
    n, k = codes.shape
    shapes.array(codes, "codes", np.uint8, (n, k))
    shapes.multiple(k, FP8_K, "k")
    shapes.row_array(scale, "scale", np.float32, n)
    if wide is not None:
        shapes.tensor(wide, "wide", (n, k))
    return Fp8Weight(codes, scale, wide)


def int4_weight(packed: Any, scales: Any, zeros: Any, group: int,
                wide: Any = None) -> Int4Weight:
    """An `Int4Weight` from device arrays, checked: ValueError naming what is wrong."""
    if getattr(packed, "ndim", 0) != 2:
        raise ValueError(f"packed must be (n, k / 2), got shape "
                         f"{getattr(packed, 'shape', '?')}")
    n, k = packed.shape[0], 2 * packed.shape[1]
    shapes.array(packed, "packed", np.uint8, (n, k // 2))
    if type(group) is not int or group < I4_K or group % I4_K or k % group:
        raise ValueError(f"group = {group!r}: a multiple of {I4_K} that divides k = {k}")
    dt = shapes.tensor(scales, "scales", (n, k // group), align=2)
    shapes.array(zeros, "zeros", np.uint8, (n, k // group))
    if wide is not None:
        shapes.tensor(wide, "wide", (n, k), dt)
    return Int4Weight(packed, scales, zeros, group, wide)


def takes_quantized(fmt: str = "e4m3") -> bool:
    """Whether this GPU runs the kernels of a quantized format ("e4m3", "i4"): FP8's e4m3
    conversion is sm_89's on, 4-bit's half2 and bfloat162 arithmetic sm_80's."""
    return compute_capability() >= ((8, 0) if fmt == "i4" else (8, 9))


def wide(w: Any, rows: int, scratch: Any = None, *, stream: Any = None,
         symbols: Any = None) -> Any:
    """The 16-bit weight a path with no quantized form takes for `rows` rows: `w` itself, a
    quantized record's copy, or the record dequantized into `scratch` (a 1-D array of the
    activations' dtype, at least n k long; the launch goes to `stream`). ValueError when it
    has neither copy nor scratch."""
    if not isinstance(w, Quantized):
        return w
    if w.wide is not None:
        return w.wide
    if scratch is None:
        raise ValueError(f"{rows} rows: a quantized weight without a 16-bit copy (wide) or a "
                         f"scratch takes only the GEMV's rows (at most {QUANT_ROWS})")
    n, k = w.shape
    out = scratch[:n * k].reshape(n, k)
    dequantize(w, out, stream=stream, symbols=symbols)
    return out


def check_scratch(w: Any, scratch: Any, dt: str) -> None:
    """A projection's `scratch` (None, or a 1-D array of `dt` that holds weight w) checked."""
    if scratch is None:
        return
    shapes.tensor(scratch, "scratch", dtype=dt)
    if scratch.ndim != 1 or scratch.size < w.shape[0] * w.shape[1]:
        raise ValueError(f"scratch {tuple(scratch.shape)}: one dimension of at least "
                         f"{w.shape[0] * w.shape[1]} values (the weight's)")


def dequantize(w: Any, out: Any, *, stream: Any = None, symbols: Any = None) -> None:
    """out = quantized weight w as 16-bit values (n, k): FP8's T(float32(code x scale)),
    4-bit's T((q - zero) x scale) (the GEMV's own values); `reference.dequantize_*`."""
    if not isinstance(w, Quantized):
        raise TypeError(f"w must be an Fp8Weight or Int4Weight, got {type(w).__name__}")
    dt = shapes.tensor(out, "out", w.shape)
    if isinstance(w, Int4Weight):
        shapes.tensor(w.scales, "w.scales", dtype=dt, align=2)
    if not takes_quantized(w.fmt):
        raise ValueError(f"{type(w).__name__}: this GPU's compute capability is too old")
    n, k = w.shape
    args = (w.packed, w.scales, w.zeros, out, n, k, w.group) if isinstance(w, Int4Weight) \
        else (w.codes, w.scale, out, n, k)
    DEQUANTIZE[w.fmt, dt].launch(-(-n * k // (8 * QUANTIZE_THREADS)), QUANTIZE_THREADS, args,
                                 stream, symbols=symbols)


def check(w: Any, dt: str) -> None:
    """A projection's weight checked against the activations' dtype `dt`: a 16-bit weight
    of that dtype, or a quantized record (its scales and 16-bit copy, if any, of it)."""
    if not isinstance(w, Quantized):
        shapes.tensor(w, "w", dtype=dt)
        return
    if isinstance(w, Int4Weight):
        shapes.tensor(w.scales, "w.scales", dtype=dt, align=2)
    if w.wide is not None:
        shapes.tensor(w.wide, "w.wide", w.shape, dt)
    if not takes_quantized(w.fmt):
        raise ValueError(f"{type(w).__name__}: this GPU's compute capability is too old for "
                         f"its kernels")


def quantize_fp8(w: Any, codes: Any, scale: Any, *, stream: Any = None) -> None:
    """codes, scale = the e4m3 codes and per-row scales of the 16-bit weight w (n, k): each
    row's largest magnitude (at least 1e-12) over 448, then w / scale rounded to the nearest
    e4m3 (ties to even), saturating: `reference.quantize_fp8`'s bits."""
    dt, n, k = _weight(w, 2)
    shapes.array(codes, "codes", np.uint8, (n, k))
    shapes.row_array(scale, "scale", np.float32, n)
    if not takes_quantized():
        raise ValueError("FP8 quantization needs compute capability 8.9 or newer")
    QUANTIZE[dt].launch(n, QUANTIZE_THREADS, (w, codes, scale, n, k), stream)


def quantize_int4(w: Any, packed: Any, scales: Any, zeros: Any, group: int, *,
                  stream: Any = None) -> None:
    """packed, scales, zeros = the 4-bit values, scales and zero points of the 16-bit weight
    w (n, k) by groups of `group` values of a row, rounded to nearest (asymmetric: each
    group's range with 0 in it over 15 levels, the scale rounded to w's dtype first):
    `reference.quantize_int4`'s bits, packed by `pack_int4`."""
    dt, n, k = _weight(w, I4_K)
    if type(group) is not int or group < I4_K or group % I4_K or k % group:
        raise ValueError(f"group = {group!r}: a multiple of {I4_K} that divides k = {k}")
    shapes.array(packed, "packed", np.uint8, (n, k // 2))
    shapes.tensor(scales, "scales", (n, k // group), dt, align=2)
    shapes.array(zeros, "zeros", np.uint8, (n, k // group))
    QUANTIZE4[dt].launch(n, QUANTIZE_THREADS, (w, packed, scales, zeros, n, k, group), stream)


def _weight(w: Any, multiple: int) -> tuple[str, int, int]:
    dt = shapes.tensor(w, "w")
    if getattr(w, "ndim", 0) != 2:
        raise ValueError(f"w must be (n, k), got shape {w.shape}")
    n, k = w.shape
    shapes.multiple(k, multiple, "k")
    return dt, n, k


def pack_int4(q: np.ndarray) -> np.ndarray:
    """4-bit values (n, k) (uint8, 0-15; k a multiple of 8) as the kernels store them:
    uint8 (n, k / 2), each 4 bytes a little-endian word whose nibble I4_NIBBLE[v] holds
    value v of its 8."""
    q = np.asarray(q, np.uint8)
    n, k = q.shape
    if k % 8 or (q > 15).any():
        raise ValueError(f"4-bit values (n, k), k % 8 == 0 and each 0-15; got {q.shape}")
    words = np.zeros((n, k // 8), np.uint32)
    for v, nib in enumerate(I4_NIBBLE):
        words |= q[:, v::8].astype(np.uint32) << np.uint32(4 * nib)
    return words.view(np.uint8).reshape(n, k // 2)


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """`pack_int4`'s inverse: (n, k) uint8 values."""
    packed = np.ascontiguousarray(packed, np.uint8)
    n = packed.shape[0]
    words = packed.reshape(n, -1, 4).view(np.uint32).reshape(n, -1)
    q = np.zeros((n, words.shape[1] * 8), np.uint8)
    for v, nib in enumerate(I4_NIBBLE):
        q[:, v::8] = (words >> np.uint32(4 * nib)) & 0xF
    return q
