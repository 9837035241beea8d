"""What a head does to its logits before the sampler (kernels_cu/logits.cu): log-probabilities
of the raw row (the chosen token's and the top n), and a request's rules (presence, frequency
and repetition penalties, logit biases, min_tokens' bans) into a processed copy that the
sampler reads instead. Rows without either return at once, so a graph carries both for free
until a request asks.

Rules keep per-sequence state on the device (`RuleState`): each slot's token counts (output
count, prompt bit, bias bit), the next position to count, and its bias entries. A sequence's
first prefill chunk installs them (`rules_start`, then `rules_mark` for the prompt and bias
bits), so a decode step continuing the last one on the device needs nothing from the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cupy
import numpy as np

from rawgraph.cuda.kernel import Kernel
from rawgraph.ops import shapes
from rawgraph.symbols import Symbols

TOP_LOGPROBS = 20          # the most top entries a row asks for (OpenAI's limit)
LP_STRIDE = TOP_LOGPROBS + 1  # a row's entries: the chosen (or target) token, then the top n
MAX_LOGIT_BIAS = 300       # entries of one request's logit_bias
MAX_BANS = 64              # ids min_tokens bans (eos and stop ids)
BIAS_CAP = MAX_LOGIT_BIAS + MAX_BANS
COUNT_MASK, BIAS_BIT, PROMPT_BIT = (1 << 30) - 1, 1 << 30, 1 << 31
LOGITS_SMEM = 32 * 2 * 256 * 4  # radix_select's per-warp histograms (select.cuh)

_SIG = ("const {t}* logits, {t}* proc, int rows, int vocab, const int* positions, "
        "const int* top_n, const int* targets, int halves, float* lse, float* lp, int* lp_ids, "
        "const int* rules, const int* slots, const int* fed, int* counts, int* counted, "
        "const float* presence, const float* frequency, const float* repetition, "
        "const int* bias_n, const int* bias_ids, const float* bias_val, const int* bias_until, "
        "int bias_cap")
LOGITS = {"float16": Kernel("logits", "logits_f16", _SIG.format(t="__half")),
          "bfloat16": Kernel("logits", "logits_bf16", _SIG.format(t="__nv_bfloat16"))}
RULES_START = Kernel("logits", "rules_start",
                     "int seqs, const int* install, const int* seq_slots, const int* nb, "
                     "const int* ids, const float* vals, const int* until, int* counts, "
                     "int* counted, int* marks, int* bias_n, int* bias_ids, float* bias_val, "
                     "int* bias_until, int vocab, int bias_cap")
RULES_MARK = Kernel("logits", "rules_mark",
                    "int n, const int* ids, const int* tok_slots, int seqs, const int* install, "
                    "const int* seq_slots, const int* nb, const int* bias_ids, int* counts, "
                    "const int* marks, int vocab, int bias_cap")


class RuleState:
    """Per-sequence rule state on the device for `slots` sequences over `vocab` tokens: token
    counts (int32: bits 0-29 the output count, bit 30 a bias entry, bit 31 in the prompt),
    the next position to count, whether the prompt is marked, and up to BIAS_CAP bias
    entries (id, value, the position it holds until: min_tokens' bans end, biases don't)."""

    def __init__(self, slots: int, vocab: int):
        self.slots, self.vocab = slots, vocab
        self.counts = cupy.zeros((slots, vocab), np.int32)
        self.counted = cupy.zeros(slots, np.int32)
        self.marks = cupy.zeros(slots, np.int32)
        self.bias_n = cupy.zeros(slots, np.int32)
        self.bias_ids = cupy.zeros((slots, BIAS_CAP), np.int32)
        self.bias_val = cupy.zeros((slots, BIAS_CAP), np.float32)
        self.bias_until = cupy.zeros((slots, BIAS_CAP), np.int32)

    @property
    def nbytes(self) -> int:
        """Device bytes held."""
        return sum(a.nbytes for a in (self.counts, self.counted, self.marks, self.bias_n,
                                      self.bias_ids, self.bias_val, self.bias_until))


@dataclass(frozen=True)
class Logprobs:
    """Where a head's log-probabilities go: `top_n` (rows,) int32 per row (-1: none, else
    0..TOP_LOGPROBS top entries), `lse` (rows,) float32, and `lp` float32 / `ids` int32 of
    (rows, LP_STRIDE), or (rows, 2, LP_STRIDE) for halves (row r writes half positions[r] %
    2: mapped host memory a step and the step continuing it write in turn). Entry 0: the
    sampled (or target) token; entries 1..n: the top n."""

    top_n: Any
    lse: Any
    lp: Any
    ids: Any

    def check(self, n: int) -> int:
        """ValueError unless the buffers fit n rows; returns the halves (1 or 2)."""
        shapes.row_array(self.top_n, "top_n", np.int32, n)
        shapes.row_array(self.lse, "lse", np.float32, n)
        halves = 2 if getattr(self.lp, "ndim", 0) == 3 else 1
        shape = (n, LP_STRIDE) if halves == 1 else (n, 2, LP_STRIDE)
        shapes.array(self.lp, "lp", np.float32, shape)
        shapes.array(self.ids, "lp ids", np.int32, shape)
        return halves


@dataclass(frozen=True)
class RowRules:
    """A head's per-row rule inputs: `rules` (int32, nonzero: the row has rules), the rows'
    sequence `slots`, the penalties (float32 each), and the token `fed` at each row's
    position (decode steps: counted as an output; None for a prefill head, whose rows have
    no output yet)."""

    rules: Any
    slots: Any
    presence: Any
    frequency: Any
    repetition: Any
    fed: Any = None


def process(logits: Any, proc: Any, positions: Any, out: Logprobs, rows: Any = None, *,
            row_rules: RowRules | None = None, state: RuleState | None = None,
            targets: Any = None, stream: Any = None, symbols: Symbols | None = None) -> None:
    """Log-probabilities and rules of rows [:rows] of `logits` (rows, vocab).

    Rows with out.top_n[r] >= 0 get out.lse[r] (log-sum-exp of the raw row, fp32) and, in
    out's entries 1..n, the n largest raw logits' ids and log-probabilities (larger first,
    then smaller index); with `targets` (rows,) entry 0 holds the target's (else the sampler
    writes the chosen token's). Rows with rules (`row_rules` with `state`) get their
    processed row in `proc` (kernels_cu/logits.cu states the rule), which `sample(...,
    proc=, rules=)` then reads instead."""
    if getattr(logits, "ndim", 0) != 2:
        raise ValueError(f"logits must be (rows, vocab), got {getattr(logits, 'shape', '?')}")
    dt = shapes.tensor(logits, "logits", align=2)
    n, vocab = logits.shape
    shapes.tensor(proc, "proc", (n, vocab), dt, align=2)
    shapes.row_array(positions, "positions", np.int32, n)
    halves = out.check(n)
    if targets is not None:
        shapes.row_array(targets, "targets", np.int32, n)
    if (row_rules is None) != (state is None):
        raise ValueError("row_rules and state go together")
    rule_args: tuple = (None,) * 12
    if row_rules is not None and state is not None:
        rr, st = row_rules, state
        if st.vocab != vocab:
            raise ValueError(f"rule state over {st.vocab} tokens, logits over {vocab}")
        for arr, name, t in ((rr.rules, "rules", np.int32), (rr.slots, "slots", np.int32),
                             (rr.presence, "presence", np.float32),
                             (rr.frequency, "frequency", np.float32),
                             (rr.repetition, "repetition", np.float32)):
            shapes.row_array(arr, name, t, n)
        if rr.fed is not None:
            shapes.row_array(rr.fed, "fed", np.int32, n)
        rule_args = (rr.rules, rr.slots, rr.fed, st.counts, st.counted, rr.presence,
                     rr.frequency, rr.repetition, st.bias_n, st.bias_ids, st.bias_val,
                     st.bias_until)
    rows = shapes.count(rows, n, "rows", symbols)
    LOGITS[dt].launch(rows, 1024, (logits, proc, rows, vocab, positions, out.top_n, targets,
                                   halves, out.lse, out.lp, out.ids, *rule_args, BIAS_CAP),
                      stream, smem=LOGITS_SMEM, symbols=symbols)


def rules_start(state: RuleState, seqs: Any, install: Any, seq_slots: Any, staged: dict,
                *, stream: Any = None, symbols: Symbols | None = None) -> None:
    """Start the rules of the chunk's pieces i < seqs with install[i] bit 0 (a sequence's
    first piece): slot seq_slots[i]'s counts zeroed, its count position 0, its prompt marked
    from now on if bit 1 (repetition), and its staged bias entries (`staged`: "nb" (pieces,),
    "ids" / "vals" / "until" (pieces, BIAS_CAP)) copied in."""
    RULES_START.launch((seqs, 32), 256, (seqs, install, seq_slots, staged["nb"], staged["ids"],
                                         staged["vals"], staged["until"], state.counts,
                                         state.counted, state.marks, state.bias_n,
                                         state.bias_ids, state.bias_val, state.bias_until,
                                         state.vocab, BIAS_CAP),
                       stream, symbols=symbols)


def rules_mark(state: RuleState, n: Any, ids: Any, tok_slots: Any, seqs: Any, install: Any,
               seq_slots: Any, staged: dict, *, stream: Any = None,
               symbols: Symbols | None = None) -> None:
    """After `rules_start`: the prompt bit of each of the chunk's n tokens (ids, tok_slots)
    whose sequence marks its prompt, and the bias bit of each entry just installed."""
    RULES_MARK.launch((16, 2), 256, (n, ids, tok_slots, seqs, install, seq_slots, staged["nb"],
                                     staged["ids"], state.counts, state.marks, state.vocab,
                                     BIAS_CAP),
                      stream, symbols=symbols)
