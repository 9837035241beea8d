"""The prefix cache's index and the allocator's idle blocks: keys chained by prefix, matches
checked token by token, idle blocks evicted least recently used first, and every block in
exactly one of free, idle or referenced whatever the order of operations."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rawgraph.memory.blocks import BlockAllocator, BlockTables
from rawgraph.memory.prefix import PrefixCache

BS = 4


def _cache(blocks=16, seqs=4):
    alloc = BlockAllocator(blocks)
    return PrefixCache(alloc, BS), BlockTables(alloc, BS, seqs, 8)


def _fill(cache, t, s, tokens):
    """Sequence s prefilled with `tokens`, its full blocks cached; returns its keys."""
    t.add(s)
    t.append(s, len(tokens))
    keys: list[int] = []
    cache.insert(tokens, t.table[s], len(tokens) // BS, keys)
    return keys


def test_a_prompt_takes_the_longest_cached_run_of_its_blocks():
    cache, t = _cache()
    a = list(range(10))  # blocks [0..3] [4..7], then 2 tokens
    _fill(cache, t, 0, a)
    assert cache.blocks == 2
    assert cache.match(a, 2, []) == t.table[0, :2].tolist()
    assert cache.match([0, 1, 2, 3, 9, 9, 9, 9], 2, []) == [int(t.table[0, 0])]
    assert cache.match([1, 0, 2, 3, 4, 5, 6, 7], 2, []) == []  # its first block differs
    assert cache.match(a, 1, []) == [int(t.table[0, 0])]  # at most `most`
    # the second block's tokens after another first block: another prefix, no match
    assert cache.match([9, 9, 9, 9, 4, 5, 6, 7], 2, []) == []


def test_a_key_that_collides_is_refused_by_its_tokens():
    cache, t = _cache()
    _fill(cache, t, 0, [1, 2, 3, 4])
    forged = cache.keys([1, 2, 3, 4], 1, [])  # the cached prefix's key for other tokens
    assert cache.match([5, 6, 7, 8], 1, list(forged)) == []
    assert cache.match([1, 2, 3, 4], 1, list(forged)) == [int(t.table[0, 0])]


def test_released_cached_blocks_wait_idle_and_are_taken_back():
    cache, t = _cache()
    _fill(cache, t, 0, list(range(8)))
    blocks = t.table[0, :2].tolist()
    t.free(0)
    a = t.alloc
    assert a.num_free == a.num_blocks and list(a.idle) == blocks[::-1]  # the last goes first
    assert all(a.refs[b] == 0 for b in blocks)
    t.adopt(1, cache.match(list(range(8)), 2, []))
    assert t.lens[1] == 8 and t.table[1, :2].tolist() == blocks and not a.idle
    assert a.refs[blocks].tolist() == [1, 1]
    t.append(1, 3)  # past the shared blocks: a fresh one, nothing copied
    assert not t.pending_copies and t.table[1, 2] not in blocks


def test_idle_blocks_are_evicted_least_recently_used_first():
    cache, t = _cache(blocks=6)
    _fill(cache, t, 0, [1] * 8)   # two blocks
    _fill(cache, t, 1, [2] * 8)   # two more
    t.free(0)
    t.free(1)  # idle, LRU first: 0's second, 0's first, 1's second, 1's first
    t.add(2)
    t.append(2, 12)  # 3 blocks: 2 free, then 0's second block evicted
    assert t.alloc.evictions == 1
    assert cache.match([1] * 8, 2, []) == cache.match([1] * 4, 1, [])  # first block only
    assert len(cache.match([2] * 8, 2, [])) == 2
    t.append(2, 8)  # 2 more: 0's first and 1's second
    assert t.alloc.evictions == 3 and cache.match([1] * 8, 2, []) == []
    assert len(cache.match([2] * 8, 2, [])) == 1


def test_a_prefix_cached_twice_keeps_the_first_and_the_second_stays_private():
    cache, t = _cache()
    _fill(cache, t, 0, [3] * 8)
    _fill(cache, t, 1, [3] * 8)  # computed again beside it (no match taken)
    assert cache.blocks == 2
    t.free(1)  # private blocks go back to the free list, not idle
    assert not t.alloc.idle
    t.free(0)
    assert len(t.alloc.idle) == 2
    cache.clear()
    assert cache.blocks == 0 and not t.alloc.idle and t.alloc.num_free == t.alloc.num_blocks


def test_reset_evicts_idle_blocks_and_hands_out_from_zero():
    cache, t = _cache()
    _fill(cache, t, 0, list(range(8)))
    t.reset()
    assert cache.blocks == 0 and not t.alloc.idle
    assert t.alloc.allocate(3) == [0, 1, 2]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["start", "grow", "free"]), st.integers(0, 3),
                          st.integers(0, 3), st.integers(1, 9)), max_size=40))
def test_every_block_is_free_idle_or_referenced(ops):
    cache, t = _cache(blocks=12)
    prompts = [[p] * 4 + [p + 1] * 4 + list(range(p, p + 8)) for p in range(4)]
    keys: dict[int, list[int]] = {}
    for op, s, p, n in ops:
        try:
            if op == "start" and s not in t.active:
                blocks = cache.match(prompts[p], 3, [])
                if blocks:
                    t.adopt(s, blocks)
                else:
                    t.add(s)
                keys[s] = [p]
            elif op == "grow" and s in t.active:
                p = keys[s][0]
                take = min(n, len(prompts[p]) - int(t.lens[s]))
                if take > 0:
                    t.append(s, take)
                    cache.insert(prompts[p], t.table[s], int(t.lens[s]) // BS, [])
            elif op == "free" and s in t.active:
                t.free(s)
        except MemoryError:
            pass
        a = t.alloc
        held = np.flatnonzero(a.refs > 0).tolist()
        free, idle = a._free, list(a.idle)
        assert sorted(free + idle + held) == list(range(a.num_blocks))
        assert all(cache._key_of.get(b) is not None for b in idle)
        for s in t.active:  # a cached block a sequence holds is keyed by what it holds
            p = keys[s][0]
            for j in range(int(t.lens[s]) // BS):
                key = cache._key_of.get(int(t.table[s, j]))
                if key is not None:
                    assert cache._by_key[key].tokens == tuple(prompts[p][j * BS:(j + 1) * BS])
    for s in list(t.active):
        t.free(s)
    assert (t.alloc.refs == 0).all() and t.alloc.num_free == t.alloc.num_blocks
