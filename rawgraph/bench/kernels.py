"""`rawgraph bench kernels`: achieved bandwidth of each kernel against the measured copy floor.

Napkin math first: every kernel here is memory-bound, so its floor is (bytes it must move) /
(device-to-device copy bandwidth measured in the same run, bytes read + written). Kernels are
timed as graph replays of many launches (CUDA events, medians), rotating through enough copies
of the weights that the 60 MB L2 cannot serve them. The GEMV rows with a target are timed a
second time as a programmatic chain (`% chained`), the way a decode graph launches them: each
GEMV then requests its first weights while the one before it drains. The target is judged on
the plain launches against the 1 GiB copy; rows with a target also show `% same-size copy`,
against a copy that moves as many bytes as they do, since a copy of 33 MB does not reach the
1 GiB rate either, and `% same-size read`, against a plain streaming read of their bytes
(kernels_cu/stream_read.cu): the ceiling of a kernel that only reads, at its size.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import cupy
import numpy as np

from rawgraph import ops
from rawgraph.bench import compute
from rawgraph.bench.shapes import SHAPES
from rawgraph.cuda.device import multiprocessors
from rawgraph.cuda.kernel import Kernel
from rawgraph.cuda.launch import programmatic
from rawgraph.cuda.stream import new_stream
from rawgraph.cuda.timing import device_us
from rawgraph.graph.capture import capture
from rawgraph.memory.paged import BLOCK_SIZE, PagedKVCache
from rawgraph.ops import shapes
from rawgraph.ops.attention import default_splits
from rawgraph.ops.matmul import SKINNY90_ROWS, SKINNY_MAX, hopper
from rawgraph.ops.matmul import path as linear_path
from rawgraph.ops.quantized import I4_GROUP, takes_quantized
from rawgraph.ops.variant import choose

GEMV_ROWS = (1, 2, 4, 8, 16, 32, 64, 128)  # the rows of x `gemv` measures (decode steps')
ROTATE_BYTES = 512 << 20  # weights cycled per measurement: ~8x the L2
F16 = np.float16


def per_launch_us(launch: Callable[[int], None], count: int, s: Any) -> float:
    """Median device time of one launch: `count` launches (launch(i)) in one graph."""
    with capture(s, name="bench") as cap:
        for i in range(count):
            launch(i)
    with cap.graph as g, g.instantiate(upload_stream=s) as ex:
        return device_us(lambda: ex.launch(s), s, reps=15) / count


def copy_gbps(s: Any, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth, bytes read + written."""
    a = cupy.ones(nbytes // 2, np.float16)
    b = cupy.empty_like(a)
    with s:
        us = device_us(lambda: b.__setitem__(Ellipsis, a), s, reps=15)
    return 2 * nbytes / us / 1e3


def sized_copy_gbps(traffic: int, s: Any) -> float:
    """Copy bandwidth (bytes read + written) when each copy moves `traffic` bytes, timed as
    the kernels are: graph replays rotating through ROTATE_BYTES of buffers. A transfer of
    tens of MB pays its start and drain like any kernel: on the H200 a copy of 33.5 MB of
    traffic (a 2048x8192 weight's bytes) reaches ~80% of the 1 GiB rate, of 134 MB ~96%
    (benchmarks/NOTES.md, "How to measure")."""
    n = max(8, traffic // 4)  # fp16 elements a side: traffic = 2 sides x 2 bytes
    k = max(2, math.ceil(ROTATE_BYTES / (4 * n)))
    src = [cupy.ones(n, np.float16) for _ in range(k)]
    dst = [cupy.empty_like(a) for a in src]

    def launch(i: int) -> None:
        with s:
            dst[i % k][...] = src[i % k]

    return 4 * n / per_launch_us(launch, max(k, 16), s) / 1e3


STREAM_READ = Kernel("stream_read", "stream_read", "const uint4* p, long long n, unsigned* out")
READ_BLOCKS_PER_SM, READ_THREADS = 4, 256  # the best of 40 shapes at 32 and 48 MiB (H200)


def stream_read(buf: Any, out: Any, stream: Any = None) -> None:
    """out[0] ^= the XOR of every 32-bit word of `buf` (a C-contiguous CuPy array of a
    multiple of 16 bytes, 16-byte aligned; out: uint32, shape (1,)): a streaming read of
    every byte, the read-only ceiling `sized_read_gbps` times."""
    if not isinstance(buf, cupy.ndarray):
        kind = type(buf)
        raise ValueError(f"buf must be a CuPy array, got {kind.__module__}.{kind.__name__}")
    if not buf.flags.c_contiguous:
        raise ValueError("buf must be C-contiguous")
    if buf.nbytes % 16:
        raise ValueError(f"buf must hold a multiple of 16 bytes, got {buf.nbytes}")
    if buf.data.ptr % 16:
        raise ValueError(f"buf must be 16-byte aligned, got address % 16 = {buf.data.ptr % 16}")
    shapes.row_array(out, "out", np.uint32, 1)
    STREAM_READ.launch(READ_BLOCKS_PER_SM * multiprocessors(), READ_THREADS,
                       (buf, buf.nbytes // 16, out), stream)


def sized_read_gbps(nbytes: int, s: Any) -> float:
    """Read-only bandwidth (bytes read) when each read moves `nbytes`, timed as the kernels
    are: graph replays of `stream_read` rotating through ROTATE_BYTES of buffers. Reads
    stream faster than copies, but short ones also pay their start and drain: on the H200
    ~84% of the 1 GiB copy's rate at 32 MiB, ~91% at 48 MiB (benchmarks/NOTES.md, "How to
    measure"): for a 2048x8192 fp16 weight read on its own, 85% of that rate is beyond a
    read."""
    n = max(16, nbytes // 16 * 16)
    k = max(2, math.ceil(ROTATE_BYTES / n))
    bufs = [cupy.ones(n // 2, np.float16) for _ in range(k)]
    out = cupy.zeros(1, np.uint32)
    return n / per_launch_us(lambda i: stream_read(bufs[i % k], out, s), max(k, 16), s) / 1e3


def _rand(shape: tuple, rng: np.random.Generator, scale: float = 1.0) -> cupy.ndarray:
    return cupy.asarray((rng.standard_normal(shape) * scale).astype(np.float16))


def _gemv_us(ws: list, x: cupy.ndarray, y: cupy.ndarray, s: Any) -> float:
    return per_launch_us(lambda i: ops.linear(x, ws[i % len(ws)], y, stream=s),
                         max(len(ws), 16), s)


def _quantized_weights(fmt: str, n: int, k: int, nbytes: int) -> list:
    """Quantized weights (n, k) of random values, enough copies to cycle `nbytes`: FP8
    (finite e4m3 codes, scales near k**-0.5 / 16), or 4-bit (scales near k**-0.5 / 8,
    zeros 8, groups of 128)."""
    out = []
    for _ in range(max(2, math.ceil(nbytes / (n * k)))):
        if fmt == "e4m3":
            codes = cupy.random.randint(0, 256, (n, k), dtype=np.uint8)
            codes[(codes & 0x7F) == 0x7F] ^= 1  # NaN (0x7F, 0xFF) to the largest finite value
            out.append(ops.fp8_weight(codes, cupy.full(n, k**-0.5 / 16, np.float32)))
            continue
        g = I4_GROUP
        packed = cupy.random.randint(0, 256, (n, k // 2), dtype=np.uint8)
        out.append(ops.int4_weight(packed, cupy.full((n, k // g), k**-0.5 / 8, F16),
                                   cupy.full((n, k // g), 8, np.uint8), g))
    return out


def _quantized(rows: list, row: Callable, s: Any) -> None:
    """The quantized GEMVs (ops.linear of an ops.Fp8Weight or Int4Weight) at 1-16 rows
    through each weight shape: their bytes (values, scales and zeros, x and y) against the
    floor and a same-size read (target 85% where the 16-bit GEMV has one), and the 16-bit
    GEMV of the same shape in the same run (x fp16)."""
    rng = np.random.default_rng(0)
    for model, weights in SHAPES.items():
        for name, (n, k) in weights.items():
            copies = max(2, math.ceil(ROTATE_BYTES / (n * k * 2)))  # as the gemv part's
            w16 = [_rand((n, k), rng, k**-0.5) for _ in range(copies)]
            x, y = _rand((16, k), rng), cupy.empty((16, n), np.float16)
            for fmt in ("e4m3", "i4"):
                if not takes_quantized(fmt):
                    continue
                wq = _quantized_weights(fmt, n, k, ROTATE_BYTES)
                for m in (1, 2, 4, 8, 16):
                    us = _gemv_us(wq, x[:m], y[:m], s)
                    ref_us = _gemv_us(w16, x[:m], y[:m], s)
                    big = n * k >= 2048 * 8192 and m <= 8
                    row(f"gemv {fmt} {model} {name}", f"{n}x{k}", m, us,
                        wq[0].nbytes + 2 * m * (k + n), 85 if big else 0)
                    rows[-1].update({"fp16 us": ref_us, "x fp16": ref_us / us})


def _skinny(wgmma: bool) -> contextlib.AbstractContextManager:
    """Every skinny GEMM on wgmma and TMA (skinny_sm90.cu, to 128 rows) or on mma.sync
    (skinny.cu, to 64) while the block runs."""
    top = SKINNY_MAX
    frm, to = (1, SKINNY90_ROWS[-1]) if wgmma else (top + 1, top)
    return choose(wgmma_skinny_from=frm, wgmma_skinny_to=to)


def _attention(rows: list, row: Callable, s: Any) -> None:
    """Decode attention at LLaMA-1B (32/8 heads of 64) and 8B (32/8 of 128) shapes."""
    for model, d in (("llama-1b", 64), ("llama-8b", 128)):
        # the long rows' shapes too (one row at 65,536, four at 16,384, 128 rows at 4,096:
        # issue #32's and the largest batch's), each against a plain read of its bytes
        for batch, ctx in ((1, 4096), (8, 4096), (32, 4096), (8, 16384), (64, 4096),
                           (1, 65536), (4, 16384), (128, 4096)):
            splits = default_splits(batch, 8, "float16", d)  # as the engine splits
            bs = BLOCK_SIZE  # the engine's
            kv = PagedKVCache(layers=1, kv_heads=8, head_dim=d, block_size=bs,
                              num_blocks=batch * ctx // bs, max_seqs=batch,
                              max_blocks_per_seq=ctx // bs)
            for q in range(batch):
                kv.tables.add(q)
                kv.tables.append(q, ctx)
            kv.sync(s)
            with s:  # every input made on the stream the kernels run on
                kv.k[...] = cupy.random.standard_normal(kv.k.shape, np.float32).astype(F16)
                kv.v[...] = cupy.random.standard_normal(kv.v.shape, np.float32).astype(F16)
                q = cupy.random.standard_normal((batch, 32, d), np.float32).astype(F16)
                out = cupy.empty_like(q)
                slots = cupy.arange(batch, dtype=np.int32)
                ws = cupy.empty(ops.workspace_floats(batch, 32, d, splits), np.float32)
            s.synchronize()
            us = per_launch_us(lambda i, kv=kv, q=q, out=out, slots=slots, ws=ws, ctx=ctx,
                               splits=splits:
                               ops.decode_attention(q, ops.Cache(kv.k[0], kv.v[0],
                                                                 kv.block_tables, kv.seq_lens),
                                                    slots, out, ws, ctx, splits=splits,
                                                    stream=s),
                               8, s)
            # K and V, and the partial results written then read by the combine
            nbytes = batch * ctx * 8 * d * 2 * 2 + 2 * ws.nbytes
            l2 = " (fits L2)" if nbytes < 120 << 20 else ""  # repeated launches hit the cache
            row(f"decode attention {model}", f"B={batch} ctx={ctx} splits={splits}{l2}", "", us,
                nbytes,
                0 if l2 else 80)
            s.synchronize()
            del kv


PARTS = ("gemv", "quantized", "attention", "elementwise", "gemm", "prefill", "sample")


def run(only: str = "") -> list[dict[str, Any]]:
    """Measure; returns result rows. `only`: comma-separated parts of PARTS (default all)."""
    parts = set(only.split(",")) if only else set(PARTS)
    if parts - set(PARTS):
        raise ValueError(f"unknown parts {sorted(parts - set(PARTS))}; choose from {PARTS}")
    s = new_stream()
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    floor = copy_gbps(s)
    rows.append({"kernel": "device copy (floor)", "shape": "1 GiB", "m": "", "us": "",
                 "GB/s": floor, "% floor": 100.0, "target": "", "ok": ""})

    sized: dict[int, float] = {}  # MiB of traffic -> copy GB/s at that size
    read: dict[int, float] = {}  # MiB -> streaming read GB/s at that size

    def row(kernel: str, shape: str, m: Any, us: float, nbytes: int, target: float = 0) -> None:
        """A memory-bound row; rows with a target also get `% same-size copy` and `% same-size
        read`: against a copy and a plain read of their own bytes (the 1 GiB floor is out of
        reach for short transfers)."""
        gbps = nbytes / us / 1e3
        pct = 100 * gbps / floor
        rows.append({"kernel": kernel, "shape": shape, "m": m, "us": us, "GB/s": gbps,
                     "% floor": pct, "target": f">= {target:.0f}%" if target else "",
                     "ok": pct >= target if target else ""})
        if target:
            mib = max(1, round(nbytes / 2**20))
            if mib not in sized:
                sized[mib] = sized_copy_gbps(mib << 20, s)
            if mib not in read:
                read[mib] = sized_read_gbps(mib << 20, s)
            rows[-1]["% same-size copy"] = 100 * gbps / sized[mib]
            rows[-1]["% same-size read"] = 100 * gbps / read[mib]

    def flop_row(kernel: str, shape: str, us: float, flops: int, ref_us: float | None,
                 target: float, **extra: Any) -> None:
        """Compute-bound: TFLOP/s; against cuBLAS (target a ratio) or absolute TFLOP/s."""
        tf = flops / us / 1e6 if flops else ""
        r = {"kernel": kernel, "shape": shape, "m": "", "us": us, "TFLOP/s": tf, **extra}
        if ref_us is not None:
            r.update({"cuBLAS us": ref_us, "x cuBLAS": ref_us / us, "target": f">= {target}x",
                      "ok": ref_us / us >= target})
        elif target:
            r.update({"target": f">= {target} TFLOP/s", "ok": tf >= target})
        rows.append(r)

    for model, weights in SHAPES.items():
        for name, (n, k) in weights.items() if "gemv" in parts else ():
            copies = max(2, math.ceil(ROTATE_BYTES / (n * k * 2)))
            ws = [_rand((n, k), rng, k**-0.5) for _ in range(copies)]
            x = _rand((GEMV_ROWS[-1], k), rng)
            y = cupy.empty((GEMV_ROWS[-1], n), np.float16)
            for m in GEMV_ROWS:
                us = _gemv_us(ws, x[:m], y[:m], s)
                big = n * k >= 2048 * 8192 and m <= 8
                kind = linear_path(m, n)
                nbytes = 2 * (n * k + m * (k + n))
                row(f"{kind} {model} {name}", f"{n}x{k}", m, us, nbytes, 85 if big else 0)
                # beside it both skinny GEMMs where they serve, the wgmma one alone past 64
                # rows (its x tile of 128 rows against the tiled GEMM; issue #28)
                alts = () if not hopper() or kind == "gemv" else \
                    ((True, "wgmma"),) if m > SKINNY_MAX else ((True, "wgmma"), (False, "mma.sync"))
                for on, label in alts:
                    with _skinny(on):
                        alt = _gemv_us(ws, x[:m], y[:m], s)
                    rows[-1].update({f"{label} us": alt,
                                     f"{label} % floor": 100 * nbytes / alt / 1e3 / floor})
                if c := compute.split_ways(m, n, k):  # the tiled GEMM's split k, A/B
                    with compute.unsplit():
                        alt = _gemv_us(ws, x[:m], y[:m], s)
                    rows[-1].update({"split": c, "unsplit us": alt})
                if big:
                    with programmatic(True):
                        chained = _gemv_us(ws, x[:m], y[:m], s)
                    rows[-1]["% chained"] = 100 * nbytes / chained / 1e3 / floor
            del ws
    if "quantized" in parts:
        _quantized(rows, row, s)
    if "attention" in parts:
        _attention(rows, row, s)
    if "gemm" in parts:
        compute.gemm(flop_row, s)
    if "prefill" in parts:
        compute.prefill_attention(flop_row, s)
        compute.prefill_chunk_attention(flop_row, s, floor)
        cupy.get_default_memory_pool().free_all_blocks()  # the GPU is the peer's now
        compute.attention_peer(rows)
    if "sample" in parts:
        compute.sampling(flop_row, s)
    if "elementwise" not in parts:
        return rows
    T = 4096  # prefill-sized activations for the elementwise kernels
    x, r, w = _rand((T, 2048), rng), _rand((T, 2048), rng), _rand((2048,), rng)
    out, r_out = cupy.empty_like(x), cupy.empty_like(x)
    us = per_launch_us(lambda i: ops.rmsnorm(x, w, out, residual=r, residual_out=r_out,
                                             stream=s), 16, s)
    row("rmsnorm + residual", f"{T}x2048", "", us, 2 * T * 2048 * 4 + 4096)
    gu, act = _rand((T, 16384), rng), cupy.empty((T, 8192), np.float16)
    us = per_launch_us(lambda i: ops.silu_mul(gu, act, stream=s), 16, s)
    row("silu_mul", f"{T}x8192", "", us, 2 * T * 8192 * 3)
    us = per_launch_us(lambda i: ops.add(x, r, out, stream=s), 16, s)
    row("add", f"{T}x2048", "", us, 2 * T * 2048 * 3)
    table = _rand((128256, 2048), rng)
    ids = cupy.asarray(rng.integers(0, 128256, T).astype(np.int32))
    us = per_launch_us(lambda i: ops.embedding(ids, table, out, stream=s), 16, s)
    row("embedding", f"{T}x2048", "", us, 2 * T * 2048 * 2)
    q, kk = _rand((T, 32, 64), rng), _rand((T, 8, 64), rng)
    pos = cupy.arange(T, dtype=np.int32)
    freqs = cupy.asarray(ops.inv_freq(64, 500000.0, ops.Llama3Scaling()))
    us = per_launch_us(lambda i: ops.rope(q, kk, pos, freqs, stream=s), 16, s)
    row("rope", f"{T}x(32+8)x64", "", us, 2 * T * 40 * 64 * 2)
    logits, ids_out = _rand((64, 128256), rng), cupy.empty(64, np.int32)
    us = per_launch_us(lambda i: ops.argmax(logits, ids_out, stream=s), 16, s)
    row("argmax", "64x128256", "", us, 2 * 64 * 128256)
    return rows
