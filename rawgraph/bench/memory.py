"""`rawgraph bench memory`: what planned memory costs.

- scratch acquire + release (lock-free) next to the same pair behind a threading.Lock;
- decode-shaped graphs at LLaMA-3.2-1B sizes (hidden 2048, MLP 8192, 16 layers, 8 KV heads
  of 64) for batch buckets 1..64, their activations held three ways:
    shared scratch (one set sized for the largest bucket, shared by every bucket's graph),
    per-graph buffers (each graph owns buffers sized for its bucket),
    graph memory nodes (activations allocated inside each graph, cudaMallocAsync);
  reporting activation bytes, the driver's exec memory per graph (the ledger) and replay time.
Each layer is the model's norm -> MLP activation -> residual -> KV append kernels; the GEMV and
attention kernels join these graphs when the model exists, so node counts here are a stand-in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import cupy
import numpy as np

from rawgraph import ops
from rawgraph.cuda.stream import new_stream
from rawgraph.cuda.timing import device_us, host_us
from rawgraph.graph.capture import capture
from rawgraph.graph.ledger import Ledger, graph_pool, trim_graph_pool
from rawgraph.memory.paged import PagedKVCache
from rawgraph.memory.scratch import Scratch

HIDDEN, INTER, LAYERS, KV_ROW = 2048, 8192, 16, 8 * 64
BUCKETS = (1, 2, 4, 8, 16, 32, 64)
F16 = np.float16
# activation buffers of one decode step: name -> (columns, dtype)
ACTS = {"x": (HIDDEN, F16), "res": (HIDDEN, F16), "h": (HIDDEN, F16), "y": (HIDDEN, F16),
        "gu": (2 * INTER, F16), "act": (INTER, F16), "k": (KV_ROW, F16), "v": (KV_ROW, F16)}


def _bytes(b: int) -> int:
    return sum(cols * np.dtype(dt).itemsize * b for cols, dt in ACTS.values())


def _buffers(b: int, new: Callable[[str, tuple, Any], Any]) -> dict[str, Any]:
    """The activation buffers of bucket b, each made by new(name, shape, dtype)."""
    return {k: new(k, (b, cols), dt) for k, (cols, dt) in ACTS.items()}


def _layers(buf: Callable[[str], Any], w: Any, kv: PagedKVCache, slots: Any, pos: Any,
            stream: Any) -> None:
    for i in range(LAYERS):
        ops.rmsnorm(buf("x"), w, buf("h"), residual=buf("res"), residual_out=buf("res"),
                    stream=stream)
        ops.silu_mul(buf("gu"), buf("act"), stream=stream)
        ops.add(buf("h"), buf("res"), buf("y"), stream=stream)
        cache = ops.Cache(*kv.layer(i), kv.block_tables)
        ops.kv_append(buf("k"), buf("v"), cache, slots, pos, stream=stream)


def run() -> list[dict[str, Any]]:
    """Measure; returns result rows."""
    s = new_stream()
    rows: list[dict[str, Any]] = []

    def row(metric: str, value: float, unit: str, variant: str = "", bucket: Any = "") -> None:
        rows.append({"metric": metric, "variant": variant, "bucket": bucket, "value": value,
                     "unit": unit})

    # ---- acquire / release ---------------------------------------------------------------
    sc = Scratch({"x": 1 << 20}, copies=2)
    row("scratch acquire + release", host_us(lambda: sc.release(sc.acquire("b"))), "us",
        "lock-free")
    lock = threading.Lock()

    def locked() -> None:
        with lock:
            lease = sc.acquire("b")
        with lock:
            sc.release(lease)

    row("scratch acquire + release", host_us(locked), "us", "behind a threading.Lock")

    # ---- decode-shaped graphs, three ways to hold activations ----------------------------
    top = max(BUCKETS)
    kv = PagedKVCache(layers=LAYERS, kv_heads=8, head_dim=64, block_size=16, num_blocks=top,
                      max_seqs=top, max_blocks_per_seq=1)
    for q in range(top):
        kv.tables.add(q)
        kv.tables.append(q, 1)
    kv.sync(s)
    w = cupy.ones(HIDDEN, F16)
    slots = cupy.arange(top, dtype=np.int32)
    pos = cupy.zeros(top, np.int32)
    scratch = Scratch({k: cols * np.dtype(dt).itemsize * top for k, (cols, dt) in ACTS.items()})
    lease = scratch.acquire("decode")
    variants = {
        "shared scratch": lambda b: _buffers(b, lease.view),
        "per-graph buffers": lambda b: _buffers(b, lambda k, shape, dt: cupy.zeros(shape, dt)),
    }
    for name, make in variants.items():
        ledger = Ledger()
        for b in BUCKETS:
            buf = make(b)
            with capture(s, name=f"{name} B={b}") as cap:
                _layers(buf.__getitem__, w, kv, slots[:b], pos[:b], s)
            ex = ledger.instantiate(cap.graph, s)
            if b in (8, 64):
                row("replay", device_us(lambda ex=ex: ex.launch(s), s), "us", name, b)
            ex.close()
            cap.graph.close()
        act = scratch.nbytes if name == "shared scratch" else sum(_bytes(b) for b in BUCKETS)
        row("activation memory, all buckets", act / 2**20, "MiB", name)
        row("exec memory, all buckets", sum(e.exec_bytes for e in ledger.entries.values())
            / 2**20, "MiB", name)
        row("nodes per graph", next(iter(ledger.entries.values())).nodes, "", name)
        print(ledger.table())

    # graph memory nodes: activations allocated inside each graph
    s.synchronize()
    trim_graph_pool()
    before = graph_pool()["reserved"]
    ledger = Ledger()
    execs = []
    for b in BUCKETS:
        with capture(s, name=f"memory nodes B={b}", allocations="graph") as cap:
            buf = _buffers(b, lambda k, shape, dt: cupy.empty(shape, dt))  # memory nodes
            _layers(buf.__getitem__, w, kv, slots[:b], pos[:b], s)
            buf.clear()  # the activations die inside the graph: mem_free nodes
        ex = ledger.instantiate(cap.graph, s)
        ledger.first_launch(ex, s)
        if b in (8, 64):
            row("replay", device_us(lambda ex=ex: ex.launch(s), s), "us", "graph memory nodes", b)
        execs.append((ex, cap.graph))
    row("activation memory, all buckets (graph pool reserved)",
        (graph_pool()["reserved"] - before) / 2**20, "MiB", "graph memory nodes")
    row("graph pool in use after the launches", graph_pool()["used"] / 2**20, "MiB",
        "graph memory nodes")
    row("exec memory, all buckets", sum(e.exec_bytes for e in ledger.entries.values()) / 2**20,
        "MiB", "graph memory nodes")
    row("nodes per graph", next(iter(ledger.entries.values())).nodes, "", "graph memory nodes")
    for ex, g in execs:
        ex.close()
        g.close()
    scratch.release(lease)
    print(ledger.table())
    return rows
