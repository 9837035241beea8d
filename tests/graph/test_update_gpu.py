"""cudaGraphExecUpdate: in place when the topology matches, re-instantiation when not."""

import numpy as np
import pytest

from rawgraph import Range, Symbols, capture
from tests.layer import buffers, layer, snapshot

pytestmark = pytest.mark.gpu


def _graph(stream, b, rows, past=None):
    with capture(stream) as cap:
        layer(b, stream, rows, past=past)
    return cap.graph


def _eager(stream, b, rows, past=None):
    b.poison()
    layer(b, stream, rows, past=past)
    stream.synchronize()
    return snapshot(b.outputs())


def _replay(stream, b, ex):
    b.poison()
    ex.launch(stream)
    stream.synchronize()
    return snapshot(b.outputs())


def test_update_in_place_takes_new_parameters(stream, rng):
    b = buffers(rng, 32)
    g1, g2 = _graph(stream, b, 8), _graph(stream, b, 20)
    with g1.instantiate() as ex:
        res = ex.update(g2)
        assert res.in_place and res.reason == ""
        for got, want in zip(_replay(stream, b, ex), _eager(stream, b, 20)):
            np.testing.assert_array_equal(got, want)
    g1.close()
    g2.close()


def test_update_with_new_topology_falls_back_with_reason(stream, rng):
    b = buffers(rng, 32)
    g1, g3 = _graph(stream, b, 8), _graph(stream, b, 8, past=77)
    with g1.instantiate() as ex:
        res = ex.update(g3)
        assert not res.in_place and "topology" in res.reason
        assert ex.graph is g3
        for got, want in zip(_replay(stream, b, ex), _eager(stream, b, 8, past=77)):
            np.testing.assert_array_equal(got, want)
    g1.close()
    g3.close()


def test_patching_still_works_after_update(stream, rng):
    S = Symbols(seq=Range(1, 32))
    b = buffers(rng, 32)
    S.set(seq=4)
    g1 = _graph_sym(stream, b, S)
    S.set(seq=9)
    g2 = _graph_sym(stream, b, S)
    with g1.instantiate() as ex:
        assert ex.update(g2).in_place and ex.symbols == {"seq": 9}
        assert ex.set(seq=30) == 3
        for got, want in zip(_replay(stream, b, ex), _eager(stream, b, 30)):
            np.testing.assert_array_equal(got, want)
    g1.close()
    g2.close()


def _graph_sym(stream, b, S):
    with capture(stream) as cap:
        layer(b, stream, S.seq, S)
    return cap.graph
