"""The engine: requests in, tokens out, through continuous batching over bucketed decode
graphs and chunked prefill graphs (or the same launches run eagerly, `graphs=False`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rawgraph.engine.request import Request
from rawgraph.engine.runner import IterStats, Pending, Runner
from rawgraph.engine.scheduler import Scheduler
from rawgraph.model.program import Model
from rawgraph.ops.sampling import SamplingParams


@dataclass
class EngineStats:
    """Per-iteration records and what they add up to."""

    iters: list[IterStats] = field(default_factory=list)
    wall_s: float = 0.0
    first_tokens: int = 0  # tokens sampled at the end of a prompt (by prefill chunks)
    capture: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Aggregates: tokens/s, ms per decode-only step, host and patch cost per step."""
        its = self.iters
        dec = [i for i in its if i.decode_rows and not i.prefill_tokens]
        tokens = sum(i.decode_rows for i in its) + self.first_tokens
        med = lambda xs: statistics.median(xs) if xs else 0.0  # noqa: E731
        return {"iterations": len(its), "decode steps": len(dec), "tokens out": tokens,
                "tokens/s": tokens / self.wall_s if self.wall_s else 0.0,
                "ms/step": med([i.wall_ms for i in dec]),
                "host us/step": med([i.host_us for i in dec]),
                "patch us/step": med([i.patch_us for i in dec]),
                "nodes patched/step": statistics.mean(i.patched for i in dec) if dec else 0.0,
                "eager iterations": sum(bool(i.eager) for i in its), **self.capture}


