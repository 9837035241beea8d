"""`rawgraph bench serve`: the server under load and faults, against the same work offline.

For each preset (random weights, the engine in its own process; again with mixed iterations and
a smaller prefill budget beside decoding rows, `--mixed --decode-chunk 48`, 128 on llama-8b;
llama-1b a third time with `--engine thread` and a fourth with `--http-processes 4`):
`rawgraph serve` starts as a subprocess; clients in `Load.clients` processes send `requests`
streaming, greedy requests with Poisson arrivals (prompts and outputs of random lengths), and
in the same run: a fifth of the clients disconnect mid-stream, malformed requests arrive (bad
JSON, unknown fields, a huge max_tokens, prompts past the context) that must get a 4xx.
`--max-queue` is the number of requests, so none of them is turned away; once they are done, a
burst of tiny requests 64 past it overflows the queue (429 expected), then one more request
must succeed (recovery). The server is then stopped by SIGTERM (exit 0 expected) and the same
work runs again offline through `Engine.run`: every request the server took, those whose
clients left cut to the tokens they had received (the server prefilled their prompts and
decoded those tokens too).

The closed-loop rows (`CLOSED`; `--only closed` for those alone) hold the batch full
instead: `Load.closed` clients, each sending its next request (256 prompt ids, 128 tokens)
when its last ends, as many as the batch holds and twice that, streamed and whole (no
inter-token latency then), and no faults; served against offline is then the server's own
cost at saturation, which Poisson arrivals never show.

Reported per preset: served and offline output tokens/s, time to first token and
inter-token latency (p50, p99) against the decode step at that batch (`max_batch` rows at the
work's mean context, timed as `bench decode` times it, after the offline run; the offline
run's median decode-only iteration beside it), the server's own iteration times (decode-only
and mixed, p50 and p99 from its /metrics histograms) and its engine thread's period from one
iteration to the next, the share of its iterations with decode rows that continued the last
step on the device and the p99 of those fed from the host (the rows changed), the engine
process's garbage collector (objects frozen at start-up, full passes and their p99), and the
fault counts: sent, completed, cancelled, refused, 429s, unexpected errors, tokens lost (a
completed stream's tokens against its usage count: must be 0), KV blocks leaked after the
run (must be 0), and completed streams whose tokens differ from the offline run's. That
last count is 0 on the float32 reference decoder; on the GPU a stream's rounding depends on
the rows that share its steps (the GEMV variant of the batch's bucket, the chunk its prompt
landed in), and random weights leave many near-ties among the top logits, so some greedy
streams part ways.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from rawgraph.bench.decode import fill_contexts, overlapped_step_ms
from rawgraph.engine.engine import Engine
from rawgraph.engine.reference import reference_engine
from rawgraph.engine.request import Request
from rawgraph.model.config import preset
from rawgraph.model.decoder import Model
from rawgraph.model.weights import random_weights
from rawgraph.serve.metrics import ROW_KINDS, quantile, sample

# client processes: with 4, each parsing a quarter of every step's SSE events one after
# another, the clients' ITL p99 sat 1.2 ms above the server's own (1B, 64-token budget: 4.83
# vs 3.64 ms); with 12 they agree (3.40 vs 3.44; benchmarks/NOTES.md, "Serving")
CLIENT_PROCS = 12


@dataclass
class Load:
    """The workload of one preset."""

    preset: str = "llama-1b"
    requests: int = 512
    rate: float = 200.0               # arrivals per second (Poisson)
    prompt: tuple[int, int] = (128, 2048)
    output: tuple[int, int] = (64, 512)
    leave: float = 0.2                # clients that disconnect mid-stream
    malformed: int = 16               # bad requests sent during the run
    max_batch: int = 32
    max_context: int = 4096
    burst_extra: int = 64             # the burst: max_queue + this many tiny requests
    seed: int = 0
    reference: bool = False           # the NumPy decoder on the CPU (tests of this harness)
    engine: str = "process"           # `rawgraph serve --engine` (process or thread)
    mixed: bool = False               # `rawgraph serve --mixed` (and offline the same)
    decode_chunk: int | None = None   # `rawgraph serve --decode-chunk` (and offline the same)
    batch_invariant: bool = False     # `rawgraph serve --batch-invariant` (and offline the same)
    http_processes: int = 1           # `rawgraph serve --http-processes`
    clients: int = CLIENT_PROCS       # client processes (the streams dealt among them)
    # clients in a closed loop, each sending its next request when its last ends (0: Poisson
    # arrivals at `rate`); with as many as the batch holds or more, the batch stays full,
    # so served against offline is the server's own cost per iteration
    closed: int = 0
    stream: bool = True               # streamed requests; False: whole responses (no ITL)

    @property
    def max_queue(self) -> int:
        """The server's queue: room for the whole load, so only the burst overflows it."""
        return self.requests

    def server_args(self) -> list[str]:
        """The `rawgraph serve` options."""
        return ["--preset", self.preset, "--max-batch", str(self.max_batch), "--max-context",
                str(self.max_context), "--max-queue", str(self.max_queue), "--grace", "60",
                "--chunk", str(min(256, self.max_context)),
                *(["--reference"] if self.reference else []),
                *(["--mixed"] if self.mixed else []),
                *(["--batch-invariant"] if self.batch_invariant else []),
                *(["--decode-chunk", str(self.decode_chunk)] if self.decode_chunk else []),
                "--engine", self.engine, "--http-processes", str(self.http_processes)]


