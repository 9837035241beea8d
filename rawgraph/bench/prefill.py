"""`rawgraph bench prefill`: time to first token as the engine prefills a prompt in chunks,
against PyTorch's forward of the same prompt; and what the chunk size costs the decode
steps running beside a prefill.

Per preset (llama-1b, llama-8b; random weights) and chunk size in CHUNKS: an engine with that
chunk graph (and decode buckets 1 and 8) takes one request per prompt length in PROMPTS (its
ids `shapes.prompt`'s, which PyTorch's forward takes too: not one id repeated), and
the time to its first token is `Engine.generate(..., max_new_tokens=1)`'s wall time, host
included (median of REPS). PyTorch's peer (benchmarks/torch_reference.py, measured after, in
the same run, where torch is importable) is one forward of the whole prompt with SDPA and
cuBLAS, its LM head on the last position. Beside decode: 8 requests decoding at ~1,024 tokens
of context while a PROMPTS[-1]-token prompt arrives: the median iteration while it prefills
(decode rows + a chunk: the inter-token latency those 8 streams see) against the median
decode-only iteration, for chunks the prompt spans at least BESIDE_CHUNKS times. Long
prompts (issue #32; `--only long` for them alone): 32k tokens (and 128k on llama-1b)
prefilled in chunks of 2,048, the time to the first token and the decode step after.
`--only profile[:PRESET]:CHUNK[:PAST]`: where one chunk graph's time goes
(rawgraph.bench.profile), a chunk of CHUNK tokens after PAST cached ones. These engines run
without the prefix cache (a prompt measured again would be found in it).

The prefix cache (issue #70; `--only prefix` for these alone): requests of a shared
PREFIX_SYSTEM-token system prompt and a PREFIX_TURN-token user turn of their own, with the
cache off and on: the time to first token of such a request once the system prompt has been
seen (median of REPS, each a new turn), the output tokens/s of PREFIX_REQUESTS of them through
`Engine.run` (PREFIX_OUT tokens each, the cache cold at the start), and of the same number of
PREFIX_OTHER-token prompts that share nothing (what the cache costs where it never hits);
and SAMPLES samples of one SAMPLES_PROMPT-token prompt (seeded apart): the prompt tokens
prefilled and the most KV blocks held at once.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

import cupy

from rawgraph.bench import peer
from rawgraph.bench.profile import part_rows, per_kernel
from rawgraph.bench.shapes import prompt
from rawgraph.engine.engine import Engine
from rawgraph.engine.request import Request
from rawgraph.engine.runner import Runner
from rawgraph.model.config import preset
from rawgraph.model.decoder import Model
from rawgraph.model.step import PrefillPiece, Shape
from rawgraph.ops.sampling import SamplingParams

PROMPTS = (512, 2048, 8192)
CHUNKS = (256, 512, 1024, 2048, 4096, 8192)
REPS = 3
BESIDE = 8        # decoding requests beside the prefill
BESIDE_CTX = 1024  # their prompt length
# chunks the prompt beside them spans at least: the median iteration is one that waits for
# its chunk (the iteration that ends the prompt does not wait for it: with one or two chunks
# it is half the sample)
BESIDE_CHUNKS = 4
# `--only long`: prompts prefilled in chunks of LONG_CHUNK, then decoded (8B's 128k prefill
# alone takes tens of seconds: 32k there)
LONG = {"llama-1b": (32768, 131072), "llama-8b": (32768,)}
LONG_CHUNK = 2048
LONG_DECODE = 32  # decode steps timed after a long prompt
# `--only prefix`: a shared system prompt and each request's own turn
PREFIX_SYSTEM, PREFIX_TURN, PREFIX_OUT, PREFIX_OTHER = 2048, 64, 64, 2112
PREFIX_REQUESTS, PREFIX_BATCH, PREFIX_CHUNK = 256, 64, 2048
SAMPLES, SAMPLES_PROMPT = 8, 1024  # n samples of one prompt


def _ttft_ms(engine: Engine, tokens: int) -> float:
    ids, times = prompt(tokens, engine.model.cfg.vocab), []
    for _ in range(REPS):
        t0 = time.perf_counter()
        engine.generate([ids], max_new_tokens=1)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _beside(engine: Engine, long: int) -> tuple[float, float]:
    """(median decode-only iteration ms, median iteration ms while a `long` prompt
    prefills beside the BESIDE decoding requests)."""
    vocab = engine.model.cfg.vocab
    rows = [engine.add(Request(prompt(BESIDE_CTX, vocab), 1024)) for _ in range(BESIDE)]
    while any(r.prefilled < len(r.prompt) for r in rows):
        engine.step()
    alone = []
    for _ in range(20):
        t0 = time.perf_counter()
        engine.step()
        alone.append((time.perf_counter() - t0) * 1e3)
    big = engine.add(Request(prompt(long, vocab), 1))
    mixed = []
    while big.prefilled < long:
        t0 = time.perf_counter()
        engine.step()
        mixed.append((time.perf_counter() - t0) * 1e3)
    for r in rows:
        engine.abort(r)
    while not engine.scheduler.idle:
        engine.step()
    engine.drain()
    return statistics.median(alone), statistics.median(mixed)


def _preset(name: str) -> list[dict[str, Any]]:
    cfg = preset(name)
    model = Model(cfg, None, max_batch=BESIDE + 1, max_context=max(PROMPTS) + 512,
                  max_chunk=max(CHUNKS), max_chunk_seqs=BESIDE + 1)
    rows = []
    for chunk in CHUNKS:
        engine = Engine(model, chunks=[chunk], buckets=[1, BESIDE], progress=False,
                        prefix_cache=False)
        # warm: every graph replayed once
        engine.generate([prompt(chunk, cfg.vocab)], max_new_tokens=2)
        for tokens in PROMPTS:
            rows.append({"preset": name, "prompt": tokens, "chunk": chunk,
                         "TTFT ms": _ttft_ms(engine, tokens)})
        if chunk * BESIDE_CHUNKS <= max(PROMPTS):
            alone, mixed = _beside(engine, max(PROMPTS))
            rows.append({"preset": name, "prompt": f"{max(PROMPTS)} beside {BESIDE} decoding",
                         "chunk": chunk, "decode-only iteration ms": alone,
                         "iteration with a chunk ms": mixed, "x decode-only": mixed / alone})
        engine.close()
    _invariant(model, rows, max(CHUNKS))
    model.close()
    return rows


def _invariant(model: Model, rows: list[dict[str, Any]], chunk: int) -> None:
    """The batch-invariant mode's time to first token beside each of `rows`' at `chunk`
    (#72's goal: within 1.25x of the default's)."""
    engine = Engine(model, chunks=[chunk], buckets=[1, BESIDE], progress=False,
                    prefix_cache=False, batch_invariant=True)
    try:
        engine.generate([prompt(chunk, model.cfg.vocab)], max_new_tokens=2)
        for row in rows:
            if row["chunk"] == chunk and "TTFT ms" in row:
                ms = _ttft_ms(engine, row["prompt"])
                row["invariant TTFT ms"], row["invariant/default"] = ms, ms / row["TTFT ms"]
    finally:
        engine.close()
        model.set_batch_invariant(False)


def _long(name: str) -> list[dict[str, Any]]:
    """One sequence per LONG prompt length: its time to first token, and the mean decode
    step after it (the context then holds the whole prompt); one run of each."""
    lengths = LONG[name]
    cfg = preset(name)
    model = Model(cfg, None, max_batch=1, max_context=max(lengths) + 2 * LONG_DECODE,
                  max_chunk=LONG_CHUNK, max_chunk_seqs=1)
    engine = Engine(model, chunks=[LONG_CHUNK], buckets=[1], progress=False,
                    prefix_cache=False)
    engine.generate([prompt(LONG_CHUNK, cfg.vocab)], max_new_tokens=2)  # warm
    rows = []
    for tokens in lengths:
        ids = prompt(tokens, cfg.vocab)
        t0 = time.perf_counter()
        engine.generate([ids], max_new_tokens=1)
        ttft = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        engine.generate([ids], max_new_tokens=LONG_DECODE + 1)
        decode = ((time.perf_counter() - t0) * 1e3 - ttft) / LONG_DECODE
        rows.append({"preset": name, "prompt": tokens, "chunk": LONG_CHUNK, "TTFT ms": ttft,
                     "decode ms/step after": decode})
    engine.close()
    model.close()
    return rows


def _ids(n: int, tokens: int, vocab: int, seed: int) -> list[list[int]]:
    """n seeded prompts of `tokens` pseudo-random ids, distinct from each other."""
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(tokens)] for _ in range(n)]