class Engine:
    """Generates tokens for requests that arrive and finish between iterations.

    `graphs=False` runs the same launches eagerly (the comparison baseline); `capture`
    ('upfront' or 'lazy') says when the graphs are made; `pdl`: decode kernels with
    programmatic dependent launch (see Runner). `overlap`: while the same requests keep
    decoding, each step is launched before the previous step's tokens are read (they feed
    it on the device), so the host's work per step hides behind the GPU's; a request that
    stops at a stop id has one step computed past it, which is discarded. Tokens are the
    same either way.
    """

    def __init__(self, model: Model, *, graphs: bool = True, capture: str = "upfront",
                 buckets: Sequence[int] | None = None, chunks: Sequence[int] | None = None,
                 streams: int = 2, progress: bool = True, max_graphs: int = 64,
                 max_graph_bytes: int = 1 << 30, pdl: bool = True, overlap: bool = True):
        if capture not in ("upfront", "lazy"):
            raise ValueError(f"capture = {capture!r}: 'upfront' or 'lazy'")
        self.model = model
        self.runner = Runner(model, graphs=graphs, buckets=buckets, chunks=chunks,
                             streams=streams, max_graphs=max_graphs,
                             max_graph_bytes=max_graph_bytes, pdl=pdl)
        kv = model.kv
        self.scheduler = Scheduler(max_seqs=model.max_batch,
                                   chunk_tokens=self.runner.chunks[-1],
                                   chunk_seqs=model.max_chunk_seqs,
                                   num_blocks=kv.tables.alloc.num_blocks,
                                   block_size=kv.block_size, max_context=model.max_context)
        self.stats = EngineStats()
        self.steps = 0
        self.overlap = overlap
        self._ahead: tuple[list[Request], Pending] | None = None  # launched, tokens unread
        if graphs and capture == "upfront":
            self.stats.capture = self.runner.capture_all(progress)

    def add(self, request: Request) -> Request:
        """Queue a request; ValueError if it could never run (context, cache, token ids)."""
        if not all(0 <= t < self.model.cfg.vocab for t in request.prompt):
            raise ValueError(f"{request.name}: prompt token ids outside [0, "
                             f"{self.model.cfg.vocab})")
        self.scheduler.add(request)
        return request

    def step(self) -> list[Request]:
        """One iteration: admit, run a prefill chunk and a decode step, retire finished
        requests (returned). With `overlap`, a decode step of the same rows as the last one
        is launched first and the last one's tokens are read after it."""
        t0 = time.perf_counter()
        sch, done = self.scheduler, []
        sch.admit(self.steps)
        plan = sch.plan()
        st = None
        if self._ahead is not None:
            rows, pending = self._ahead
            self._ahead = None
            if self._follows(plan, rows):
                nxt = self.runner.launch([], [r.slot for r in rows], None, follow=True)
                self._ahead, st = (rows, nxt), nxt.st
                plan = None  # this iteration is launched
            self._read(rows, pending, done)
            if plan is not None:  # the rows changed: plan again with the tokens read
                plan = sch.plan()
        if plan is not None and (plan.prefill or plan.decode):
            pending = self.runner.launch([p for _, p in plan.prefill],
                                         [r.slot for r in plan.decode],
                                         [r.output[-1] for r in plan.decode])
            st = pending.st
            if self.overlap and not plan.prefill:
                self._ahead = (plan.decode, pending)
            else:
                first, nxt, _ = self.runner.collect(pending)
                for (r, piece), tok in zip(plan.prefill, first):
                    r.prefilled += len(piece.tokens)
                    if r.prefilled == len(r.prompt):  # the prompt's last logits: a real token
                        self.stats.first_tokens += 1
                        self._emit(r, tok, done)
                for r, tok in zip(plan.decode, nxt):
                    self._emit(r, tok, done)
        wall = time.perf_counter() - t0
        if st is not None:  # an iteration was launched: it is timed by this call
            st.wall_ms = wall * 1e3
            self.stats.iters.append(st)
        self.stats.wall_s += wall
        self.steps += 1
        return done

    def _follows(self, plan: Any, rows: list[Request]) -> bool:
        """Whether this iteration is a decode step of exactly `rows` (in order), each with
        room for the token after the one still on its way."""
        return (not plan.prefill and len(plan.decode) == len(rows)
                and all(a is b for a, b in zip(plan.decode, rows))
                and all(len(r.output) + 2 <= r.max_new_tokens for r in rows))

    def _read(self, rows: list[Request], pending: Pending, done: list[Request]) -> None:
        """Tokens of a launched decode step; rows that finished meanwhile drop theirs."""
        _, nxt, _ = self.runner.collect(pending)
        for r, tok in zip(rows, nxt):
            if not r.finish:
                self._emit(r, tok, done)

    def drain(self) -> list[Request]:
        """Read the decode step still on its way, if any; requests it finishes."""
        done: list[Request] = []
        if self._ahead is not None:
            t0 = time.perf_counter()
            rows, pending = self._ahead
            self._ahead = None
            self._read(rows, pending, done)
            self.stats.wall_s += time.perf_counter() - t0
        return done

    def _emit(self, r: Request, tok: int, done: list[Request]) -> None:
        r.output.append(tok)
        if r.first_step < 0:
            r.first_step = self.steps
        r.last_step = self.steps
        why = "stop" if tok in r.stop else "length" if len(r.output) >= r.max_new_tokens \
            else ""
        if why:
            self.scheduler.finish(r, why)
            self.model.free(r.slot)
            done.append(r)

    def run(self, requests: Sequence[Request], max_steps: int = 1_000_000) -> list[Request]:
        """Run until every request has finished; returns them in the order given."""
        for r in requests:
            self.add(r)
        while not self.scheduler.idle:
            if self.steps >= max_steps:
                raise RuntimeError(f"requests still running after {max_steps} steps")
            self.step()
        self.drain()  # a step launched past the last tokens: its rows have all finished
        return list(requests)

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int = 32,
                 sampling: SamplingParams | None = None,
                 stop: Sequence[int] = ()) -> list[list[int]]:
        """Token ids generated for each prompt (all arriving at once)."""
        reqs = [Request(list(p), max_new_tokens, sampling or SamplingParams(), frozenset(stop))
                for p in prompts]
        return [r.output for r in self.run(reqs)]

    def close(self) -> None:
        """Destroy the graphs (the model stays usable)."""
        self.drain()
        self.runner.close()
