"""Beam search on the host's reference decoder (CPU) against a beam search written here over
whole-sequence NumPy forwards: the same hypotheses and scores, with and without an eos id
that ends beams; beams fork and drop cache blocks, and every block comes back."""

import numpy as np
import pytest

from rawgraph.engine.reference import reference_engine
from rawgraph.engine.request import Request
from rawgraph.model.config import preset
from rawgraph.model.reference import KVState, float_weights, forward
from rawgraph.model.weights import random_weights

CFG = preset("tiny")
W = random_weights(CFG, 9)
FW = float_weights(CFG, W)
PROMPT = [int(t) for t in np.random.default_rng(4).integers(0, CFG.vocab, 70)]


def _numpy_beams(prompt, k, n, length_penalty, eos):
    """Hugging Face's beam search (engine/beam.py's docstring), every beam's logits from a
    forward of its whole sequence."""
    beams, done = [([], 0.0)], []

    def finish(toks, s):
        return tuple(toks), s, s / len(toks) ** length_penalty
    for step in range(n):
        cands = []
        for i, (toks, s) in enumerate(beams):
            logits = forward(CFG, FW, np.array(prompt + toks), KVState())[-1].astype(np.float64)
            lsm = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
            cands += [(s + lsm[t], i, int(t)) for t in np.argsort(-lsm, kind="stable")[:2 * k]]
        cands.sort(key=lambda c: -c[0])
        going = []
        for rank, (s, i, t) in enumerate(cands):
            toks = [*beams[i][0], t]
            if t in eos:
                if rank < k:
                    done.append(finish(toks, s))
                continue
            going.append((toks, s))
            if len(going) == k:
                break
        hopeless = len(done) >= k and max(
            s / len(t) ** length_penalty for t, s in going) <= sorted(d[2] for d in done)[-k]
        if step == n - 1 or hopeless:
            done += [finish(t, s) for t, s in going]
            break
        beams = going
    return sorted(done, key=lambda d: -d[2])[:k]


def _engine(**kw):
    return reference_engine(CFG, W, max_batch=8, max_context=256, max_chunk=32, **kw)


@pytest.mark.parametrize(("k", "eos", "penalty"), [(1, (), 1.0), (2, (), 1.0), (4, (), 1.0),
                                                   (8, (), 1.0), (3, "frequent", 0.0),
                                                   (4, "frequent", 1.0), (4, "frequent", 2.0)])
def test_beams_are_those_of_a_numpy_beam_search(k, eos, penalty):
    if eos == "frequent":  # an id the beams reach, so some of them end early
        logits = forward(CFG, FW, np.array(PROMPT), KVState())[-1]
        eos = (int(np.argsort(-logits)[1]),)
    want = _numpy_beams(PROMPT, k, 6, penalty, set(eos))
    e = _engine()
    forks = []
    fork = e.model.kv.tables.fork
    e.model.kv.tables.fork = lambda a, b: (forks.append((a, b)), fork(a, b))
    got = e.beam_search(PROMPT, k, 6, penalty, eos=eos)
    assert [h.tokens for h in got] == [w[0] for w in want]
    assert [h.logprob for h in got] == pytest.approx([w[1] for w in want], abs=1e-3)
    assert [h.score for h in got] == pytest.approx([w[2] for w in want], abs=1e-3)
    if eos and penalty == 0:  # scored by sum alone, a beam ended at once wins
        assert got[0].tokens[-1] in eos and len(got[0].tokens) == 1
    assert (k > 1) == bool(forks)
    a = e.model.kv.tables.alloc
    assert not e.model.kv.tables.active and a.num_free == a.num_blocks
    # the engine goes on serving
    assert e.generate([PROMPT[:5]], max_new_tokens=3) == _engine().generate([PROMPT[:5]], 3)


@pytest.mark.parametrize(("args", "match"), [
    ((PROMPT, 0, 4), "beam_width = 0"), ((PROMPT, 9, 4), "beam_width = 9"),
    ((PROMPT, True, 4), "beam_width = True"), ((PROMPT, 2, 0), "max_tokens = 0"),
    ((PROMPT, 2, 200), "exceeds max_context"), (([CFG.vocab], 2, 4), "prompt: 1 or more"),
    (([], 2, 4), "prompt: 1 or more"), ((PROMPT, 2, 4, float("nan")), "length_penalty")])
def test_a_search_the_engine_cannot_run_is_refused(args, match):
    e = _engine()
    with pytest.raises(ValueError, match=match):
        e.beam_search(*args)
    assert not e.model.kv.tables.active


def test_eos_ids_are_token_ids():
    with pytest.raises(TypeError, match="eos"):
        _engine().beam_search(PROMPT, 2, 4, eos=["</s>"])


def test_a_busy_engine_refuses_a_search():
    e = _engine()
    e.add(Request(PROMPT, 4))
    e.step()
    with pytest.raises(ValueError, match="idle engine"):
        e.beam_search(PROMPT, 2, 4)
