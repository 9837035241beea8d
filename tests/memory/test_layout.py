"""Arena layout: aligned named regions, stats, and an over-subscription error with the sizes."""

import pytest

from rawgraph.memory.layout import ArenaFullError, Layout, align_up


def test_regions_are_aligned_and_never_move():
    lay = Layout(10_000, "weights")
    a = lay.reserve("a", 100)
    b = lay.reserve("b", 1000, align=512)
    c = lay.reserve("c", 8, align=8)
    assert (a.offset, b.offset, c.offset) == (0, 512, 1512)
    assert lay.stats() == {"a": 100, "b": 1000, "c": 8, "free": 10_000 - 1520,
                           "capacity": 10_000}
    assert lay.find(600) == b and lay.find(1511) == b and lay.find(300) is None


def test_oversubscription_names_sizes():
    lay = Layout(4096, "kv")
    lay.reserve("x", 3000)
    with pytest.raises(ArenaFullError, match=r"'y' needs 2,000 bytes.*only 1,024 of 4,096"):
        lay.reserve("y", 2000)
    assert list(lay.regions) == ["x"] and lay.used == 3000


@pytest.mark.parametrize(("args", "match"), [(("x", 0), "positive"), (("a", 1), "already")])
def test_bad_requests(args, match):
    lay = Layout(100)
    lay.reserve("a", 1)
    with pytest.raises(ValueError, match=match):
        lay.reserve(*args)
    with pytest.raises(ValueError, match="power of two"):
        align_up(5, 3)
