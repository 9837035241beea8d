"""The engine on the GPU: graphs replay the eager launches bit for bit, greedy tokens match
the NumPy reference, requests joining and leaving do not disturb each other, fallbacks work."""

import logging

import numpy as np
import pytest

from rawgraph.engine import Engine, Request
from rawgraph.model.config import preset
from rawgraph.model.program import Model
from rawgraph.model.reference import float_weights, greedy
from rawgraph.model.weights import random_weights
from rawgraph.ops import SamplingParams

pytestmark = pytest.mark.gpu
CFG = preset("tiny")
TENSORS = random_weights(CFG, 21)


def _model(**kw):
    args = {"max_batch": 4, "max_context": 640, "max_chunk": 64, "max_chunk_seqs": 4} | kw
    return Model(CFG, TENSORS, **args)


def _stream(seed=0, n=9):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        prompt = [int(t) for t in rng.integers(0, CFG.vocab, int(rng.choice([1, 5, 40, 150])))]
        sp = SamplingParams(0.9, 20, 0.9, seed=i) if i % 2 else SamplingParams()
        out.append(Request(prompt, int(rng.integers(1, 30)), sp, arrival=int(rng.integers(0, 12)),
                           name=f"r{i}"))
    return out


@pytest.mark.parametrize("streams", [1, 2])
def test_graphs_match_eager_bit_for_bit(streams):
    outs, logits = [], []
    for graphs in (False, True):
        model = _model()
        engine = Engine(model, graphs=graphs, streams=streams, progress=False)
        reqs = engine.run(_stream())
        outs.append([r.output for r in reqs])
        logits.append((model.dec["logits"].get(), model.pre["logits"].get()))
        if graphs:
            s = engine.stats.summary()
            assert s["eager iterations"] == 0 and s["graphs"] == len(engine.runner.keys())
        engine.close()
        model.close()
    assert outs[0] == outs[1]
    for a, b in zip(logits[0], logits[1]):
        assert np.array_equal(a.view(np.uint16), b.view(np.uint16))


def test_greedy_requests_arriving_over_time_match_the_reference_alone():
    w = float_weights(CFG, TENSORS)
    rng = np.random.default_rng(3)
    reqs = [Request([int(t) for t in rng.integers(0, CFG.vocab, n)], k, arrival=a)
            for n, k, a in [(7, 20, 0), (130, 8, 0), (1, 33, 2), (64, 12, 5), (65, 5, 5),
                            (20, 16, 9)]]
    model = _model()
    engine = Engine(model, progress=False)
    engine.run(reqs)
    for r in reqs:
        assert r.output == greedy(CFG, w, r.prompt, r.max_new_tokens), r.name
        assert r.finish == "length"
    assert model.kv.tables.active == set() and model.kv.tables.alloc.num_free == \
        model.kv.tables.alloc.num_blocks
    engine.close()
    model.close()


def test_stop_tokens_and_fallbacks(caplog):
    w = float_weights(CFG, TENSORS)
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]
    lens = [10, 3, 6, 9]  # the batch shrinks 4 -> 3 -> 2 -> 1: eager, then two graphs
    want = [greedy(CFG, w, p, n) for p, n in zip(prompts, lens)]
    model = _model()
    # two buckets (batches of 3 and 4 run eagerly), a pool of 2 graphs (evictions), lazy
    engine = Engine(model, buckets=[1, 2], chunks=[8, 64], capture="lazy", max_graphs=2)
    stop = want[0][4]
    reqs = [Request(p, n, stop=frozenset([stop]) if i == 0 else frozenset())
            for i, (p, n) in enumerate(zip(prompts, lens))]
    with caplog.at_level(logging.WARNING, "rawgraph.engine"):
        engine.run(reqs)
    assert reqs[0].output == want[0][:want[0].index(stop) + 1] and reqs[0].finish == "stop"
    for r, w_ in zip(reqs[1:], want[1:]):
        assert r.output == w_
    assert "exceed the largest bucket 2" in caplog.text
    assert engine.runner.pool.evictions > 0 and len(engine.runner.pool) <= 2
    engine.close()
    model.close()


def test_split_counts_are_patched_as_contexts_cross_256():
    model = _model()
    engine = Engine(model, progress=False)
    engine.run([Request([1] * 250, 20)])
    patched = [i.patched for i in engine.stats.iters if i.decode_rows]
    # the first step (captured at max_context) and the step at 257 tokens change the split
    # count: attention and combine of every layer; the other steps patch nothing
    assert patched[0] == patched[6] == 2 * CFG.layers and sum(patched) == 4 * CFG.layers
    engine.close()
    model.close()


def test_requests_that_cannot_run_are_refused():
    model = _model()
    engine = Engine(model, capture="lazy")
    with pytest.raises(ValueError, match="exceeds max_context"):
        engine.add(Request([1] * 600, 100))
    with pytest.raises(ValueError, match="token ids outside"):
        engine.add(Request([CFG.vocab], 1))
    engine.close()
    model.close()