def _samples(engine: Engine) -> tuple[int, int]:
    """(prompt tokens prefilled, the most KV blocks held at once) for SAMPLES samples of one
    SAMPLES_PROMPT-token prompt, PREFIX_OUT tokens each."""
    ids = prompt(SAMPLES_PROMPT, engine.model.cfg.vocab)
    reqs = [engine.add(Request(ids, PREFIX_OUT, SamplingParams(0.8, seed=s)))
            for s in range(SAMPLES)]
    refs, start, peak = engine.model.kv.tables.alloc.refs, engine.stats.iterations, 0
    while not engine.scheduler.idle:
        engine.step()
        peak = max(peak, int((refs > 0).sum()))
    engine.drain()
    assert all(r.finish for r in reqs)
    n = engine.stats.iterations - start  # the iterations that ran them (the last n kept)
    return sum(i.prefill_tokens for i in list(engine.stats.iters)[-n:]), peak


def _prefix(name: str) -> list[dict[str, Any]]:
    """The prefix cache's rows (module docstring): the cache off, then on, one model."""
    cfg = preset(name)
    system = prompt(PREFIX_SYSTEM, cfg.vocab)
    other = _ids(PREFIX_REQUESTS, PREFIX_OTHER, cfg.vocab, 2)
    model = Model(cfg, None, max_batch=PREFIX_BATCH,
                  max_context=PREFIX_OTHER + PREFIX_OUT, max_chunk=PREFIX_CHUNK,
                  max_chunk_seqs=8)
    rows = []
    for cached in (False, True):
        turns = iter(_ids(REPS + 1 + PREFIX_REQUESTS, PREFIX_TURN, cfg.vocab, 1))
        engine = Engine(model, progress=False, prefix_cache=cached)
        engine.generate([prompt(PREFIX_SYSTEM - 1, cfg.vocab)], max_new_tokens=2)  # warm
        engine.generate([system + next(turns)], max_new_tokens=1)  # the system prompt seen
        ttft = []
        for _ in range(REPS):
            t0 = time.perf_counter()
            engine.generate([system + next(turns)], max_new_tokens=1)
            ttft.append((time.perf_counter() - t0) * 1e3)
        rates = []
        for prompts in ([system + next(turns) for _ in range(PREFIX_REQUESTS)], other):
            if engine.prefix is not None:
                engine.prefix.clear()  # cold: the first requests prefill the system prompt
            reqs = [Request(p, PREFIX_OUT) for p in prompts]
            t0 = time.perf_counter()
            engine.run(reqs)
            rates.append(PREFIX_REQUESTS * PREFIX_OUT / (time.perf_counter() - t0))
        if engine.prefix is not None:
            engine.prefix.clear()
        tokens, blocks = _samples(engine)
        rows.append({"preset": name, "prompt": f"{PREFIX_SYSTEM} shared + {PREFIX_TURN}",
                     "prefix cache": "on" if cached else "off",
                     "TTFT ms": statistics.median(ttft),
                     f"tokens/s, {PREFIX_REQUESTS} requests": rates[0],
                     "cached share": engine.stats.cached_tokens
                     / max(engine.stats.prompt_tokens, 1),
                     f"tokens/s, {PREFIX_OTHER} unshared": rates[1],
                     f"n={SAMPLES} of {SAMPLES_PROMPT}: tokens prefilled": tokens,
                     f"n={SAMPLES}: most KV blocks": blocks})
        engine.close()
    model.close()
    off, on = rows
    rows.append({"preset": name, "prompt": "on against off",
                 "TTFT x lower": off["TTFT ms"] / on["TTFT ms"],
                 "throughput x": on[f"tokens/s, {PREFIX_REQUESTS} requests"]
                 / off[f"tokens/s, {PREFIX_REQUESTS} requests"],
                 "unshared on / off": on[f"tokens/s, {PREFIX_OTHER} unshared"]
                 / off[f"tokens/s, {PREFIX_OTHER} unshared"]})
    return rows


