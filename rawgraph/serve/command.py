"""`rawgraph serve`: the model, the engine (on a thread, or in a process of its own with
`--engine`), the HTTP server (one process, or `--http-processes` of them on one port), and a
graceful end.

SIGTERM (or Ctrl-C) stops admitting (new requests get 503), lets running requests finish
for `--grace` seconds, ends the rest with finish "abort" (each stream gets its final event),
then the server exits with status 0. With several HTTP processes the main one takes the
signal (the others ignore it) and drains the engine, which tells the others to stop too.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import signal
import socket
import threading
from multiprocessing.connection import Connection
from typing import Any

from rawgraph.serve.app import ModelInfo, create_app
from rawgraph.serve.collector import freeze_startup_heap
from rawgraph.serve.engine import build, model_info
from rawgraph.serve.metrics import Metrics, http_block
from rawgraph.serve.process import EngineLink, EngineProcess
from rawgraph.serve.worker import Worker

log = logging.getLogger("rawgraph.serve")


def _engine(args: argparse.Namespace, metrics: Metrics) -> tuple[Any, ModelInfo, Any]:
    """(the worker the handlers talk to, the model's info, what closes the engine after)."""
    if args.engine == "process":
        info = model_info(args)  # the handlers' side reads no weights; the engine's does
        return EngineProcess(args, metrics, args.http_processes), info, lambda: None
    engine, info = build(args)
    worker = Worker(engine, metrics, max_queue=args.max_queue)

    def close() -> None:
        engine.close()
        engine.model.close()
    return worker, info, close


def _bind(host: str, port: int, first: bool = False) -> socket.socket:
    """A socket bound to host:port that the server's other HTTP processes bind too
    (SO_REUSEPORT: the kernel spreads new connections over them); the server listens on it
    once it serves (until then connections are refused, as with one process). `first`:
    ValueError when anything holds the address, another server binding with SO_REUSEPORT
    included (which would otherwise share the port silently)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        if first:
            with socket.socket(family) as probe:  # no SO_REUSEPORT: fails where any holds it
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((host, port))
        sock = socket.socket(family)
    except OSError as e:
        raise ValueError(f"--host {host} --port {port}: {e.strerror}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ValueError(f"--host {host} --port {port}: {e.strerror}") from None
    return sock


def _config(app: Any, args: argparse.Namespace) -> Any:
    import uvicorn

    return uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                          timeout_graceful_shutdown=int(args.grace) + 5)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or Ctrl-C; 0 after a graceful end."""
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    n = args.http_processes
    sock = _bind(args.host, args.port, first=True) if n > 1 else None  # before the engine
    metrics = Metrics()
    block = http_block(n) if n > 1 else None
    if block is not None:
        metrics.share(block, 0)
    worker, info, close = _engine(args, metrics)
    worker.start()
    others = _start_http(args, worker, block) if n > 1 else []
    app = create_app(worker, info, timeout_s=args.request_timeout)
    frozen = freeze_startup_heap()  # the engine (on a thread) and the app: built to stay
    if args.engine != "process":  # else the engine's process reports its own
        metrics.gc_frozen = frozen

    class Server(uvicorn.Server):
        """uvicorn's server, draining the engine when told to stop; a stop by signal is the
        expected end (exit status 0), so the signal is not raised again afterwards."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit:  # a second signal: stop now
                self.force_exit = True
                return
            log.info("stopping: no new requests; %.0f s for the running ones", args.grace)
            threading.Thread(target=worker.drain_and_stop, args=(args.grace,),
                             daemon=True).start()
            self.should_exit = True

    if info.sampling:
        log.info("sampling defaults from generation_config.json: %s",
                 ", ".join(f"{k}={v}" for k, v in info.sampling.items()))
    if info.unapplied:
        log.warning("generation_config.json sets %s, which rawgraph does not apply",
                    ", ".join(info.unapplied))
    log.info("serving %s (%s, context %d, batch %s) on http://%s:%d, the engine %s%s",
             info.model_id, info.family, info.max_context,
             "sized to the GPU" if args.max_batch is None else args.max_batch, args.host,
             args.port,
             "in its own process" if args.engine == "process" else "on a thread",
             f", {n} HTTP processes" if n > 1 else "")
    try:
        Server(_config(app, args)).run(sockets=None if sock is None else [sock])
    finally:
        worker.stop()
        close()
        for p in others:
            p.join(args.grace + 10)
            if p.is_alive():
                log.error("HTTP process %d did not stop; terminating it", p.pid)
                p.terminate()
    return 0


def _start_http(args: argparse.Namespace, engine: EngineProcess,
                block: Any) -> list[multiprocessing.process.BaseProcess]:
    """Start the HTTP processes past the first, each on its own pipe to the engine."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_http_process, args=(args, conn, i + 1, block, os.getpid()),
                         name=f"rawgraph-http-{i + 1}", daemon=True)
             for i, conn in enumerate(engine.other_ends)]
    for p in procs:
        p.start()
    for conn in engine.other_ends:
        conn.close()  # the children hold them now
    return procs


def _http_process(args: argparse.Namespace, conn: Connection, index: int, block: Any,
                  parent: int) -> None:
    """An HTTP process past the first: the app over its own link to the engine, on its own
    socket on the port. Signals are the main process's to handle; this one stops when the
    engine drains, once its streams have ended, or when the engine or the main process is
    gone (the kernel then sends new connections to the processes still listening)."""
    import uvicorn

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    metrics = Metrics()
    metrics.share(block, index)
    link = EngineLink(conn, metrics)
    link.start()
    app = create_app(link, model_info(args), timeout_s=args.request_timeout, process=index)
    freeze_startup_heap()

    class Server(uvicorn.Server):
        """Ends when the engine drains or ends, or the main process goes; ignores signals."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            pass

        async def on_tick(self, counter: int) -> bool:
            if link.draining or link.ended or os.getppid() != parent:
                self.should_exit = True
            return await super().on_tick(counter)

    try:
        Server(_config(app, args)).run(sockets=[_bind(args.host, args.port)])
    finally:
        link.drain_and_stop(args.grace)
