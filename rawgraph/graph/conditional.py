"""Conditional nodes: a graph whose one node is a WHILE loop over a captured body.

The body is captured (with rawgraph's capture, so its launches are observed and checked) into
the graph the conditional node owns; a kernel in the body sets the loop condition on the
device with `cudaGraphSetConditional(handle, value)`. One launch runs every iteration: no
host round trip between them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cuda.bindings import driver

from rawgraph.cuda.check import check
from rawgraph.cuda.device import ensure_context
from rawgraph.cuda.stream import stream_handle
from rawgraph.graph.capture import capture


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
            handle = check(driver.cuGraphConditionalHandleCreate(
                self._graph, ctx, 1, driver.CU_GRAPH_COND_ASSIGN_DEFAULT),
                f"{name}: conditional handle")
            params = driver.CUgraphNodeParams()
            params.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
            params.conditional.handle = handle
            params.conditional.type = driver.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE
            params.conditional.size = 1
            params.conditional.ctx = ctx
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
