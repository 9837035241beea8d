"""`rawgraph serve`'s options and their checks (no import of the serve extra's packages, so
the command line's help works without them)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from rawgraph.model.config import PRESETS
from rawgraph.ops.matmul import DECODE_ROWS
from rawgraph.options import add_quantize, at_least, check_model, check_quantize, positive


def check(args: argparse.Namespace) -> None:
    """ValueError naming the option unless the options make sense (no GPU needed)."""
    check_model(args)
    if args.reference and args.model is None and args.preset != "tiny":
        raise ValueError("--reference runs the NumPy decoder on the CPU: --preset tiny or a "
                         "--model checkpoint small enough for it")
    if args.reference and args.mixed:
        raise ValueError("--mixed: the reference decoder (--reference) runs no graphs to mix")
    check_quantize(args)
    if args.quantize and args.reference:
        raise ValueError(f"--quantize {args.quantize}: the reference decoder (--reference) "
                         f"computes in float32")
    if args.quantize and args.batch_invariant:
        raise ValueError(f"--quantize {args.quantize} with --batch-invariant: the invariant "
                         f"mode's projections take the tiled GEMM, which reads the 16-bit "
                         f"weights")
    if args.batch_invariant and args.mixed:
        raise ValueError("--mixed with --batch-invariant: a mixed iteration's decode rows "
                         "round as its chunk's tokens do")
    if args.max_batch is not None and not 1 <= args.max_batch <= DECODE_ROWS:
        raise ValueError(f"--max-batch {args.max_batch}: 1 to {DECODE_ROWS}")
    if args.chunk > args.max_context:
        raise ValueError(f"--chunk {args.chunk} exceeds --max-context {args.max_context}")
    if args.decode_chunk is not None and args.decode_chunk > args.chunk:
        raise ValueError(f"--decode-chunk {args.decode_chunk} exceeds --chunk {args.chunk}")
    if not 0 < args.port < 65536:
        raise ValueError(f"--port {args.port}: 1 to 65535")
    if args.request_timeout is not None and not args.request_timeout > 0:
        raise ValueError(f"--request-timeout {args.request_timeout}: seconds, more than 0")
    if not args.grace >= 0:
        raise ValueError(f"--grace {args.grace}: seconds, 0 or more")
    if args.http_processes > 1 and args.engine != "process":
        raise ValueError(f"--http-processes {args.http_processes}: the HTTP processes share "
                         f"an engine in a process of its own (--engine process)")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The `serve` subcommand's options (the caller sets what runs it)."""
    q = sub.add_parser("serve", help="an OpenAI-compatible HTTP server over the engine")
    q.add_argument("--model", type=Path, help="a checkpoint directory (config.json, "
                   "*.safetensors; tokenizer.json for text, its chat template for chat, "
                   "generation_config.json's sampling defaults)")
    q.add_argument("--preset", default="tiny", help=f"random weights of a named shape: "
                   f"{', '.join(PRESETS)} (prompts as token ids)")
    q.add_argument("--name", default=None, help="the model id clients send (default: the "
                   "checkpoint directory's name, or the preset)")
    q.add_argument("--host", default="127.0.0.1", help="address to listen on")
    q.add_argument("--port", type=int, default=8000, help="port to listen on")
    q.add_argument("--max-batch", type=positive, default=None,
                   help="sequences decoding at once (default: as many as the GPU holds at "
                        "--max-context, beside the weights, 90%% of its memory; 8 with "
                        "--reference)")
    q.add_argument("--max-context", type=positive, default=2048,
                   help="tokens per sequence, prompt and output")
    q.add_argument("--chunk", type=positive, default=256, help="largest prefill chunk")
    q.add_argument("--decode-chunk", type=positive, default=None,
                   help="largest prefill chunk in an iteration that also decodes, None "
                   "meaning --chunk: smaller shortens the inter-token latency's tail and "
                   "lengthens the time to first token")
    q.add_argument("--max-queue", type=positive, default=256,
                   help="requests waiting for admission before new ones get 429")
    q.add_argument("--request-timeout", type=float, default=None,
                   help="seconds before a request is aborted (none: no limit)")
    q.add_argument("--grace", type=float, default=30.0,
                   help="seconds running requests get to finish on SIGTERM")
    q.add_argument("--seed", type=at_least(0), default=0, help="seed of random weights")
    q.add_argument("--reference", action="store_true",
                   help="serve the NumPy reference decoder on the CPU (no GPU; tiny models)")
    q.add_argument("--mixed", action="store_true",
                   help="run an iteration's prefill chunk and decode step as one pass over "
                        "the weights (one graph per batch bucket and chunk size; faster than "
                        "two graphs side by side for chunks of up to ~128 tokens)")
    q.add_argument("--batch-invariant", action="store_true",
                   default=os.environ.get("RAWGRAPH_BATCH_INVARIANT") == "1",
                   help="each request's tokens the same whatever else is batched with it: "
                   "slower kernels in fixed orders (default: RAWGRAPH_BATCH_INVARIANT=1); "
                   "the NumPy reference (--reference) is invariant already")
    q.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                   help="prefill every prompt whole: no request takes the KV blocks of a "
                   "prefix an earlier prompt left in the cache")
    q.add_argument("--engine", choices=("process", "thread"), default="process",
                   help="where the engine runs: a process of its own (the event loop and the "
                   "engine hold no lock in common; served 88-92%% of offline throughput against "
                   "72-74%% on a thread, llama-1b on the H200) or a thread of the server's")
    q.add_argument("--http-processes", type=positive, default=1,
                   help="HTTP processes over the one engine, each with its own event loop on "
                   "the port (SO_REUSEPORT): an event loop spends ~40 us of CPU a streamed "
                   "token, a whole core at ~25k tokens/s")
    add_quantize(q)
    return q
