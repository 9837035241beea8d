"""Automatic prefix caching in the engine, on the host's reference decoder (CPU): prompts that
start with cached blocks prefill only the rest and give the tokens of a prefill from scratch;
requests that score their prompt or penalize repetition prefill it all; under memory for a
tenth of the work, cached blocks are evicted and every block comes back; aborts and
rolled-back iterations leave reference counts as they were."""

import numpy as np
import pytest

from rawgraph.engine.reference import reference_engine
from rawgraph.engine.request import Request
from rawgraph.model.config import preset
from rawgraph.model.reference import float_weights, greedy
from rawgraph.model.weights import random_weights
from rawgraph.ops.sampling import SamplingParams
from tests.helpers import drive, inject

CFG = preset("tiny")
W = random_weights(CFG, 5)
BS = 64
SYSTEM = [int(t) for t in np.random.default_rng(1).integers(0, CFG.vocab, 150)]


def _engine(prefix_cache=True, **kw):
    kw = {"max_batch": 4, "max_context": 512, "max_chunk": 64, **kw}
    return reference_engine(CFG, W, **kw) if prefix_cache else _off(**kw)


def _off(**kw):
    e = reference_engine(CFG, W, **kw)
    e.prefix = None
    return e


def _idle(e):
    a = e.model.kv.tables.alloc
    return (e.scheduler.idle and not e.model.kv.tables.active and (a.refs == 0).all()
            and a.num_free == a.num_blocks)


def test_a_cached_prefix_gives_the_tokens_of_a_prefill_from_scratch():
    fw = float_weights(CFG, W)
    prompts = [[*SYSTEM, 1, 2, 3], SYSTEM + [4] * 40, [*SYSTEM[:128], 9],  # two whole blocks
               SYSTEM[:128], SYSTEM[:70], [*SYSTEM[:10], 5]]
    e = _engine()
    first = e.run([Request([*SYSTEM, 7], 8)])[0]
    assert first.cached == 0 and e.prefix.blocks == 2
    reqs = e.run([Request(p, 8) for p in prompts])
    for r, p in zip(reqs, prompts):
        assert r.output == greedy(CFG, fw, p, 8), len(p)
    # the most blocks a prompt may take: all but its last token's
    assert [r.cached for r in reqs] == [128, 128, 128, 64, 64, 0]
    assert e.stats.cached_tokens == 512 and e.stats.prompt_tokens == 151 + sum(map(len, prompts))
    assert e.stats.summary()["cached prompt share"] == pytest.approx(512 / e.stats.prompt_tokens)
    e.drain()
    assert _idle(e)


@pytest.mark.parametrize("overlap", [True, False])
def test_sampled_and_ruled_requests_draw_the_same_with_the_cache_or_without(overlap):
    def reqs():
        return [Request(SYSTEM + [i] * (i + 1), 12, s, arrival=3 * i) for i, s in enumerate([
            SamplingParams(0.8, seed=3), SamplingParams(1.0, top_k=5, seed=4),
            SamplingParams(presence_penalty=1.5, frequency_penalty=0.5),
            SamplingParams(logit_bias=((7, 5.0),), min_tokens=4),
            SamplingParams(repetition_penalty=1.3), SamplingParams(prompt_logprobs=2),
            SamplingParams(logprobs=3)])]
    want = _engine(False, overlap=overlap).run(reqs())
    e = _engine(overlap=overlap)
    got = e.run(reqs())
    assert [r.output for r in got] == [r.output for r in want]
    assert [[x.token for x in r.logprobs] for r in got] == [
        [x.token for x in r.logprobs] for r in want]
    assert got[5].prompt_logprobs == want[5].prompt_logprobs
    # the first prefills the prefix; the repetition penalty and the prompt's scores want
    # their prompt's tokens through their own chunks
    assert [r.cached for r in got] == [0, 128, 128, 128, 0, 0, 128]


