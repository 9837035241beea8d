"""Graph: owns a cudaGraph_t; its nodes, edges, a readable table and a DOT picture."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cuda.bindings import driver

from rawgraph.cuda.check import check
from rawgraph.cuda.kernel import kernel_for_handle
from rawgraph.cuda.launch import Launch
from rawgraph.cuda.signature import decode

if TYPE_CHECKING:
    from rawgraph.graph.exec import GraphExec

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
        from rawgraph.graph.exec import GraphExec

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
