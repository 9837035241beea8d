"""A step's sizes checked on the host (CPU): decode rows, prefill chunks, the blocks a growth
takes and the one check of a context; every refusal names the problem and changes nothing."""

import numpy as np
import pytest

from rawgraph.memory.blocks import BlockAllocator, BlockTables
from rawgraph.model import step
from rawgraph.model.step import Limits, PrefillPiece, Shape
from rawgraph.ops.sampling import SamplingParams

LIMITS = Limits(max_batch=4, max_chunk=32, max_chunk_seqs=2, max_context=64, vocab=100)


def _tables():
    t = BlockTables(BlockAllocator(16), 16, 4, 4)
    t.add(0)
    t.append(0, 20)  # slot 0: 20 tokens (2 blocks)
    t.add(1)
    t.append(1, 63)  # slot 1: one token from full
    return t


def _unchanged(t, before):
    assert (t.lens == before[0]).all() and set(t.active) == before[1]
    assert t.alloc.num_free == before[2]


def _state(t):
    return t.lens.copy(), set(t.active), t.alloc.num_free


def test_decode_rows_are_arrays_of_checked_slots_and_tokens():
    t = _tables()
    rows = step.decode_rows([0, 1], [5, 99], t, LIMITS)
    assert rows.slots.tolist() == [0, 1] and rows.tokens.dtype == np.int64


@pytest.mark.parametrize(("slots", "tokens", "match"), [
    ([], [], "need 1 to 4 rows"), ([0, 1], [5], "one token each"),
    ([0, 0], [5, 6], "distinct"), ([4], [5], r"in \[0, 4\)"), ([-1], [5], "distinct"),
    ([0], [100], r"outside \[0, 100\)"), ([0], [-3], "outside"),
    ([0, 1, 2, 3, 0], [1] * 5, "need 1 to 4 rows")])
def test_bad_decode_rows_are_refused(slots, tokens, match):
    t = _tables()
    before = _state(t)
    with pytest.raises(ValueError, match=match):
        step.decode_rows(slots, tokens, t, LIMITS)
    _unchanged(t, before)


def test_a_row_past_the_context_is_refused():
    t = _tables()
    t.append(1, 1)  # 64 tokens: the next one would be the 65th
    with pytest.raises(ValueError, match="context 65 exceeds max_context = 64"):
        step.decode_rows([1], [5], t, LIMITS)


def test_blocks_needed_counts_new_blocks_only():
    t = _tables()
    assert step.blocks_needed({0: 12}, t, LIMITS) == 0   # 20 -> 32: fills block 2
    assert step.blocks_needed({0: 13}, t, LIMITS) == 1   # 33 tokens: a third block
    assert step.blocks_needed({2: 17, 0: 1}, t, LIMITS) == 2  # a new sequence of 17
    with pytest.raises(ValueError, match="slot 1: context 65 exceeds"):
        step.blocks_needed({1: 2}, t, LIMITS)


def test_a_chunk_is_sized_once():
    t = _tables()
    c = step.chunk([PrefillPiece(0, [1, 2, 3], 20), PrefillPiece(2, list(range(10)), 0)],
                   t, LIMITS)
    assert (c.tokens, c.seqs, c.max_q_len, c.need) == (13, 2, 10, {0: 3, 2: 10})


@pytest.mark.parametrize(("pieces", "match"), [
    ([], "0 pieces"), ([PrefillPiece(2, [1] * 33, 0)], "1 to 32 tokens"),
    ([PrefillPiece(2, [1], 0), PrefillPiece(3, [1], 0), PrefillPiece(0, [1], 20)],
     "1 to 2 sequences"),
    ([PrefillPiece(2, [1], 0), PrefillPiece(2, [1], 0)], "distinct"),
    ([PrefillPiece(0, [1], 19)], "continue its sequence at position 20"),
    ([PrefillPiece(2, [], 0)], "0 tokens"), ([PrefillPiece(2, [100], 0)], "token ids outside"),
    ([PrefillPiece(1, [1, 2], 63)], "slot 1: context 65 exceeds")])
def test_bad_chunks_are_refused(pieces, match):
    t = _tables()
    before = _state(t)
    with pytest.raises(ValueError, match=match):
        step.chunk(pieces, t, LIMITS)
    _unchanged(t, before)


def test_final_tokens_mark_pieces_that_sampled_nothing():
    pieces = [PrefillPiece(0, [1], 0), PrefillPiece(1, [1], 0, final=False)]
    assert step.final_tokens([7, 8], pieces) == [7, -1]


