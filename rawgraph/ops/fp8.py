"""FP8 weights in the decode GEMV (W8A16): an (n, k) weight as e4m3fn codes with a float32
scale per output row. gemv.cu's FP8 forms widen a lane's 16 bytes of codes to 16 values of
the activations' dtype in registers (exact: every e4m3 value is a half and a bfloat16), sum
on the tensor cores in fp32 as the 16-bit GEMV does, and multiply each row's finished sum by
its scale: y[i, r] = T(scale[r] * sum_j x[i, j] * e4m3(codes[r, j]) (+ residual[i, r])).

At one row a decode step reads its weights once, so FP8 halves the step's floor. Up to 16
rows (the GEMV's x tiles); more rows take 16-bit weights for now (a checkpoint's FP8
weights are dequantized at load where the model needs them: `rawgraph.model.quant`).
A per-tensor scale is a per-row scale repeated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rawgraph.cuda.device import compute_capability
from rawgraph.ops import shapes
from rawgraph.ops.gemv import GEMV_F8, M_TILES, gemv_launch
from rawgraph.ops.variant import by_count
from rawgraph.symbols import Symbols

FP8_ROWS = M_TILES[-1]  # rows of x an FP8 weight takes (the GEMV's)
FP8_K = 16  # k must be a multiple: a lane reads 16 codes at a time


@dataclass(frozen=True)
class Fp8Weight:
    """An (n, k) weight stored as FP8: `codes` uint8 (n, k), e4m3fn bit patterns (no NaN:
    0x7F / 0xFF), and `scale` float32 (n,), row r's values being codes[r] * scale[r]. Build
    it with `fp8_weight`, which checks both."""

    codes: Any
    scale: Any

    @property
    def shape(self) -> tuple[int, int]:
        """(n, k), as a 16-bit weight's."""
        return tuple(self.codes.shape)  # type: ignore[return-value]


def fp8_weight(codes: Any, scale: Any) -> Fp8Weight:
    """An `Fp8Weight` from device arrays, checked: ValueError naming what is wrong."""
    if getattr(codes, "ndim", 0) != 2:
        raise ValueError(f"codes must be (n, k), got shape {getattr(codes, 'shape', '?')}")
    n, k = codes.shape
    shapes.array(codes, "codes", np.uint8, (n, k))
    shapes.multiple(k, FP8_K, "k")
    shapes.row_array(scale, "scale", np.float32, n)
    return Fp8Weight(codes, scale)


def takes_fp8() -> bool:
    """Whether this GPU runs the FP8 GEMV (its e4m3 conversion is sm_89's on)."""
    return compute_capability() >= (8, 9)


def linear_fp8(x: Any, w: Fp8Weight, y: Any, *, residual: Any = None, m: Any = None,
               m_max: int | None = None, row_max: Any = None, stream: Any = None,
               symbols: Symbols | None = None) -> None:
    """y[:m] = x[:m] @ W.T (+ residual[:m]) for an FP8 weight W (`Fp8Weight`, (n, k));
    x (rows, k), y (rows, n) in fp16 or bf16; at most FP8_ROWS rows (m's bound, or m_max).

    As `ops.linear` for the rest: `m` may be symbolic, the kernel is chosen for `m_max`
    rows when given, `row_max` (uint64 (rows,)) also keeps each row's greedy pick."""
    if not isinstance(w, Fp8Weight):
        raise TypeError(f"w must be an Fp8Weight (ops.fp8_weight), got {type(w).__name__}")
    if getattr(x, "ndim", 0) != 2:
        raise ValueError(f"x must be (rows, k), got shape {getattr(x, 'shape', '?')}")
    (cap, k), (n, kw) = x.shape, w.shape
    if kw != k:
        raise ValueError(f"x has k = {k} columns but w is {w.shape} (w must be [out, in])")
    dt = shapes.tensor(x, "x")
    m = shapes.count(m, cap, "m", symbols)
    top = shapes.top(m, "m", symbols)
    if m_max is not None:
        if not top <= m_max <= cap:
            raise ValueError(f"m_max = {m_max} must lie in [{top}, {cap}] (m's bound, rows)")
        top = m_max
    if top > FP8_ROWS:
        raise ValueError(f"{top} rows: an FP8 weight takes at most {FP8_ROWS} (the GEMV's)")
    shapes.tensor(y, "y", (cap, n), dt, align=2)
    if residual is not None:
        shapes.tensor(residual, "residual", (cap, n), dt, align=2)
    if shapes.overlap(x, y):
        raise ValueError("y must not overlap x (other blocks still read x while y is written)")
    if row_max is not None:
        shapes.row_array(row_max, "row_max", np.uint64, cap)
    if not takes_fp8():
        raise ValueError("the FP8 GEMV needs compute capability 8.9 or newer")

    def run(rows: int) -> None:
        key, grid, threads = gemv_launch(dt, rows, n, k, fp8=True)
        GEMV_F8[key].launch(grid, threads, (x, w.codes, w.scale, residual, y, m, n, k, row_max),
                            stream, symbols=symbols)
    by_count(m if m_max is None else m_max, run,
             lambda v: gemv_launch(dt, v, n, k, fp8=True)[0][1:], stream=stream,
             symbols=symbols)
