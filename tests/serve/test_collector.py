"""The serving processes' garbage collector: the start-up heap frozen, the passes timed."""

import gc

import pytest

from rawgraph.serve.collector import PauseClock, freeze_startup_heap


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()  # the rest of the test session collects as before


def test_freeze_moves_what_lives_now_out_of_the_collectors_reach(unfrozen):
    kept = [[i] for i in range(5000)]  # tracked containers alive at "start-up"
    frozen = freeze_startup_heap()
    assert frozen == gc.get_freeze_count() >= len(kept)
    assert all(gc.is_tracked(x) for x in kept[:3])
    assert not any(x is kept for x in gc.get_objects(generation=2))  # frozen: in none
    later = [[1]]
    assert gc.get_freeze_count() == frozen and later  # made after: not frozen


def test_pause_clock_times_each_pass_until_closed():
    clock = PauseClock()
    try:
        clock.drain()
        gc.collect(0)
        gc.collect(2)
        pauses = clock.drain()
        assert [g for g, _ in pauses][-2:] == [0, 2]
        assert all(0 <= s < 5 for _, s in pauses)
        assert clock.drain() == []
    finally:
        clock.close()
    gc.collect()
    assert clock.drain() == []
    clock.close()  # twice: nothing left to remove
