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
from rawgraph.ops.logits import MAX_LOGIT_BIAS, TOP_LOGPROBS, Logprobs
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


_SAMPLE = ("const {t}* logits, const {t}* proc, const int* rules, const float* temperature, "
           "const int* top_k, const float* top_p, const unsigned long long* seeds, "
           "int* positions, int* out, int rows, int vocab, unsigned long long* row_max, "
           "int* host_out, int advance, int* ids, const int* seq_slots, int* seq_lens, "
           "const int* top_n, const float* lse, float* lp, int* lp_ids")
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
           handoff: Handoff | None = None, proc: Any = None, rules: Any = None,
           logprobs: Logprobs | None = None, stream: Any = None,
           symbols: Symbols | None = None) -> None:
    """out[r] = a token drawn from softmax(logits[r] / temperature[r]) after top-k and top-p.

    Per-row device arrays: temperature (float32; <= 1e-6 means greedy), top_k (int32; <= 0
    off), top_p (float32; >= 1 off), seeds (uint64), positions (int32, mixed into the seed so
    each step draws afresh). The same (seed, position, logits) always give the same token.
    `row_max`: what `linear(..., row_max=)` merged while writing these logits: greedy rows
    take their token from it (no pass over the row), and every row's entry is reset to 0.
    `handoff`: where the tokens also go (Handoff).
    `proc`, `rules`: rows with rules[r] != 0 draw from proc's row instead (`ops.process`
    wrote it), and never from row_max's key. `logprobs`: rows with top_n[r] >= 0 get the
    token's raw log-probability (logits[token] - lse[r]) and id in entry 0 (halves, when
    lp has them, as `handoff.host`'s: the position's parity).
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
    if (proc is None) != (rules is None):
        raise ValueError("proc and rules go together")
    if proc is not None:
        shapes.tensor(proc, "proc", logits.shape, dt, align=2)
        shapes.row_array(rules, "rules", np.int32, n)
    lp = logprobs or Logprobs(None, None, None, None)
    if logprobs is not None and logprobs.check(n) != (2 if h.host is not None else 1):
        raise ValueError("logprobs: halves (rows, 2, LP_STRIDE) exactly when the tokens go "
                         "to handoff.host")
    rows = shapes.count(rows, n, "rows", symbols)
    SAMPLE[dt].launch(rows, 1024, (logits, proc, rules, temperature, top_k, top_p, seeds,
                                   positions, out, rows, logits.shape[1], row_max, h.host,
                                   h.advance, h.ids, h.seq_slots, h.seq_lens, lp.top_n, lp.lse,
                                   lp.lp, lp.ids),
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


def _top(v: Any, what: str) -> int | None:
    if v is None:
        return None
    n = _integer(v, what)
    if not 0 <= n <= TOP_LOGPROBS:
        raise ValueError(f"{what} = {n} must be in [0, {TOP_LOGPROBS}] (or None: off)")
    return n


def _bias(v: Any) -> tuple[tuple[int, float], ...]:
    items = v.items() if isinstance(v, dict) else v
    try:
        pairs = [(k, b) for k, b in items]
    except (TypeError, ValueError):
        raise TypeError(f"logit_bias must map token ids to biases, got {type(v).__name__}") \
            from None
    out: dict[int, float] = {}
    for k, b in pairs:
        tok, bias = _integer(k, "logit_bias token id"), _real(b, f"logit_bias[{k}]")
        if tok < 0:
            raise ValueError(f"logit_bias token id {tok} must be >= 0")
        if not -100 <= bias <= 100:
            raise ValueError(f"logit_bias[{tok}] = {bias} must be in [-100, 100]")
        if tok in out:
            raise ValueError(f"logit_bias names token id {tok} twice")
        out[tok] = bias
    if len(out) > MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias has {len(out)} entries, at most {MAX_LOGIT_BIAS}")
    return tuple(sorted(out.items()))


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens and what it reports. Checked when made: TypeError
    for a wrong type (a float seed, a string), ValueError for a value out of range.

    temperature (>= 0; <= 1e-6 is greedy), top_k (>= 0; 0 off), top_p (in (0, 1]; 1 off),
    seed (in [0, 2**64)): the draw. Rules, applied on the device before the draw
    (`ops.process`), in vLLM's order: `logit_bias` (token id -> bias in [-100, 100], up to
    300 entries; a dict or pairs), then `repetition_penalty` (in (0, 2]; 1 off: tokens in the
    prompt or the output divided by it when positive, multiplied when not, as Hugging Face's),
    `frequency_penalty` and `presence_penalty` (in [-2, 2], OpenAI's: minus the output count
    times the one, minus the other once a token is in the output); `min_tokens` (>= 0): the
    request's stop ids are banned until that many tokens are out. `logprobs` (None, or 0 to
    20): each output token's log-probability and that many top alternatives;
    `prompt_logprobs` (likewise): each prompt token's. Log-probabilities are the model's raw
    distribution's (before rules and temperature).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Any = ()
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        t, p = _real(self.temperature, "temperature"), _real(self.top_p, "top_p")
        k, seed = _integer(self.top_k, "top_k"), _integer(self.seed, "seed")
        pres = _real(self.presence_penalty, "presence_penalty")
        freq = _real(self.frequency_penalty, "frequency_penalty")
        rep = _real(self.repetition_penalty, "repetition_penalty")
        min_tokens = _integer(self.min_tokens, "min_tokens")
        for ok, what in ((t >= 0, f"temperature = {t} must be >= 0"),
                         (0 <= k < 2**31, f"top_k = {k} must be in [0, 2**31) (0: off)"),
                         (0 < p <= 1, f"top_p = {p} must be in (0, 1]"),
                         (0 <= seed < 2**64, f"seed = {seed} must be in [0, 2**64)"),
                         (-2 <= pres <= 2, f"presence_penalty = {pres} must be in [-2, 2]"),
                         (-2 <= freq <= 2, f"frequency_penalty = {freq} must be in [-2, 2]"),
                         (0 < rep <= 2, f"repetition_penalty = {rep} must be in (0, 2]"),
                         (min_tokens >= 0, f"min_tokens = {min_tokens} must be >= 0")):
            if not ok:
                raise ValueError(what)
        values = {"temperature": t, "top_k": k, "top_p": p, "seed": seed,
                  "presence_penalty": pres, "frequency_penalty": freq,
                  "repetition_penalty": rep, "logit_bias": _bias(self.logit_bias),
                  "min_tokens": min_tokens, "logprobs": _top(self.logprobs, "logprobs"),
                  "prompt_logprobs": _top(self.prompt_logprobs, "prompt_logprobs")}
        for name, v in values.items():
            object.__setattr__(self, name, v)  # plain Python values from here on

    @property
    def penalized(self) -> bool:
        """Whether a penalty applies (they need the sequence's token counts)."""
        return bool(self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty != 1)

    def rules(self, bans: bool = False) -> bool:
        """Whether the row has rules: a penalty, a bias, or (`bans`: stop ids to ban)
        min_tokens."""
        return self.penalized or bool(self.logit_bias) or (bans and self.min_tokens > 0)
