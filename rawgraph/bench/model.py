"""`rawgraph bench model`: the eager baseline of the GPU decoder per preset (what the engine's
graphs are measured against): a decode step and a prefill chunk, wall time (host launches
included) and GPU time, against the floor (weights + KV bytes over the copy bandwidth
measured in the same run). Random weights made on the device; contexts pre-filled with
random cache contents."""

from __future__ import annotations

import statistics
import time
from typing import Any

import cupy

from rawgraph.bench.kernels import copy_gbps
from rawgraph.cuda.stream import new_stream
from rawgraph.cuda.timing import device_us
from rawgraph.model.config import preset
from rawgraph.model.decoder import Model
from rawgraph.model.step import PrefillPiece, Shape

CASES = (("tiny", 1, 1024), ("llama-1b", 1, 1024), ("llama-1b", 8, 1024), ("llama-8b", 1, 1024))
CHUNK = 512


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
    model = Model(cfg, None, max_batch=batch + 1, max_context=ctx + 2 * CHUNK,
                  max_chunk=CHUNK, max_chunk_seqs=1)
    slots, tokens = list(range(batch)), [1] * batch
    for q in slots:
        model.kv.tables.add(q)
        model.kv.tables.append(q, ctx - 1)
    kv_bytes = batch * ctx * cfg.layers * 2 * cfg.kv_size * 2
    floor_ms = (cfg.decode_bytes() + kv_bytes) / floor_gbps / 1e6

    step = Shape(batch=batch)

    def decode() -> None:
        model.launch(step, model.inputs.prepare([], slots, tokens, decode_stream=s), s)

    decode_ms = _wall_ms(decode, s)
    gpu_ms = device_us(lambda: model.launch(step, {"max_len": ctx + 32}, s), s, reps=5) / 1e3
    pos = [0]

    def prefill() -> None:  # one chunk of a fresh prompt, then the next chunk, ...
        piece = PrefillPiece(batch, [1] * CHUNK, pos[0])
        pos[0] += CHUNK
        sizes = model.inputs.prepare([piece], [], None, decode_stream=s, prefill_stream=s)
        model.launch(Shape(chunk=CHUNK), sizes, s)

    prefill_ms = _wall_ms(prefill, s, steps=1)
    flops = 2 * CHUNK * cfg.decode_bytes() / 2
    row = {"preset": name, "B": batch, "context": ctx, "eager ms/step": decode_ms,
           "eager GPU ms": gpu_ms, "floor ms": floor_ms, "eager/floor": decode_ms / floor_ms,
           f"prefill {CHUNK} ms": prefill_ms, "prefill tok/s": CHUNK / prefill_ms * 1e3,
           "prefill TFLOP/s": flops / prefill_ms / 1e9}
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
