"""capture(stream): record launches into a CUDA graph, or fail cleanly.

An exception inside the block ends and discards the capture, leaves the stream usable and
re-raises; an operation that invalidates the capture (a synchronize, a cudaMalloc, ...) comes
out as one CaptureError naming it. CuPy allocations inside the block raise by default
(a graph freezes addresses: allocate before capturing).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from typing import Any

import cupy
from cuda.bindings import driver, runtime

from rawgraph.cuda.check import CudaError, check
from rawgraph.cuda.device import ensure_context
from rawgraph.cuda.launch import Launch, observers
from rawgraph.cuda.stream import cupy_stream, stream_handle
from rawgraph.graph.graph import Graph
from rawgraph.memory.graphalloc import GraphAllocator

MODES = {
    "global": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL,
    "thread_local": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    "relaxed": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED,
}
_ACTIVE = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE


class CaptureError(RuntimeError):
    """A capture could not be completed; the stream is usable again."""


class CaptureAllocationError(CaptureError):
    """A CuPy allocation was attempted while capturing."""


class Capture:
    """What one capture recorded: (node, Launch) pairs in launch order, then the Graph."""

    def __init__(self, name: str, stream: int):
        self.name, self.stream = name, stream
        self.records: list[tuple[Any, Launch]] = []
        self.graph: Graph | None = None
        self.id = 0

    def _observe(self, stream: int, launch: Launch) -> None:
        # A launch on our stream, or on another stream joined into this capture by an event.
        err, status, cid, _, deps, _, n = driver.cuStreamGetCaptureInfo(driver.CUstream(stream))
        if err != driver.CUresult.CUDA_SUCCESS or status != _ACTIVE or int(cid) != self.id:
            return
        if n != 1:
            raise CaptureError(f"capture {self.name!r}: cannot tell which node {launch.kernel.name}"
                               f" became ({n} dependencies)")
        self.records.append((deps[0], launch))


def capture_status(stream: Any = None) -> str:
    """'none', 'active' or 'invalidated' for `stream`."""
    err, status, *_ = driver.cuStreamGetCaptureInfo(driver.CUstream(stream_handle(stream)))
    check((err,), "query capture status")
    return status.name.removeprefix("CU_STREAM_CAPTURE_STATUS_").lower()


def _forbid_allocation(name: str) -> Callable[[int], Any]:
    def alloc(nbytes: int) -> Any:
        raise CaptureAllocationError(
            f"allocation of {nbytes} bytes while capturing {name!r}: a graph freezes addresses, "
            f"so allocate every buffer before the capture (or pass allocations= a scratch "
            f"allocator)")
    return alloc


def _allocator(allocations: str | Callable[[int], Any], name: str, stream: int) -> Any:
    if callable(allocations):
        return allocations
    if allocations == "forbid":
        return _forbid_allocation(name)
    if allocations == "graph":
        return GraphAllocator(stream)
    if allocations == "allow":
        return None
    raise ValueError(f"allocations={allocations!r}: use 'forbid', 'graph', 'allow' or an "
                     f"allocator function")


def _abort(stream: int) -> None:
    """End a capture that failed, drop its graph, clear the sticky last error."""
    err, graph = driver.cuStreamEndCapture(driver.CUstream(stream))
    if err == driver.CUresult.CUDA_SUCCESS and graph is not None and int(graph):
        driver.cuGraphDestroy(graph)
    runtime.cudaGetLastError()


def _broke_capture(e: BaseException) -> bool:
    text = f"{getattr(e, 'name', '')} {e}"
    return isinstance(e, (CudaError, cupy.cuda.runtime.CUDARuntimeError)) and (
        "Capture" in text or "CAPTURE" in text)


@contextlib.contextmanager
def capture(stream: Any = None, *, name: str = "graph", mode: str = "thread_local",
            allocations: str | Callable[[int], Any] = "forbid",
            into: Any = None) -> Iterator[Capture]:
    """Capture the launches issued in the block on `stream` into `cap.graph`.

    into: an existing CUgraph to capture into instead (the body of a conditional node, say);
      it stays its owner's, and `cap.graph` stays None (`cap.records` has the launches).

    mode: 'thread_local' (default), 'global' or 'relaxed' (cudaStreamCaptureMode).
    allocations: what a CuPy allocation inside the block does:
      'forbid'  raise CaptureAllocationError naming the capture (the default);
      'graph'   become a graph memory node (cudaMallocAsync on the capturing stream; freed in
                the graph when the array dies inside the block);
      'allow'   use CuPy's current allocator (its pool may hand out memory that later moves);
      a function `nbytes -> MemoryPointer`, e.g. ScratchSet.allocator() for stable addresses.
    Inside the block CuPy's current stream is the capturing stream, so CuPy work lands in
    the graph too. Python's cyclic garbage collector is paused for the block: a finalizer
    run mid-capture (a dropped stream, event or pinned buffer of some unrelated object)
    would make a CUDA call that invalidates the capture.
    """
    if mode not in MODES:
        raise ValueError(f"capture mode {mode!r}: choose one of {sorted(MODES)}")
    ensure_context()
    h = stream_handle(stream)
    if h in (0, 1):
        raise ValueError("cannot capture the legacy default stream: pass a stream made with "
                         "rawgraph.new_stream() or cupy.cuda.Stream(non_blocking=True)")
    if capture_status(h) != "none":
        raise CaptureError(f"stream {h:#x} is already capturing")
    alloc = _allocator(allocations, name, h)
    cap = Capture(name, h)
    # no cyclic garbage is collected inside the capture: a finalizer there could make a CUDA
    # call that a capture forbids. What is pending is collected after, in its own time (a
    # full collection here cost every capture ~10 ms).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with _captured(stream, h, name, mode, alloc, cap, into) as c:
            yield c
    finally:
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def _captured(stream: Any, h: int, name: str, mode: str, alloc: Any,
              cap: Capture, into: Any) -> Iterator[Capture]:
    if into is None:
        check(driver.cuStreamBeginCapture(driver.CUstream(h), MODES[mode]),
              f"begin capture {name!r}")
    else:
        check(driver.cuStreamBeginCaptureToGraph(driver.CUstream(h), into, None, None, 0,
                                                 MODES[mode]), f"begin capture {name!r}")
    cap.id = int(driver.cuStreamGetCaptureInfo(driver.CUstream(h))[2])
    observers().append(cap._observe)
    allocating = cupy.cuda.using_allocator(alloc) if alloc else contextlib.nullcontext()
    try:
        with cupy_stream(stream if isinstance(stream, cupy.cuda.Stream) else h), allocating:
            yield cap
            if isinstance(alloc, GraphAllocator):
                alloc.close()  # graph allocations still referenced are freed in the graph
    except BaseException as e:
        if isinstance(alloc, GraphAllocator):
            alloc.open = False  # the graph is dropped with everything it allocated
        _abort(h)
        if _broke_capture(e):
            raise CaptureError(
                f"capture {name!r} on stream {h:#x} was invalidated by a forbidden operation: "
                f"{e}. Synchronizing, cudaMalloc, event or stream queries and work on the legacy "
                f"default stream are not allowed while capturing; do them before the capture"
            ) from e
        raise
    finally:
        observers().remove(cap._observe)
    err, graph = driver.cuStreamEndCapture(driver.CUstream(h))
    if err != driver.CUresult.CUDA_SUCCESS:
        runtime.cudaGetLastError()
        raise CaptureError(
            f"capture {name!r} on stream {h:#x} failed at its end with {err.name}: an operation "
            f"in the block (a synchronize, a cudaMalloc, an event query, work on the legacy "
            f"stream, or a stream forked and not joined back) invalidated it")
    if into is None:
        cap.graph = Graph(graph, cap.records, name=name)
