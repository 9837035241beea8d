"""The engine refuses bad input before anything changes, and an exception anywhere in a step
(KeyboardInterrupt included) rolls the iteration back: the same tokens as a run without
faults, nothing lost or emitted twice, every cache block back at the end. Aborts free a
request at the next step boundary, also while a decode step it is part of is in flight."""

import numpy as np
import pytest

from rawgraph.engine import Engine, Request
from rawgraph.graph.graph import GraphExec
from rawgraph.model.config import preset
from rawgraph.model.decoder import Model
from rawgraph.model.weights import random_weights
from rawgraph.ops import SamplingParams
from tests.helpers import drive, inject

pytestmark = pytest.mark.gpu
CFG = preset("tiny")
TENSORS = random_weights(CFG, 5)


@pytest.fixture(scope="module")
def engine():
    model = Model(CFG, TENSORS, max_batch=4, max_context=512, max_chunk=64, max_chunk_seqs=4)
    eng = Engine(model, progress=False)
    yield eng
    eng.close()
    model.close()


def _requests():
    rng = np.random.default_rng(7)
    specs = [(5, 12, 0), (150, 9, 0), (40, 20, 1), (1, 7, 3), (70, 14, 4), (9, 25, 6)]
    out = []
    for i, (n, k, arrival) in enumerate(specs):
        prompt = [int(t) for t in rng.integers(0, CFG.vocab, n)]
        sp = SamplingParams(0.8, 30, 0.9, seed=i) if i % 2 else SamplingParams()
        out.append(Request(prompt, k, sp, arrival=arrival, name=f"r{i}"))
    return out


def _idle(engine):
    t = engine.model.kv.tables
    return (engine.scheduler.idle and not t.active and t.alloc.num_free == t.alloc.num_blocks
            and len(engine.scheduler._free_slots) == engine.model.max_batch)




@pytest.fixture(scope="module")
def want(engine):
    reqs = _requests()
    assert drive(engine, reqs) == 0
    return [(r.output, r.finish) for r in reqs]


class _Injected(RuntimeError):
    pass




POINTS = [  # (what, attribute path from the engine, after its work)
    ("runner.launch", ("runner", "launch"), False),
    ("runner.launch done", ("runner", "launch"), True),
    ("inputs.prefill", ("model", "inputs", "prefill"), True),
    ("inputs.decode", ("model", "inputs", "decode"), True),
    ("inputs.follow", ("model", "inputs", "follow"), True),
    ("kv.sync", ("model", "kv", "sync"), False),
    ("runner._settle (waiting)", ("runner", "_settle"), False),
    ("runner.collect done", ("runner", "collect"), True),
    ("engine._emit", ("_emit",), True),
    ("graph launched", None, True),
]


@pytest.mark.parametrize("at", [1, 2, 4])  # inputs.decode: 4 calls a run
@pytest.mark.parametrize(("what", "path", "after"), POINTS, ids=[p[0] for p in POINTS])
def test_a_step_that_raises_is_rolled_back(engine, want, monkeypatch, what, path, after, at):
    error = KeyboardInterrupt() if at == 2 else _Injected(what)
    if path is None:
        calls = inject(monkeypatch, GraphExec, "launch", at, after, error)
    else:
        owner = engine
        for attr in path[:-1]:
            owner = getattr(owner, attr)
        calls = inject(monkeypatch, owner, path[-1], at, after, error)
    rollbacks = engine.stats.rollbacks
    reqs = _requests()
    faults = drive(engine, reqs)
    monkeypatch.undo()
    assert calls["n"] >= at and faults == 1 and engine.stats.rollbacks == rollbacks + 1
    assert [(r.output, r.finish) for r in reqs] == want
    assert _idle(engine)


def test_bad_requests_are_refused_before_anything_changes(engine, want):
    ok = [1, 2, 3]
    before = engine.model.kv.tables.lens.copy()
    r = Request(ok, 4)
    engine.add(r)
    with pytest.raises(ValueError, match="already queued"):
        engine.add(r)
    with pytest.raises(TypeError, match="expected a Request"):
        engine.add([1, 2, 3])
    with pytest.raises(ValueError, match="token id 512 outside"):
        engine.generate([[1, 2], [CFG.vocab]], 3)  # the good prompt is not queued either
    assert list(engine.scheduler.waiting) == [r]
    assert np.array_equal(engine.model.kv.tables.lens, before)
    engine.run([])
    while not engine.scheduler.idle:
        engine.step()
    engine.drain()
    with pytest.raises(ValueError, match="has already run"):
        engine.add(r)
    with pytest.raises(ValueError, match="appears twice"):
        fresh = Request(ok, 2)
        engine.run([fresh, fresh])
    assert _idle(engine)
    # a NumPy array is a natural prompt; the engine still gives the reference tokens
    reqs = _requests()
    arrays = [Request(np.asarray(q.prompt, np.int64), q.max_new_tokens, q.sampling,
                      arrival=q.arrival) for q in reqs]
    engine.run(arrays)
    assert [(a.output, a.finish) for a in arrays] == want


def test_abort_frees_a_request_at_the_next_step(engine, want):
    reqs = _requests()
    for r in reqs:
        r.arrival += engine.steps
        engine.add(r)
    victim, waiting = reqs[2], reqs[5]
    assert engine.abort(waiting) and waiting.finish == "abort"  # still queued: gone now
    while not (victim.decoding and len(victim.output) >= 3 and engine._ahead is not None
               and victim in engine._ahead[0]):
        engine.step()  # until a decode step with the victim in it is in flight
    assert engine.abort(victim) and not engine.abort(Request([1], 1))
    kept = len(victim.output)
    done = engine.step()
    assert victim in done and victim.finish == "abort"
    assert victim not in engine.scheduler.running  # its slot free, or another request's now
    while not engine.scheduler.idle:
        engine.step()
    engine.drain()
    assert victim.output == want[2][0][:kept]  # nothing more once aborted
    for i, r in enumerate(reqs):
        if r not in (victim, waiting):
            assert (r.output, r.finish) == want[i], r.name
    assert _idle(engine) and not engine.abort(victim)
