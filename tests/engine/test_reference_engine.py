"""The engine on the host's reference decoder (CPU): greedy tokens equal the NumPy reference
decoding one request alone, whatever else is in the batch; seeded draws repeat; an abort or a
rolled-back iteration leaves no trace in the cache."""

import pytest

from rawgraph.engine.reference import reference_engine
from rawgraph.engine.request import Request
from rawgraph.model.config import preset
from rawgraph.model.reference import float_weights, greedy
from rawgraph.model.weights import random_weights
from rawgraph.ops.sampling import SamplingParams

CFG = preset("tiny")
W = random_weights(CFG, 3)
PROMPTS = [[1, 2, 3], list(range(5, 70)), [7] * 10, [400]]


def _engine(**kw):
    return reference_engine(CFG, W, max_batch=3, max_context=128, max_chunk=32, **kw)


@pytest.mark.parametrize(("overlap", "decode_chunk"), [(True, None), (False, None), (True, 5)])
def test_greedy_tokens_are_the_references(overlap, decode_chunk):
    fw = float_weights(CFG, W)
    want = [greedy(CFG, fw, p, 10) for p in PROMPTS]
    engine = _engine(overlap=overlap, decode_chunk=decode_chunk)
    assert engine.generate(PROMPTS, max_new_tokens=10) == want
    if decode_chunk:  # the long prompt went in pieces of 5 while the others decoded
        assert max(i.prefill_tokens for i in engine.stats.iters if i.decode_rows) == 5


def test_steps_with_a_chunk_beside_them_follow_on_the_device():
    # the long prompt goes in pieces while the others decode: those iterations are launched
    # ahead of the last one's tokens (follow) too, and the tokens stay the reference's
    engine, launches = _engine(decode_chunk=8), []
    launch = engine.runner.launch

    def spy(pieces, slots, tokens, sampling=None, *, follow=False, fed=None):
        launches.append((bool(pieces), bool(slots), follow))
        return launch(pieces, slots, tokens, sampling, follow=follow, fed=fed)

    engine.runner.launch = spy
    fw = float_weights(CFG, W)
    assert engine.generate(PROMPTS, max_new_tokens=10) == [greedy(CFG, fw, p, 10)
                                                           for p in PROMPTS]
    assert (True, True, True) in launches


def test_rows_that_finish_are_left_empty_and_the_others_go_on_on_the_device():
    # three requests decode together and end one by one: each step after an end continues
    # the last on the device with the ended row left empty (slot -1, a padding row), instead
    # of reading the last step first and feeding every row from the host; tokens stay the
    # reference's, and the empty rows' places are the ended requests'
    engine, launches = _engine(), []
    launch = engine.runner.launch

    def spy(pieces, slots, tokens, sampling=None, *, follow=False, fed=None):
        launches.append((list(slots), follow))
        return launch(pieces, slots, tokens, sampling, follow=follow, fed=fed)

    engine.runner.launch = spy
    requests = [Request(p, n) for p, n in zip(PROMPTS[:3], (4, 7, 10))]
    engine.run(requests)
    fw = float_weights(CFG, W)
    assert [r.output for r in requests] == [greedy(CFG, fw, r.prompt, r.max_new_tokens)
                                            for r in requests]
    first = next(i for i, (slots, _) in enumerate(launches) if -1 in slots)
    after = [(slots, follow) for slots, follow in launches[first:] if slots]
    assert after and all(follow for _, follow in after)
    assert after[-1][0].count(-1) == 2  # the last request alone, in its own place
    assert engine.stats.iters[-1].decode_rows == 1


def test_requests_join_the_rows_on_the_device_without_reading_the_last_step_first():
    # requests arrive while others decode: once its prompt is done, each joins a continued
    # step in an empty row or after the last one, its first token fed on the device from
    # the chunk that ended its prompt (not read yet) or from the host (read), while the
    # others go on from the device; tokens stay the reference's
    engine, launches = _engine(), []
    launch = engine.runner.launch

    def spy(pieces, slots, tokens, sampling=None, *, follow=False, fed=None):
        launches.append((list(slots), tokens and list(tokens), fed and list(fed), follow))
        return launch(pieces, slots, tokens, sampling, follow=follow, fed=fed)

    engine.runner.launch = spy
    specs = [(PROMPTS[0], 12, 0), (PROMPTS[2], 3, 0), (PROMPTS[3], 8, 2), (PROMPTS[1], 6, 5)]
    requests = [Request(p, n, arrival=a) for p, n, a in specs]
    engine.run(requests)
    fw = float_weights(CFG, W)
    assert [r.output for r in requests] == [greedy(CFG, fw, r.prompt, r.max_new_tokens)
                                            for r in requests]
    joined = [(slots, tokens or [-1] * len(slots), fed or [-1] * len(slots))
              for slots, tokens, fed, follow in launches if follow and (tokens or fed)]
    assert len(joined) >= 2  # the two late requests joined a continued step
    assert any(j >= 0 for _, _, fed in joined for j in fed)  # on the device, unread
    for slots, tokens, fed in joined:  # a token or a piece only in a row taking a sequence
        assert all(s >= 0 for s, t, j in zip(slots, tokens, fed) if t >= 0 or j >= 0)
        assert not any(t >= 0 and j >= 0 for t, j in zip(tokens, fed))
    host = [slots for slots, _, _, follow in launches if slots and not follow]
    assert len(host) == 1  # only the very first decode step read nothing before it


