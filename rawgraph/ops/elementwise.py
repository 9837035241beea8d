"""Elementwise ops: residual add and SiLU(gate) * up (on the interleaved gate_up layout)."""

from __future__ import annotations

from typing import Any

import numpy as np

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
GATE_UP_GROUP = 8  # gate_up rows (and its output's columns): 8 gate, then their 8 up, ...


def stack_gate_up(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """The fused gate_up weight (2 * inter, hidden) from gate_proj and up_proj (inter,
    hidden) each: groups of GATE_UP_GROUP gate rows, each followed by the matching up rows,
    so one GEMV block's 16 rows hold both halves of 8 outputs (gemv.cu _silu)."""
    if gate.shape != up.shape or gate.ndim != 2 or gate.shape[0] % GATE_UP_GROUP:
        raise ValueError(f"gate {gate.shape} and up {up.shape} must be equal (inter, hidden) "
                         f"with inter a multiple of {GATE_UP_GROUP}")
    inter, hidden = gate.shape
    g = gate.reshape(inter // GATE_UP_GROUP, 1, GATE_UP_GROUP, hidden)
    u = up.reshape(inter // GATE_UP_GROUP, 1, GATE_UP_GROUP, hidden)
    return np.concatenate([g, u], axis=1).reshape(2 * inter, hidden)


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
    """out[r] = silu(gate[r]) * up[r] for r < rows (may be symbolic), gate_up (rows, 2 * inter)
    in the interleaved layout of `stack_gate_up`'s weight."""
    if getattr(gate_up, "ndim", 0) != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must be (rows, 2 * inter), got {getattr(gate_up, 'shape', '?')}")
    cap, inter = gate_up.shape[0], gate_up.shape[1] // 2
    shapes.multiple(inter, 8, "inter")
    dt = shapes.tensor(gate_up, "gate_up")
    shapes.tensor(out, "out", (cap, inter), dt)
    rows = shapes.count(rows, cap, "rows", symbols)
    grid = (cdiv(inter, 8 * SILU_BLOCK), rows)
    SILU_MUL[dt].launch(grid, SILU_BLOCK, (gate_up, out, rows, inter), stream, symbols=symbols)
