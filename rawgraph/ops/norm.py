"""RMSNorm, optionally fused with the residual add before it; its weight folded into the
projection that reads its output (`fold_norm`), leaving the norm a scale per row."""

from __future__ import annotations

from typing import Any

import numpy as np

from rawgraph.cuda.kernel import Kernel
from rawgraph.ops import shapes
from rawgraph.ops.variant import chosen
from rawgraph.symbols import Symbols, cdiv

_SIG = "const {t}* x, const {t}* residual, const {t}* w, {t}* out, {t}* residual_out, " \
       "int rows, int dim, float eps, const int* gather, int x_rows"
RMSNORM = {
    "float16": Kernel("rmsnorm", "rmsnorm_f16", _SIG.format(t="__half")),
    "bfloat16": Kernel("rmsnorm", "rmsnorm_bf16", _SIG.format(t="__nv_bfloat16")),
}
RMSNORM_ROWS = {  # a warp per row
    "float16": Kernel("rmsnorm", "rmsnorm_rows_f16", _SIG.format(t="__half")),
    "bfloat16": Kernel("rmsnorm", "rmsnorm_rows_bf16", _SIG.format(t="__nv_bfloat16")),
}
_SIG_FOLD = "{t}* w, const {t}* g, long long count, int dim"
FOLD = {
    "float16": Kernel("rmsnorm", "fold_norm_f16", _SIG_FOLD.format(t="__half")),
    "bfloat16": Kernel("rmsnorm", "fold_norm_bf16", _SIG_FOLD.format(t="__nv_bfloat16")),
}
BLOCK = 256
WARP_ROWS = 4  # rmsnorm_rows_*: a warp per row, WARP_ROWS rows a block
# a warp per row where the rows can reach this many (a prefill chunk), a block per row below:
# a block spreads one row over 256 threads, which few rows need (decode's final norm: one row
# of 4,096 1.9 us a block, 5.3 a warp) and many rows starve of loads in flight (8,192 x 2,048:
# 29.1 us a block, 18.3 a warp; benchmarks/NOTES.md, "Norms, RoPE"): from
# `Variants.norm_warp_rows_from` rows (1,024). Both forms give the same bits.
FOLD_GRID = 1024  # blocks of fold_norm's grid-stride loop


def rmsnorm(x: Any, w: Any, out: Any, *, residual: Any = None, residual_out: Any = None,
            rows: Any = None, eps: float = 1e-5, gather: Any = None, stream: Any = None,
            symbols: Symbols | None = None) -> None:
    """out = rmsnorm(x [+ residual]) * w over the first `rows` rows (rows may be symbolic);
    w None: no weight (it was folded into the next projection, `fold_norm`).

    With `residual`, also writes residual_out = x + residual (it may be `residual` itself).
    With `gather` (int32, one index per row of out), row r of out is the norm of x's row
    gather[r] (x may then have any number of rows; an index outside them gives zeros).

    Its two forms (a block or a warp per row, `rmsnorm_launch`: by the most rows `rows`
    can take) add a row's squares in one order: the same bits whichever a count picks, so
    a row's result does not depend on the row count, on whether it was a symbol, nor on
    the symbol's range.
    """
    if getattr(x, "ndim", 0) != 2:
        raise ValueError(f"x must be (rows, dim), got shape {getattr(x, 'shape', '?')}")
    x_rows, dim = x.shape
    shapes.multiple(dim, 8, "dim")
    dt = shapes.tensor(x, "x")
    if w is not None:
        shapes.tensor(w, "w", (dim,), dt)
    if gather is None:
        shapes.tensor(out, "out", x.shape, dt)
    else:
        shapes.tensor(out, "out", dtype=dt)
        if out.shape[1:] != (dim,):
            raise ValueError(f"out must be (rows, {dim}), got shape {out.shape}")
        shapes.row_array(gather, "gather", np.int32, out.shape[0])
        if residual is not None:
            raise ValueError("gather takes no residual (a gathered row has none)")
    if out is x:
        raise ValueError("out must not be x (the kernel reads x after writing out)")
    if (residual is None) != (residual_out is None):
        raise ValueError("pass residual and residual_out together")
    if residual is not None:
        shapes.tensor(residual, "residual", x.shape, dt)
        shapes.tensor(residual_out, "residual_out", x.shape, dt)
    rows = shapes.count(rows, out.shape[0], "rows", symbols)
    warp, grid, block = rmsnorm_launch(rows, symbols)
    (RMSNORM_ROWS if warp else RMSNORM)[dt].launch(
        grid, block, (x, residual, w, out, residual_out, rows, dim, eps, gather, x_rows),
        stream, symbols=symbols)


def rmsnorm_launch(rows: Any, symbols: Symbols | None = None) -> tuple[bool, Any, int]:
    """(a warp per row, grid, block) of rmsnorm over `rows` rows (an int or an expression
    with ranged symbols): a warp per row where rows can reach `Variants.norm_warp_rows_from`."""
    if shapes.top(rows, "rows", symbols) >= chosen().norm_warp_rows_from:
        return True, cdiv(rows, WARP_ROWS), 32 * WARP_ROWS
    return False, rows, BLOCK


def fold_norm(w: Any, g: Any, *, stream: Any = None) -> None:
    """w = w * g column by column, in place, rounded once to the storage type: w (n, dim)
    reads the output of an RMSNorm whose weight is g (dim,). Afterwards the projection takes
    rmsnorm(x) without the weight (`rmsnorm(x, None, ...)`, or the GEMV's `norm_eps`)."""
    if getattr(w, "ndim", 0) != 2:
        raise ValueError(f"w must be (n, dim), got shape {getattr(w, 'shape', '?')}")
    dim = w.shape[1]
    shapes.multiple(dim, 8, "dim")
    dt = shapes.tensor(w, "w")
    shapes.tensor(g, "g", (dim,), dt)
    count = w.size
    FOLD[dt].launch(max(1, min(FOLD_GRID, -(-count // (8 * BLOCK)))), BLOCK,
                    (w, g, count, dim), stream)