def test_a_prompt_ending_beside_a_step_decodes_in_the_next_one():
    # a request whose prompt ends in the chunk beside a decode step joins the very next step
    # (as a run that reads each iteration before the next takes it), fed its first token on
    # the device from that chunk, which has not been read yet
    for overlap in (True, False):
        engine, log = _engine(decode_chunk=8, overlap=overlap), []
        launch = engine.runner.launch

        def spy(pcs, slots, tokens, sampling=None, *, follow=False, fed=None, log=log,
                launch=launch, engine=engine):
            log.append((engine.steps, [p.slot for p in pcs if p.final], list(slots), fed))
            return launch(pcs, slots, tokens, sampling, follow=follow, fed=fed)

        engine.runner.launch = spy
        late = Request(PROMPTS[3], 8, arrival=2)  # its prompt goes beside the others' step
        engine.run([Request(PROMPTS[0], 12), Request(PROMPTS[2], 9), late])
        ended = next(st for st, finals, slots, _ in log if late.slot in finals and slots)
        step, _, slots, fed = next(x for x in log if late.slot in x[2])
        assert step == ended + 1
        if overlap:
            assert fed is not None and fed[slots.index(late.slot)] >= 0


@pytest.mark.parametrize("bad", [0, 33, 4.0, "8"])
def test_a_decode_chunk_outside_the_chunks_is_refused(bad):
    with pytest.raises(ValueError, match=f"decode_chunk = {bad!r}: an int in \\[1, max_chunk = 32"):
        _engine(decode_chunk=bad)


def test_seeded_draws_repeat_and_differ_by_seed():
    def draw(seed):
        return _engine().run([Request([1, 2, 3], 12, SamplingParams(0.9, 40, 0.95, seed))]
                             )[0].output
    assert draw(5) == draw(5) and draw(5) != draw(6)


def test_an_abort_and_a_rollback_leave_the_cache_as_it_was():
    eng = _engine()
    t = eng.model.kv.tables
    a, b = Request(PROMPTS[1], 30), Request(PROMPTS[0], 30)
    eng.add(a)
    eng.add(b)
    for _ in range(4):
        eng.step()
    assert eng.abort(a)
    step = eng.runner.launch
    calls = []

    def flaky(*args, **kw):  # the next launch raises after its tables grew
        out = step(*args, **kw)
        if not calls:
            calls.append(1)
            raise RuntimeError("injected")
        return out
    eng.runner.launch = flaky
    with pytest.raises(RuntimeError, match="injected"):
        eng.step()
    eng.runner.launch = step
    while not eng.scheduler.idle:
        eng.step()
    eng.drain()
    assert a.finish == "abort" and b.finish == "length"
    fw = float_weights(CFG, W)
    assert b.output == greedy(CFG, fw, PROMPTS[0], 30)
    assert t.alloc.num_free == t.alloc.num_blocks and not eng.model.states


def test_a_row_fed_on_the_device_names_a_piece_that_ended_its_prompt_in_the_last_launch():
    from rawgraph.model.step import PrefillPiece

    runner = _engine().runner
    runner.launch([PrefillPiece(0, [1, 2, 3], 0)], [], [])
    first = runner.launch([PrefillPiece(1, [4, 5], 0), PrefillPiece(2, [6], 0, final=False)],
                          [0], [9])
    for fed, match in (([-1, 1], "row 1 \\(slot 2\\) names no piece"),  # not final
                       ([-1, 2], "row 1 \\(slot 1\\) names no piece"),  # no such piece
                       ([-1, -1, 0], "one per row")):
        with pytest.raises(ValueError, match=match):
            runner.launch([], [0, 1 if fed[1] != 1 else 2], None, follow=True, fed=fed)
    with pytest.raises(ValueError, match="only a step that follows"):
        runner.launch([], [0, 1], [9, 9], fed=[-1, 0])
    nxt = runner.launch([], [0, 1], None, follow=True, fed=[-1, 0])  # slot 1's first token
    assert runner.model.kv.tables.lens[1] == 3  # its prompt and the token fed
    fw = float_weights(CFG, W)
    assert runner.collect(first)[0] == [greedy(CFG, fw, [4, 5], 1)[0], -1]
    assert runner.collect(nxt)[1][1] == greedy(CFG, fw, [4, 5], 2)[1]
