"""Graph: owns a cudaGraph_t; its nodes, edges, a readable table and a DOT picture.
GraphExec: an instantiated graph; launch, upload, patch in place, ExecUpdate."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda.bindings import driver

from rawgraph.cuda.check import CudaError, check
from rawgraph.cuda.kernel import kernel_for_handle
from rawgraph.cuda.launch import Launch
from rawgraph.cuda.signature import decode
from rawgraph.cuda.stream import stream_handle
from rawgraph.graph.patch import PatchPlan, Program

_KERNEL = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL


@dataclass(frozen=True)
class Node:
    """One graph node as the driver reports it (kernel nodes decoded by their signature)."""

    index: int
    handle: Any
    type: str                      # "kernel", "memcpy", "memset", ...
    kernel: str | None = None      # kernel name, for kernel nodes
    grid: tuple = ()
    block: tuple = ()
    smem: int = 0
    args: dict | None = None       # name -> value, when the kernel is a rawgraph Kernel
    reads: frozenset = frozenset()  # symbols the node is patched by

    def describe(self) -> str:
        """One line: what the node does."""
        if self.type != "kernel":
            return self.type
        args = "" if self.args is None else ", ".join(
            f"{k}={_fmt(v)}" for k, v in self.args.items())
        return f"{self.kernel}<<<{self.grid}, {self.block}, {self.smem}>>>({args})"


def _fmt(v: Any) -> str:
    if isinstance(v, bytes):  # a by-value descriptor (TMA)
        return f"<{len(v)} B>"
    return f"{v:#x}" if isinstance(v, int) and v > 1 << 32 else f"{v:g}" if isinstance(
        v, float) else str(v)


def _list(fn: Any, *args: Any) -> Any:
    """Call a two-phase driver query: once for the count, once for the items."""
    n = check(fn(*args, 0))[-1]
    return check(fn(*args, n)) if n else None


class Graph:
    """A captured (or built) CUDA graph. `records` maps kernel nodes to their rawgraph launches."""

    def __init__(self, handle: driver.CUgraph, records: list[tuple[Any, Launch]] = (),
                 name: str = "graph"):
        self.handle, self.name = handle, name
        self.records = list(records)
        self._execs = 0
        self._closed = False
        self._nodes: list[Node] | None = None

    # ---- inspection -------------------------------------------------------------------
    @property
    def nodes(self) -> list[Node]:
        """Nodes in the driver's order, kernel nodes decoded."""
        if self._nodes is None:
            self._alive()
            got = _list(driver.cuGraphGetNodes, self.handle)
            handles = got[0] if got else []
            launches = {int(n): launch for n, launch in self.records}
            self._nodes = [self._node(i, h, launches.get(int(h))) for i, h in enumerate(handles)]
        return self._nodes

    def _node(self, i: int, h: Any, launch: Launch | None) -> Node:
        kind = check(driver.cuGraphNodeGetType(h))
        type_name = kind.name.removeprefix("CU_GRAPH_NODE_TYPE_").lower()
        if kind != _KERNEL:
            return Node(i, h, type_name)
        p = check(driver.cuGraphKernelNodeGetParams(h))
        k = kernel_for_handle(int(p.func))
        args = None
        if k is not None:  # read-only decode of the driver's copy of the arguments
            args = dict(zip((q.name for q in k.sig.params), decode(k.sig, int(p.kernelParams))))
        return Node(i, h, "kernel", k.name if k else f"<function {int(p.func):#x}>",
                    (p.gridDimX, p.gridDimY, p.gridDimZ), (p.blockDimX, p.blockDimY, p.blockDimZ),
                    p.sharedMemBytes, args, launch.reads if launch else frozenset())

    @property
    def edges(self) -> list[tuple[int, int]]:
        """Dependencies as (from index, to index)."""
        index = {int(n.handle): n.index for n in self.nodes}
        got = _list(driver.cuGraphGetEdges, self.handle)
        if not got:
            return []
        src, dst = got[0], got[1]
        return [(index[int(a)], index[int(b)]) for a, b in zip(src, dst)]

    def table(self) -> str:
        """A readable table of the nodes (index, type, patched-by, launch)."""
        rows = [f"graph {self.name!r}: {len(self.nodes)} nodes, {len(self.edges)} edges"]
        for n in self.nodes:
            by = ",".join(sorted(n.reads)) or "-"
            rows.append(f"{n.index:4d}  {n.type:8s} {by:14s} {n.describe()}")
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.table()

    def to_dot(self) -> str:
        """Graphviz DOT text; patchable nodes are filled."""
        out = [f'digraph "{self.name}" {{', '  node [shape=box, fontname="monospace"];']
        for n in self.nodes:
            label = n.type if n.type != "kernel" else f"{n.kernel}\\ngrid {n.grid} block {n.block}"
            if n.reads:
                label += f"\\npatched by {', '.join(sorted(n.reads))}"
            style = ', style=filled, fillcolor="#ffe9a8"' if n.reads else ""
            out.append(f'  n{n.index} [label="{n.index}: {label}"{style}];')
        out += [f"  n{a} -> n{b};" for a, b in self.edges]
        out.append("}")
        return "\n".join(out)

    def to_png(self, path: str | Path) -> Path | None:
        """Render with graphviz `dot` if installed; returns the path, or None without `dot`."""
        dot = shutil.which("dot")
        if dot is None:
            return None
        path = Path(path)
        subprocess.run([dot, "-Tpng", "-o", str(path)], input=self.to_dot().encode(), check=True)
        return path

    # ---- lifetime ---------------------------------------------------------------------
    def instantiate(self, upload_stream: Any = None) -> GraphExec:
        """An executable graph (uploaded to the device when `upload_stream` is given)."""
        return GraphExec(self, upload_stream=upload_stream)

    def _alive(self) -> None:
        if self._closed:
            raise ValueError(f"graph {self.name!r} is closed")

    def close(self) -> None:
        """Destroy the graph (deferred while executable graphs made from it are open)."""
        self._closed = True
        if self._execs == 0 and self.handle is not None:
            check(driver.cuGraphDestroy(self.handle), f"destroy graph {self.name!r}")
            self.handle = None

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_UPDATE_REASONS = {
    "CU_GRAPH_EXEC_UPDATE_ERROR": "the update failed for an unlisted reason",
    "CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED": "the graph's topology changed "
                                                   "(nodes or edges added, removed or reordered)",
    "CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED": "a node's type changed",
    "CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED": "a kernel node's function changed",
    "CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED": "a node's parameters changed in a way "
                                                     "that cannot be updated",
    "CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED": "a node's type or configuration is not "
                                                "supported by update",
    "CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE": "a kernel's function changed in "
                                                              "an unsupported way",
    "CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED": "a node's attributes changed",
}


