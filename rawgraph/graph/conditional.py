"""Conditional nodes: WHILE loops and IF branches whose condition a kernel sets on the device.

A conditional node owns a body graph; a kernel (in the body, or before the node) sets the
condition through the node's handle with `cudaGraphSetConditional(handle, value)`, so the
graph decides on the device, with no host round trip:

- `WhileGraph`: an executable graph whose one node is WHILE (condition) { body }.
- `if_node`: inside a capture, the launches of a `with` block become the body of an IF node
  that runs only when a kernel launched before it (`set_condition_any`, say) set its
  condition. Optional stages (the LM head of a prefill chunk that ends no prompt) cost
  nothing when skipped.

Bodies are captured with rawgraph's `capture(..., into=)`, so their launches are observed and
checked like any other capture's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from cuda.bindings import driver

from rawgraph.cuda.check import check
from rawgraph.cuda.device import ensure_context
from rawgraph.cuda.kernel import Kernel
from rawgraph.cuda.stream import stream_handle
from rawgraph.graph.capture import Capture, CaptureError, capture, capture_status
from rawgraph.symbols import Symbols

SET_ANY = Kernel("conditional", "set_condition_any",
                 "const int* flags, int n, unsigned long long handle")
_ASSIGN = driver.CU_GRAPH_COND_ASSIGN_DEFAULT
_TYPES = {"if": driver.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_IF,
          "while": driver.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE}


def _node_params(handle: Any, kind: str, ctx: Any) -> driver.CUgraphNodeParams:
    params = driver.CUgraphNodeParams()
    params.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    params.conditional.handle = handle
    params.conditional.type = _TYPES[kind]
    params.conditional.size = 1
    params.conditional.ctx = ctx
    return params


def _capturing(stream: Any, what: str) -> tuple[int, Any, list, int]:
    """(stream handle, graph being captured, current dependencies, their count)."""
    h = stream_handle(stream)
    if capture_status(h) != "active":
        raise CaptureError(f"{what} needs an active capture on stream {h:#x}")
    _, _, graph, deps, _, n = check(driver.cuStreamGetCaptureInfo(driver.CUstream(h)))
    return h, graph, list(deps or [])[:n], n


def condition_handle(stream: Any, default: int = 0) -> int:
    """A conditional handle of the graph being captured on `stream`; its value is reset to
    `default` at every launch of the graph (so a skipped setter means `default`)."""
    _, graph, _, _ = _capturing(stream, "condition_handle")
    ctx = check(driver.cuCtxGetCurrent())
    return int(check(driver.cuGraphConditionalHandleCreate(graph, ctx, default, _ASSIGN),
                     "conditional handle"))


def set_condition_any(flags: Any, n: Any, handle: int, stream: Any = None,
                      symbols: Symbols | None = None) -> None:
    """Launch the kernel that sets `handle` to 1 if any of flags[:n] (int32, on the device) is
    non-zero, else 0. `n` may be a symbol (patched like any other argument)."""
    if getattr(flags, "dtype", None) != "int32" or getattr(flags, "ndim", 0) != 1:
        raise ValueError("flags must be a 1-D int32 device array")
    SET_ANY.launch(1, 32, (flags, n, handle), stream, symbols=symbols)


@contextlib.contextmanager
def if_node(stream: Any, handle: int, body_stream: Any, name: str = "if") -> Iterator[Capture]:
    """Inside a capture on `stream`: add an IF node (after everything captured so far) whose
    body is what the block launches on `body_stream` (a second, idle stream: a capturing
    stream cannot start another capture). Work captured on `stream` afterwards runs after
    the IF node. Nothing in the body can be patched: give its launches fixed arguments."""
    h, graph, deps, n = _capturing(stream, "if_node")
    ctx = check(driver.cuCtxGetCurrent())
    params = _node_params(handle, "if", ctx)
    node = check(driver.cuGraphAddNode(graph, deps, None, n, params), f"{name}: add IF node")
    check(driver.cuStreamUpdateCaptureDependencies(
        driver.CUstream(h), [node], None, 1,
        driver.CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES),
        f"{name}: continue the capture after the IF node")
    with capture(body_stream, name=f"{name} body", into=params.conditional.phGraph_out[0]) \
            as cap:
        yield cap


class WhileGraph:
    """An executable graph: WHILE (condition) { body }.

    `body(stream, handle)` issues the body's launches; one of them must set the condition
    through `handle` (an unsigned long long kernel argument). The condition starts at 1 on
    every launch, so the body runs at least once.
    """

    def __init__(self, body: Callable[[Any, int], None], stream: Any, name: str = "while"):
        ensure_context()
        self.name = name
        ctx = check(driver.cuCtxGetCurrent())
        self._graph = check(driver.cuGraphCreate(0), f"{name}: create graph")
        self._exec = None
        try:
            handle = check(driver.cuGraphConditionalHandleCreate(self._graph, ctx, 1, _ASSIGN),
                           f"{name}: conditional handle")
            params = _node_params(handle, "while", ctx)
            check(driver.cuGraphAddNode(self._graph, None, None, 0, params),
                  f"{name}: add WHILE node")
            with capture(stream, name=f"{name} body", into=params.conditional.phGraph_out[0]) \
                    as cap:
                body(stream, int(handle))
            self.records = cap.records  # the body's launches, in order
            self._exec = check(driver.cuGraphInstantiate(self._graph, 0), f"{name}: instantiate")
        except BaseException:
            self.close()
            raise

    def launch(self, stream: Any = None) -> None:
        """Run the loop to its end (asynchronously, on `stream`)."""
        check(driver.cuGraphLaunch(self._exec, driver.CUstream(stream_handle(stream))),
              f"launch {self.name}")

    def close(self) -> None:
        """Destroy the executable graph and the graph."""
        if self._exec is not None:
            check(driver.cuGraphExecDestroy(self._exec), f"{self.name}: destroy exec")
            self._exec = None
        if self._graph is not None:
            check(driver.cuGraphDestroy(self._graph), f"{self.name}: destroy graph")
            self._graph = None
