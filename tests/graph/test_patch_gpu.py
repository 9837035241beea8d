"""In-place patching: patched args and grids give exactly what eager launches give."""

import cupy
import numpy as np
import pytest

from rawgraph import Pointer, Range, Symbols, VerifyError, capture, cdiv, verify
from rawgraph.ops.elementwise import ADD
from tests.helpers import poisoned, randn
from tests.layer import buffers, layer, snapshot

pytestmark = pytest.mark.gpu
CAP = 64


def _eager(rng_seed, rows, past=None):
    """Outputs of eager launches with concrete sizes, on fresh buffers."""
    from rawgraph.cuda.stream import new_stream

    s = new_stream()
    b = buffers(np.random.default_rng(rng_seed), CAP)
    layer(b, s, rows, past=past)
    s.synchronize()
    return snapshot(b.outputs())


def test_patched_rows_and_grids_equal_eager(stream):
    S = Symbols(seq=Range(1, CAP), past=Range(1, CAP * 256))
    S.set(seq=16, past=100)
    b = buffers(np.random.default_rng(7), CAP)
    with capture(stream) as cap:
        layer(b, stream, S.seq, S, past=S.past)
    g = cap.graph
    assert [sorted(n.reads) for n in g.nodes] == [["seq"], ["seq"], ["seq"], ["past"]]
    with g.instantiate() as ex:
        for seq, past, patched in [(16, 100, 0), (1, 100, 3), (33, 100, 3), (33, 5000, 1),
                                   (64, 7, 4), (64, 7, 0), (5, 16384, 4)]:
            assert ex.set(seq=seq, past=past) == patched
            assert ex.symbols == {"seq": seq, "past": past}
            want = _eager(7, seq, past)
            for _ in range(5):
                b.poison()
                ex.launch(stream)
                stream.synchronize()
                for got, w in zip(snapshot(b.outputs()), want):
                    np.testing.assert_array_equal(got, w)
            node = next(n for n in ex.graph.nodes if n.kernel == "silu_mul_f16")
            assert node.grid[1] == 16  # the graph keeps what was captured; the exec is patched
            verify(ex, b.all(), stream)
    g.close()


def test_grid_patch_changes_block_count(stream, rng):
    S = Symbols(n=Range(1, 1 << 16))
    S.set(n=100)
    a, _ = randn(rng, (1 << 16,), "float16")
    c, _ = randn(rng, (1 << 16,), "float16")
    out = poisoned((1 << 16,), "float16")
    ref = poisoned((1 << 16,), "float16")
    k = ADD["float16"]
    with capture(stream) as cap:
        k.launch(cdiv(S.n, 2048), 256, (a, c, out, S.n), stream, symbols=S)
    with cap.graph as g, g.instantiate() as ex:
        for n in [100, 2049, 65536, 3]:
            assert ex.set(n=n) == (n != 100)
            assert ex.plan.nodes[0].grid == (-(-n // 2048), 1, 1)
            out[...] = poisoned(out.shape, "float16")
            ref[...] = poisoned(out.shape, "float16")
            ex.launch(stream)
            k.launch(-(-n // 2048), 256, (a, c, ref, n), stream)
            stream.synchronize()
            np.testing.assert_array_equal(out.view(np.uint16).get(), ref.view(np.uint16).get())


def test_pointer_rebinding(stream, rng):
    a1, _ = randn(rng, (4096,), "float16")
    a2, _ = randn(rng, (4096,), "float16")
    c, _ = randn(rng, (4096,), "float16")
    out, ref = poisoned((4096,), "float16"), poisoned((4096,), "float16")
    S = Symbols(src=Pointer(nbytes=a1.nbytes, dtype="float16"))
    S.set(src=a1)
    k = ADD["float16"]
    with capture(stream) as cap:
        k.launch(2, 256, (S.src, c, out, 4096), stream, symbols=S)
    with cap.graph as g, g.instantiate() as ex:
        assert ex.set(src=a2) == 1
        ex.launch(stream)
        k.launch(2, 256, (a2, c, ref, 4096), stream)
        stream.synchronize()
        np.testing.assert_array_equal(out.get(), ref.get())
        with pytest.raises(ValueError, match="smaller"):
            ex.set(src=a2[:8])
        with pytest.raises(TypeError, match="float16"):
            ex.set(src=cupy.zeros(4096, np.float32))


def test_invalid_patches_raise_and_leave_the_exec_working(stream):
    S = Symbols(seq=Range(1, CAP))
    S.set(seq=10)
    b = buffers(np.random.default_rng(3), CAP)
    with capture(stream) as cap:
        layer(b, stream, S.seq, S)
    with cap.graph as g, g.instantiate() as ex:
        for bad, err in [({"seq": 0}, ValueError), ({"seq": CAP + 1}, ValueError),
                         ({"seq": 2.5}, TypeError), ({"len": 3}, KeyError)]:
            with pytest.raises(err):
                ex.set(**bad)
            assert ex.symbols == {"seq": 10} and ex.patched_total == 0
        b.poison()
        ex.launch(stream)
        stream.synchronize()
        for got, w in zip(snapshot(b.outputs()), _eager(3, 10)):
            np.testing.assert_array_equal(got, w)


def test_verify_catches_a_stale_node(stream):
    S = Symbols(seq=Range(1, CAP))
    S.set(seq=10)
    b = buffers(np.random.default_rng(4), CAP)
    with capture(stream) as cap:
        layer(b, stream, S.seq, S)
    with cap.graph as g, g.instantiate() as ex:
        verify(ex, b.all(), stream)
        # change a launch's stored values behind the driver's back: the exec still runs 10 rows
        node = ex.plan.nodes[0]
        node.write(*node.resolve({"seq": 20}))
        with pytest.raises(VerifyError, match="differ"):
            verify(ex, b.all(), stream)
