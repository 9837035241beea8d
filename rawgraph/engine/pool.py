"""A pool of executable graphs: acquire by key (capturing on a miss), LRU eviction when the
pool holds more graphs or device memory than its budget."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rawgraph.graph.graph import Graph, GraphExec
from rawgraph.graph.ledger import free_bytes


@dataclass
class PoolEntry:
    """One executable graph with what it cost to make."""

    graph: Graph
    exec: GraphExec
    nbytes: int
    capture_ms: float


class GraphPool:
    """Executable graphs by key, least recently used first out.

    `build(key)` captures and returns a Graph; the pool instantiates it, measures the device
    memory it took (free-memory drop, at the driver's granularity) and evicts the least
    recently used graphs while more than `max_graphs` or `max_bytes` are held. `captures`
    and `evictions` count both since it was made (a server's /metrics reports them: a
    capture while serving is tens of milliseconds no client should wait for).
    """

    def __init__(self, build: Callable[[Any], Graph], stream: Any, *, max_graphs: int = 64,
                 max_bytes: int = 1 << 30):
        self._build, self._stream = build, stream
        self.max_graphs, self.max_bytes = max_graphs, max_bytes
        self.entries: OrderedDict[Any, PoolEntry] = OrderedDict()
        self.captures = self.evictions = 0

    def __contains__(self, key: Any) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def nbytes(self) -> int:
        """Device memory the held executable graphs took."""
        return sum(e.nbytes for e in self.entries.values())

    def acquire(self, key: Any, keep: tuple = ()) -> GraphExec:
        """The executable graph for `key`, captured and instantiated on a miss; eviction
        spares `keep` (graphs the caller holds for this step)."""
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
            return entry.exec
        t0 = time.perf_counter()
        free0 = free_bytes()
        graph = self._build(key)
        ex = graph.instantiate(upload_stream=self._stream)
        entry = PoolEntry(graph, ex, max(0, free0 - free_bytes()),
                          (time.perf_counter() - t0) * 1e3)
        self.entries[key] = entry
        self.captures += 1
        self._evict(keep=(key, *keep))
        return ex

    def _evict(self, keep: tuple) -> None:
        while len(self.entries) > self.max_graphs or self.nbytes > self.max_bytes:
            key = next((k for k in self.entries if k not in keep), None)
            if key is None:  # everything left is in use this step
                return
            self.release(key)
            self.evictions += 1

    def release(self, key: Any) -> None:
        """Destroy the executable graph for `key` (it is captured again on the next use)."""
        entry = self.entries.pop(key)
        entry.exec.close()
        entry.graph.close()

    def close(self) -> None:
        """Destroy every graph."""
        for key in list(self.entries):
            self.release(key)
