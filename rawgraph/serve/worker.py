"""The thread that owns the engine (and so the GPU): requests in through a lock-guarded inbox,
events out through `post` as each iteration commits (by default to each request's asyncio
queue, all of an iteration's in one wake-up of the loop; in an engine process, to its pipe).

The HTTP side never touches the engine. `submit` queues a job and returns at once; the
worker admits it (the engine's own checks decide: an "error" event, or "accepted"), steps
the engine while anything runs, and after every committed iteration sends each job its new
tokens ("tokens", with their log-probabilities when asked; before them once, "prompt" with
the prompt's) and, when it ends, "finish" with the reason and the prompt tokens it found in
the prefix cache. `abort` ends a job at the next
step boundary (a client gone, a stop string met, a deadline passed).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rawgraph.engine.engine import Engine
from rawgraph.engine.request import Request
from rawgraph.serve.collector import PauseClock
from rawgraph.serve.metrics import GENERATIONS, Metrics
from rawgraph.serve.protocol import APIError

log = logging.getLogger("rawgraph.serve")
FAILURES = 3  # iterations in a row that raise before the running requests are failed


@dataclass(eq=False)
class Job:
    """A request on its way through the worker, and where its events go (`loop`'s queue;
    `id` names it across a process boundary)."""

    request: Request
    loop: asyncio.AbstractEventLoop | None
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    sent: int = 0  # tokens already sent
    prompt_sent: bool = False  # the prompt's log-probabilities, when asked
    done: bool = False
    id: int = field(default_factory=lambda: next(_ids))


_ids = itertools.count()
Post = Callable[[list[tuple[Job, tuple]]], None]  # events from the engine's thread


def post_to_loops(events: list[tuple[Job, tuple]]) -> None:
    """Hand events to their jobs' queues, one wake-up per event loop for the lot: a step's
    events for every stream in one call (each call_soon_threadsafe writes the loop's
    wake-up pipe)."""
    by_loop: dict[Any, list[tuple[Job, tuple]]] = {}
    for job, event in events:
        by_loop.setdefault(job.loop, []).append((job, event))
    for loop, mine in by_loop.items():
        def deliver(mine: list[tuple[Job, tuple]] = mine) -> None:
            for job, event in mine:
                job.events.put_nowait(event)
        try:
            loop.call_soon_threadsafe(deliver)
        except RuntimeError:  # the handlers' loop has closed: nobody is listening
            pass


class Worker:
    """Runs `engine` on its own thread; `max_queue` jobs may wait for admission; `post` takes
    each iteration's events (with the metrics already updated)."""

    def __init__(self, engine: Engine, metrics: Metrics, *, max_queue: int = 256,
                 idle_s: float = 0.05, post: Post = post_to_loops):
        self.engine, self.metrics, self.max_queue, self.idle_s = engine, metrics, max_queue, \
            idle_s
        self._post = post  # where events go: the jobs' event loops, or a pipe
        self._lock = threading.Condition()
        self._inbox: list[Job] = []
        self._aborts: list[Job] = []
        self._jobs: list[Job] = []   # admitted, not finished
        self._counted = 0            # engine iterations counted into the metrics
        self._stepped = 0.0          # when the last step started (0: the engine was idle)
        self._gc = PauseClock()      # this process's collector passes, into the metrics
        self._admitting = True
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="rawgraph-engine", daemon=True)
        t = engine.model.kv.tables
        metrics.kv_blocks_total = t.alloc.num_blocks
        with metrics.lock:  # the graphs captured at start-up, before any request
            self._graph_metrics(metrics)

    def _graph_metrics(self, m: Metrics) -> None:
        """The engine's graph pool into `m`, its lock held (the reference decoder has no
        pool)."""
        pool = getattr(self.engine.runner, "pool", None)
        if pool is not None:
            m.graphs, m.graph_bytes = len(pool), pool.nbytes
            m.graph_captures, m.graph_evictions = pool.captures, pool.evictions

    def start(self) -> None:
        """Start the engine's thread."""
        self._thread.start()

    @property
    def admitting(self) -> bool:
        """Whether new requests are taken (False once shutting down)."""
        return self._admitting

    @property
    def load(self) -> tuple[int, int]:
        """(jobs running, jobs waiting)."""
        with self._lock:
            return len(self._jobs), len(self._inbox) + len(self.engine.scheduler.waiting)

    def submit(self, job: Job) -> None:
        """Queue a job; APIError 503 when shutting down, 429 when the queue is full."""
        with self._lock:
            if not self._admitting:
                raise APIError(503, "the server is shutting down", kind="server_error")
            waiting = len(self._inbox) + len(self.engine.scheduler.waiting)
            if waiting >= self.max_queue:
                raise APIError(429, f"{waiting} requests are waiting (--max-queue "
                               f"{self.max_queue}); retry shortly", kind="rate_limit_error",
                               headers={"Retry-After": "1"})
            self._inbox.append(job)
            self._lock.notify()

    def abort(self, job: Job) -> None:
        """End a job at the next step boundary (nothing if it has ended)."""
        with self._lock:
            if not job.done:
                self._aborts.append(job)
                self._lock.notify()

    def drain_and_stop(self, grace_s: float) -> None:
        """Stop admitting; let running jobs finish for up to `grace_s`, abort the rest (their
        streams end with finish "abort"), then stop the thread."""
        with self._lock:
            self._admitting = False
            for job in self._inbox:  # queued, never admitted
                job.done = True
            self._post([(job, ("error", APIError(503, "the server is shutting down",
                                                 kind="server_error"))) for job in self._inbox])
            self._inbox.clear()
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self.load[0]:
            time.sleep(0.01)
        with self._lock:
            self._aborts.extend(self._jobs)
            self._lock.notify()
        while self.load[0] and self._thread.is_alive():
            time.sleep(0.01)
        self.stop()

    def stop(self) -> None:
        """Stop the thread (jobs still running get no more events)."""
        with self._lock:
            self._stop = True
            self._lock.notify()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
        self._gc.close()

    # -- the engine's thread ---------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while True:
            with self._lock:
                busy = self._inbox or self._aborts or not self.engine.scheduler.idle
                if not busy and not self._stop:
                    self._lock.wait(self.idle_s)
                if self._stop:
                    return
                inbox, self._inbox = self._inbox, []
                aborts, self._aborts = self._aborts, []
            try:
                failures = self._iterate(inbox, aborts, failures)
            except Exception:  # a bug outside the engine's step: keep the thread serving
                log.exception("the engine's thread hit an error; it goes on")

    def _iterate(self, inbox: list[Job], aborts: list[Job], failures: int) -> int:
        """Admit, abort, step once (or drain when idle), publish; the failures in a row."""
        self._admit(inbox)
        for job in aborts:
            self.engine.abort(job.request)
        if self.engine.scheduler.idle:
            self.engine.drain()  # a step launched past the last tokens
            self._publish()
            self._stepped = 0.0
            return failures
        now = time.monotonic()
        if self._stepped:
            with self.metrics.lock:
                self.metrics.period.observe(now - self._stepped)
        self._stepped = now
        try:
            self.engine.step()
            failures = 0
        except Exception:  # rolled back by the engine; try again, then give up on them
            failures += 1
            log.exception("an engine iteration failed (%d in a row)", failures)
            with self.metrics.lock:
                self.metrics.step_failures += 1
            if failures >= FAILURES:
                self._fail_all()
                failures = 0
        self._publish()
        return failures

    def _admit(self, inbox: list[Job]) -> None:
        for job in inbox:
            try:
                self.engine.add(job.request)
            except (TypeError, ValueError) as e:
                job.done = True
                with self.metrics.lock:
                    self.metrics.requests["refused"] += 1
                self._post([(job, ("error", APIError(400, str(e))))])
                continue
            self._jobs.append(job)
            with self.metrics.lock:
                self.metrics.prompt_tokens += len(job.request.prompt)
            self._post([(job, ("accepted",))])

    def _publish(self) -> None:
        """Each job's new tokens; the end of those that finished."""
        m, sch = self.metrics, self.engine.scheduler
        sent, ended = 0, False
        out: list[tuple[Job, tuple]] = []
        for job in self._jobs:  # every running row, every iteration: kept lean
            r = job.request
            if (not job.prompt_sent and r.sampling.prompt_logprobs is not None
                    and len(r.prompt_logprobs) == len(r.prompt)):
                job.prompt_sent = True
                out.append((job, ("prompt", r.prompt_logprobs)))
            k, n = job.sent, len(r.output)
            if n > k:
                new = r.output[k:]
                lps = None if r.sampling.logprobs is None else r.logprobs[k:n]
                job.sent = n
                sent += n - k
                out.append((job, ("tokens", new, lps)))
            if r.finish and r not in sch.running:  # retired: its slot and blocks are free
                job.done = ended = True
                out.append((job, ("finish", r.finish, r.cached)))
                with m.lock:
                    m.requests["aborted" if r.finish == "abort" else "completed"] += 1
                    m.cached_tokens.observe(r.cached)
        if ended:
            with self._lock:
                self._jobs = [j for j in self._jobs if not j.done]
        if sent:
            m.tokens_out(sent)
        st, last = self.engine.stats, self.engine.stats.iters
        with m.lock:
            m.running, m.waiting = len(sch.running), len(sch.waiting)
            m.batch = last[-1].decode_rows if last else 0
            t = self.engine.model.kv.tables
            m.kv_blocks_used = t.alloc.num_blocks - t.alloc.num_free
            m.iterations = {"graph": st.iterations - st.eager_iterations,
                            "eager": st.eager_iterations}
            m.decode_steps = st.decode_steps
            m.prompt_tokens_started, m.prompt_tokens_cached = st.prompt_tokens, st.cached_tokens
            prefix = self.engine.prefix
            m.prefix_blocks = 0 if prefix is None else prefix.blocks
            m.prefix_evictions = t.alloc.evictions
            self._graph_metrics(m)
            new = min(st.iterations - self._counted, len(last))  # iterations since the last
            for it in (last[-i] for i in range(new, 0, -1)):  # near the end: O(1) each
                m.nodes_patched += it.patched
                m.decode_rows += it.decode_rows
                kind = "mixed" if it.prefill_tokens and it.decode_rows else \
                    "prefill" if it.prefill_tokens else "decode"
                m.iteration[kind].observe(it.wall_ms / 1e3)
                m.host[kind].observe(it.host_us / 1e6)
                if kind in m.continued and it.follow:
                    m.continued[kind] += 1
                elif kind in m.fed:
                    m.fed[kind].observe(it.wall_ms / 1e3)
            for generation, seconds in self._gc.drain():  # an interpreter with more
                m.gc_pause[min(generation, GENERATIONS[-1])].observe(seconds)  # goes oldest
        self._counted = st.iterations
        # after the metrics: a post across a process carries them (every iteration, events
        # or not, so the other side's view of the engine is never a step old)
        self._post(out)

    def _fail_all(self) -> None:
        """Iterations keep failing: end every running job with an error (aborted in the
        engine, so their slots and blocks come back)."""
        for job in self._jobs:
            self.engine.abort(job.request)
            job.done = True
            self._post([(job, ("error", APIError(500, "the engine failed repeatedly on this "
                                                      "batch", kind="server_error")))])
            with self.metrics.lock:
                self.metrics.requests["failed"] += 1
        self._jobs = []
        try:
            self.engine.step()  # the aborts take effect: slots and blocks free
        except Exception:
            log.exception("an engine iteration failed while ending the failed requests")
