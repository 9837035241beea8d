"""The engine on the GPU: graphs replay the eager launches bit for bit, greedy tokens match
the NumPy reference, requests joining and leaving do not disturb each other, fallbacks work."""

import logging

import numpy as np
import pytest

from rawgraph.engine import Engine, Request
from rawgraph.model.config import preset
from rawgraph.model.decoder import Model
from rawgraph.model.reference import KVState, float_weights, forward
from rawgraph.model.step import PrefillPiece
from rawgraph.model.weights import random_weights
from rawgraph.ops import SamplingParams

pytestmark = pytest.mark.gpu
CFG = preset("tiny")
TENSORS = random_weights(CFG, 21)
NEAR_TIE = 0.01  # logits; tiny's top logits are O(1), fp16 errors O(1e-3)


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


def _reference(prompt, n, w):
    """Greedy tokens of the NumPy reference, and how many of them are unambiguous: a step
    whose top two logits lie within NEAR_TIE may round either way in fp16 (and everything
    after it then differs), so comparisons stop there."""
    state = KVState()
    logits = forward(CFG, w, np.asarray(prompt), state)
    out, sure = [], None
    for i in range(n):
        top2 = np.sort(logits[-1])[-2:]
        if sure is None and top2[1] - top2[0] < NEAR_TIE:
            sure = i
        out.append(int(np.argmax(logits[-1])))
        logits = forward(CFG, w, np.asarray([out[-1]]), state)
    return out, n if sure is None else sure


def test_requests_arriving_over_time_match_each_alone_and_the_reference():
    w = float_weights(CFG, TENSORS)
    rng = np.random.default_rng(3)
    specs = [(7, 20, 0), (130, 8, 0), (1, 33, 2), (64, 12, 5), (65, 5, 5), (20, 16, 9)]
    prompts = [[int(t) for t in rng.integers(0, CFG.vocab, n)] for n, _, _ in specs]
    model = _model()
    engine = Engine(model, progress=False)
    reqs = engine.run([Request(p, k, arrival=a) for p, (_, k, a) in zip(prompts, specs)])
    assert model.kv.tables.active == set() and model.kv.tables.alloc.num_free == \
        model.kv.tables.alloc.num_blocks
    compared = 0
    for r in reqs:  # continuous batching changes nothing: each alone gives the same tokens
        alone = engine.run([Request(r.prompt, r.max_new_tokens)])[0]
        assert alone.output == r.output and r.finish == "length", r.name
        want, sure = _reference(r.prompt, r.max_new_tokens, w)
        assert r.output[:sure + 1] == want[:sure + 1] or r.output[:sure] == want[:sure], r.name
        compared += sure
    assert compared >= 40  # most steps are far from a tie
    engine.close()
    model.close()


def test_stop_tokens_and_fallbacks(caplog):
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]
    lens = [10, 3, 6, 9]  # the batch shrinks 4 -> 3 -> 2 -> 1: eager, then two graphs
    model = _model()
    alone = Engine(model, progress=False)
    want = [alone.run([Request(p, n)])[0].output for p, n in zip(prompts, lens)]
    alone.close()
    # two buckets (batches of 3 and 4 run eagerly), a pool of 2 graphs (evictions), lazy;
    # host-driven steps: with overlap a stopped row is seen a step later, which can skip the
    # 2-row step whose graph makes the third one
    engine = Engine(model, buckets=[1, 2], chunks=[8, 64], capture="lazy", max_graphs=2,
                    overlap=False)
    stop = want[0][4]
    reqs = [Request(p, n, stop=frozenset([stop]) if i == 0 else frozenset())
            for i, (p, n) in enumerate(zip(prompts, lens))]
    with caplog.at_level(logging.WARNING, "rawgraph.engine"):
        engine.run(reqs)
    assert reqs[0].output == want[0][:want[0].index(stop) + 1] and reqs[0].finish == "stop"
    for r, w_ in zip(reqs[1:], want[1:]):
        assert r.output == w_
    assert "exceed the largest bucket 2" in caplog.text
    pool = engine.runner.pool
    assert pool.evictions > 0 and len(pool) <= 2
    assert pool.captures == len(pool) + pool.evictions  # each capture held or evicted
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
    with pytest.raises(ValueError, match="token id 512 outside"):
        engine.add(Request([CFG.vocab], 1))
    engine.close()
    model.close()


