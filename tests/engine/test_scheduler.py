"""Scheduling without a GPU: admission by KV blocks (the worst case reserved, undone exactly),
chunk planning, requests that can never run, bucket and chunk sizes, bounded stats."""

import pytest

from rawgraph.engine.request import Request
from rawgraph.engine.runner import _sizes
from rawgraph.engine.scheduler import Scheduler


def _sched(**kw):
    args = {"max_seqs": 3, "chunk_tokens": 16, "chunk_seqs": 2, "num_blocks": 10,
            "block_size": 16, "max_context": 128} | kw
    return Scheduler(**args)


def test_admission_reserves_the_worst_case_in_blocks():
    s = _sched()
    a, b, c = Request([1] * 60, 40), Request([1] * 30, 2), Request([1], 1, arrival=3)
    for r in (a, b, c):
        s.add(r)
    s.admit(0)  # a: 7 blocks; b: 2 blocks; c has not arrived
    assert [r.slot for r in s.running] == [0, 1] and list(s.waiting) == [c]
    s.admit(3)  # c needs 1 block: 10 reserved now
    assert len(s.running) == 3
    d = Request([1] * 10, 10)
    s.add(d)
    s.admit(4)
    assert list(s.waiting) == [d]  # no slot left
    s.finish(a, "length")
    s.admit(5)
    assert d.slot == 0 and a.finish == "length"


def test_plan_fills_chunks_in_arrival_order_and_steps_every_decoder():
    s = _sched()
    a, b, c = Request([1] * 20, 4), Request([2] * 5, 4), Request([3] * 3, 4)
    for r in (a, b, c):
        s.add(r)
    s.admit(0)
    p = s.plan()
    assert [(r.name, len(x.tokens), x.start) for r, x in p.prefill] == [(a.name, 16, 0)]
    a.prefilled = 16
    p = s.plan()  # a's last 4 tokens, then b's 5; c waits (two sequences per chunk)
    assert [(len(x.tokens), x.start) for _, x in p.prefill] == [(4, 16), (5, 0)]
    a.prefilled, b.prefilled = 20, 5
    a.output, b.output = [7], [8]
    p = s.plan()
    assert p.decode == [a, b] and [r for r, _ in p.prefill] == [c]


def test_a_chunk_beside_decoding_sequences_keeps_to_decode_chunk():
    s = _sched(decode_chunk=4)
    a, b = Request([1] * 20, 4), Request([2] * 30, 4)
    for r in (a, b):
        s.add(r)
    s.admit(0)
    assert [len(x.tokens) for _, x in s.plan().prefill] == [16]  # nobody decodes: the chunk
    a.prefilled, a.output = 20, [7]
    p = s.plan()
    assert p.decode == [a] and [(len(x.tokens), x.start) for _, x in p.prefill] == [(4, 0)]
    assert _sched(decode_chunk=99).decode_chunk == 16  # never above the chunk


def test_requests_that_can_never_run_are_refused():
    s = _sched()
    with pytest.raises(ValueError, match="exceeds max_context = 128"):
        s.add(Request([1] * 100, 29))
    with pytest.raises(ValueError, match="KV blocks"):
        _sched(num_blocks=2).add(Request([1] * 40, 1))
    with pytest.raises(ValueError, match="at least one prompt token"):
        Request([], 1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        Request([1], 0)


def test_bucket_and_chunk_sizes():
    assert _sizes((1, 2, 4, 8, 16), 12, None) == (1, 2, 4, 8, 12)
    assert _sizes((1, 2, 4), 8, [4, 2, 2]) == (2, 4)
    with pytest.raises(ValueError, match="must lie in"):
        _sizes((1,), 8, [16])


def test_engine_stats_stay_bounded():
    from rawgraph.engine.engine import RECENT, EngineStats
    from rawgraph.engine.runner import IterStats

    st = EngineStats()
    for i in range(RECENT + 100):
        st.record(IterStats(decode_rows=1, wall_ms=float(i)), 1)
    st.record(IterStats(decode_rows=1, prefill_tokens=5), 2)
    assert len(st.iters) == RECENT and st.decode_steps == RECENT + 100
    assert st.tokens == RECENT + 102 and st.summary()["ms/step"] == 101 + (RECENT - 2) / 2


def test_admissions_are_undone_exactly():
    s = _sched(max_seqs=4, num_blocks=12)
    a, b, c = Request([1] * 60, 40), Request([1] * 30, 2), Request([1], 1, arrival=3)
    for r in (a, b, c):
        s.add(r)
    s.admit(0)
    d = Request([1] * 5, 5)
    s.add(d)
    before = (list(s.waiting), list(s.running), *s.books())
    books, admitted = s.books(), []
    assert s.admit(3, admitted) == [c, d] == admitted and c.slot >= 0 and d.slot >= 0
    s.unadmit(admitted, books)
    assert (list(s.waiting), list(s.running), *s.books()) == before
    assert c.slot == d.slot == -1
    s.admit(3)
    assert [r.slot for r in s.running] == [0, 1, 2, 3]  # the same slots as before the undo
    assert s.drop(d) is False and s.drop(Request([2], 1)) is False

