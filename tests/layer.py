"""A small decoder-like sequence of ops on static buffers, for the graph tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cupy

from rawgraph import ops
from rawgraph.symbols import Symbols
from tests.helpers import poisoned, randn

DIM, INTER = 256, 512


@dataclass
class Buffers:
    x: Any
    res: Any
    w: Any
    h: Any
    res_out: Any
    gu: Any
    act: Any
    y: Any

    def outputs(self) -> list:
        return [self.h, self.res_out, self.act, self.y]

    def all(self) -> list:
        return [self.x, self.res, self.w, self.h, self.res_out, self.gu, self.act, self.y]

    def poison(self) -> None:
        for b, src in zip(self.outputs(), [poisoned(b.shape, "float16") for b in self.outputs()]):
            b[...] = src


def buffers(rng, rows: int) -> Buffers:
    """Inputs random, outputs poisoned; all fp16, `rows` rows of capacity."""
    x, _ = randn(rng, (rows, DIM), "float16")
    res, _ = randn(rng, (rows, DIM), "float16")
    w, _ = randn(rng, (DIM,), "float16")
    gu, _ = randn(rng, (rows, 2 * INTER), "float16")
    return Buffers(x, res, w, poisoned((rows, DIM), "float16"), poisoned((rows, DIM), "float16"),
                   gu, poisoned((rows, INTER), "float16"), poisoned((rows, DIM), "float16"))


def layer(b: Buffers, stream: Any, rows: Any = None, S: Symbols | None = None,
          past: Any = None) -> None:
    """rmsnorm(+residual) -> silu_mul -> add; `past` adds a node that reads a second symbol."""
    ops.rmsnorm(b.x, b.w, b.h, residual=b.res, residual_out=b.res_out, rows=rows,
                stream=stream, symbols=S)
    ops.silu_mul(b.gu, b.act, rows, stream=stream, symbols=S)
    ops.add(b.h, b.res_out, b.y, None if rows is None else rows * DIM, stream=stream, symbols=S)
    if past is not None:
        ops.add(b.x, b.res, b.h, past, stream=stream, symbols=S)


def snapshot(bufs: list) -> list:
    return [cupy.asnumpy(b).view("uint16").copy() for b in bufs]