def test_an_iteration_is_all_or_nothing():
    from rawgraph.engine.runner import Runner
    from rawgraph.memory.blocks import OutOfBlocks

    # blocks of 16 tokens, 3 in all: the first prompt takes one
    model = _model(max_batch=4, max_context=64, max_chunk=32, max_chunk_seqs=2, block_size=16,
                   num_blocks=3)
    runner = Runner(model, buckets=[2], chunks=[32])
    first, _, _ = runner.run([PrefillPiece(0, [1, 2, 3], 0)], [], [])
    t = model.kv.tables
    before = t.lens.copy(), t.table.copy(), t.alloc.num_free
    short, long = PrefillPiece(1, [4] * 9, 0), PrefillPiece(1, [4] * 17, 0)
    for piece, slots, tokens, err in [
            (short, [0], [CFG.vocab], ValueError),  # a bad decode token
            (short, [1], [5], ValueError),          # slot 1 in both halves
            (long, [0, 2], [5, 6], OutOfBlocks)]:   # 2 + 1 new blocks, 2 free
        with pytest.raises(err):
            runner.run([piece], slots, tokens)
        assert (t.lens == before[0]).all() and (t.table == before[1]).all()  # nothing half-done
        assert t.alloc.num_free == before[2]
    _, nxt, _ = runner.run([short], [0], [first[0]])
    assert len(nxt) == 1 and t.lens[0] == 4 and t.lens[1] == 9
    runner.close()


