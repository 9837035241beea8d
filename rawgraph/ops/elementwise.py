"""Elementwise ops: residual add and SiLU(gate) * up."""

from __future__ import annotations

from typing import Any

from rawgraph.cuda.kernel import Kernel
from rawgraph.ops import shapes
from rawgraph.symbols import Symbols, cdiv

ADD = {
    "float16": Kernel("add", "add_f16", "const __half* a, const __half* b, __half* out, int n"),
    "bfloat16": Kernel("add", "add_bf16", "const __nv_bfloat16* a, const __nv_bfloat16* b, "
                                          "__nv_bfloat16* out, int n"),
}
SILU_MUL = {
    "float16": Kernel("silu_mul", "silu_mul_f16",
                      "const __half* gate_up, __half* out, int rows, int inter"),
    "bfloat16": Kernel("silu_mul", "silu_mul_bf16",
                       "const __nv_bfloat16* gate_up, __nv_bfloat16* out, int rows, int inter"),
}
ADD_BLOCK, SILU_BLOCK = 256, 128


def add(a: Any, b: Any, out: Any, n: Any = None, *, stream: Any = None,
        symbols: Symbols | None = None) -> None:
    """out[:n] = a[:n] + b[:n] over the flattened arrays (n may be symbolic)."""
    dt = shapes.tensor(a, "a", align=2)
    shapes.tensor(b, "b", a.shape, dt, align=2)
    shapes.tensor(out, "out", a.shape, dt, align=2)
    n = shapes.count(n, a.size, "n", symbols)
    ADD[dt].launch(cdiv(n, 8 * ADD_BLOCK), ADD_BLOCK, (a, b, out, n), stream, symbols=symbols)


def silu_mul(gate_up: Any, out: Any, rows: Any = None, *, stream: Any = None,
             symbols: Symbols | None = None) -> None:
    """out[r] = silu(gate_up[r, :inter]) * gate_up[r, inter:] for r < rows (may be symbolic)."""
    if getattr(gate_up, "ndim", 0) != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must be (rows, 2 * inter), got {getattr(gate_up, 'shape', '?')}")
    cap, inter = gate_up.shape[0], gate_up.shape[1] // 2
    shapes.multiple(inter, 8, "inter")
    dt = shapes.tensor(gate_up, "gate_up")
    shapes.tensor(out, "out", (cap, inter), dt)
    rows = shapes.count(rows, cap, "rows", symbols)
    grid = (cdiv(inter, 8 * SILU_BLOCK), rows)
    SILU_MUL[dt].launch(grid, SILU_BLOCK, (gate_up, out, rows, inter), stream, symbols=symbols)