def test_a_step_continues_only_the_same_rows_of_the_same_sequences():
    t = _tables()
    t.add(2)
    t.append(2, 5)
    last = step.last_step([2, 0], t, syncs=3)
    assert last.lens.tolist() == [5, 20] and last.syncs == 3
    step.check_follow(last, [2, 0], t, LIMITS)  # as left: it may continue
    with pytest.raises(ValueError, match="no decode step to continue"):
        step.check_follow(None, [2, 0], t, LIMITS)
    with pytest.raises(ValueError, match="not the continued step's"):
        step.check_follow(last, [0, 2], t, LIMITS)  # another order
    t.append(0, 1)  # slot 0 grew on the host since
    with pytest.raises(ValueError, match="changed since"):
        step.check_follow(last, [2, 0], t, LIMITS)
    t.truncate(0, 20)
    t.free(2)  # slot 2 ends, and a new sequence reaches the same length in it
    t.add(2)
    t.append(2, 5)
    with pytest.raises(ValueError, match="changed since"):
        step.check_follow(last, [2, 0], t, LIMITS)
    t.append(1, 1)  # 64 tokens: no room for the one on its way
    with pytest.raises(ValueError, match="context 65 exceeds"):
        step.check_follow(step.last_step([1], t, syncs=0), [1], t, LIMITS)


def test_a_continuing_step_keeps_rows_in_place_leaves_them_empty_or_fills_empty_ones():
    t = _tables()
    t.add(2)
    t.append(2, 5)
    t.add(3)
    t.append(3, 9)
    last = step.last_step([2, -1, 0], t, syncs=0)  # a row already empty stays recorded so
    assert last.lens.tolist() == [5, 0, 20] and last.started[1] == -1
    none = [False] * 3
    assert step.check_follow(last, [-1, -1, 0], t, LIMITS).tolist() == none  # 2 left
    assert step.check_follow(last, [2, -1, -1, -1], t, LIMITS).tolist() == [*none, False]
    # slot 3 (its prompt done) joins in the empty row, or past the last one, fed its token
    joins = step.check_follow(last, [2, 3, 0], t, LIMITS, [-1, 7, -1])
    assert joins.tolist() == [False, True, False]
    assert step.check_follow(last, [-1, -1, 0, 3], t, LIMITS, [-1, -1, -1, 7]).tolist() == \
        [False, False, False, True]
    with pytest.raises(ValueError, match="tokens are needed"):
        step.check_follow(last, [2, 3, 0], t, LIMITS)
    # or fed on the device (its first token where its prompt's last chunk left it): no token
    fed = [False, True, False]
    assert step.check_follow(last, [2, 3, 0], t, LIMITS, None, fed).tolist() == fed
    assert step.check_follow(last, [2, 3, 0], t, LIMITS, [-1, -1, -1], fed).tolist() == fed
    for tokens, bad_fed, match in (([-1, 7, -1], fed, "token"),  # both ways at once
                                   (None, [True, True, False], "True only in rows"),
                                   (None, [False, True], "one per row")):
        with pytest.raises(ValueError, match=match):
            step.check_follow(last, [2, 3, 0], t, LIMITS, tokens, bad_fed)
    for bad_tokens in ([-1, 100, -1], [5, 7, -1], [-1, 7]):
        with pytest.raises(ValueError, match="token"):
            step.check_follow(last, [2, 3, 0], t, LIMITS, bad_tokens)
    with pytest.raises(ValueError, match="may not move"):  # 2's token is on the device
        step.check_follow(last, [-1, 2, 0], t, LIMITS, [-1, 7, -1])
    with pytest.raises(ValueError, match="distinct"):
        step.check_follow(last, [2, -1, 0, 0], t, LIMITS, [-1, -1, -1, 7])
    for bad in ([-1, -1, -1], [0, -1, 2], [2, 0], [2, -1, 0, -1, -1]):
        with pytest.raises(ValueError, match="not the continued step's"):
            step.check_follow(last, bad, t, LIMITS)
    t.free(2)  # once it has ended, its own place may only be empty
    step.check_follow(last, [-1, -1, 0], t, LIMITS)
    with pytest.raises(ValueError, match="changed since"):  # the live row's sequence left
        step.check_follow(last, [2, -1, 0], t, LIMITS)


