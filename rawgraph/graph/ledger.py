"""Graph memory ledger: what each executable graph costs and pins.

For each graph: the device memory the driver took to instantiate and upload it (the drop in
free memory, at the driver's allocation granularity), the growth of the driver's graph memory
pool (memory nodes), and the arena regions its kernel arguments point into (what it pins).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cuda.bindings import driver, runtime

from rawgraph.cuda.check import check
from rawgraph.cuda.device import ensure_context
from rawgraph.cuda.stream import cupy_stream
from rawgraph.graph.graph import Graph, GraphExec

_ATTRS = {
    "used": driver.CUgraphMem_attribute.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT,
    "used_high": driver.CUgraphMem_attribute.CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
    "reserved": driver.CUgraphMem_attribute.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
    "reserved_high": driver.CUgraphMem_attribute.CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
}


def graph_pool() -> dict[str, int]:
    """The driver's graph memory pool (memory nodes) on device 0, in bytes."""
    ensure_context()
    dev = check(driver.cuDeviceGet(0))
    return {k: int(check(driver.cuDeviceGetGraphMemAttribute(dev, a))) for k, a in _ATTRS.items()}


def trim_graph_pool() -> None:
    """Give unused graph-pool memory back to the OS (cudaDeviceGraphMemTrim)."""
    check(runtime.cudaDeviceGraphMemTrim(0), "trim graph memory pool")


def free_bytes() -> int:
    """Free device memory now."""
    ensure_context()
    return int(check(driver.cuMemGetInfo())[0])


@dataclass
class GraphMemory:
    """One graph's line in the ledger."""

    name: str
    nodes: int
    exec_bytes: int                 # free-memory drop at instantiate + upload, pool excluded
    pool_bytes: int = 0             # graph-pool growth at upload and first launch
    pins: dict[str, int] = field(default_factory=dict)  # arena region -> bytes


class Ledger:
    """Instantiates graphs while measuring them; `table()` prints what each costs and pins."""

    def __init__(self, arenas: tuple = ()):
        self.arenas = arenas
        self.entries: dict[str, GraphMemory] = {}

    def instantiate(self, graph: Graph, stream: Any = None) -> GraphExec:
        """graph.instantiate(upload_stream=stream), measured and recorded under graph.name."""
        free, pool = free_bytes(), graph_pool()["reserved"]
        ex = graph.instantiate(upload_stream=stream)
        cupy_stream(stream).synchronize()
        grew = graph_pool()["reserved"] - pool
        self.entries[graph.name] = GraphMemory(graph.name, len(graph.nodes),
                                               max(free - free_bytes() - grew, 0), grew,
                                               pins=self._pins(graph))
        return ex

    def first_launch(self, ex: GraphExec, stream: Any) -> None:
        """Launch once, recording how much the graph memory pool grew (memory nodes)."""
        before = graph_pool()["reserved"]
        ex.launch(stream)
        cupy_stream(stream).synchronize()
        e = self.entries.get(ex.graph.name)
        if e is not None:
            e.pool_bytes += graph_pool()["reserved"] - before

    def _pins(self, graph: Graph) -> dict[str, int]:
        pins: dict[str, int] = {}
        for n in graph.nodes:
            for v in (n.args or {}).values():
                if not isinstance(v, int) or v == 0:
                    continue
                for a in self.arenas:
                    name = a.owner(v)
                    if name is not None:
                        pins[f"{a.name}:{name}"] = a.layout.regions[name].nbytes
        return pins

    def table(self) -> str:
        """One row per graph."""
        rows = [f"{'graph':24s} {'nodes':>6s} {'exec MiB':>9s} {'pool MiB':>9s}  pins"]
        for e in self.entries.values():
            pins = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in e.pins.items()) or "-"
            rows.append(f"{e.name:24s} {e.nodes:6d} {e.exec_bytes / 2**20:9.2f} "
                        f"{e.pool_bytes / 2**20:9.2f}  {pins}")
        return "\n".join(rows)