BURST_TOKENS = 64  # tokens each request of the burst asks for


@dataclass
class ClientRequest:
    """One client request: when, what, and whether the client leaves after `leave_after`
    tokens (0: stays) or sends a malformed body (`bad`)."""

    i: int
    at: float
    prompt: list[int]
    max_tokens: int
    leave_after: int = 0
    bad: str = ""


def client_requests(load: Load, vocab: int) -> list[ClientRequest]:
    """The load's requests (seeded): the streams and the malformed ones."""
    rng = np.random.default_rng(load.seed)
    at = np.zeros(load.requests) if load.closed else \
        np.cumsum(rng.exponential(1 / load.rate, load.requests))
    out = []
    for i in range(load.requests):
        n = int(rng.integers(load.prompt[0], load.prompt[1] + 1))
        m = int(rng.integers(load.output[0], load.output[1] + 1))
        leave = int(rng.integers(1, max(2, m // 2))) if rng.random() < load.leave else 0
        out.append(ClientRequest(i, float(at[i]), rng.integers(0, vocab, n).tolist(), m, leave))
    kinds = ("json", "field", "max_tokens", "context")
    for j in range(load.malformed):
        out.append(ClientRequest(load.requests + j, float(rng.uniform(0, at[-1])), [1, 2, 3], 4,
                        bad=kinds[j % len(kinds)]))
    return sorted(out, key=lambda p: p.at)


def burst(load: Load) -> list[ClientRequest]:
    """Short requests (BURST_TOKENS each) all at once, past the queue's room. Whether some
    get 429 depends on how fast the engine drains the queue against how fast the server takes
    requests in: on the H200 the engine in its own process took all 576 as they came (llama-1b
    and 8B, with 4 tokens each and with 64), on a thread it refused 32 to 52."""
    first = load.requests + load.malformed
    return [ClientRequest(first + j, 0.0, [5, 6, 7], BURST_TOKENS, bad="burst")
            for j in range(load.max_queue + load.burst_extra)]


def _body(p: ClientRequest, load: Load) -> bytes:
    stream = load.stream or p.bad == "burst" or p.leave_after > 0  # leaving needs a stream
    body: dict[str, Any] = {"prompt": p.prompt, "max_tokens": p.max_tokens, "temperature": 0,
                            "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if p.bad == "json":
        return b'{"prompt": [1, 2,'
    if p.bad == "field":
        body["frobnicate"] = True
    elif p.bad == "max_tokens":
        body["max_tokens"] = 10**9
    elif p.bad == "context":
        body["prompt"] = [1] * (load.max_context + 1)
    return json.dumps(body).encode()


async def _one(client: Any, url: str, p: ClientRequest, load: Load, t0: float) -> dict[str, Any]:
    """Send one request at its time; what came back."""
    await asyncio.sleep(max(0.0, t0 + p.at - time.monotonic()))
    sent = time.monotonic()
    res: dict[str, Any] = {"i": p.i, "bad": p.bad, "status": 0, "tokens": [], "times": [],
                           "usage": None, "finish": None, "left": False, "sent": sent,
                           "ended": sent}
    try:
        async with client.stream("POST", f"{url}/v1/completions", content=_body(p, load),
                                 headers={"content-type": "application/json"}) as r:
            res["status"] = r.status_code
            if r.status_code != 200:
                await r.aread()
                return res
            if not r.headers.get("content-type", "").startswith("text/event-stream"):
                body = json.loads(await r.aread())  # a whole response: its tokens at once
                c = body["choices"][0]
                res["tokens"], res["finish"] = c["token_ids"], c["finish_reason"]
                res["usage"] = body["usage"]["completion_tokens"]
                res["times"].append((time.monotonic() - sent, len(c["token_ids"])))
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    res["usage"] = chunk["usage"]["completion_tokens"]
                for c in chunk.get("choices", []):
                    if c["token_ids"]:
                        res["tokens"] += c["token_ids"]
                        res["times"].append((time.monotonic() - sent, len(c["token_ids"])))
                    res["finish"] = c["finish_reason"] or res["finish"]
                if p.leave_after and len(res["tokens"]) >= p.leave_after:
                    res["left"] = True
                    break  # the client goes away mid-stream
    except Exception as e:  # every failure is counted, none stops the run
        res["status"], res["error"] = -1, repr(e)
    res["ended"] = time.monotonic()
    return res


def _clients(args: tuple[str, list[ClientRequest], Load, float, int]) -> list[dict[str, Any]]:
    """One client process: its share of the requests, each on its own stream at its time;
    or (closed loop) in `loops` clients, each sending its next request when its last
    ends."""
    import httpx

    url, mine, load, t0, loops = args

    async def closed(client: Any, share: list[ClientRequest]) -> list[dict[str, Any]]:
        return [await _one(client, url, p, load, t0) for p in share]

    async def go() -> list[dict[str, Any]]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
            if not load.closed:
                return await asyncio.gather(*(_one(client, url, p, load, t0) for p in mine))
            parts = await asyncio.gather(*(closed(client, mine[j::loops])
                                           for j in range(loops)))
            return [r for part in parts for r in part]
    return asyncio.run(go())


def free_port() -> int:
    """A TCP port free on this machine now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_server(args: list[str], timeout_s: float = 600.0, *, own_group: bool = False
                 ) -> tuple[subprocess.Popen, str]:
    """`rawgraph serve ARGS` as a subprocess on a free port, once /health answers: (the
    process, its base URL). Its output goes to a temporary file (`server_log(proc)` reads
    it): a pipe nobody reads fills up after 64 KiB of access log and stops the server.
    `own_group`: the server leads a process group of its own (a signal can go to all of it).
    RuntimeError with the server's last output if it exits or is not up within `timeout_s`."""
    import httpx

    port = free_port()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "rawgraph.cli", "serve", *args, "--port",
                             str(port)], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            start_new_session=own_group)
    proc.log = log  # type: ignore[attr-defined]
    url, t0 = f"http://127.0.0.1:{port}", time.monotonic()
    while True:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() - t0 > timeout_s:
            proc.kill()
            proc.wait()
            raise RuntimeError("the server did not start: " + server_log(proc))
        time.sleep(0.05)


def server_log(proc: subprocess.Popen, tail: int = 2000) -> str:
    """The last `tail` characters a `spawn_server` process has printed."""
    log = proc.log  # type: ignore[attr-defined]
    log.flush()
    log.seek(0)
    return log.read().decode(errors="replace")[-tail:]


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"rawgraph_{name} "):
            return float(line.split()[1])
    raise KeyError(name)


def _send(pool: Any, url: str, work: list[ClientRequest], load: Load
          ) -> tuple[list[dict[str, Any]], float]:
    """`work` from the client processes; (results, seconds from the first request sent to
    the last answer's end: the clients' own clock, CLOCK_MONOTONIC, one for every process
    of the machine, so neither the client processes' start nor the results' way back
    counts as serving time)."""
    shares = [work[k::load.clients] for k in range(load.clients)]
    t0 = time.monotonic() + 1.0  # the client processes start within a second
    loops = [len(range(k, load.closed, load.clients)) for k in range(load.clients)]
    out = [r for share in pool.map(_clients, [(url, s, load, t0, n)
                                              for s, n in zip(shares, loops)])
           for r in share]
    return out, max(r["ended"] for r in out) - min(r["sent"] for r in out)


def served(load: Load, vocab: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the load against a server subprocess; (each request's result, server facts)."""
    import httpx

    t0 = time.monotonic()
    proc, url = spawn_server(load.server_args())
    _progress(f"{load.preset}: server up in {time.monotonic() - t0:.1f} s")
    try:  # its graphs captured at start-up: any more during the load made an iteration wait
        captured = _metric(httpx.get(f"{url}/metrics").text, "graph_captures_total")
        with multiprocessing.get_context("spawn").Pool(load.clients) as pool:
            results, wall = _send(pool, url, client_requests(load, vocab), load)
            _progress(f"{load.preset}: {len(results)} requests served in {wall:.1f} s")
            # (a closed loop measures throughput alone: no burst after it)
            more = [] if load.closed else _send(pool, url, burst(load), load)[0]
        idle = time.monotonic()
        while True:  # aborts take effect at the next step boundary
            text = httpx.get(f"{url}/metrics").text
            if _metric(text, "requests_running") == 0 or time.monotonic() - idle > 30:
                break
            time.sleep(0.05)
        results += more
        recovered = httpx.post(f"{url}/v1/completions", json={"prompt": [5, 6, 7],
                                                               "max_tokens": 4}).status_code
        facts = {"wall_s": wall, "kv_blocks_used": _metric(text, "kv_blocks_used"),
                 "metrics": text, "captured at start-up": captured,
                 "recovered": recovered, "health": httpx.get(f"{url}/health").status_code}
        proc.send_signal(signal.SIGTERM)
        facts["exit"] = proc.wait(120)
    except BaseException:
        _progress(f"{load.preset}: the server's last output:\n{server_log(proc)}")
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
    return results, facts


def _progress(line: str) -> None:
    print(f"bench serve: {line}", file=sys.stderr, flush=True)


def offline(load: Load, work: list[ClientRequest]
            ) -> tuple[dict[int, list[int]], float, float, float]:
    """The same requests (all at once) through `Engine.run`: (tokens per request, output
    tokens/s, median ms of its decode-only iterations, and the decode step at the load's
    batch: `load.max_batch` rows at the work's mean context (prompt and half the output),
    overlapped as `bench decode` times it; on the reference decoder the median again)."""
    cfg = preset(load.preset)
    if load.reference:
        engine = reference_engine(cfg, random_weights(cfg, 0), max_batch=load.max_batch,
                                  max_context=load.max_context,
                                  max_chunk=min(256, load.max_context),
                                  decode_chunk=load.decode_chunk)
    else:
        model = Model(cfg, random_weights(cfg, 0) if load.preset == "tiny" else None,
                      max_batch=load.max_batch, max_context=load.max_context,
                      max_chunk=min(256, load.max_context), max_chunk_seqs=min(8, load.max_batch),
                      batch_invariant=load.batch_invariant)
        engine = Engine(model, progress=False, mixed=load.mixed,
                        decode_chunk=load.decode_chunk)
    reqs = [Request(p.prompt, p.max_tokens) for p in work]
    t0 = time.perf_counter()
    engine.run(reqs)
    wall = time.perf_counter() - t0
    iteration = engine.stats.summary()["ms/step"]
    step = iteration
    if not load.reference:  # every request has finished: the cache is free for the step's
        ctx = round(statistics.mean(len(p.prompt) + p.max_tokens / 2 for p in work))
        slots = fill_contexts(engine.model, load.max_batch, ctx)
        step, _ = overlapped_step_ms(engine.runner, slots)
    engine.close()
    engine.model.close()
    tokens = sum(len(r.output) for r in reqs)
    return {p.i: r.output for p, r in zip(work, reqs)}, tokens / wall, iteration, step


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    return float(np.percentile(xs, q))


def _by_row_kind(text: str, name: str) -> float:
    """Sample `name` summed over the iteration kinds with decode rows (decode, mixed)."""
    return sum(sample(text, name, f'kind="{k}"') for k in ROW_KINDS)


def _continued(text: str) -> float:
    """The share of the server's iterations with decode rows that continued the last step
    on the device (`iterations_continued_total` over their count)."""
    steps = _by_row_kind(text, "iteration_seconds_count")
    return _by_row_kind(text, "iterations_continued_total") / steps if steps else math.nan


def _mean_rows(text: str) -> float:
    """Rows with a sequence per server iteration with decode rows (`decode_rows_total`
    over their count)."""
    steps = _by_row_kind(text, "iteration_seconds_count")
    return sample(text, "decode_rows_total") / steps if steps else math.nan


def measure(load: Load) -> dict[str, Any]:
    """One preset's row."""
    cfg = preset(load.preset)
    results, facts = served(load, cfg.vocab)
    streams = [r for r in results if not r["bad"]]
    taken = [r for r in streams if r["status"] == 200]
    done = [r for r in taken if not r["left"]]
    # the same work offline: every request the server took, one whose client left cut to
    # the tokens it had received (its prompt was prefilled and those tokens decoded)
    work = {p.i: p for p in client_requests(load, cfg.vocab)}
    replay = [dataclasses.replace(work[r["i"]], max_tokens=len(r["tokens"])) if r["left"]
              else work[r["i"]] for r in taken]
    t0 = time.monotonic()
    want, offline_tps, iteration_ms, step_ms = offline(load, replay)
    _progress(f"{load.preset}: {len(replay)} requests offline in {time.monotonic() - t0:.1f} s")
    ttft = [r["times"][0][0] for r in done if r["times"]] if load.stream else []
    itl = [g for r in done for (a, _), (b, n) in zip(r["times"], r["times"][1:])
           for g in [(b - a) / n] * n]
    served_tokens = sum(len(r["tokens"]) for r in streams)
    bad = [r for r in results if r["bad"] in ("json", "field", "max_tokens", "context")]
    burst = [r for r in results if r["bad"] == "burst"]
    itl_p99 = _pct(itl, 99) * 1e3
    return {
        "preset": load.preset, "closed-loop clients": load.closed, "streamed": load.stream,
        "engine": load.engine, "mixed": load.mixed, "batch invariant": load.batch_invariant,
        "HTTP processes": load.http_processes, "client processes": load.clients,
        "decode chunk": load.decode_chunk or min(256, load.max_context),
        "requests": load.requests, "batch": load.max_batch,
        "served tok/s": served_tokens / facts["wall_s"], "offline tok/s": offline_tps,
        "served / offline": served_tokens / facts["wall_s"] / offline_tps,
        "TTFT p50 ms": _pct(ttft, 50) * 1e3, "TTFT p99 ms": _pct(ttft, 99) * 1e3,
        "ITL p50 ms": _pct(itl, 50) * 1e3, "ITL p99 ms": itl_p99,
        "offline decode-only iteration ms": iteration_ms,
        "decode step ms": step_ms, "ITL p99 / step": itl_p99 / step_ms if step_ms else math.nan,
        # the server's own view (its /metrics after the run): the engine's iterations, its
        # thread's period and the ITL as the HTTP side relays tokens, against which the
        # clients' ITL shows the share of the sockets and the clients
        **{f"server {what} p{q} ms": 1e3 * quantile(facts["metrics"], name, q / 100, labels)
           for what, name, labels in (("decode", "iteration_seconds", 'kind="decode"'),
                                      ("mixed", "iteration_seconds", 'kind="mixed"'),
                                      ("mixed host", "iteration_host_seconds", 'kind="mixed"'),
                                      ("period", "iteration_period_seconds", ""),
                                      # as the HTTP side hands each stream its tokens
                                      ("ITL", "inter_token_latency_seconds", ""))
           for q in (50, 99)},
        # iterations with decode rows that continued the last step on the device, and the
        # others' (fed from the host: the rows changed) times
        "continued share": _continued(facts["metrics"]),
        # how full the batch ran: a closed loop's rows idle while their clients turn around
        "mean decode rows": _mean_rows(facts["metrics"]),
        **{f"server fed {k} p99 ms": 1e3 * quantile(facts["metrics"], "iteration_fed_seconds",
                                                     0.99, f'kind="{k}"')
           for k in ("decode", "mixed")},
        # the engine process's collector: objects frozen at start-up, full passes since
        "gc frozen objects": int(sample(facts["metrics"], "gc_frozen_objects")),
        "gc full passes": int(sample(facts["metrics"], "gc_pause_seconds_count",
                                     'generation="2"')),
        "gc full pass p99 ms": 1e3 * quantile(facts["metrics"], "gc_pause_seconds", 0.99,
                                              'generation="2"'),
        # the engine's graphs: captured while serving (a miss: an iteration waited for it),
        # and evicted to keep the pool within its budget
        "graph captures in load": int(sample(facts["metrics"], "graph_captures_total")
                                      - facts["captured at start-up"]),
        "graph evictions": int(sample(facts["metrics"], "graph_evictions_total")),
        "sent": len(results), "completed": len(done),
        "cancelled": sum(r["left"] for r in streams),
        "refused 4xx": sum(400 <= r["status"] < 500 and r["status"] != 429 for r in bad),
        "burst 429": sum(r["status"] == 429 for r in burst),
        "burst ok": sum(r["status"] == 200 for r in burst),
        "unexpected": sum(r["status"] not in (200, 400, 404, 429) for r in results)
        + sum(r["status"] != 400 for r in bad) + sum(r["status"] not in (200, 429)
                                                     for r in burst),
        "tokens lost": sum(abs((r["usage"] or 0) - len(r["tokens"])) for r in done),
        "KV blocks leaked": int(facts["kv_blocks_used"]),
        "streams unlike offline": sum(r["tokens"] != want[r["i"]] for r in done),
        "recovered": facts["recovered"] == 200, "exit": facts["exit"],
    }


# the latency rows' --decode-chunk: the most prompt tokens beside decoding rows for which
# the preset's ITL p99 stays under 2x its step with rows in place (1B 1.67x at 48, 2.10x at
# 64; 8B 1.74x at 128; benchmarks/NOTES.md, "Serving")
LATENCY_CHUNK = {"llama-1b": 48, "llama-8b": 128}
HTTP_PROCESSES = 4  # the several-event-loops row's --http-processes (llama-1b: most tokens/s)


# the closed-loop rows, (preset, --max-batch, clients, streamed[, --http-processes]): the
# batch held full by as many clients as it holds, and by twice as many, streamed and whole;
# llama-1b's streams also over HTTP_PROCESSES event loops (one loop streams ~25k tokens/s,
# below 1B's offline rate at 64 rows and more: it falls behind, merging tokens into fewer
# events); 512 requests of 256 prompt ids and 128 tokens
CLOSED = (("llama-1b", 64, 64, True), ("llama-1b", 64, 64, False), ("llama-1b", 64, 128, True),
          ("llama-1b", 128, 128, True), ("llama-1b", 128, 128, False),
          ("llama-1b", 64, 64, True, HTTP_PROCESSES), ("llama-1b", 128, 128, True, HTTP_PROCESSES),
          ("llama-8b", 64, 64, True), ("llama-8b", 64, 64, False))


def closed_load(name: str, batch: int, clients: int, stream: bool = True,
                http_processes: int = 1) -> Load:
    """A closed-loop row's load: throughput at saturation, no faults; `stream` False: whole
    responses."""
    return Load(preset=name, requests=512, prompt=(256, 256), output=(128, 128), leave=0.0,
                malformed=0, max_batch=batch, max_context=2048, closed=clients, stream=stream,
                http_processes=http_processes)


def run(only: str = "") -> list[dict[str, Any]]:
    """llama-1b and llama-8b (or the presets whose names contain `only`), the engine in its
    own process as `rawgraph serve` starts it, then tuned for inter-token latency (`--mixed
    --decode-chunk N`, N the preset's LATENCY_CHUNK: at most that many prompt tokens ride
    along with the decoding rows, in one pass over the weights); llama-1b (the shortest
    steps) also with the engine on the server's thread, and with HTTP_PROCESSES event
    loops, and in the batch-invariant mode (its streams all as offline's); then the CLOSED
    rows (`only` "closed": those alone)."""
    names = [n for n in ("llama-1b", "llama-8b") if only in n]
    loads = [Load(preset=n) for n in names]
    loads += [Load(preset=n, mixed=True, decode_chunk=LATENCY_CHUNK[n]) for n in names]
    loads += [Load(preset=n, engine="thread") for n in ("llama-1b",) if only in n]
    loads += [Load(preset=n, http_processes=HTTP_PROCESSES) for n in ("llama-1b",) if only in n]
    # every stream as offline's: the batch-invariant mode (#72)
    loads += [Load(preset=n, batch_invariant=True) for n in ("llama-1b",) if only in n]
    loads += [closed_load(*row) for row in CLOSED if only in row[0] or only == "closed"]
    return [measure(load) for load in loads]


def _http(r: dict[str, Any]) -> str:
    n = r.get("HTTP processes", 1)
    return f", {n} HTTP processes" if n > 1 else ""


def _closed(r: dict[str, Any]) -> str:
    n = r.get("closed-loop clients", 0)
    whole = "" if r.get("streamed", True) else ", whole responses"
    return f", batch {r['batch']}, {n} clients in a closed loop{whole}" if n else ""


def summary(rows: list[dict[str, Any]]) -> str:
    """One line per preset on the goals: served >= 90% of offline; ITL p99 <= 2 steps."""
    return "\n".join(
        f"{r['preset']} (engine on a {r['engine']}{', mixed' if r['mixed'] else ''}{_http(r)}"
        f"{', batch-invariant' if r.get('batch invariant') else ''}"
        f"{_closed(r)}, decode chunk {r['decode chunk']}): served {r['served / offline']:.0%} of "
        f"offline (goal 90%); "
        + (f"ITL p99 {r['ITL p99 / step']:.2f}x the decode step (goal <= 2); "
           if r.get("streamed", True) else "")
        + (f"streams unlike offline {r['streams unlike offline']} (goal 0); "
           if r.get("batch invariant") else "")
        + (f"{r['mean decode rows']:.1f} of {r['batch']} rows busy; "
           if r.get("closed-loop clients") else "")
        + f"tokens lost {r['tokens lost']}, KV blocks leaked {r['KV blocks leaked']}"
        for r in rows)

