"""Failed captures end cleanly: one clear error, the stream and library usable afterwards."""

import cupy
import numpy as np
import pytest

from rawgraph import CaptureAllocationError, CaptureError, capture
from rawgraph.graph.capture import capture_status
from tests.layer import buffers, layer, snapshot

pytestmark = pytest.mark.gpu


def _still_usable(stream, rng):
    b = buffers(rng, 4)
    layer(b, stream)
    stream.synchronize()
    first = snapshot(b.outputs())
    with capture(stream) as cap:
        layer(b, stream)
    with cap.graph as g, g.instantiate() as ex:
        b.poison()
        ex.launch(stream)
        stream.synchronize()
        assert all((x == y).all() for x, y in zip(snapshot(b.outputs()), first))


def test_exception_in_block_discards_capture_and_reraises(stream, rng):
    b = buffers(rng, 4)
    with pytest.raises(KeyError, match="boom"), capture(stream):
        layer(b, stream)
        raise KeyError("boom")
    assert capture_status(stream) == "none"
    _still_usable(stream, rng)


def test_synchronize_in_block_is_one_named_error(stream, rng):
    b = buffers(rng, 4)
    with pytest.raises(CaptureError, match="invalidated by a forbidden operation") as e, \
            capture(stream, name="bad-sync"):
        layer(b, stream)
        stream.synchronize()
        layer(b, stream)
    assert "bad-sync" in str(e.value) and "Capture" in str(e.value)
    assert capture_status(stream) == "none"
    _still_usable(stream, rng)


def test_allocation_in_block_raises_naming_the_capture(stream, rng):
    with pytest.raises(CaptureAllocationError, match="'decode-b8'"), \
            capture(stream, name="decode-b8"):
        cupy.empty(1024, np.float16)
    assert capture_status(stream) == "none"
    _still_usable(stream, rng)


def test_allocator_mode_serves_allocations_at_stable_addresses(stream, rng):
    arena = cupy.cuda.alloc(1 << 20)
    served = []

    def scratch(nbytes):
        served.append(nbytes)
        return arena

    with capture(stream, allocations=scratch):
        tmp = cupy.empty(512, np.float16)
    assert tmp.data.ptr == arena.ptr and served == [1024]


@pytest.mark.parametrize("mode", ["global", "relaxed"])
def test_other_capture_modes(stream, rng, mode):
    b = buffers(rng, 4)
    with capture(stream, mode=mode) as cap:
        layer(b, stream)
    assert len(cap.graph.nodes) == 3
    cap.graph.close()


def test_bad_capture_requests(stream):
    with pytest.raises(ValueError, match="legacy default stream"), \
            capture(cupy.cuda.Stream.null):
        pass
    with pytest.raises(ValueError, match="capture mode"), capture(stream, mode="loose"):
        pass
    with capture(stream), pytest.raises(CaptureError, match="already capturing"), \
            capture(stream):
        pass


def test_garbage_with_cuda_finalizers_is_not_collected_mid_capture(stream, rng):
    import gc

    class Holder:  # a reference cycle: only the cyclic collector frees it
        def __init__(self):
            self.me = self
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self.event = cupy.cuda.Event()
            self.pinned = cupy.cuda.alloc_pinned_memory(1 << 16)

    old = gc.get_threshold()
    bufs = buffers(rng, 4)
    try:
        for _ in range(20):
            Holder()
        gc.set_threshold(1)  # collect at the first allocation anywhere
        with capture(stream) as cap:
            layer(bufs, stream)
            _ = [object() for _ in range(1000)]  # allocations that would trigger the collector
        with cap.graph as g, g.instantiate() as ex:
            ex.launch(stream)
            stream.synchronize()
    finally:
        gc.set_threshold(*old)