def test_overlapped_steps_give_the_same_tokens():
    # each decode step launched before the last one's tokens are read: the same tokens and
    # finish reasons, with rows stopping early at stop ids (one step past them discarded)
    def run(overlap, stops):
        model = _model()
        engine = Engine(model, overlap=overlap, progress=False)
        reqs = _stream(seed=5)
        for r in reqs:
            r.stop = stops.get(r.name, frozenset())
        engine.run(reqs)
        assert model.kv.tables.active == set()
        assert model.kv.tables.alloc.num_free == model.kv.tables.alloc.num_blocks
        out = {r.name: (r.output, r.finish) for r in reqs}
        steps = engine.stats.summary()["decode steps"]
        engine.close()
        model.close()
        return out, steps

    plain, _ = run(False, {})
    stops = {name: frozenset([out[len(out) // 2]]) for name, (out, _) in plain.items()
             if len(out) > 4}
    assert stops
    for s in ({}, stops):
        want, _ = run(False, s)
        got, steps = run(True, s)
        assert got == want and steps > 0
    assert any(f == "stop" for _, f in want.values())


@pytest.mark.parametrize("graphs", [False, True])
def test_first_tokens_outlive_later_chunks_launched_before_they_are_read(graphs):
    # four chunks launched before any is read: the third's and fourth's copies reuse the
    # halves of the first's and second's first tokens, which are read before that
    from rawgraph.engine.runner import Runner

    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]

    def first_tokens(launch_all):
        model = _model()
        runner = Runner(model, graphs=graphs, buckets=[2], chunks=[64])
        pieces = [PrefillPiece(s, p, 0) for s, p in enumerate(prompts)]
        if launch_all:
            pending = [runner.launch([piece], [], []) for piece in pieces]
            out = [runner.collect(p)[0] for p in pending]
        else:
            out = [runner.run([piece], [], [])[0] for piece in pieces]
        runner.close()
        model.close()
        return out

    got, want = first_tokens(True), first_tokens(False)
    assert got == want and all(len(t) == 1 for t in got)


def test_follow_launches_need_the_last_steps_rows():
    from rawgraph.engine.runner import Runner

    model = _model()
    model.kv.k.fill(0)
    model.kv.v.fill(0)
    runner = Runner(model, buckets=[1, 2, 4], chunks=[64])
    with pytest.raises(ValueError, match="no decode step to continue"):
        runner.launch([], [0], None, follow=True)
    with pytest.raises(ValueError, match="tokens are needed"):
        runner.launch([], [0], None)

    def fresh():  # two sequences of 3 cached tokens, in the same blocks each time
        model.kv.tables.reset()
        for s in (0, 1):
            model.kv.tables.add(s)
            model.kv.tables.append(s, 3)

    fresh()
    first = runner.launch([], [0, 1], [5, 6])
    with pytest.raises(ValueError, match="not the continued step's"):
        runner.launch([], [1, 0], None, follow=True)
    with pytest.raises(ValueError, match="sampling parameters the slots' own"):
        runner.launch([], [0, 1], None, [SamplingParams()] * 2, follow=True)
    nxt = runner.launch([], [0, 1], None, follow=True)  # fed `first`'s tokens on the device
    a, b = runner.collect(first)[1], runner.collect(nxt)[1]
    fresh()
    a2 = runner.run([], [0, 1], [5, 6])[1]
    b2 = runner.run([], [0, 1], a2)[1]  # fed from the host
    assert (a, b) == (a2, b2)
    # tokens a launch could overwrite are read first: the third of three unread steps, and
    # a step fed from the host, each find the tokens before them already read
    fresh()
    p1 = runner.launch([], [0, 1], [5, 6])
    p2 = runner.launch([], [0, 1], None, follow=True)
    p3 = runner.launch([], [0, 1], None, follow=True)
    p4 = runner.launch([], [0, 1], [9, 9])
    got = [runner.collect(p)[1] for p in (p1, p2, p3, p4)]
    fresh()
    want = [runner.run([], [0, 1], [5, 6])[1]]
    for toks in (want[0], None, [9, 9]):
        want.append(runner.run([], [0, 1], toks or want[-1])[1])
    assert got == want
    # a row whose sequence has left may stay empty in its place (slot -1, a padding row):
    # the other row goes on as when both are fed from the host, the empty one yields -1
    fresh()
    p1 = runner.launch([], [0, 1], [5, 6])
    p2 = runner.launch([], [-1, 1], None, follow=True)
    p3 = runner.launch([], [-1, 1], None, follow=True)
    got = [runner.collect(p)[1] for p in (p1, p2, p3)]
    fresh()
    want = [runner.run([], [0, 1], [5, 6])[1]]
    for _ in range(2):
        want.append(runner.run([], [0, 1], want[-1])[1])
    assert got[0] == want[0] and [g[1] for g in got[1:]] == [w[1] for w in want[1:]]
    assert [g[0] for g in got[1:]] == [-1, -1]
    fresh()  # a step with row 0 empty, then row 0 taken again: that needs its token
    runner.launch([], [0, 1], [5, 6])
    runner.launch([], [-1, 1], None, follow=True)
    with pytest.raises(ValueError, match="tokens are needed"):
        runner.launch([], [0, 1], None, follow=True)
    runner.run([], [0, 1], [5, 6])
    # the empty row takes a joining sequence fed from the host, the other goes on from the
    # device: as when every row is fed from the host

    def fresh3():
        fresh()
        model.kv.tables.add(2)
        model.kv.tables.append(2, 3)

    fresh3()
    p1 = runner.launch([], [0, 1], [5, 6])
    p2 = runner.launch([], [-1, 1], None, follow=True)
    p3 = runner.launch([], [2, 1], [8, -1], follow=True)
    p4 = runner.launch([], [2, 1], None, follow=True)
    got = [runner.collect(p)[1] for p in (p1, p2, p3, p4)]
    fresh3()
    want = [runner.run([], [0, 1], [5, 6])[1]]
    want.append(runner.run([], [0, 1], want[-1])[1])
    want.append(runner.run([], [2, 1], [8, want[-1][1]])[1])
    want.append(runner.run([], [2, 1], want[-1])[1])
    assert got[0] == want[0] and got[1][1] == want[1][1] and got[2:] == want[2:]
    # a sequence whose prompt ends in the chunk beside a step joins the next step with the
    # first token that chunk left on the device (unread): as when it is read and fed
    fresh()
    p1 = runner.launch([PrefillPiece(2, [7, 8, 9], 0)], [0, 1], [5, 6])
    p2 = runner.launch([], [0, 1, 2], None, follow=True, fed=[-1, -1, 0])
    p3 = runner.launch([], [0, 1, 2], None, follow=True)
    got = [runner.collect(p)[:2] for p in (p1, p2, p3)]
    fresh()
    first, a, _ = runner.run([PrefillPiece(2, [7, 8, 9], 0)], [0, 1], [5, 6])
    b = runner.run([], [0, 1, 2], [*a, first[0]])[1]
    assert got == [(first, a), ([], b), ([], runner.run([], [0, 1, 2], b)[1])]
    runner.run([], [0, 1], [5, 6])
    # a sequence changed on the host since: no continuation
    runner.run([PrefillPiece(0, [7], int(model.kv.tables.lens[0]))], [], [])
    with pytest.raises(ValueError, match="changed since the step"):
        runner.launch([], [0, 1], None, follow=True)
    runner.run([], [0, 1], [5, 6])
    n = int(model.kv.tables.lens[1])
    model.free(1)  # the sequence in slot 1 ends, and another reaches its length there
    model.kv.tables.add(1)
    model.kv.tables.append(1, n)
    with pytest.raises(ValueError, match="changed since the step"):
        runner.launch([], [0, 1], None, follow=True)
    runner.close()
    model.close()


@pytest.mark.parametrize("graphs,streams", [(False, 1), (False, 2), (True, 2)])
def test_follow_chains_match_host_fed_steps(graphs, streams):
    # 40 steps, each continuing the last on the device: two new 16-token cache blocks per
    # row on the way, new sampling parameters for one row at step 20, and a prefill of
    # another slot at step 30 (its copy of the lengths lands between two continued steps):
    # the same tokens as steps fed from the host, and the cache lengths agree after. Eager
    # on one stream, nothing stands between one step's sampler and the next step's first
    # kernel (under PDL, that one must launch plainly)
    from rawgraph.engine.runner import Runner

    def chain(follow):
        model = _model()
        model.kv.k.fill(0)
        model.kv.v.fill(0)
        runner = Runner(model, graphs=graphs, buckets=[2], chunks=[64], streams=streams)
        for s in (0, 1):
            model.kv.tables.add(s)
            model.kv.tables.append(s, 3)
        out, pending = [], runner.launch([], [0, 1], [5, 6])
        for i in range(40):
            if i == 20:
                model.inputs.set_sampling(1, SamplingParams(0.9, 50, 0.95, seed=3))
            if i == 30:
                runner.run([PrefillPiece(2, [7, 8, 9], 0)], [], [])
            if follow:
                nxt = runner.launch([], [0, 1], None, follow=True)
                out.append(runner.collect(pending)[1])
            else:
                out.append(runner.collect(pending)[1])
                nxt = runner.launch([], [0, 1], out[-1])
            pending = nxt
        out.append(runner.collect(pending)[1])
        assert model.kv.tables.lens[:3].tolist() == [44, 44, 3]
        assert model.kv.seq_lens.get()[:3].tolist() == [45, 45, 3]  # moved on by the last step
        runner.close()
        model.close()
        return out

    a, b = chain(True), chain(False)
    assert a == b and len(set(map(tuple, a))) > 5


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("graphs", [False, True])
def test_follow_steps_with_a_chunk_beside_them_match_host_fed_ones(graphs, mixed):
    # 24 steps of two rows, each continuing the last on the device; steps 8 to 15 carry a
    # piece of slot 2's 60-token prompt beside them (8 tokens each, the last one final; or
    # with it in mixed iterations, whose rows' inputs then come from the device too),
    # launched before the step before has been read: the rows' tokens, the prompt's first
    # token and the cache lengths are those of steps fed from the host and read at once
    from rawgraph.engine.runner import Runner

    prompt = list(range(100, 160))

    def chain(follow):
        model = _model()
        model.kv.k.fill(0)
        model.kv.v.fill(0)
        runner = Runner(model, graphs=graphs, buckets=[2], chunks=[16, 64], mixed=mixed)
        for s in (0, 1):
            model.kv.tables.add(s)
            model.kv.tables.append(s, 3)
        out, firsts, pending = [], [], runner.launch([], [0, 1], [5, 6])
        for i in range(24):
            k = i - 8
            pieces = ([PrefillPiece(2, prompt[8 * k:8 * k + 8 + (4 if k == 7 else 0)], 8 * k,
                                    final=k == 7)] if 0 <= k < 8 else [])
            if follow:
                nxt = runner.launch(pieces, [0, 1], None, follow=True)
                first, toks, _ = runner.collect(pending)
            else:
                first, toks, _ = runner.collect(pending)
                nxt = runner.launch(pieces, [0, 1], toks)
            out.append(toks)
            firsts += [t for t in first if t >= 0]
            pending = nxt
        first, toks, _ = runner.collect(pending)
        out.append(toks)
        firsts += [t for t in first if t >= 0]
        assert model.kv.tables.lens[:3].tolist() == [28, 28, 60]
        runner.close()
        model.close()
        return out, firsts

    (a, fa), (b, fb) = chain(True), chain(False)
    assert a == b and fa == fb and len(fa) == 1
