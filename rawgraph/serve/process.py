"""The engine in a process of its own: `EngineProcess` is the HTTP side's `Worker` (submit,
abort, load, admitting, metrics, drain_and_stop, stop) with the engine, and the `Worker`
thread that steps it, in a child process that alone touches the GPU.

Why a process (`rawgraph serve`'s default; `--engine thread` for the other): on a thread, the
event loop's Python for each streamed token (the relay, the SSE chunk, uvicorn's send;
benchmarks/NOTES.md, "Serving") and the engine's host work between steps take turns at one
interpreter lock, and at LLaMA-1B's short steps the engine's next launch can wait for the loop;
in a process of its own it never does. It pays for the pipe: `bench serve` (llama-1b both ways,
H200, two runs) served 88-92% of offline throughput in a process, 72-74% on a thread. Over one
pipe each way: requests and aborts go down; each iteration's events (the worker's `post`) and
the engine's metrics come up, read by a thread that hands them to the event loop in one wake-
up.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import signal
import threading
from typing import Any

from rawgraph.serve.engine import build
from rawgraph.serve.metrics import Metrics
from rawgraph.serve.protocol import APIError
from rawgraph.serve.worker import Job, Worker, post_to_loops

log = logging.getLogger("rawgraph.serve")
# the engine's Metrics fields that come up with each step's events (the iteration
# histograms among them; the token latency histograms and tokens per second are measured on
# the HTTP side)
SHARED = ("requests", "prompt_tokens", "running", "waiting", "batch", "kv_blocks_used",
          "kv_blocks_total", "iterations", "decode_steps", "nodes_patched", "step_failures",
          "iteration", "host", "period")


def _wire(event: tuple) -> tuple:
    """An event as the pipe carries it (an APIError as its fields)."""
    if event[0] == "error":
        e = event[1]
        return ("error", (e.status, e.message, e.param, e.kind, e.headers))
    return event


def _unwire(event: tuple) -> tuple:
    return ("error", APIError(*event[1])) if event[0] == "error" else event


def _child(conn: Any, args: argparse.Namespace) -> None:
    """The engine's process: build the engine, run its worker, obey the pipe."""
    # a Ctrl-C or a SIGTERM to the whole process group is the server's to handle (it drains
    # through the pipe); this process ends when told to, or when the pipe closes
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        engine, _ = build(args)
    except Exception as e:  # the checkpoint or options refused: the parent says it in one line
        conn.send(("failed", f"{e}" if isinstance(e, ValueError) else f"{e!r}"))
        return
    send = threading.Lock()  # the worker's thread and this one both send
    metrics = Metrics()
    jobs: dict[int, Job] = {}

    def post(events: list[tuple[Job, tuple]]) -> None:
        for job, event in events:
            if event[0] in ("finish", "error"):
                jobs.pop(job.id, None)
        snapshot = {k: getattr(metrics, k) for k in SHARED}
        with send:
            conn.send(("events", [(job.id, _wire(e)) for job, e in events], snapshot,
                       worker.load))

    worker = Worker(engine, metrics, max_queue=args.max_queue, post=post)
    worker.start()
    with send:
        conn.send(("ready", {k: getattr(metrics, k) for k in SHARED}))
    try:
        while True:
            try:
                msg = conn.recv()
            except EOFError:  # the server is gone
                worker.stop()
                break
            if msg[0] == "submit":
                job = jobs[msg[1]] = Job(msg[2], None, id=msg[1])
                try:
                    worker.submit(job)
                except APIError as e:  # a full queue, a shutdown
                    post([(job, ("error", e))])
            elif msg[0] == "abort":
                if msg[1] in jobs:
                    worker.abort(jobs[msg[1]])
            elif msg[0] == "drain":
                worker.drain_and_stop(msg[1])
                break
            elif msg[0] == "stop":
                worker.stop()
                break
    finally:
        engine.close()
        engine.model.close()
        with send:
            conn.send(("stopped",))


class EngineProcess:
    """A `Worker` whose engine runs in a child process built from the serve options `args`
    (`rawgraph serve`'s). `start` returns once the engine is built (ValueError with the
    child's message when the checkpoint or the options are refused)."""

    def __init__(self, args: argparse.Namespace, metrics: Metrics):
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no CUDA inherited
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_child, args=(child, args), name="rawgraph-engine",
                                 daemon=True)
        self.metrics = metrics
        self._jobs: dict[int, Job] = {}
        self._lock = threading.Lock()  # the jobs, and sends to the pipe
        self._admitting = False
        self._load = (0, 0)
        self._reader = threading.Thread(target=self._read, name="rawgraph-engine-pipe",
                                        daemon=True)

    def start(self) -> None:
        """Start the engine's process; return once its engine is built."""
        self._proc.start()
        try:
            msg = self._conn.recv()
        except EOFError:
            raise RuntimeError(f"the engine process exited ({self._proc.exitcode}) before "
                               f"its engine was built") from None
        if msg[0] == "failed":
            self._proc.join()
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
                self._conn.send(("abort", job.id))

    def drain_and_stop(self, grace_s: float) -> None:
        """Stop admitting; the engine lets running jobs finish for up to `grace_s`, ends the
        rest with finish "abort", then its process exits."""
        self._admitting = False
        self._send(("drain", grace_s))
        self._wait()

    def stop(self) -> None:
        """Stop the engine's process (jobs still running get no more events)."""
        self._admitting = False
        self._send(("stop",))
        self._wait()

    def _send(self, msg: tuple) -> None:
        with self._lock:
            try:
                self._conn.send(msg)
            except (OSError, ValueError):  # the process is gone already
                pass

    def _wait(self) -> None:
        self._proc.join()
        if self._reader.is_alive():
            self._reader.join()

    def _apply(self, snapshot: dict[str, Any]) -> None:
        with self.metrics.lock:
            for k, v in snapshot.items():
                setattr(self.metrics, k, v)

    def _read(self) -> None:
        """The pipe's reader: events to the jobs' loops, the engine's metrics and load."""
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                break
            if msg[0] == "stopped":
                break
            _, events, snapshot, self._load = msg
            self._apply(snapshot)
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
