"""The profile's in-place figure (CPU): whole and disabled timings alternated, the median of
their differences, the nodes enabled again; a refusal reported, not raised."""

import pytest

from rawgraph.bench import profile
from rawgraph.cuda.check import CudaError


class _Exec:
    """A GraphExec stand-in: records enable calls; refuses when told to."""

    def __init__(self, refuse: bool = False):
        self.calls, self.refuse, self.disabled = [], refuse, False

    def enable(self, nodes, on=True):
        if self.refuse and not on:
            raise CudaError("cuGraphNodeSetEnabled: not supported")
        self.calls.append((tuple(nodes), on))
        self.disabled = not on


def test_in_place_is_the_median_of_alternated_pairs(monkeypatch):
    ex = _Exec()
    # (whole, disabled) pairs: differences 10, 130 (a drift between the two), -20
    times = iter([100.0, 90.0, 240.0, 110.0, 100.0, 120.0])
    seen = []

    def graph_us(e, stream):
        seen.append(e.disabled)
        return next(times)

    monkeypatch.setattr(profile, "graph_us", graph_us)
    assert profile._in_place(ex, None, ["a", "b"]) == 10.0
    assert seen == [False, True] * profile.ROUNDS
    assert ex.calls == [(("a", "b"), False), (("a", "b"), True)] * profile.ROUNDS
    assert not ex.disabled


def test_in_place_says_why_where_the_driver_refuses(monkeypatch):
    monkeypatch.setattr(profile, "graph_us", lambda e, stream: 1.0)
    got = profile._in_place(_Exec(refuse=True), None, ["a"])
    assert isinstance(got, str) and got.startswith("n/a") and "not supported" in got


def test_a_timing_that_fails_leaves_the_nodes_enabled(monkeypatch):
    ex = _Exec()
    calls = iter([1.0])

    def graph_us(e, stream):
        if e.disabled:
            raise RuntimeError("timing failed")
        return next(calls)

    monkeypatch.setattr(profile, "graph_us", graph_us)
    with pytest.raises(RuntimeError, match="timing failed"):
        profile._in_place(ex, None, ["a"])
    assert not ex.disabled