def test_under_memory_for_a_tenth_cached_blocks_are_evicted_and_all_come_back():
    rng = np.random.default_rng(2)
    prefixes = [[int(t) for t in rng.integers(0, CFG.vocab, 64 * (1 + i % 3))]
                for i in range(20)]
    order = rng.integers(0, 20, 300)

    def reqs():
        return [Request(prefixes[p] + [int(i) % CFG.vocab, 3], 3, name=f"q{i}")
                for i, p in enumerate(order)]
    # 4 rows of 256 tokens: 16 blocks, against ~600 the requests take
    kw = {"max_batch": 4, "max_context": 256, "max_chunk": 128}
    want = _engine(False, **kw).run(reqs())
    e = _engine(**kw)
    got = e.run(reqs())
    e.drain()
    assert [r.output for r in got] == [r.output for r in want]
    assert all(r.finish == "length" and len(r.output) == 3 for r in got)
    a = e.model.kv.tables.alloc
    assert a.num_blocks == 16 and a.evictions > 0 and e.stats.cached_tokens > 0
    assert _idle(e) and len(a.idle) == e.prefix.blocks > 0
    e.prefix.clear()
    assert e.prefix.blocks == 0 and not a.idle and a.num_free == a.num_blocks


def test_aborting_a_request_that_shares_blocks_frees_only_its_own():
    fw = float_weights(CFG, W)
    e = _engine()
    e.run([Request(SYSTEM, 2)])
    shared = e.prefix.match(SYSTEM, 2, [])
    a, b = e.add(Request([*SYSTEM, 1], 20)), e.add(Request([*SYSTEM, 2], 20))
    while len(a.output) < 3:
        e.step()
    refs = e.model.kv.tables.alloc.refs
    assert refs[shared].tolist() == [2, 2]
    e.abort(a)
    e.step()
    assert a.finish == "abort" and refs[shared].tolist() == [1, 1]
    while not e.scheduler.idle:
        e.step()
    e.drain()
    assert b.output == greedy(CFG, fw, [*SYSTEM, 2], 20) and _idle(e)


@pytest.mark.parametrize("at", [1, 2, 3, 5])
@pytest.mark.parametrize(("owner", "name", "after"), [
    ("runner", "launch", False), ("runner", "launch", True), ("tables", "adopt", True),
    ("runner", "collect", False)])
