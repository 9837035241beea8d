"""`rawgraph serve`: the model, the engine (on a thread, or in a process of its own with
`--engine`), the HTTP server, and a graceful end.

SIGTERM (or Ctrl-C) stops admitting (new requests get 503), lets running requests finish
for `--grace` seconds, ends the rest with finish "abort" (each stream gets its final event),
then the server exits with status 0.
"""

from __future__ import annotations

import argparse
import logging
import threading
from typing import Any

from rawgraph.serve.app import ModelInfo, create_app
from rawgraph.serve.engine import build, model_info
from rawgraph.serve.metrics import Metrics
from rawgraph.serve.process import EngineProcess
from rawgraph.serve.worker import Worker

log = logging.getLogger("rawgraph.serve")


def _engine(args: argparse.Namespace, metrics: Metrics) -> tuple[Any, ModelInfo, Any]:
    """(the worker the handlers talk to, the model's info, what closes the engine after)."""
    if args.engine == "process":
        info = model_info(args)  # the handlers' side reads no weights; the engine's does
        return EngineProcess(args, metrics), info, lambda: None
    engine, info = build(args)
    worker = Worker(engine, metrics, max_queue=args.max_queue)

    def close() -> None:
        engine.close()
        engine.model.close()
    return worker, info, close


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or Ctrl-C; 0 after a graceful end."""
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    worker, info, close = _engine(args, Metrics())
    worker.start()
    app = create_app(worker, info, timeout_s=args.request_timeout)

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

    server = uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                            timeout_graceful_shutdown=int(args.grace) + 5)
    log.info("serving %s (context %d, batch %d) on http://%s:%d, the engine %s", info.model_id,
             info.max_context, args.max_batch, args.host, args.port,
             "in its own process" if args.engine == "process" else "on a thread")
    try:
        Server(server).run()
    finally:
        worker.stop()
        close()
    return 0
