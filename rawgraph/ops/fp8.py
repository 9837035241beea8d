"""FP8 weights (W8A16): an (n, k) weight as e4m3fn codes with a float32 scale per output row,
which the projections (`ops.linear`, `qkv_rope`, `gate_up_silu`) take in place of a 16-bit
weight.

On the GEMV path (decode, up to 16 rows) gemv.cu's FP8 forms widen a lane's 16 bytes of
codes to 16 values of the activations' dtype in registers (exact: every e4m3 value is a
half and a bfloat16), sum on the tensor cores in fp32 as the 16-bit GEMV does, and multiply
each row's finished sum by its scale: y[i, r] = T(scale[r] * sum_j x[i, j] * e4m3(codes[r,
j]) (+ residual[i, r])). At one row a decode step reads its weights once, so FP8 halves the
step's floor. The other paths (the skinny GEMM, the tiled GEMM) have no FP8 form yet: they
take the weight's 16-bit copy (`Fp8Weight.wide`), which a model keeps beside the codes for
now. A per-tensor scale is a per-row scale repeated.

`quantize` makes the codes and scales of a 16-bit weight on the GPU (per output row, round
to nearest even, saturating at 448), the bits `rawgraph.model.quant.quantize` gives for
the "channel" strategy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rawgraph.cuda.device import compute_capability
from rawgraph.cuda.kernel import Kernel
from rawgraph.dtypes import KERNEL_TYPES
from rawgraph.ops import shapes
from rawgraph.ops.gemv import M_TILES

FP8_ROWS = M_TILES[-1]  # rows of x the FP8 kernels take (the GEMV's)
FP8_K = 16  # k must be a multiple: a lane reads 16 codes at a time
QUANTIZE = {dt: Kernel("fp8_quantize", f"fp8_quantize_{s}",
                       f"const {t}* w, unsigned char* codes, float* scale, int n, int k")
            for dt, (s, t) in KERNEL_TYPES.items()}
QUANTIZE_THREADS = 256  # fp8_quantize.cu: a block a row


@dataclass(frozen=True)
class Fp8Weight:
    """An (n, k) weight stored as FP8: `codes` uint8 (n, k), e4m3fn bit patterns (no NaN:
    0x7F / 0xFF), and `scale` float32 (n,), row r's values being codes[r] * scale[r];
    `wide`: the weight in the activations' dtype for the paths with no FP8 form (None: only
    the GEMV's rows). Build it with `fp8_weight`, which checks them."""

    codes: Any
    scale: Any
    wide: Any = None

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
        """The bytes an FP8 kernel reads of it: codes and scales."""
        return int(self.codes.nbytes + self.scale.nbytes)


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


def takes_fp8() -> bool:
    """Whether this GPU runs the FP8 kernels (their e4m3 conversions are sm_89's on)."""
    return compute_capability() >= (8, 9)


def wide(w: Any, rows: int) -> Any:
    """The 16-bit weight a path with no FP8 form takes for `rows` rows: `w` itself, or an
    `Fp8Weight`'s copy (ValueError when it keeps none)."""
    if not isinstance(w, Fp8Weight):
        return w
    if w.wide is None:
        raise ValueError(f"{rows} rows: an FP8 weight without a 16-bit copy (wide) takes only "
                         f"the GEMV's rows (at most {FP8_ROWS}, fewer for wide weights)")
    return w.wide


def check(w: Any, dt: str) -> None:
    """A projection's weight checked against the activations' dtype `dt`: a 16-bit weight
    of that dtype, or an `Fp8Weight` (whose 16-bit copy, if any, has it)."""
    if not isinstance(w, Fp8Weight):
        shapes.tensor(w, "w", dtype=dt)
        return
    if w.wide is not None:
        shapes.tensor(w.wide, "w.wide", w.shape, dt)
    if not takes_fp8():
        raise ValueError("FP8 weights need compute capability 8.9 or newer")


def quantize(w: Any, codes: Any, scale: Any, *, stream: Any = None) -> None:
    """codes, scale = the e4m3 codes and per-row scales of the 16-bit weight w (n, k): see
    the module docstring. codes uint8 (n, k), scale float32 (n,)."""
    dt = shapes.tensor(w, "w")
    if getattr(w, "ndim", 0) != 2:
        raise ValueError(f"w must be (n, k), got shape {w.shape}")
    n, k = w.shape
    shapes.array(codes, "codes", np.uint8, (n, k))
    shapes.row_array(scale, "scale", np.float32, n)
    shapes.multiple(k, 2, "k")
    if not takes_fp8():
        raise ValueError("FP8 quantization needs compute capability 8.9 or newer")
    QUANTIZE[dt].launch(n, QUANTIZE_THREADS, (w, codes, scale, n, k), stream)