def test_a_rolled_back_iteration_puts_reference_counts_back(monkeypatch, owner, name, after,
                                                            at):
    def reqs():
        return [Request([*SYSTEM, i], 6, arrival=i // 2) for i in range(6)]
    want = _engine().run(reqs())
    e = _engine()
    e.run([Request(SYSTEM, 1)])  # the prefix is cached before the faults
    target = {"runner": e.runner, "tables": e.model.kv.tables}[owner]
    calls = inject(monkeypatch, target, name, at, after, RuntimeError(name))
    got = reqs()
    assert drive(e, got) == 1 and calls["n"] >= at
    assert [r.output for r in got] == [r.output for r in want]
    assert all(r.cached == 128 for r in got)
    assert _idle(e) and e.stats.rollbacks == 1


@pytest.mark.parametrize(("overlap", "length"), [(True, 152), (False, 152), (True, 10),
                                                (True, 2), (False, 1)])
def test_samples_of_one_prompt_prefill_it_once_and_hold_it_once(overlap, length):
    prompt = [*SYSTEM, 4, 5][:length]  # 152: two full blocks and 24 tokens; 10: one part

    def reqs():
        return [Request(prompt, 6, SamplingParams(0.9, seed=s)) for s in range(8)]
    e = _engine(overlap=overlap, max_batch=8)
    got = [e.add(r) for r in reqs()]
    while not all(r.decoding for r in got):
        e.step()
    # the others fork the first once it has all but the last token and prefill that token
    # alone: the prompt's blocks are held once, each sample has its own copy of the last
    # (a prompt of one token has nothing to share: each prefills its one token)
    assert [r.cached for r in got] == [0] + [length - 1] * 7
    assert sum(i.prefill_tokens for i in e.stats.iters) == length + 7
    assert int((e.model.kv.tables.alloc.refs > 0).sum()) == -(-length // BS) + 7
    while not e.scheduler.idle:
        e.step()
    e.drain()
    want = _engine(False, overlap=overlap, max_batch=8).run(reqs())
    assert [r.output for r in got] == [r.output for r in want]
    assert len({tuple(r.output) for r in got}) > 1  # seeded apart
    assert _idle(e)


@pytest.mark.parametrize("at", [1, 2, 3, 4])
def test_a_rolled_back_fork_puts_the_shared_blocks_back(monkeypatch, at):
    def reqs():
        return [Request([*SYSTEM, 4], 5, SamplingParams(0.9, seed=s)) for s in range(4)]
    want = _engine(False, max_batch=8).run(reqs())
    e = _engine(max_batch=8)
    inject(monkeypatch, e.runner, "launch", at, True, RuntimeError("launch"))
    got = reqs()
    assert drive(e, got) == 1
    assert [r.output for r in got] == [r.output for r in want] and _idle(e)


def test_a_burst_sharing_a_system_prompt_waits_for_the_one_prefilling_it():
    e = _engine(max_batch=8)
    reqs = e.run([Request([*SYSTEM, *range(3, 3 + i)], 4) for i in range(1, 9)])
    assert [r.cached for r in reqs] == [0] + [128] * 7
    assert sum(i.prefill_tokens for i in e.stats.iters) == sum(
        len(r.prompt) for r in reqs) - 7 * 128
    e.drain()
    assert _idle(e)


def _tight(blocks, prefix_cache=True):
    """A reference engine of 8 rows over only `blocks` KV blocks (memory for a few)."""
    from rawgraph.engine.engine import Engine
    from rawgraph.engine.reference import HostCache, ReferenceModel, ReferenceRunner
    from rawgraph.memory.blocks import BlockAllocator, BlockTables

    m = ReferenceModel(CFG, W, max_batch=8, max_context=256, max_chunk=64)
    m.kv = HostCache(BlockTables(BlockAllocator(blocks), BS, 8, 4), BS)
    return Engine(m, graphs=False, progress=False, runner=ReferenceRunner(m),
                  prefix_cache=prefix_cache)


def test_shared_blocks_admit_more_requests_than_their_worst_cases_and_none_runs_out():
    def reqs():  # worst case 4 blocks each: 12 blocks hold three unshared
        return [Request([*(SYSTEM * 2)[:190], i], 20, name=f"s{i}") for i in range(8)]
    peaks = {}
    for cache in (False, True):
        e = _tight(12, cache)
        for r in (got := reqs()):
            e.add(r)
        peak = 0
        while not e.scheduler.idle:
            e.step()
            peak = max(peak, sum(r.slot in e.model.kv.tables.active
                                 for r in e.scheduler.running))
        e.drain()
        peaks[cache] = (peak, [r.output for r in got])
        assert _idle(e)
    assert peaks[False][0] == 3 and peaks[True][0] > 3, peaks
    assert peaks[True][1] == peaks[False][1]


@pytest.mark.parametrize("seed", range(6))
def test_random_sharing_under_tight_memory_never_runs_out_of_blocks(seed):
    rng = np.random.default_rng(seed)
    heads = [[int(t) for t in rng.integers(0, CFG.vocab, 64 * int(rng.integers(1, 3)))]
             for _ in range(3)]

    def reqs():
        out = []
        for i in range(40):
            head = heads[int(rng.integers(0, 3))]
            tail = [int(t) for t in rng.integers(0, CFG.vocab, int(rng.integers(0, 40)))]
            prompt = (head + tail)[:200] or [1]
            out.append(Request(prompt, int(rng.integers(1, 50)), arrival=int(rng.integers(0, 30)),
                               sampling=SamplingParams(0.7, seed=i) if i % 3 else
                               SamplingParams()))
        return out
    e = _tight(int(rng.integers(6, 14)))
    got = e.run(reqs())
    e.drain()
    assert all(r.finish == "length" or r.finish == "stop" for r in got) and _idle(e)
