"""`rawgraph serve`: the model, the engine (on a thread, or in a process of its own with
`--engine-process`), the HTTP server, and a graceful end.

SIGTERM (or Ctrl-C) stops admitting (new requests get 503), lets running requests finish
for `--grace` seconds, ends the rest with finish "abort" (each stream gets its final event),
then the server exits with status 0.
"""

from __future__ import annotations

import argparse
import logging
import threading
from pathlib import Path
from typing import Any

from rawgraph.engine.engine import Engine
from rawgraph.engine.reference import reference_engine
from rawgraph.model.checkpoint import config, load
from rawgraph.model.config import preset
from rawgraph.model.decoder import Model
from rawgraph.model.tokenizer import Tokenizer
from rawgraph.model.weights import random_weights
from rawgraph.serve.app import ModelInfo, create_app
from rawgraph.serve.metrics import Metrics
from rawgraph.serve.process import EngineProcess
from rawgraph.serve.text import ChatTemplate
from rawgraph.serve.worker import Worker

log = logging.getLogger("rawgraph.serve")


def model_info(args: argparse.Namespace) -> ModelInfo:
    """What the handlers know of the model (its configuration, tokenizer and chat template;
    no weights are read); ValueError (CheckpointError included) for a checkpoint the
    configuration or tokenizer of which is refused."""
    tok = template = None
    if args.model is not None:
        cfg = config(args.model)
        path = Path(args.model) / "tokenizer.json"
        if path.is_file():
            tok = Tokenizer(path)
            template = ChatTemplate.from_config(Path(args.model) / "tokenizer_config.json")
        name = Path(args.model).resolve().name
    else:
        cfg, name = preset(args.preset), args.preset
    return ModelInfo(args.name or name, cfg.vocab, args.max_context, tok, template, cfg.eos)


def build(args: argparse.Namespace) -> tuple[Engine, ModelInfo]:
    """The engine (on the GPU, or the reference decoder with --reference) and what the
    handlers know of the model; ValueError (CheckpointError included) for a checkpoint or
    options the model refuses."""
    info = model_info(args)
    files = None
    if args.model is not None:
        ck = load(args.model)
        cfg, tensors, files = ck.config, ck.tensors, ck.files
    else:
        cfg = preset(args.preset)
        tensors = random_weights(cfg, args.seed) if args.preset == "tiny" else None
    sizes = {"max_batch": args.max_batch, "max_context": args.max_context,
             "max_chunk": args.chunk, "max_chunk_seqs": min(8, args.max_batch)}
    if args.reference:
        engine = reference_engine(cfg, tensors, **sizes)
    else:
        model = Model(cfg, tensors, seed=args.seed, files=files, **sizes)
        engine = Engine(model, progress=False)
    return engine, info


def _engine(args: argparse.Namespace, metrics: Metrics) -> tuple[Any, ModelInfo, Any]:
    """(the worker the handlers talk to, the model's info, what closes the engine after)."""
    if args.engine_process:
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
             "in its own process" if args.engine_process else "on a thread")
    try:
        Server(server).run()
    finally:
        worker.stop()
        close()
    return 0