def _explain(old: Graph, new: Graph, info: Any) -> str:
    """Why cudaGraphExecUpdate refused `new`: from the driver's result info when the binding
    returns it (it does not on failure), else by comparing the two graphs the same way."""
    if info is not None and int(info.result) != 0:
        reason = _UPDATE_REASONS.get(info.result.name, info.result.name)
        bad = next((n for n in new.nodes if int(n.handle) == int(info.errorNode or 0)), None)
        return reason + (f" (at node {bad.index}: {bad.describe()})" if bad else "")
    a, b = old.nodes, new.nodes
    if len(a) != len(b) or old.edges != new.edges:
        return (f"{_UPDATE_REASONS['CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED']}: "
                f"{len(a)} nodes/{len(old.edges)} edges before, {len(b)}/{len(new.edges)} now")
    for x, y in zip(a, b):
        if x.type != y.type:
            return f"node {x.index}'s type changed ({x.type} -> {y.type})"
        if x.kernel != y.kernel:
            return f"node {x.index}'s kernel changed ({x.kernel} -> {y.kernel})"
    return _UPDATE_REASONS["CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED"]


@dataclass(frozen=True)
class UpdateResult:
    """How `GraphExec.update` went: in place, or re-instantiated with the reason."""

    in_place: bool
    reason: str = ""


