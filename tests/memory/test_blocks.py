"""Paged KV bookkeeping: allocation, append, fork with copy-on-write, free, and atomic failure."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rawgraph.memory.blocks import BlockAllocator, BlockTables, OutOfBlocks


def _tables(num_blocks=8, bs=4, seqs=4, per_seq=4):
    return BlockTables(BlockAllocator(num_blocks), bs, seqs, per_seq)


def test_append_allocates_blocks_as_tokens_arrive():
    t = _tables()
    t.add(0)
    t.append(0, 3)
    assert t.lens[0] == 3 and list(t.table[0]) == [0, -1, -1, -1]
    t.append(0, 1)
    assert list(t.table[0]) == [0, -1, -1, -1]
    t.append(0, 6)
    assert t.lens[0] == 10 and list(t.table[0]) == [0, 1, 2, -1] and t.alloc.num_free == 5


def test_fork_shares_and_copy_on_write_splits_the_last_block():
    t = _tables()
    t.add(0)
    t.append(0, 6)                     # blocks 0, 1 (block 1 half full)
    t.fork(0, 1)
    assert list(t.table[1][:2]) == [0, 1] and list(t.alloc.refs[:2]) == [2, 2]
    t.append(1, 1)                     # writes into shared block 1: copy it first
    assert t.pending_copies == [(1, 2, 2)] and list(t.table[1][:2]) == [0, 2]
    assert list(t.alloc.refs[:3]) == [2, 1, 1]
    t.append(0, 1)                     # block 1 is private to seq 0 again: no copy
    assert t.pending_copies == [(1, 2, 2)]
    t.free(0)
    assert list(t.alloc.refs[:3]) == [1, 0, 1] and t.alloc.num_free == 6
    t.free(1)
    assert t.alloc.num_free == 8 and not t.active


def test_running_out_changes_nothing():
    t = _tables(num_blocks=3)
    t.add(0)
    t.add(1)
    t.append(0, 8)
    before = (t.table.copy(), t.lens.copy(), t.alloc.refs.copy(), t.alloc.num_free)
    with pytest.raises(OutOfBlocks, match="need 2 KV blocks to append 5 tokens to sequence 1"):
        t.append(1, 5)
    after = (t.table, t.lens, t.alloc.refs, t.alloc.num_free)
    assert all(np.array_equal(a, b) for a, b in zip(before[:3], after[:3]))
    assert before[3] == after[3]


@pytest.mark.parametrize(("op", "match"), [
    (lambda t: t.append(3, 1), "not in use"), (lambda t: t.add(0), "in use"),
    (lambda t: t.add(9), "outside"), (lambda t: t.append(0, 17), "exceed"),
    (lambda t: t.fork(0, 0), "in use")])
def test_bad_calls(op, match):
    t = _tables()
    t.add(0)
    with pytest.raises(ValueError, match=match):
        op(t)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "append", "fork", "free"]),
                          st.integers(0, 5), st.integers(0, 5), st.integers(1, 9)), max_size=40))
def test_invariants_hold_under_any_sequence_of_operations(ops):
    t = _tables(num_blocks=12, bs=4, seqs=6, per_seq=5)
    for op, a, b, n in ops:
        call = {"add": (t.add, a), "append": (t.append, a, n), "fork": (t.fork, a, b),
                "free": (t.free, a)}[op]
        try:
            call[0](*call[1:])
        except (ValueError, OutOfBlocks):
            pass
        refs = np.zeros(12, np.int32)
        for s in t.active:
            used = -(-int(t.lens[s]) // 4)
            assert (t.table[s, :used] >= 0).all() and (t.table[s, used:] == -1).all()
            np.add.at(refs, t.table[s, :used], 1)
        assert np.array_equal(refs, t.alloc.refs)
        assert t.alloc.num_free == int((refs == 0).sum())
        assert sorted(t.alloc._free) == [i for i in range(12) if refs[i] == 0]


def test_append_one_matches_append_and_is_all_or_nothing():
    def tables():
        t = BlockTables(BlockAllocator(40), 4, 6, 8)
        for s, n in ((0, 3), (1, 4), (2, 0), (3, 7)):
            t.add(s)
            t.append(s, n)
        t.fork(3, 4)  # shares a partly filled last block: copy on write
        return t

    a, b = tables(), tables()
    rows = np.array([0, 1, 2, 3, 4])
    for _ in range(9):
        a.append_one(rows)
        for s in rows:
            b.append(int(s), 1)
        np.testing.assert_array_equal(a.table, b.table)
        np.testing.assert_array_equal(a.lens, b.lens)
        assert a.pending_copies == b.pending_copies and a.alloc.num_free == b.alloc.num_free
    t = BlockTables(BlockAllocator(2), 4, 3, 8)
    for s in (0, 1):
        t.add(s)
        t.append(s, 4)
    before = (t.table.copy(), t.lens.copy())
    with pytest.raises(OutOfBlocks):
        t.append_one(np.array([0, 1]))
    assert (t.table == before[0]).all() and (t.lens == before[1]).all()


def test_truncate_gives_back_the_blocks_past_the_end():
    t = BlockTables(BlockAllocator(10), 4, 2, 8)
    t.add(0)
    t.append(0, 13)  # 4 blocks
    t.truncate(0, 5)  # 2 blocks
    assert t.lens[0] == 5 and t.alloc.num_free == 8 and (t.table[0, 2:] == -1).all()
    t.append(0, 3)
    assert t.lens[0] == 8 and t.alloc.num_free == 8
    with pytest.raises(ValueError, match="cannot truncate"):
        t.truncate(0, 9)


def test_reset_hands_blocks_out_in_the_original_order_again():
    t = BlockTables(BlockAllocator(6), 4, 3, 4)
    for s, n in ((0, 5), (1, 3), (2, 1)):
        t.add(s)
        t.append(s, n)
    first = t.table.copy()
    t.free(1)
    t.reset()
    assert t.active == set() and t.alloc.num_free == 6
    for s, n in ((0, 5), (1, 3), (2, 1)):
        t.add(s)
        t.append(s, n)
    assert (t.table == first).all()
    t.alloc.share([0])
    with pytest.raises(ValueError, match="still referenced"):
        t.alloc.reset()


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "append", "append_one", "fork", "free",
                                           "truncate", "reset"]),
                          st.integers(0, 5), st.integers(0, 5), st.integers(1, 9)), max_size=40))
@example([("add", 0, 0, 1), ("append", 0, 0, 1), ("append", 0, 0, 2)])  # a piece in its block
def test_changed_rows_and_moved_lengths_are_all_a_device_copy_needs(ops):
    # a device mirror that copies only the rows in `changed` after each operation (as the
    # paged cache's sync does) always equals the table; and its lengths, which it copies only
    # when rows changed or `lens_moved` says so, moving each decode row's on by itself in
    # between (a step continuing the last one, as `Inputs.follow` relies on), always
    # equal the host's
    t = _tables(num_blocks=12, bs=4, seqs=6, per_seq=5)
    mirror, lens = np.zeros_like(t.table), t.lens.copy()
    for op, a, b, n in ops:
        rows = np.array(sorted(t.active)[:b + 1], np.int64)
        call = {"add": (t.add, a), "append": (t.append, a, n), "fork": (t.fork, a, b),
                "free": (t.free, a), "truncate": (t.truncate, a, n % 4), "reset": (t.reset,),
                "append_one": (t.append_one, rows)}[op]
        try:
            call[0](*call[1:])
        except (ValueError, OutOfBlocks):
            pass
        else:
            if op == "append_one":
                lens[rows] += 1
        if t.changed or t.lens_moved:
            lens[:] = t.lens
        changed = sorted(t.changed)
        t.changed.clear()
        t.lens_moved = False
        mirror[changed] = t.table[changed]
        assert np.array_equal(mirror, t.table) and np.array_equal(lens, t.lens)


def test_a_step_in_the_same_blocks_changes_no_row():
    t = _tables()
    t.add(0)
    t.append(0, 2)
    t.changed.clear()
    t.append_one(np.array([0]))  # token 3 of block 0: the length only
    assert t.changed == set() and t.lens[0] == 3
    t.append_one(np.array([0]))
    t.append_one(np.array([0]))  # token 5 opens block 1
    assert t.changed == {0} and list(t.table[0][:2]) == [0, 1]


def test_a_prefill_piece_in_the_same_block_is_a_length_the_device_must_be_told():
    t = _tables()
    t.add(0)
    t.append(0, 2)
    t.changed.clear()
    t.lens_moved = False
    t.append_one(np.array([0]))  # a decode token: the continuing step moves it on itself
    assert not t.lens_moved and not t.changed
    t.append(0, 1)  # a piece's token in the same block: no row changed, the length did
    assert t.lens_moved and not t.changed
