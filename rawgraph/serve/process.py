"""The engine in a process of its own: `EngineProcess` starts it (the engine, and the `Worker`
thread that steps it, in a child process that alone touches the GPU) and is the main HTTP
process's `Worker` (submit, abort, load, admitting, metrics, drain_and_stop, stop); each other
HTTP process (`rawgraph serve --http-processes`) reaches the same engine through an
`EngineLink` of its own.

Why a process (`rawgraph serve`'s default; `--engine thread` for the other): on a thread, the
event loop's Python for each streamed token (the relay, the SSE chunk, uvicorn's send;
benchmarks/NOTES.md, "Serving") and the engine's host work between steps take turns at one
interpreter lock, and at LLaMA-1B's short steps the engine's next launch can wait for the loop;
in a process of its own it never does. It pays for the pipe: `bench serve` (llama-1b both ways,
H200, two runs) served 88-92% of offline throughput in a process, 72-74% on a thread. Over one
pipe each way per HTTP process: requests and aborts go down; each iteration's events for that
process's jobs (the worker's `post`) and the engine's metrics come up, read by a thread that
hands them to the event loop in one wake-up. Draining (the main process's SIGTERM) reaches the
other HTTP processes as a message on their pipes; a pipe that closes aborts its jobs.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import pickle
import signal
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Any

from rawgraph.serve.collector import freeze_startup_heap
from rawgraph.serve.engine import build
from rawgraph.serve.metrics import Metrics
from rawgraph.serve.protocol import APIError
from rawgraph.serve.worker import Job, Worker, post_to_loops

log = logging.getLogger("rawgraph.serve")
# the engine's Metrics fields that come up with each step's events (the iteration
# histograms among them; the token latency histograms and tokens per second are measured on
# the HTTP side)
SHARED = ("requests", "prompt_tokens", "running", "waiting", "batch", "kv_blocks_used",
          "kv_blocks_total", "iterations", "decode_steps", "decode_rows", "nodes_patched",
          "step_failures", "graphs", "graph_bytes", "graph_captures", "graph_evictions",
          "iteration", "host", "period", "continued", "fed", "gc_pause", "gc_frozen")
# seconds: while jobs stream and none ends, a link whose jobs had no events in an iteration
# gets the metrics at most this often (one with events gets them with its events)
SNAPSHOT_S = 0.01


def _wire(event: tuple) -> tuple:
    """An event as the pipe carries it (an APIError as its fields)."""
    if event[0] == "error":
        e = event[1]
        return ("error", (e.status, e.message, e.param, e.kind, e.headers))
    return event


def _unwire(event: tuple) -> tuple:
    return ("error", APIError(*event[1])) if event[0] == "error" else event


class _Links:
    """The engine process's side of the HTTP processes' pipes (link 0 is the main process's,
    which alone drains or stops the engine): which link each job came by, and sends to each
    under one lock (the worker's thread and the main thread both send)."""

    def __init__(self, conns: list[Connection]):
        self.live = dict(enumerate(conns))
        self.of: dict[Job, int] = {}  # open jobs and their links
        self.jobs: dict[tuple[int, int], Job] = {}  # by (link, the job's id on that link)
        self.lock = threading.Lock()
        self._all_told = 0.0  # when every link last had the metrics

    def send(self, i: int, msg: tuple) -> None:
        """Send to link i (nothing if its process is gone: its reader finds out)."""
        with self.lock:
            conn = self.live.get(i)
            if conn is not None:
                try:
                    conn.send(msg)
                except (OSError, ValueError):
                    pass

    def broadcast(self, msg: tuple) -> None:
        """Send to every live link."""
        for i in list(self.live):
            self.send(i, msg)

    def post(self, events: list[tuple[Job, tuple]], metrics: Metrics,
             load: tuple[int, int]) -> None:
        """An iteration's events (the worker's `post`), each to its job's link with the
        engine's metrics and load. Every link gets the metrics when a job ends (the request
        counters move), when there are no events (an idle engine's last state), or when
        they are SNAPSHOT_S old; otherwise only the links with events do (at 128 rows a
        send costs the engine tens of us a link)."""
        mine: dict[int, list] = {}
        ended = False
        for job, event in events:
            i = self.of.get(job)
            if i is None:
                continue
            if event[0] in ("finish", "error"):
                del self.of[job]
                self.jobs.pop((i, job.id), None)
                ended = True
            mine.setdefault(i, []).append((job.id, _wire(event)))
        now = time.monotonic()
        with self.lock:
            every = ended or not mine or now - self._all_told >= SNAPSHOT_S
            to = list(self.live) if every else [i for i in mine if i in self.live]
        if not to:
            return
        if every:
            self._all_told = now
        # pickled once for every link (each HTTP process unpickles its own copy)
        snapshot = pickle.dumps({k: getattr(metrics, k) for k in SHARED},
                                pickle.HIGHEST_PROTOCOL)
        for i in to:
            self.send(i, ("events", mine.get(i, []), snapshot, load))


def _child(conns: list[Connection], args: argparse.Namespace) -> None:
    """The engine's process: build the engine, run its worker, obey the pipes."""
    # a Ctrl-C or a SIGTERM to the whole process group is the server's to handle (it drains
    # through the pipe); this process ends when told to, or when the main pipe closes
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    links = _Links(conns)
    try:
        engine, _ = build(args)
    except Exception as e:  # the checkpoint or options refused: the parent says it in one line
        links.broadcast(("failed", f"{e}" if isinstance(e, ValueError) else f"{e!r}"))
        return
    metrics = Metrics()
    metrics.gc_frozen = freeze_startup_heap()  # the engine and its graphs: built to stay

    def post(events: list[tuple[Job, tuple]]) -> None:
        links.post(events, metrics, worker.load)

    worker = Worker(engine, metrics, max_queue=args.max_queue, post=post)
    worker.start()
    links.broadcast(("ready", {k: getattr(metrics, k) for k in SHARED}))
    try:
        _obey(links, worker)
    finally:
        engine.close()
        engine.model.close()
        links.broadcast(("stopped",))


def _obey(links: _Links, worker: Worker) -> None:
    """Read the links until the main one says drain or stop, or closes."""
    jobs = links.jobs
    index = {id(conn): i for i, conn in links.live.items()}
    while True:
        for conn in wait(list(links.live.values())):
            i = index[id(conn)]
            try:
                msg = conn.recv()  # type: ignore[union-attr]
            except (EOFError, OSError):  # that HTTP process is gone
                if i == 0:  # the server is gone
                    worker.stop()
                    return
                with links.lock:
                    del links.live[i]
                for (j, _), job in list(jobs.items()):
                    if j == i:
                        worker.abort(job)  # its blocks come back at the next step
                continue
            if msg[0] == "submit":
                job = jobs[i, msg[1]] = Job(msg[2], None, id=msg[1])
                links.of[job] = i
                try:
                    worker.submit(job)
                except APIError as e:  # a full queue, a shutdown
                    links.of.pop(job, None)
                    jobs.pop((i, msg[1]), None)
                    links.send(i, ("events", [(msg[1], _wire(("error", e)))], None,
                                   worker.load))
            elif msg[0] == "abort":
                if (i, msg[1]) in jobs:
                    worker.abort(jobs[i, msg[1]])
            elif msg[0] == "drain" and i == 0:
                for j in list(links.live):
                    if j:
                        links.send(j, ("draining",))
                worker.drain_and_stop(msg[1])
                return
            elif msg[0] == "stop" and i == 0:
                worker.stop()
                return


class EngineLink:
    """The `Worker` an HTTP process's handlers talk to, over its pipe `conn` to the engine's
    process (built elsewhere: `EngineProcess`). `start` returns once the engine is built
    (ValueError with the engine process's message when the checkpoint or the options are
    refused). `draining` turns True when the main process starts draining the engine."""

    def __init__(self, conn: Connection, metrics: Metrics):
        self._conn = conn
        self.metrics = metrics
        self._jobs: dict[int, Job] = {}
        self._lock = threading.Lock()  # the jobs, and sends to the pipe
        self._admitting = False
        self.draining = False
        self._load = (0, 0)
        self._reader = threading.Thread(target=self._read, name="rawgraph-engine-pipe",
                                        daemon=True)

    def start(self) -> None:
        """Wait until the engine is built, then read its events."""
        try:
            msg = self._conn.recv()
        except EOFError:
            raise RuntimeError("the engine process exited before its engine was built"
                               ) from None
        if msg[0] == "failed":
            raise ValueError(msg[1])
        self._apply(msg[1])
        self._admitting = True
        self._reader.start()

    @property
    def admitting(self) -> bool:
        """Whether new requests are taken (False once shutting down, or the engine gone)."""
        return self._admitting

    @property
    def load(self) -> tuple[int, int]:
        """(jobs running, jobs waiting), as of the engine's last step."""
        return self._load

    @property
    def ended(self) -> bool:
        """Whether the engine has stopped or its process is gone (after `start`)."""
        return self._reader.ident is not None and not self._reader.is_alive()

    def submit(self, job: Job) -> None:
        """Queue a job; APIError 503 when shutting down (a full queue is the engine's to
        say: an "error" event with 429)."""
        if not self._admitting:
            raise APIError(503, "the server is shutting down", kind="server_error")
        with self._lock:
            try:
                self._conn.send(("submit", job.id, job.request))
            except (OSError, ValueError):  # the engine's process is gone
                self._admitting = False
                raise APIError(503, "the engine process ended", kind="server_error") from None
            self._jobs[job.id] = job

    def abort(self, job: Job) -> None:
        """End a job at the engine's next step boundary (nothing if it has ended)."""
        with self._lock:
            if job.id in self._jobs:
                self._send(("abort", job.id))

    def drain_and_stop(self, grace_s: float) -> None:
        """Stop admitting; wait until this link's jobs have ended (the main process drains
        the engine, which ends them within its grace; 10 s more at most), then close the
        pipe."""
        self._admitting = False
        deadline = time.monotonic() + grace_s + 10
        while self._jobs and self._reader.is_alive() and time.monotonic() < deadline:
            self._reader.join(0.05)
        self.stop()

    def stop(self) -> None:
        """Close the pipe (the engine aborts this link's jobs still running)."""
        self._admitting = False
        with self._lock:
            self._conn.close()
        # the reader ends on the engine's "stopped"; a closed pipe need not wake it, and it
        # is a daemon thread
        if self._reader.is_alive():
            self._reader.join(1.0)

    def _send(self, msg: tuple) -> None:
        try:
            self._conn.send(msg)
        except (OSError, ValueError):  # the process is gone already
            pass

    def _apply(self, snapshot: dict[str, Any] | bytes | None) -> None:
        """The engine's metrics into this process's (a step's come pickled: `post`)."""
        if isinstance(snapshot, bytes):
            snapshot = pickle.loads(snapshot)
        with self.metrics.lock:
            for k, v in (snapshot or {}).items():
                setattr(self.metrics, k, v)
            self.metrics.publish()

    def _read(self) -> None:
        """The pipe's reader: events to the jobs' loops, the engine's metrics and load."""
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                break
            if msg[0] == "stopped":
                break
            if msg[0] == "draining":
                self._admitting, self.draining = False, True
                continue
            _, events, snapshot, self._load = msg
            out, tokens = [], 0
            with self._lock:
                for jid, event in events:
                    job = self._jobs.get(jid)
                    if job is None:
                        continue
                    event = _unwire(event)
                    if event[0] == "tokens":
                        tokens += len(event[1])
                    elif event[0] in ("finish", "error"):
                        job.done = True
                        del self._jobs[jid]
                    out.append((job, event))
            if tokens:
                self.metrics.tokens_out(tokens)
            self._apply(snapshot)
            post_to_loops(out)
        self._gone()

    def _gone(self) -> None:
        """The engine's process has ended: jobs still open end with an error."""
        self._admitting = False
        with self._lock:
            jobs, self._jobs = list(self._jobs.values()), {}
        if jobs:
            log.error("the engine process ended with %d requests open", len(jobs))
            err = APIError(500, "the engine process ended", kind="server_error")
            for job in jobs:
                job.done = True
            post_to_loops([(job, ("error", err)) for job in jobs])


class EngineProcess(EngineLink):
    """The engine's process, built from the serve options `args` (`rawgraph serve`'s), and
    the main HTTP process's link to it; `links` pipes in all, the others' ends in
    `other_ends` for the other HTTP processes (`EngineLink`). `start` returns once the
    engine is built (ValueError with the child's message when the checkpoint or the
    options are refused)."""

    def __init__(self, args: argparse.Namespace, metrics: Metrics, links: int = 1):
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no CUDA inherited
        pipes = [ctx.Pipe() for _ in range(links)]
        super().__init__(pipes[0][0], metrics)
        self.other_ends = [ours for ours, _ in pipes[1:]]
        self._proc = ctx.Process(target=_child, args=([theirs for _, theirs in pipes], args),
                                 name="rawgraph-engine", daemon=True)

    def start(self) -> None:
        """Start the engine's process; return once its engine is built."""
        self._proc.start()
        try:
            super().start()
        except (RuntimeError, ValueError) as e:
            self._proc.join()
            if isinstance(e, RuntimeError):
                raise RuntimeError(f"the engine process exited ({self._proc.exitcode}) "
                                   f"before its engine was built") from None
            raise

    def drain_and_stop(self, grace_s: float) -> None:
        """Stop admitting; the engine lets running jobs finish for up to `grace_s`, ends the
        rest with finish "abort" (the other HTTP processes are told to drain), then its
        process exits."""
        self._admitting = False
        with self._lock:
            self._send(("drain", grace_s))
        self._wait()

    def stop(self) -> None:
        """Stop the engine's process (jobs still running get no more events)."""
        self._admitting = False
        with self._lock:
            self._send(("stop",))
        self._wait()

    def _wait(self) -> None:
        self._proc.join()
        if self._reader.is_alive():
            self._reader.join()
