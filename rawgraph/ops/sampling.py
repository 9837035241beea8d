"""Choosing tokens on the device, no host sync: greedy argmax, and seeded temperature /
top-k / top-p sampling with per-row parameters in device memory."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from rawgraph.cuda.kernel import Kernel
from rawgraph.ops import shapes
from rawgraph.symbols import Expr, Range, Sym, Symbols, current

ARGMAX = {"float16": Kernel("argmax", "argmax_f16",
                            "const __half* logits, int* out, int rows, int vocab"),
          "bfloat16": Kernel("argmax", "argmax_bf16",
                             "const __nv_bfloat16* logits, int* out, int rows, int vocab")}


def argmax(logits: Any, out: Any, rows: Any = None, *, stream: Any = None,
           symbols: Symbols | None = None) -> None:
    """out[r] = argmax(logits[r]) for r < rows (smallest index on ties; NaNs skipped)."""
    if getattr(logits, "ndim", 0) != 2:
        raise ValueError(f"logits must be (rows, vocab), got {getattr(logits, 'shape', '?')}")
    dt = shapes.tensor(logits, "logits", align=2)
    shapes.row_array(out, "out", np.int32, logits.shape[0])
    rows = shapes.count(rows, logits.shape[0], "rows", symbols)
    ARGMAX[dt].launch(rows, 1024, (logits, out, rows, logits.shape[1]), stream,
                      symbols=symbols)


_SAMPLE = ("const {t}* logits, const float* temperature, const int* top_k, const float* top_p, "
           "const unsigned long long* seeds, int* positions, int* out, int rows, "
           "int vocab, unsigned long long* row_max, int* host_out, int advance, int* ids, "
           "const int* seq_slots, int* seq_lens")
SAMPLE = {"float16": Kernel("sample", "sample_f16", _SAMPLE.format(t="__half")),
          "bfloat16": Kernel("sample", "sample_bf16", _SAMPLE.format(t="__nv_bfloat16"))}
GREEDY_TEMPERATURE = 1e-6  # at or below: argmax (sample.cu tests the same bound)
SAMPLE_SMEM = 32 * 2 * 256 * 4  # per-warp radix histograms (two 32-bit halves)


@dataclass(frozen=True)
class Handoff:
    """Where a decode step's tokens go besides `out` (sample.cu's last arguments).

    `host`: (rows, 2) int32 in mapped pinned memory (`MappedArray.dev`), so the host reads
    the tokens once the step is done, with no copy: row r's token at [r, positions[r] % 2],
    so a step and the step continuing it (positions + 1) write different halves and one can
    be read while the other runs. `advance` (0 or 1, or a symbol in [0, 1] in graphs): each
    row with a sequence (`seq_slots` >= 0) takes its token as the next step's input (`ids`),
    its position (sample's `positions`) + 1 and its sequence's cache length (`seq_lens`)
    + 1, so a step continuing this one needs nothing from the host.
    """

    ids: Any
    seq_slots: Any
    seq_lens: Any
    advance: Any = 1
    host: Any = None


def sample(logits: Any, out: Any, temperature: Any, top_k: Any, top_p: Any, seeds: Any,
           positions: Any, rows: Any = None, *, row_max: Any = None,
           handoff: Handoff | None = None, stream: Any = None,
           symbols: Symbols | None = None) -> None:
    """out[r] = a token drawn from softmax(logits[r] / temperature[r]) after top-k and top-p.

    Per-row device arrays: temperature (float32; <= 1e-6 means greedy), top_k (int32; <= 0
    off), top_p (float32; >= 1 off), seeds (uint64), positions (int32, mixed into the seed so
    each step draws afresh). The same (seed, position, logits) always give the same token.
    `row_max`: what `linear(..., row_max=)` merged while writing these logits: greedy rows
    take their token from it (no pass over the row), and every row's entry is reset to 0.
    `handoff`: where the tokens also go (Handoff).
    """
    if getattr(logits, "ndim", 0) != 2:
        raise ValueError(f"logits must be (rows, vocab), got {getattr(logits, 'shape', '?')}")
    dt = shapes.tensor(logits, "logits", align=2)
    n = logits.shape[0]
    shapes.row_array(out, "out", np.int32, n)
    for arr, name, t in ((temperature, "temperature", np.float32), (top_k, "top_k", np.int32),
                         (top_p, "top_p", np.float32), (seeds, "seeds", np.uint64),
                         (positions, "positions", np.int32)):
        shapes.row_array(arr, name, t, n)
    if row_max is not None:
        shapes.row_array(row_max, "row_max", np.uint64, n)
    h = handoff or Handoff(None, None, None, advance=0)
    if handoff is not None:
        _check_handoff(handoff, n, symbols)
    rows = shapes.count(rows, n, "rows", symbols)
    SAMPLE[dt].launch(rows, 1024, (logits, temperature, top_k, top_p, seeds, positions, out,
                                   rows, logits.shape[1], row_max, h.host, h.advance, h.ids,
                                   h.seq_slots, h.seq_lens),
                      stream, smem=SAMPLE_SMEM, symbols=symbols)


def _check_handoff(h: Handoff, n: int, symbols: Symbols | None) -> None:
    shapes.row_array(h.ids, "handoff ids", np.int32, n)
    shapes.row_array(h.seq_slots, "handoff seq_slots", np.int32, n)
    shapes.array(h.seq_lens, "handoff seq_lens", np.int32, (None,))
    if h.host is not None:
        shapes.array(h.host, "handoff host", np.int32, (n, 2))
    symbols = current(symbols)
    if isinstance(h.advance, Expr):
        spec = symbols.specs.get(h.advance.name) if symbols is not None \
            and isinstance(h.advance, Sym) else None
        if not isinstance(spec, Range) or spec.lo < 0 or spec.hi > 1:
            raise ValueError(f"handoff advance = {h.advance!r} must be a symbol in [0, 1]")
    elif h.advance not in (0, 1):
        raise ValueError(f"handoff advance = {h.advance!r} must be 0 or 1")


def _real(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{what} must be a number, got {type(v).__name__} {v!r}")
    if not math.isfinite(v):
        raise ValueError(f"{what} must be finite, got {v}")
    return float(v)


def _integer(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{what} must be an integer, got {type(v).__name__} {v!r}")
    return int(v)


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens: temperature <= 1e-6 is greedy; top_k <= 0 and
    top_p >= 1 switch those cuts off; `seed` makes the draws reproducible. Checked when made:
    TypeError for a wrong type (a float seed, a string), ValueError for a value out of range
    (temperature finite and >= 0, top_k >= 0, 0 < top_p <= 1, 0 <= seed < 2**64)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        t, p = _real(self.temperature, "temperature"), _real(self.top_p, "top_p")
        k, seed = _integer(self.top_k, "top_k"), _integer(self.seed, "seed")
        for ok, what in ((t >= 0, f"temperature = {t} must be >= 0"),
                         (0 <= k < 2**31, f"top_k = {k} must be in [0, 2**31) (0: off)"),
                         (0 < p <= 1, f"top_p = {p} must be in (0, 1]"),
                         (0 <= seed < 2**64, f"seed = {seed} must be in [0, 2**64)")):
            if not ok:
                raise ValueError(what)
        for name, v in (("temperature", t), ("top_k", k), ("top_p", p), ("seed", seed)):
            object.__setattr__(self, name, v)  # plain Python numbers from here on