class GraphExec:
    """An executable graph, patchable through the symbols its launches were captured with."""

    def __init__(self, graph: Graph, upload_stream: Any = None):
        self._instantiate(graph)
        self.patched_total = 0  # nodes patched over this executable's life
        self.patched_last = 0   # nodes patched by the last set()
        if upload_stream is not None:
            self.upload(upload_stream)

    # ---- running ----------------------------------------------------------------------
    def launch(self, stream: Any = None) -> None:
        """Launch the whole graph on `stream`: one host call."""
        err, = driver.cuGraphLaunch(self.handle, driver.CUstream(stream_handle(stream)))
        if err:
            raise CudaError(err, f"launch graph {self.graph.name!r}")

    def upload(self, stream: Any = None) -> None:
        """Upload the executable to the device ahead of the first launch."""
        check(driver.cuGraphUpload(self.handle, driver.CUstream(stream_handle(stream))),
              f"upload graph {self.graph.name!r}")

    # ---- patching ---------------------------------------------------------------------
    @property
    def symbols(self) -> dict[str, int]:
        """The symbol values the executable currently computes with."""
        return dict(self.plan.env)

    def set(self, **values: Any) -> int:
        """Set symbols; patch in place only the nodes whose grid or arguments change.

        Returns the number of nodes patched. Unknown symbols, wrong types and values outside
        the declared ranges raise before anything is patched.
        """
        key = tuple(values)
        prog = self._programs.get(key)
        if prog is None:
            prog = self._programs[key] = self.plan.program(
                key, self.handle, driver.cuGraphExecKernelNodeSetParams,
                set_enabled=driver.cuGraphNodeSetEnabled)
        n = prog(values)
        self.patched_last = n
        self.patched_total += n
        return n

    def _instantiate(self, graph: Graph) -> None:
        graph._alive()
        self.handle = check(driver.cuGraphInstantiate(graph.handle, 0),
                            f"instantiate graph {graph.name!r}")
        self.graph = graph
        graph._execs += 1  # the graph stays alive while executables made from it are open
        self._use(PatchPlan(graph.records))

    def _use(self, plan: PatchPlan) -> None:
        self.plan = plan
        self._programs: dict[tuple[str, ...], Program] = {}  # compiled set() per symbol names
        for node in plan.variants():  # each variant's nodes run only while their case holds
            check(driver.cuGraphNodeSetEnabled(self.handle, node.handle, int(node.enabled)),
                  f"switch {node.kernel.name} in graph {self.graph.name!r}")

    def launches(self) -> list[Launch]:
        """Every captured launch in order, with the values this executable uses now."""
        return self.plan.launches(self.graph.records)

    def enable(self, nodes: Any, enabled: bool = True) -> None:
        """Enable or disable kernel nodes (handles of `self.graph`, as in its `records`). A
        disabled node runs as an empty node until enabled again, and what it would have
        written keeps its last values: an ablation for profiling, not a way to run less.
        All or none: a node the driver refuses (one inside a conditional node's body, say)
        puts the others back before the error is raised. An op's variant that its case
        leaves off (`when`) stays off: enabling it would run two variants."""
        off = {int(n.handle) for n in self.plan.variants() if not n.enabled}
        done = []
        try:
            for node in nodes:
                if enabled and int(node) in off:
                    continue
                check(driver.cuGraphNodeSetEnabled(self.handle, node, int(enabled)),
                      f"{'enable' if enabled else 'disable'} a node of graph {self.graph.name!r}")
                done.append(node)
        except CudaError:
            for node in done:
                driver.cuGraphNodeSetEnabled(self.handle, node, int(not enabled))
            raise

    # ---- whole-graph update -----------------------------------------------------------
    def update(self, graph: Graph) -> UpdateResult:
        """Take `graph`'s parameters: cudaGraphExecUpdate, else re-instantiate from `graph`.

        Patchable nodes afterwards follow `graph`'s launches (matched to this executable's
        nodes by position).
        """
        graph._alive()
        err, info = driver.cuGraphExecUpdate(self.handle, graph.handle)
        if err == driver.CUresult.CUDA_SUCCESS:
            by_pos = {int(n.handle): i for i, n in enumerate(graph.nodes)}
            mine = self.graph.nodes
            self._use(PatchPlan([(mine[by_pos[int(node)]].handle, L)
                                 for node, L in graph.records]))
            return UpdateResult(True)
        reason = _explain(self.graph, graph, info)
        self._close_handle()
        self._instantiate(graph)
        return UpdateResult(False, reason)

    # ---- lifetime ---------------------------------------------------------------------
    def _close_handle(self) -> None:
        check(driver.cuGraphExecDestroy(self.handle), "destroy executable graph")
        self.handle = None
        self.graph._execs -= 1
        if self.graph._closed:
            self.graph.close()

    def close(self) -> None:
        """Destroy the executable graph."""
        if self.handle is not None:
            self._close_handle()

    def __enter__(self) -> GraphExec:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
