"""Requests and sampling parameters are checked when made: each bad field refused by name."""

import numpy as np
import pytest

from rawgraph.engine.request import Request
from rawgraph.ops.sampling import SamplingParams


def test_bad_requests_and_sampling_parameters_are_refused():
    ok = [1, 2, 3]
    bad = [
        (lambda: Request([1.5, 2.5], 4), TypeError, "token ids must be integers"),
        (lambda: Request(["1", "2"], 4), TypeError, "token ids must be integers"),
        (lambda: Request("hello", 4), TypeError, "list of token ids"),
        (lambda: Request([True, 2], 4), TypeError, "bool"),
        (lambda: Request([-1], 4), ValueError, ">= 0"),
        # past the plain-int pass: the one id that fails it is found and named
        (lambda: Request([1] * 100 + [True], 4), TypeError, "bool True at index 100"),
        (lambda: Request([1] * 100 + [-3], 4), ValueError, ">= 0, got -3"),
        (lambda: Request(ok, 2.5), TypeError, "max_new_tokens must be an integer"),
        (lambda: Request(ok, 4, None), TypeError, "sampling must be a SamplingParams"),
        (lambda: Request(ok, 4, stop=5), TypeError, "stop must be a collection"),
        (lambda: Request(ok, 4, stop=[1.0]), TypeError, "stop: token ids must be integers"),
        (lambda: SamplingParams(seed=1.5), TypeError, "seed must be an integer"),
        (lambda: SamplingParams(seed="7"), TypeError, "seed must be an integer"),
        (lambda: SamplingParams(temperature=float("inf")), ValueError, "temperature must be"),
        (lambda: SamplingParams(temperature=float("nan")), ValueError, "temperature must be"),
        (lambda: SamplingParams(top_p=0), ValueError, "top_p"),
    ]
    for make, kind, match in bad:
        with pytest.raises(kind, match=match):
            make()
    r = Request(np.asarray([3, 4], np.int64), np.int64(3), SamplingParams(0.5, np.int32(4)),
                stop=np.array([9]))
    assert r.prompt == [3, 4] and type(r.prompt[0]) is int and r.max_new_tokens == 3
    mixed = Request([5, np.int32(6)], 1)  # NumPy ints in a list: Python ints after
    assert mixed.prompt == [5, 6] and all(type(t) is int for t in mixed.prompt)
    assert r.stop == frozenset([9]) and type(r.sampling.top_k) is int