def test_the_inputs_check_steps_through_them():
    # the host side of an iteration without a GPU: bare Inputs with tables and limits only
    from types import SimpleNamespace

    from rawgraph.model.inputs import Inputs, sampling_fields

    m = object.__new__(Inputs)
    m.kv, m.limits = SimpleNamespace(tables=_tables(), block_size=16), LIMITS
    m.sampling = {name: np.zeros(4, dt) for name, (dt, _) in sampling_fields(4).items()}
    sl, tok = m.check_decode([0, 1], [3, 4])
    assert sl.tolist() == [0, 1] and tok.tolist() == [3, 4]
    with pytest.raises(ValueError, match="distinct"):
        m.check_decode([0, 0], [3, 4])
    assert m.blocks_needed({0: 13}) == 1
    with pytest.raises(ValueError, match="slot 1: context 65 exceeds max_context = 64"):
        m.blocks_needed({1: 2})
    m.set_sampling(2, SamplingParams(temperature=0.5, top_k=3, top_p=0.9, seed=7))
    assert m.sampling["seeds"][2] == 7 and m.sampling["top_k"][2] == 3
    assert m.sampling["rules"][2] == 0 and m.sampling["top_n"][2] == -1
    m.set_sampling(1, SamplingParams(presence_penalty=0.5, logprobs=3))
    assert m.sampling["rules"][1] == 1 and m.sampling["top_n"][1] == 3
    assert m.sampling["presence"][1] == 0.5 and m.sampling["repetition"][1] == 1
    m.set_sampling(1, SamplingParams(min_tokens=2), bans=True)
    assert m.sampling["rules"][1] == 1
    m.set_sampling(1, SamplingParams(min_tokens=2))  # nothing to ban: no rules
    assert m.sampling["rules"][1] == 0
    with pytest.raises(ValueError, match=r"in \[0, 4\)"):
        m.set_sampling(4, step.GREEDY)


def test_a_shape_names_the_sizes_its_launches_take():
    assert Shape(batch=8).sizes == ("max_len", "advance")
    assert Shape(chunk=64).sizes == ("n", "seqs", "max_q_len", "pre_len")
    both = Shape(8, 64)
    assert both.sizes == ("max_len", "advance", "n", "seqs", "max_q_len", "pre_len")
    assert [s.kind for s in (Shape(batch=1), Shape(chunk=1), both)] == [
        "decode", "prefill", "mixed"]
    assert str(both) == "mixed B=8 C=64" and set(step.SIZES) == set(both.sizes)
    assert len({Shape(batch=8), Shape(8, 0), Shape(chunk=8)}) == 2  # graph pool keys


def test_a_graph_is_captured_at_the_largest_sizes_it_may_be_patched_to():
    sym = step.symbols(Shape(4, 32), LIMITS)
    assert sym.env == {"max_len": 64, "advance": 1, "n": 32, "seqs": 1, "max_q_len": 32,
                       "pre_len": 64}
    sym.set(max_len=1, advance=0, n=1, seqs=2, max_q_len=1, pre_len=1)  # the other ends
    for bad in ({"max_len": 65}, {"n": 33}, {"seqs": 3}, {"advance": 2}, {"pre_len": 0}):
        with pytest.raises(ValueError):
            sym.set(**bad)
    assert set(step.symbols(Shape(chunk=16), LIMITS).env) == {"n", "seqs", "max_q_len",
                                                               "pre_len"}


@pytest.mark.parametrize(("shape", "sizes", "match"), [
    ((0, 0), {}, "a batch in"),
    ((5, 0), {"max_len": 3}, r"a batch in \[1, 4\]"),
    ((0, 33), {"n": 1, "seqs": 1, "max_q_len": 1, "pre_len": 1}, r"chunk in \[1, 32\]"),
    ((2, 0), {"max_len": 3, "n": 4}, "takes"),
    ((0, 8), {"n": 1, "seqs": 1, "max_q_len": 1}, "takes"),
    ((2, 8), {"max_len": 3, "n": 1, "seqs": 1, "max_q_len": 1, "pre_len": 3, "x": 0}, "takes"),
])
def test_a_launch_of_the_wrong_shape_or_sizes_is_refused(shape, sizes, match):
    with pytest.raises(ValueError, match=match):
        step.check_shape(Shape(*shape), sizes, LIMITS)
    step.check_shape(Shape(2, 8), {"max_len": 3, "n": 1, "seqs": 1, "max_q_len": 1,
                                   "pre_len": 3}, LIMITS)  # advance defaults to 0
