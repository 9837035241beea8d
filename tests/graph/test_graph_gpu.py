"""Capture, inspect and replay: replay equals eager launches, bit for bit, every time."""

import numpy as np
import pytest

from rawgraph import capture, verify
from rawgraph.graph.capture import capture_status
from rawgraph.ops.elementwise import ADD
from tests.layer import DIM, buffers, layer, snapshot

pytestmark = pytest.mark.gpu


def test_replay_equals_eager_over_many_replays(stream, rng):
    b = buffers(rng, 8)
    layer(b, stream)
    stream.synchronize()
    eager = snapshot(b.outputs())
    b.poison()
    with capture(stream, name="layer") as cap:
        layer(b, stream)
    assert capture_status(stream) == "none"
    stream.synchronize()
    assert all((s == 0x7E00).all() for s in snapshot(b.outputs()))  # capture ran nothing
    with cap.graph as g, g.instantiate(upload_stream=stream) as ex:
        for _ in range(6):
            b.poison()
            ex.launch(stream)
            stream.synchronize()
            for got, want in zip(snapshot(b.outputs()), eager):
                np.testing.assert_array_equal(got, want)
        verify(ex, b.all(), stream)


def test_nodes_are_inspectable(stream, rng):
    b = buffers(rng, 8)
    with capture(stream, name="layer") as cap:
        layer(b, stream)
    g = cap.graph
    kernels = [n for n in g.nodes if n.type == "kernel"]
    assert [n.kernel for n in kernels] == ["rmsnorm_f16", "silu_mul_f16", "add_f16"]
    norm = kernels[0]
    assert norm.grid == (8, 1, 1) and norm.block == (256, 1, 1) and norm.smem == 0
    assert norm.args["x"] == b.x.data.ptr and norm.args["rows"] == 8
    assert norm.args["dim"] == DIM and norm.args["eps"] == pytest.approx(1e-5)
    assert kernels[2].args["n"] == 8 * DIM
    assert g.edges == [(0, 1), (1, 2)]
    table = g.table()
    assert "rmsnorm_f16<<<(8, 1, 1), (256, 1, 1), 0>>>" in table and "3 nodes, 2 edges" in table
    dot = g.to_dot()
    assert dot.startswith('digraph "layer"') and "n0 -> n1" in dot
    g.close()


def test_pdl_launches_capture_and_match(stream, rng):
    a = b = None
    from tests.helpers import poisoned, randn

    a, _ = randn(rng, (4096,), "float16")
    b, _ = randn(rng, (4096,), "float16")
    out1, out2 = poisoned((4096,), "float16"), poisoned((4096,), "float16")
    k = ADD["float16"]
    k.launch(2, 256, (a, b, out1, 4096), stream)
    with capture(stream) as cap:
        k.launch(2, 256, (a, b, out2, 4096), stream)
        k.launch(2, 256, (out2, b, out2, 4096), stream, pdl=True)
    k.launch(2, 256, (out1, b, out1, 4096), stream, pdl=True)
    with cap.graph as g, g.instantiate() as ex:
        ex.launch(stream)
        stream.synchronize()
        np.testing.assert_array_equal(out1.get(), out2.get())


def test_a_disabled_node_runs_as_an_empty_one_until_enabled(stream, rng):
    # GraphExec.enable: bench's in-place profile disables a kernel's nodes and puts them back
    b = buffers(rng, 8)
    with capture(stream, name="layer") as cap:
        layer(b, stream)
    with cap.graph as g, g.instantiate(upload_stream=stream) as ex:
        ex.launch(stream)
        stream.synchronize()
        want = snapshot(b.outputs())
        silu = [node for node, L in g.records if L.kernel.name.startswith("silu_mul")]
        assert len(silu) == 1
        ex.enable(silu, False)
        b.poison()
        ex.launch(stream)
        stream.synchronize()
        got = dict(zip(("h", "res_out", "act", "y"), snapshot(b.outputs())))
        assert (got["act"] == 0x7E00).all()  # silu_mul's output: not written
        np.testing.assert_array_equal(got["y"], want[3])  # the nodes after it still ran
        ex.enable(silu)
        b.poison()
        ex.launch(stream)
        stream.synchronize()
        for x, y in zip(snapshot(b.outputs()), want):
            np.testing.assert_array_equal(x, y)
