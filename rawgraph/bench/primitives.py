"""`rawgraph bench primitives`: what launches, graphs and patches cost on this machine.

Eager launch cost (CuPy RawKernel call vs rawgraph's cuLaunchKernelEx), graph launch host
cost, GPU time per node, patch cost per node, and for graphs of 50/200/1000 nodes: patching
10% of the nodes vs recapture + instantiate (rawgraph's capture, and the cheapest one anyone
would write: CuPy kernel calls between cuStreamBeginCapture and cuStreamEndCapture, then
cuGraphInstantiate) vs recapture + cudaGraphExecUpdate.

The graphs are chains of tiny residual adds (1024 fp16 elements each, ping-ponging between
two buffers), so every node depends on the one before and device work is ~nothing: the
numbers are launch, patch and capture costs, not kernel time.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

import cupy
import numpy as np
from cuda.bindings import driver

from rawgraph import ops
from rawgraph.cuda.check import check
from rawgraph.cuda.launch import Launch
from rawgraph.cuda.stream import new_stream, stream_handle
from rawgraph.cuda.timing import device_us, host_us, wall_ms
from rawgraph.graph.capture import capture
from rawgraph.graph.graph import Graph
from rawgraph.ops.elementwise import ADD, ADD_BLOCK
from rawgraph.symbols import Range, Symbols

N = 1024  # elements per add


def _chain(nodes: int, every: int, S: Symbols, bufs: list, stream: Any) -> Graph:
    """`nodes` dependent adds; every `every`-th reads symbol n, the rest use n = N."""
    x0, x1, a = bufs
    with capture(stream, name=f"chain{nodes}") as cap:
        for i in range(nodes):
            src, dst = (x0, x1) if i % 2 == 0 else (x1, x0)
            ops.add(src, a, dst, S.n if i % every == 0 else N, stream=stream, symbols=S)
    return cap.graph


def _paired_us(fa: Callable[[], Any], fb: Callable[[], Any], calls: int = 2000,
               batches: int = 15) -> tuple[float, float]:
    """(median host us of fa, median of fa - fb), from batches of each in turn: the host's
    speed drifts by up to 2x between processes and moments, so a difference from adjacent
    batches says more than two medians taken apart."""
    def batch(fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls * 1e6
    batch(fa), batch(fb)  # warm-up
    pairs = [(batch(fa), batch(fb)) for _ in range(batches)]
    return statistics.median(a for a, _ in pairs), statistics.median(a - b for a, b in pairs)


def _bare_recapture(nodes: int, bufs: list, n: int, stream: Any) -> None:
    """The same chain captured and instantiated straight through the driver, its kernels
    called through CuPy: no records, no checks, nothing kept (both graphs destroyed)."""
    x0, x1, a = bufs
    raw, h = ADD["float16"].raw, driver.CUstream(stream_handle(stream))
    grid, n32 = ((n + 8 * ADD_BLOCK - 1) // (8 * ADD_BLOCK),), np.int32(n)
    mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    check(driver.cuStreamBeginCapture(h, mode))
    for i in range(nodes):
        src, dst = (x0, x1) if i % 2 == 0 else (x1, x0)
        raw(grid, (ADD_BLOCK,), (src, a, dst, n32), stream=stream)
    graph = check(driver.cuStreamEndCapture(h))
    check(driver.cuGraphExecDestroy(check(driver.cuGraphInstantiate(graph, 0))))
    check(driver.cuGraphDestroy(graph))


def run(sizes: tuple[int, ...] = (50, 200, 1000)) -> list[dict[str, Any]]:
    """Measure everything; returns result rows."""
    s = new_stream()
    rng = np.random.default_rng(0)
    bufs = [cupy.asarray(rng.standard_normal(N).astype(np.float16)) for _ in range(3)]
    S = Symbols(n=Range(1, N))
    S.set(n=N)
    rows: list[dict[str, Any]] = []

    def row(metric: str, value: float, unit: str, nodes: Any = "", target: str = "",
            ok: Any = "") -> None:
        rows.append({"metric": metric, "nodes": nodes, "value": value, "unit": unit,
                     "target": target, "ok": ok})

    # ---- eager launches --------------------------------------------------------------
    k = ADD["float16"]
    x0, x1, a = bufs
    raw = k.raw
    grid = ((N + 8 * ADD_BLOCK - 1) // (8 * ADD_BLOCK),)
    n32 = np.int32(N)
    row("eager: CuPy RawKernel call", host_us(
        lambda: raw(grid, (ADD_BLOCK,), (x0, a, x1, n32), stream=s), sync=s), "us/launch")
    row("eager: rawgraph op (checks + pack + cuLaunchKernelEx)", host_us(
        lambda: ops.add(x0, a, x1, stream=s), sync=s), "us/launch")
    prepared = Launch(k, grid, ADD_BLOCK, (x0, a, x1, N))
    row("eager: prepared Launch (cuLaunchKernelEx, prebuilt void**)", host_us(
        lambda: prepared.launch(s), sync=s), "us/launch")

    # ---- graph launch and GPU time per node ------------------------------------------
    g = _chain(200, 10**9, S, bufs, s)
    ex = g.instantiate(upload_stream=s)
    row("graph launch host cost", host_us(lambda: ex.launch(s), calls=50, sync=s),
        "us/launch", 200)
    row("GPU time per node (chain of tiny adds)",
        device_us(lambda: ex.launch(s), s) / 200, "us/node", 200)
    eager_chain = device_us(lambda: [L.launch(s) for L in ex.launches()], s) / 200
    row("GPU+launch time per node, same chain eager", eager_chain, "us/node", 200)
    ex.close()
    g.close()

    # ---- patching one node -------------------------------------------------------------
    g = _chain(200, 200, S, bufs, s)
    ex = g.instantiate(upload_stream=s)
    values = itertools.cycle((N // 2, N))
    one = host_us(lambda: ex.set(n=next(values)), calls=2000, batches=15)
    row("patch 1 node: ex.set(n=...)", one, "us", 200, "<= 2 us", one <= 2.0)
    node = ex.plan.nodes[0]
    prog = ex._programs[("n",)]
    row("  the patch program (checks, pack, SetParams)", host_us(
        lambda: prog({"n": next(values)}), calls=2000, batches=15), "us")
    def set_alone() -> None:
        driver.cuGraphExecKernelNodeSetParams(ex.handle, node.handle, node.params)

    raw_set = host_us(set_alone, calls=2000, batches=15)
    row("  cuGraphExecKernelNodeSetParams alone (prebuilt params)", raw_set, "us", 200)
    _, own = _paired_us(lambda: ex.set(n=next(values)), set_alone)
    row("  ex.set minus SetParams alone (paired batches)", own, "us", 200)
    ex.close()
    g.close()

    # ---- patch 10% vs recapture + instantiate vs recapture + ExecUpdate ----------------
    for nodes in sizes:
        g = _chain(nodes, 10, S, bufs, s)
        ex = g.instantiate(upload_stream=s)
        patched = ex.set(n=N // 2) or ex.set(n=N)
        patch = host_us(lambda ex=ex: ex.set(n=next(values)), calls=50) / 1e3

        def recapture_instantiate(nodes: int = nodes) -> None:
            g2 = _chain(nodes, 10, S, bufs, s)
            g2.instantiate().close()
            g2.close()

        def recapture_update(nodes: int = nodes, ex: Any = ex) -> None:
            g2 = _chain(nodes, 10, S, bufs, s)
            res = ex.update(g2)
            if not res.in_place:
                raise RuntimeError(f"ExecUpdate fell back: {res.reason}")
            g2.close()

        ri = wall_ms(recapture_instantiate)
        rb = wall_ms(lambda nodes=nodes: _bare_recapture(nodes, bufs, N // 2, s))
        ru = wall_ms(recapture_update)
        row(f"patch 10% ({patched} nodes)", patch, "ms", nodes)
        row("  per patched node", patch * 1e3 / patched, "us", nodes)
        row("recapture + instantiate", ri, "ms", nodes)
        row("recapture + instantiate, bare (driver + CuPy calls)", rb, "ms", nodes)
        row("recapture + ExecUpdate", ru, "ms", nodes)
        target = ">= 100x" if nodes == 200 else ""
        row("speedup: patch vs recapture + instantiate", ri / patch, "x", nodes, target,
            ri / patch >= 100 if nodes == 200 else "")
        row("speedup: patch vs bare recapture + instantiate", rb / patch, "x", nodes)
        row("speedup: patch vs recapture + ExecUpdate", ru / patch, "x", nodes)
        ex.close()
        g.close()
    s.synchronize()
    return rows
