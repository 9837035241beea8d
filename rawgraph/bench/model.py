"""`rawgraph bench model`: decode step time of the GPU decoder per preset, eager and as one
captured graph patched per step, against the floor (weights + KV bytes over the copy
bandwidth measured in the same run). Random weights made on the device; each sequence's
context is pre-filled to the given length (cache contents random)."""

from __future__ import annotations

import statistics
import time
from typing import Any

import cupy

from rawgraph.bench.kernels import copy_gbps
from rawgraph.bench.timing import device_us
from rawgraph.cuda.stream import new_stream
from rawgraph.graph.capture import capture
from rawgraph.memory.ledger import Ledger
from rawgraph.model.config import preset
from rawgraph.model.program import DecodeModel
from rawgraph.symbols import Range, Symbols

CASES = (("tiny", 1, 1024), ("llama-1b", 1, 1024), ("llama-1b", 8, 1024), ("llama-8b", 1, 1024))


def _wall_ms(fn: Any, s: Any, steps: int = 20) -> float:
    fn()
    s.synchronize()
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        s.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def _case(name: str, batch: int, ctx: int, s: Any, floor_gbps: float) -> dict[str, Any]:
    cfg = preset(name)
    model = DecodeModel(cfg, None, max_batch=batch, max_context=ctx + 64)
    slots, tokens = list(range(batch)), [1] * batch
    for q in slots:
        model.kv.tables.add(q)
        model.kv.tables.append(q, ctx - 1)
    kv_bytes = batch * ctx * cfg.layers * 2 * cfg.kv_size * 2
    floor_ms = (cfg.decode_bytes() + kv_bytes) / floor_gbps / 1e6

    def eager() -> None:
        model.launch_step(batch, model.set_step(slots, tokens, s), s)

    eager_ms = _wall_ms(eager, s)
    gpu_eager_ms = device_us(lambda: model.launch_step(batch, ctx + 32, s), s, reps=5) / 1e3
    S = Symbols(max_len=Range(1, model.max_context))
    S.set(max_len=ctx + 32)
    t0 = time.perf_counter()
    with capture(s, name=f"decode {name} B={batch}") as cap:
        model.launch_step(batch, S.max_len, s, symbols=S)
    ledger = Ledger(arenas=(model.arena,))
    ex = ledger.instantiate(cap.graph, s)  # the graph's memory: exec, pool, pinned regions
    capture_ms = (time.perf_counter() - t0) * 1e3
    mem = ledger.entries[cap.graph.name]

    def graphed() -> None:
        ex.set(max_len=model.set_step(slots, tokens, s))
        ex.launch(s)

    graph_ms = _wall_ms(graphed, s)
    gpu_graph_ms = device_us(lambda: ex.launch(s), s, reps=10) / 1e3
    ex.set(max_len=ctx - 200)  # one split fewer: every attention node changes
    patched = ex.set(max_len=ctx + 40)
    t0 = time.perf_counter()
    for _ in range(100):
        ex.set(max_len=ctx - 200)
        ex.set(max_len=ctx + 40)
    patch_us = (time.perf_counter() - t0) / 200 * 1e6
    row = {"preset": name, "B": batch, "context": ctx, "nodes": len(cap.graph.nodes),
           "eager ms/step": eager_ms, "eager GPU ms": gpu_eager_ms, "graph ms/step": graph_ms,
           "graph GPU ms": gpu_graph_ms, "floor ms": floor_ms, "graph/floor": graph_ms / floor_ms,
           "eager/graph": eager_ms / graph_ms, "capture+inst ms": capture_ms,
           "nodes patched": patched, "patch us": patch_us,
           "exec MiB": mem.exec_bytes / 2**20,
           "pins MiB": sum(mem.pins.values()) / 2**20}
    ex.close()
    cap.graph.close()
    model.close()
    return row


def run(only: str = "") -> list[dict[str, Any]]:
    """Measure every case (or those whose preset contains `only`); returns result rows."""
    s = new_stream()
    floor_gbps = copy_gbps(s)
    rows = [_case(name, batch, ctx, s, floor_gbps) for name, batch, ctx in CASES
            if not only or only in name]
    cupy.get_default_memory_pool().free_all_blocks()
    return rows
