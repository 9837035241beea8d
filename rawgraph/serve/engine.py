"""What a server serves, from `rawgraph serve`'s options: the engine (on the GPU, or the
NumPy decoder with --reference) and what the handlers know of the model."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from rawgraph.engine.engine import Engine
from rawgraph.engine.reference import reference_engine
from rawgraph.model import generation, sizing
from rawgraph.model.checkpoint import config, load
from rawgraph.model.config import ModelConfig, preset
from rawgraph.model.decoder import Model
from rawgraph.model.generation import GenerationConfig
from rawgraph.model.tokenizer import Tokenizer
from rawgraph.model.weights import random_weights
from rawgraph.serve.app import ModelInfo
from rawgraph.serve.text import ChatTemplate

log = logging.getLogger("rawgraph.serve")


def model_info(args: argparse.Namespace) -> ModelInfo:
    """What the handlers know of the model (its configuration, tokenizer, chat template and
    generation_config.json's defaults and eos ids; no weights are read); ValueError
    (CheckpointError included) for a checkpoint whose configuration, tokenizer or
    generation config is refused."""
    tok = template = None
    gen = GenerationConfig()
    if args.model is not None:
        root = Path(args.model)
        cfg, gen = config(root), generation.read(root)
        if (root / "tokenizer.json").is_file():
            tok = Tokenizer(root / "tokenizer.json")
            template = ChatTemplate.from_dir(root)
        name = root.resolve().name
    else:
        cfg, name = preset(args.preset), args.preset
    eos = tuple(dict.fromkeys((*cfg.eos, *gen.eos)))  # config.json's, then the generation's
    return ModelInfo(args.name or name, cfg.vocab, args.max_context, tok, template, eos,
                     sampling=gen.sampling(), unapplied=gen.unapplied, family=cfg.family)


def _sized(cfg: ModelConfig, args: argparse.Namespace) -> int:
    """The batch the GPU holds for the model at --max-context (`sizing.max_batch`), logged."""
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    n = sizing.max_batch(cfg, args.max_context, total, free, max_chunk=args.chunk,
                         quantize=args.quantize, keep_16bit=not args.quantized_only)
    log.info("--max-batch %d: what %.0f GiB hold at context %d beside %.1f GiB of weights",
             n, total / 2**30, args.max_context,
             sizing.weight_bytes(cfg, args.quantize, not args.quantized_only) / 2**30)
    return n


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
    if args.max_batch is None:  # as many as the GPU holds (sizing), 8 on the CPU
        args.max_batch = 8 if args.reference else _sized(cfg, args)
    sizes = {"max_batch": args.max_batch, "max_context": args.max_context,
             "max_chunk": args.chunk, "max_chunk_seqs": min(8, args.max_batch)}
    if args.reference:
        engine = reference_engine(cfg, tensors, decode_chunk=args.decode_chunk,
                                  prefix_cache=args.prefix_cache, **sizes)
    else:
        model = Model(cfg, tensors, seed=args.seed, files=files,
                      batch_invariant=args.batch_invariant, quantize=args.quantize,
                      keep_16bit=not args.quantized_only, **sizes)
        engine = Engine(model, progress=False, mixed=args.mixed,
                        decode_chunk=args.decode_chunk, prefix_cache=args.prefix_cache)
    return engine, info