def with_peer(rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The time-to-first-token rows of preset `name` with PyTorch's forward of the same
    prompt beside them and the ratio (PyTorch's ms over ours: above 1, we are faster)."""
    found, why = peer.measure("prefill", sorted({(r["prompt"],) for r in rows
                                                 if "TTFT ms" in r}), preset=name)
    theirs = peer.index(found, "tokens")
    for r in rows:
        if "TTFT ms" not in r:
            continue
        t = theirs.get((r["prompt"],))
        r["PyTorch ms"] = t["ms"] if t else why or "skipped"
        r["x PyTorch"] = t["ms"] / r["TTFT ms"] if t else ""
        r["ok"] = bool(t) and r["x PyTorch"] >= 1.0
    return rows


def profile(name: str = "llama-1b", chunk: int = 2048, past: int = 0) -> list[dict[str, Any]]:
    """Per-kernel GPU time of one prefill chunk graph, then per step part ("part: qkv",
    ...): one sequence's `chunk` tokens after `past` cached ones (rawgraph.bench.profile)."""
    model = Model(preset(name), None, max_batch=1, max_context=past + chunk + 64,
                  max_chunk=chunk, max_chunk_seqs=1)
    runner = Runner(model, graphs=True, buckets=[1], chunks=[chunk])
    s = runner.prefill_stream
    if past:
        model.kv.tables.add(0)
        model.kv.tables.append(0, past)
    ex = runner.pool.acquire(Shape(chunk=chunk))
    piece = PrefillPiece(0, prompt(chunk, model.cfg.vocab), past)
    ex.set(**model.inputs.prepare([piece], [], None, decode_stream=s, prefill_stream=s))
    rows = per_kernel(ex, s)
    rows += part_rows(ex, s)
    runner.close()
    model.close()
    return [{"preset": name, "chunk": chunk, "past": past, **r} for r in rows]


def run(only: str = "") -> list[dict[str, Any]]:
    """llama-1b and llama-8b (or the presets whose names contain `only`; 'long' for the
    long prompts alone, 'prefix' (or 'prefix:PRESET') for the prefix cache's rows alone, both
    of which a full run also measures; 'profile[:PRESET]:CHUNK[:PAST]' for a per-kernel
    breakdown of one chunk graph, llama-1b unless named)."""
    if only.startswith("profile"):
        parts = only.split(":")[1:]
        name = parts.pop(0) if parts and not parts[0].isdigit() else "llama-1b"
        c, past = [*parts, "2048", "0"][:2]
        return profile(name, int(c), int(past))
    rows = []
    if only.startswith("prefix"):
        names = only.split(":")[1:] or ["llama-1b", "llama-8b"]
        for name in names:
            rows.extend(_prefix(name))
            cupy.get_default_memory_pool().free_all_blocks()
        return rows
    for name in ("llama-1b", "llama-8b"):
        if not only or only in name or only == "long":
            mine = [] if only == "long" else _preset(name)
            cupy.get_default_memory_pool().free_all_blocks()
            mine += _long(name)
            cupy.get_default_memory_pool().free_all_blocks()  # the GPU is the peer's now
            rows.extend(with_peer(mine, name))
            if only != "long":
                rows.extend(_prefix(name))
                cupy.get_default_memory_pool().free_all_blocks()
    return rows
