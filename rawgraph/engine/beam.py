"""Beam search on the engine's runner: beams are sequences in cache slots that fork and drop
blocks every step, one decode step over the live beams per token.

A beam that several continuations follow is forked (`BlockTables.fork`: the child shares the
parent's blocks, the last, partly filled one copied on write before the step writes into it);
a beam no continuation follows is freed. The step's rows and block tables change every token
and are patched into the decode graph of the rows' bucket, never captured again.

Scores follow Hugging Face's `generate(num_beams=k, do_sample=False)`: a beam's score is the
sum of its tokens' log-probabilities (the raw distribution: each row's top 2k come from the
sampler's log-probability pass); each step the 2k best continuations of all beams are ranked,
the first k that do not end at an eos id go on, and one that ends there within the first k
is a finished hypothesis, scored sum / generated_length ** length_penalty (the eos token
counted). At max_tokens the running beams finish too; the search stops early once no running
beam can beat the worst of k finished ones at its current length.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from rawgraph.engine.request import token_ids
from rawgraph.model.step import PrefillPiece
from rawgraph.ops.logits import TOP_LOGPROBS
from rawgraph.ops.sampling import SamplingParams


@dataclass(frozen=True)
class Hypothesis:
    """A finished beam: its generated `tokens` (an eos id last where one ended it), the sum
    of their log-probabilities, and its score (`logprob / len(tokens) ** length_penalty`)."""

    tokens: tuple[int, ...]
    logprob: float
    score: float


@dataclass
class _Beam:
    slot: int
    tokens: list[int]
    logprob: float


def _check(engine: Any, prompt: list[int], width: int, max_tokens: int,
           length_penalty: float) -> None:
    m = engine.model
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) \
            or not math.isfinite(length_penalty):
        raise ValueError(f"length_penalty = {length_penalty!r}: a finite number")
    if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= min(
            m.max_batch, TOP_LOGPROBS // 2):
        raise ValueError(f"beam_width = {width!r}: an int in [1, {min(m.max_batch, 10)}] "
                         f"(max_batch, and 2 x beams within the {TOP_LOGPROBS} top entries)")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens = {max_tokens!r}: a positive int")
    if not prompt or max(prompt) >= m.cfg.vocab:
        raise ValueError(f"prompt: 1 or more token ids in [0, {m.cfg.vocab})")
    if len(prompt) + max_tokens > m.max_context:
        raise ValueError(f"prompt of {len(prompt)} + {max_tokens} tokens exceeds max_context "
                         f"= {m.max_context}")
    bs, alloc = m.kv.block_size, m.kv.tables.alloc
    need = width * -(-(len(prompt) + max_tokens) // bs)
    if need > alloc.num_free:
        raise ValueError(f"{width} beams of {len(prompt) + max_tokens} tokens need up to "
                         f"{need} KV blocks, {alloc.num_free} are free")
    engine.drain()
    if not engine.scheduler.idle:
        raise ValueError("beam search runs on an idle engine: requests are queued or running")


def beam_search(engine: Any, prompt: Sequence[int], beam_width: int, max_tokens: int,
                length_penalty: float = 1.0, eos: Collection[int] = ()) -> list[Hypothesis]:
    """The best `beam_width` hypotheses for `prompt` (highest score first), found by beam
    search on an idle `engine` (module docstring). ValueError before anything runs for a
    width, length or prompt the engine cannot take."""
    prompt = token_ids(prompt)
    _check(engine, prompt, beam_width, max_tokens, length_penalty)
    k, m, run = beam_width, engine.model, engine.runner
    eos = frozenset(token_ids(list(eos), "eos"))
    params = SamplingParams(logprobs=2 * k)
    free = [s for s in range(m.max_batch) if s not in m.kv.tables.active][::-1]
    ours = set(free)
    beams = [_Beam(free.pop(), [], 0.0)]
    done: list[Hypothesis] = []
    try:
        chunk = run.chunks[-1]
        for a in range(0, len(prompt), chunk):
            piece = PrefillPiece(beams[0].slot, prompt[a:a + chunk], a, params,
                                 final=a + chunk >= len(prompt))
            p = run.launch([piece], [], None)
            run.collect(p)
        rows = [(p.first_lp[0][0], p.first_lp[1][0])]
        for step in range(max_tokens):
            going = _rank(beams, rows, k, eos, length_penalty, done)
            last = step == max_tokens - 1 or not going
            if last or _hopeless(going, done, k, length_penalty):
                done += [_finish(b.tokens, b.logprob, length_penalty) for _, b in going]
                break
            beams = _move(m, beams, going, free)
            p = run.launch([], [b.slot for b in beams], [b.tokens[-1] for b in beams],
                           [params] * len(beams))
            run.collect(p)
            rows = list(zip(p.lp[0], p.lp[1]))
    finally:  # every slot it took, also after an exception part way
        for s in sorted(ours & m.kv.tables.active):
            m.free(s)
    return sorted(done, key=lambda h: -h.score)[:k]


def _finish(tokens: list[int], logprob: float, length_penalty: float) -> Hypothesis:
    return Hypothesis(tuple(tokens), logprob, logprob / len(tokens) ** length_penalty)


def _rank(beams: list[_Beam], rows: list[tuple[Any, Any]], k: int, eos: frozenset[int],
          length_penalty: float, done: list[Hypothesis]) -> list[tuple[int, _Beam]]:
    """The continuations that go on: (parent index, the beam it makes); those that end at
    an eos id within the first k join `done`."""
    cands = sorted(((b.logprob + float(lp[j]), i, int(ids[j]))
                    for i, (b, (lp, ids)) in enumerate(zip(beams, rows))
                    for j in range(1, 2 * k + 1) if ids[j] >= 0),
                   key=lambda c: -c[0])  # stable: ties keep the beam's and the rank's order
    going: list[tuple[int, _Beam]] = []
    for rank, (score, i, tok) in enumerate(cands):
        tokens = [*beams[i].tokens, tok]
        if tok in eos:
            if rank < k:
                done.append(_finish(tokens, score, length_penalty))
            continue
        going.append((i, _Beam(-1, tokens, score)))
        if len(going) == k:
            break
    return going


def _hopeless(going: list[tuple[int, _Beam]], done: list[Hypothesis], k: int,
              length_penalty: float) -> bool:
    """k hypotheses have finished and none of the running beams scores above the worst of
    them at its current length."""
    if len(done) < k:
        return False
    worst = sorted(h.score for h in done)[-k]
    best = max(b.logprob / len(b.tokens) ** length_penalty for _, b in going)
    return best <= worst


def _move(m: Any, beams: list[_Beam], going: list[tuple[int, _Beam]], free: list[int]
          ) -> list[_Beam]:
    """Slots for the beams that go on: parents with no child are freed first, then a
    parent's first child keeps its slot and the others fork it into free ones."""
    t, parents = m.kv.tables, {beams[i].slot for i, _ in going}
    for b in beams:
        if b.slot not in parents:
            m.free(b.slot)
            free.append(b.slot)
    kept: set[int] = set()
    for i, b in going:
        parent = beams[i].slot
        if parent not in kept:
            kept.add(parent)
            b.slot = parent
        else:
            b.slot = free.pop()
            t.fork(parent, b.slot)
    return [b for _, b in going]
