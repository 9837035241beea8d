"""Compute-bound kernels of `rawgraph bench kernels`: the prefill GEMM against cuBLAS (through
cupy.matmul, in the same run), prefill attention against its FLOP count and PyTorch's fastest
SDPA backend (measured after, in the same run, where torch is importable); sampling's cost.

Napkin math: a GEMM of (m, k) x (k, n) does 2 m n k FLOPs; causal attention over S tokens
does 4 S^2 D H / 2 (QK^T and PV, half the square). The H200's dense fp16 peak is ~990
TFLOP/s with wgmma; mma.sync kernels top out well below that, cuBLAS uses wgmma.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import cupy
import numpy as np

from rawgraph import ops
from rawgraph.bench import peer
from rawgraph.bench.shapes import SHAPES
from rawgraph.cuda.device import multiprocessors
from rawgraph.cuda.timing import device_us
from rawgraph.memory.paged import BLOCK_SIZE, PagedKVCache
from rawgraph.ops import matmul
from rawgraph.ops.variant import choose

Row = Callable[..., None]
F16 = np.float16


def _rand(shape: tuple, scale: float = 1.0) -> cupy.ndarray:
    return (cupy.random.standard_normal(shape, np.float32) * scale).astype(F16)


@functools.cache
def _busy() -> tuple[cupy.ndarray, cupy.ndarray]:
    """Two 1 GiB buffers: copying one to the other keeps the GPU busy for ~0.5 ms."""
    a = cupy.zeros(1 << 29, F16)
    return a, cupy.empty_like(a)


def _us(fn: Callable[[], None], s: Any, reps: int = 10) -> float:
    """Median device time of one call: `reps` calls queued back to back behind two 1 GiB
    copies, so the GPU has not reached the first call before the host has queued the last
    and the events time kernels, not the host's launch rate (a 20 us kernel called eagerly
    would otherwise measure Python)."""
    a, b = _busy()

    def busy() -> None:
        b[...] = a
        b[...] = a

    with s:
        return device_us(lambda: [fn() for _ in range(reps)], s, reps=7, before=busy) / reps


def unsplit() -> contextlib.AbstractContextManager:
    """Every wgmma GEMM unsplit (no split k) for the block: the A/B of `Variants.split_k`."""
    return choose(split_k=False)


def gemm_tile(m: int, n: int, k: int) -> str:
    """The tiled GEMM's plan that `ops.linear` runs for an (m, k) x (k, n) product on this
    GPU: "BMxBN", or "BMxBN/c" where c blocks split each tile's k; "" on another path."""
    if matmul.path(m, n) != "gemm":
        return ""
    (bm, bn), c = matmul.device_plan(m, n, k)
    return f"{bm}x{bn}" + (f"/{c}" if c > 1 else "")


def split_ways(m: int, n: int, k: int) -> str:
    """gemm_tile where it splits k, else ""."""
    tile = gemm_tile(m, n, k)
    return tile if "/" in tile else ""


def gemm(row: Row, s: Any) -> None:
    """Prefill-sized y = x W^T at LLaMA shapes, ours vs cuBLAS, M in 128 / 512 / 2048 /
    4096, with the tile the plan takes; where it splits k, the unsplit GEMM's time beside it."""
    for model, shapes in SHAPES.items():
        for name, (n, k) in shapes.items():
            if name == "lm_head":  # prefill runs the LM head on the last tokens only
                continue
            w = _rand((n, k), k**-0.5)
            for m in (128, 512, 2048, 4096):
                x, y, yb = _rand((m, k)), cupy.empty((m, n), F16), cupy.empty((m, n), F16)
                ours = _us(lambda x=x, y=y, w=w: ops.linear(x, w, y, stream=s), s)
                cublas = _us(lambda x=x, yb=yb, w=w: cupy.matmul(x, w.T, out=yb), s)
                extra: dict[str, Any] = {"tile": gemm_tile(m, n, k)}
                if "/" in extra["tile"]:
                    with unsplit():
                        extra["unsplit us"] = _us(lambda x=x, y=y, w=w: ops.linear(x, w, y,
                                                                                   stream=s), s)
                row(f"gemm {model} {name}", f"{m}x{n}x{k}", ours, 2 * m * n * k, cublas, 0.6,
                    **extra)
            del w


