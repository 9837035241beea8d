"""argparse types and checks shared by the command line's subcommands."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rawgraph.model import checkpoint
from rawgraph.model.config import PRESETS


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `low`, refused in one line otherwise."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{v} must be at least {low}")
        return v
    return parse


positive = at_least(1)


def check_model(args: Any) -> None:
    """ValueError naming the option unless `--preset` names a preset or `--model` is a
    checkpoint directory whose config.json rawgraph reads (CheckpointError; no tensor read,
    no GPU needed)."""
    if args.model is None and args.preset not in PRESETS:
        raise ValueError(f"--preset {args.preset!r}: choose one of {', '.join(PRESETS)}")
    if args.model is not None and not Path(args.model).is_dir():
        raise ValueError(f"--model {args.model}: not a directory")
    if args.model is not None:
        checkpoint.config(args.model)


def add_quantize(q: argparse.ArgumentParser) -> None:
    """The `--quantize` option of the commands that build a model on the GPU."""
    q.add_argument("--quantize", choices=("fp8", "int4"), default=None,
                   help="also keep each projection quantized at load on the GPU, read by decode "
                   "steps of up to 16 rows: fp8 (e4m3, a scale per output row; half the "
                   "weight bytes of such a step; compute capability 8.9 or newer) or int4 "
                   "(4-bit, a scale and zero point per group of 128; a quarter). The 16-bit "
                   "weights stay for larger batches and prefill (see --quantized-only)")
    q.add_argument("--quantized-only", action="store_true",
                   help="with --quantize: keep the layers' projections quantized alone (the "
                   "memory of the format: a 70B model in FP8 on one 141 GB GPU); prefill and "
                   "batches past 16 rows dequantize each projection into a scratch first")


def check_quantize(args: Any) -> None:
    """ValueError unless --quantized-only comes with --quantize."""
    if args.quantized_only and not args.quantize:
        raise ValueError("--quantized-only: with --quantize fp8 or int4")
