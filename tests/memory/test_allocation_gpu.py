"""Arena, scratch, capture allocation modes and the graph memory ledger on the device."""

import threading

import cupy
import numpy as np
import pytest

from rawgraph import CaptureAllocationError, capture, ops
from rawgraph.graph.ledger import Ledger, graph_pool, trim_graph_pool
from rawgraph.memory.arena import Arena
from rawgraph.memory.layout import ArenaFullError
from rawgraph.memory.scratch import Scratch, ScratchBusyError
from tests.helpers import poisoned, randn

pytestmark = pytest.mark.gpu


def test_arena_regions_views_and_errors():
    with Arena(1 << 20, "weights") as a:
        w = a.array("w", (256, 256), np.float16)
        b = a.array("b", 100, np.float32)
        assert w.data.ptr == a.ptr and b.data.ptr == a.ptr + 131072
        assert a.owner(b.data.ptr + 8) == "b" and a.owner(a.ptr + (1 << 21)) is None
        assert a.stats()["w"] == 131072 and a.stats()["free"] == (1 << 20) - 131072 - 400
        w[...] = 1
        assert float(w.astype(np.float32).sum()) == 65536
        with pytest.raises(ArenaFullError, match="'big' needs 1,048,576 bytes"):
            a.array("big", 1 << 19, np.float16)
    with pytest.raises(ValueError, match="closed"):
        a.array("c", 4, np.float16)


def test_scratch_sets_share_addresses_and_guard_release():
    s = Scratch({"x": 4096, "h": 8192}, copies=2)
    with s.acquire("decode-b8") as one:
        x8 = one.view("x", (8, 256), np.float16)
        with s.acquire("prefill") as two:
            assert two.view("x", 16, np.float16).data.ptr != x8.data.ptr
            with pytest.raises(ScratchBusyError, match="held by decode-b8, prefill"):
                s.acquire("third")
        with pytest.raises(ValueError, match="declared with 4,096"):
            one.view("x", 4096, np.float16)
        with pytest.raises(KeyError, match="no buffer 'y'"):
            one.view("y", 1, np.float16)
    again = s.acquire("decode-b64")
    assert again.view("x", (1, 8), np.float16).data.ptr in (x8.data.ptr, x8.data.ptr + s.set_bytes)
    s.release(again)
    with pytest.raises(ValueError, match="not held"):
        s.release(again)


def test_scratch_is_exclusive_under_threads():
    s = Scratch({"x": 256}, copies=3)
    holders: dict[int, str] = {}
    errors = []

    def work(name):
        for _ in range(2000):
            try:
                lease = s.acquire(name)
            except ScratchBusyError:
                continue
            if holders.setdefault(lease.index, name) != name:
                errors.append(lease.index)
            del holders[lease.index]
            s.release(lease)

    threads = [threading.Thread(target=work, args=(f"t{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and sorted(s._free) == [0, 1, 2]


def test_capture_temporaries_from_scratch_keep_their_addresses(stream, rng):
    s = Scratch({"x": 1024}, temp_bytes=1 << 16)
    a, _ = randn(rng, (4096,), "float16")
    ptrs = []
    with s.acquire("g") as lease:
        for _ in range(2):
            with capture(stream, allocations=lease.allocator()) as cap:
                tmp = cupy.empty_like(a)          # served from the scratch set
                ops.add(a, a, tmp, stream=stream)
                out = cupy.empty_like(a)
                ops.add(tmp, a, out, stream=stream)
            ptrs.append((tmp.data.ptr, out.data.ptr))
            with cap.graph as g, g.instantiate() as ex:
                ex.launch(stream)
                stream.synchronize()
                np.testing.assert_array_equal(out.get(), (a.get() + a.get()) + a.get())
    assert ptrs[0] == ptrs[1]
    with pytest.raises(CaptureAllocationError), capture(stream):
        cupy.empty(4, np.float16)


def test_graph_memory_nodes_run_and_show_in_the_pool(stream, rng):
    a, _ = randn(rng, (1 << 20,), "float16")
    out = poisoned((1 << 20,), "float16")
    trim_graph_pool()
    with capture(stream, name="memnodes", allocations="graph") as cap:
        tmp = cupy.empty_like(a)                  # a graph memory node
        ops.add(a, a, tmp, stream=stream)
        ops.add(tmp, a, out, stream=stream)
        del tmp                                   # freed inside the graph
    types = [n.type for n in cap.graph.nodes]
    assert types.count("mem_alloc") == 1 and types.count("mem_free") == 1
    ledger = Ledger()
    ex = ledger.instantiate(cap.graph, stream)
    ledger.first_launch(ex, stream)
    for _ in range(3):
        ex.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(out.get(), (a.get() + a.get()) + a.get())
    assert ledger.entries["memnodes"].pool_bytes >= 2 << 20 or graph_pool()["reserved"] >= 2 << 20
    assert "memnodes" in ledger.table()
    ex.close()
    cap.graph.close()


def test_ledger_reports_pinned_arena_regions(stream, rng):
    arena = Arena(1 << 22, "persistent")
    x = arena.array("act.x", (8, 256), np.float16)
    w = arena.array("w.norm", 256, np.float16)
    y = arena.array("act.y", (8, 256), np.float16)
    x[...] = cupy.asarray(rng.standard_normal((8, 256)).astype(np.float16))
    w[...] = 1
    with capture(stream, name="norm") as cap:
        ops.rmsnorm(x, w, y, stream=stream)
    ledger = Ledger(arenas=(arena,))
    ex = ledger.instantiate(cap.graph, stream)
    e = ledger.entries["norm"]
    assert e.nodes == 1 and e.pins == {"persistent:act.x": 4096, "persistent:w.norm": 512,
                                       "persistent:act.y": 4096}
    assert e.exec_bytes >= 0 and set(graph_pool()) == {"used", "used_high", "reserved",
                                                       "reserved_high"}
    ex.close()
    cap.graph.close()