def _one_sequence(d: int, n: int, s: Any) -> PagedKVCache:
    """A one-layer cache of 8 kv heads holding one sequence of n random tokens (slot 0), in
    blocks of the engine's size (n a multiple of it)."""
    bs = BLOCK_SIZE
    kv = PagedKVCache(layers=1, kv_heads=8, head_dim=d, block_size=bs, num_blocks=n // bs,
                      max_seqs=1, max_blocks_per_seq=n // bs)
    kv.tables.add(0)
    kv.tables.append(0, n)
    kv.sync(s)
    with s:
        kv.k[...] = _rand(kv.k.shape)
        kv.v[...] = _rand(kv.v.shape)
    return kv


def _cache(kv: PagedKVCache) -> ops.Cache:
    """Layer 0 of `kv` as attention reads it."""
    return ops.Cache(kv.k[0], kv.v[0], kv.block_tables, kv.seq_lens)


def _prefill_family(wgmma: bool, tma: bool) -> contextlib.AbstractContextManager:
    """Prefill attention on one family for the block: wgmma or mma.sync, K/V tiles by TMA or
    gathered (Hopper takes wgmma and TMA)."""
    return choose(prefill_wgmma=wgmma, prefill_tma=tma)


def prefill_attention(row: Row, s: Any) -> None:
    """Causal prefill of one sequence at LLaMA head shapes (32 query / 8 kv heads)."""
    for d in (64, 128):
        for n in (1024, 4096, 8192):
            kv = _one_sequence(d, n, s)
            with s:
                q, out = _rand((n, 32, d)), cupy.empty((n, 32, d), F16)
                cu, slots = cupy.array([0, n], np.int32), cupy.zeros(1, np.int32)
            for rows in (64, 128):
                def run(kv=kv, q=q, out=out, cu=cu, slots=slots, n=n, r=rows):
                    ops.prefill_attention(q, _cache(kv), ops.Chunk(cu, slots, n), out,
                                          ops.PrefillPlan(r), stream=s)
                us, extra = _us(run, s, reps=5), {}
                if ops.attention.prefill_wgmma():  # beside it, the gathers and mma.sync
                    with _prefill_family(True, False):
                        extra["gathered us"] = _us(run, s, reps=5)
                    with _prefill_family(False, False):
                        extra["mma.sync us"] = _us(run, s, reps=5)
                flops = 4 * n * n * d * 32 // 2
                row(f"prefill attention d={d} r={rows}", f"causal S={n}", us, flops, None,
                    ATTENTION_TFLOPS.get((n, d), 0), S=n, head_dim=d, **extra)
            del kv


CHUNK_CONTEXTS, CHUNKS = (1024, 8192), (16, 64, 256, 512)


def prefill_chunk_attention(row: Row, s: Any, gbps: float, runs: tuple[int, ...] = ()) -> None:
    """A chunk of the engine's sizes at the end of a sequence of 1,024 or 8,192 tokens (32
    query / 8 kv heads): a block per (query tile, head) leaves most SMs idle; beside it the
    grouped kernel (a GQA group's heads in one tile) in the key runs `prefill_runs` counts
    for that context, and with each count in `runs` forced. Each row's `KV us` is its K and
    V read once at `gbps` (the copy rate), what a short chunk cannot go below."""
    for d in (64, 128):
        for n in CHUNK_CONTEXTS:
            kv = _one_sequence(d, n, s)
            for chunk in CHUNKS:
                with s:
                    q, out = _rand((chunk, 32, d)), cupy.empty((chunk, 32, d), F16)
                    cu, slots = cupy.array([0, chunk], np.int32), cupy.zeros(1, np.int32)
                rows = ops.attention.grouped_rows(chunk, 4)
                splits, keys = ops.attention.prefill_runs(chunk, rows // 4, 8, multiprocessors())
                ws = cupy.empty(ops.workspace_floats(chunk, 32, d, max((*runs, splits))),
                                np.float32)
                rule = ops.attention.row_runs(n, splits, keys)
                flops = 4 * chunk * (n - chunk // 2) * d * 32

                def timed(kw: dict, kv=kv, q=q, out=out, cu=cu, slots=slots, c=chunk) -> float:
                    return _us(lambda: ops.prefill_attention(
                        q, _cache(kv), ops.Chunk(cu, slots, c), out, ops.PrefillPlan(**kw),
                        stream=s), s, reps=5)
                extra = {"per head us": timed({}), "runs": rule,
                         "KV us": n * 8 * d * 4 / gbps / 1e3}
                for r in runs:
                    extra[f"{r} runs us"] = timed({"splits": r, "workspace": ws})
                us = timed({"context": n, "workspace": ws})
                row(f"prefill chunk attention d={d}", f"{chunk} at {n}", us, flops, None, 0,
                    **extra)
            del kv


ATTENTION_TFLOPS = {(4096, 128): 470}  # prefill attention's absolute goal (issue #29)
ATTENTION_VS_PEER = 0.9  # and against PyTorch's fastest SDPA backend, measured in the run


def attention_peer(rows: list[dict[str, Any]]) -> None:
    """Put PyTorch's fastest SDPA backend (benchmarks/torch_reference.py, same shapes, same
    run) beside each prefill attention row; the row's goal becomes both its TFLOP/s target
    and ATTENTION_VS_PEER of PyTorch's time."""
    mine = [r for r in rows if "S" in r and "head_dim" in r]
    found, why = peer.measure("attention", sorted({(r["S"], r["head_dim"]) for r in mine}))
    best: dict[tuple, dict[str, Any]] = {}
    for t in found:
        key = (t["S"], t["head_dim"])
        if "us" in t and (key not in best or t["us"] < best[key]["us"]):
            best[key] = t
    for r in mine:
        t = best.get((r["S"], r["head_dim"]))
        if t is None:
            r["PyTorch us"] = why or "skipped"
            continue
        ratio = t["us"] / r["us"]
        r.update({"PyTorch us": t["us"], "PyTorch backend": t["backend"],
                  "x PyTorch": ratio})
        r["target"] = " and ".join(filter(None, [r.get("target", ""),
                                                 f">= {ATTENTION_VS_PEER}x PyTorch"]))
        r["ok"] = (r.get("ok", True) is True) and ratio >= ATTENTION_VS_PEER


def sampling(row: Row, s: Any) -> None:
    """Top-k/top-p sampling vs argmax over a 128256-token vocabulary."""
    for rows in (1, 32):
        logits, out = _rand((rows, 128256)), cupy.empty(rows, np.int32)
        for what, k in (("t=0.8 k=50 p=0.9", 50), ("t=0.8 p=0.9", 0)):
            cols = [cupy.full(rows, v, t) for v, t in ((0.8, np.float32), (k, np.int32),
                                                       (0.9, np.float32), (7, np.uint64),
                                                       (3, np.int32))]
            us = _us(lambda c=cols, x=logits, o=out: ops.sample(x, o, *c, stream=s), s)
            row(f"sample {what}", f"{rows}x128256", us, 0, None, 0)
        us = _us(lambda x=logits, o=out: ops.argmax(x, o, stream=s), s)
        row("argmax", f"{rows}x128256", us, 0, None, 0)
