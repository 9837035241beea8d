"""The `rawgraph` command: info, demo, serve, bench, check-kernels.

Options are checked before anything looks for a GPU; a user error (a bad option, a missing
checkpoint, a command that needs a GPU on a machine without one) is one line on stderr and
exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, NoReturn

from rawgraph import demo
from rawgraph.cuda.device import available, info
from rawgraph.model.config import PRESETS, ModelConfig
from rawgraph.model.safetensors import CheckpointError
from rawgraph.serve import options as serve_options

BENCHES = ("primitives", "memory", "kernels", "model", "decode", "prefill", "serve")


class UsageError(Exception):
    """A mistake in how the command was called: printed as one line, exit status 2."""

    def __init__(self, message: str, prog: str = "rawgraph"):
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors and defaults shown in every option's help."""

    def __init__(self, **kw: Any):
        super().__init__(formatter_class=argparse.ArgumentDefaultsHelpFormatter, **kw)

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.prog)


def model_facts(cfg: ModelConfig, stored: Any = None) -> dict[str, Any]:
    """What `rawgraph info --model` says of a model: its family and what the family adds to
    LLaMA's layers, its shape, its window, how its weights are stored (`stored`: the
    checkpoint's quantized format, `model.quant.Fp8` or `Int4`), and what they take on the
    GPU with each `--quantize`, with and without `--quantized-only`."""
    from rawgraph.model.sizing import weight_bytes

    fam = cfg.fam
    adds = [what for what, on in (("q, k, v biases", fam.qkv_bias),
                                  ("q and k head norms", fam.qk_norm)) if on]
    return {"model": cfg.name, "family": f"{fam.name} ({fam.architecture})",
            "adds to LLaMA": ", ".join(adds) or "nothing",
            "shape": f"{cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} heads "
                     f"({cfg.kv_heads} kv) of {cfg.head_dim}, mlp {cfg.intermediate}, "
                     f"vocab {cfg.vocab}",
            "dtype": cfg.dtype, "tied embeddings": cfg.tie_embeddings,
            "sliding window": cfg.sliding_window or "none",
            "weights": f"{cfg.weight_bytes() / 2**30:.2f} GiB" + _stored(stored),
            **{f"--quantize {q}": f"{weight_bytes(cfg, q) / 2**30:.2f} GiB on the GPU, "
                                  f"{weight_bytes(cfg, q, False) / 2**30:.2f} GiB with "
                                  f"--quantized-only" for q in ("fp8", "int4")}}


def _stored(fmt: Any) -> str:
    """How `model_facts` says a quantized checkpoint's weights are stored."""
    if fmt is None:
        return ""
    if fmt.method in ("awq", "gptq"):
        group = "per row" if fmt.group == -1 else f"groups of {fmt.group}"
        return f" once dequantized at load from 4 bits ({fmt.method}, {group})"
    return f" once dequantized at load from FP8 e4m3 ({fmt.method}, per {fmt.strategy})"


def _info(args: argparse.Namespace) -> int:
    facts = info()
    if args.model:
        from rawgraph.model.checkpoint import config, stored_format

        preset_name = args.model in PRESETS
        cfg = PRESETS[args.model] if preset_name else config(args.model)
        stored = None if preset_name else stored_format(args.model)
        facts = {**facts, **model_facts(cfg, stored)}
    if args.json:
        print(json.dumps(facts, indent=2))
        return 0
    width = max(map(len, facts))
    for k, v in facts.items():
        print(f"{k.ljust(width)}  {v}")
    if facts["device"] is None:
        print("(no CUDA device: CPU-side features only; GPU tests will be skipped)")
    return 0


# `bench NAME --only profile[:PRESET]:A:B`: (A:B's form, B's pattern, an example)
_PROFILES = {
    "decode": ("BATCH:CONTEXT (positive integers)", r"[1-9]\d*", "profile:llama-8b:32:1024"),
    "prefill": ("CHUNK:PAST (a positive chunk, the tokens cached before it)", r"\d+",
                "profile:llama-1b:2048:6144"),
}


def check_only(name: str, only: str) -> None:
    """UsageError unless `--only` means something to benchmark `name`."""
    if not only:
        return
    if name in ("primitives", "memory"):
        raise UsageError(f"bench {name} takes no --only")
    if name == "kernels":
        from rawgraph.bench.kernels import PARTS

        unknown = sorted(set(only.split(",")) - set(PARTS))
        if unknown:
            raise UsageError(f"bench kernels --only: unknown parts {unknown}; choose from "
                             f"{','.join(PARTS)}")
        return
    from rawgraph.bench.decode import PRESETS as DECODE_PRESETS
    from rawgraph.bench.decode import QUANT_ONLY

    names = (DECODE_PRESETS if name == "decode" else ("llama-1b", "llama-8b")
             if name in ("prefill", "serve") else tuple(PRESETS))
    if name in _PROFILES and only.startswith("profile"):
        form, last, example = _PROFILES[name]
        m = re.fullmatch(rf"profile(:[a-z][\w-]*)?(:[1-9]\d*(:{last})?)?", only)
        if not m or (m[1] and m[1][1:] not in names):
            raise UsageError(f"bench {name} --only {only!r}: profile[:PRESET]:{form} with a "
                             f"preset of {list(names)} (e.g. {example})")
        cfg = PRESETS[m[1][1:] if m[1] else "llama-1b"]
        a, b = (int(v) for v in [*only.split(":")[2 if m[1] else 1:], "0", "0"][:2])
        tokens = b if name == "decode" else a + b  # the context, or chunk + past
        if tokens > cfg.max_position or (name == "decode" and a > 256):
            raise UsageError(f"bench {name} --only {only!r}: at most {cfg.max_position} "
                             f"tokens of context for {cfg.name}" + (" and 256 rows" if
                                                                   name == "decode" else ""))
        return
    if (name in ("decode", "prefill") and only == "long") or (name, only) in (
            ("serve", "closed"), ("decode", "fp8"), ("decode", "int4")):
        return
    if name == "prefill" and only.split(":")[0] == "prefix":
        bad = [n for n in only.split(":")[1:] if n not in names]
        if bad:
            raise UsageError(f"bench prefill --only {only!r}: prefix[:PRESET] with a preset "
                             f"of {list(names)}")
        return
    if name == "decode":  # QUANT_ONLY's presets too: measured quantized alone
        names = (*names, *QUANT_ONLY)
    if not any(only in n for n in names):
        raise UsageError(f"bench {name} --only {only!r} matches no preset of {list(names)}")


def _bench(args: argparse.Namespace) -> int:
    check_only(args.name, args.only)
    _need_gpu(f"bench {args.name}")
    from rawgraph.bench import results

    if args.name == "primitives":
        from rawgraph.bench.primitives import run
    elif args.name == "memory":
        from rawgraph.bench.memory import run
    elif args.name == "kernels":
        from rawgraph.bench.kernels import run
    elif args.name == "model":
        from rawgraph.bench.model import run
    elif args.name == "serve":
        from rawgraph.bench.serve import run
    elif args.name == "prefill":
        from rawgraph.bench.prefill import run
    else:
        from rawgraph.bench.decode import run
    rows = run(args.only) if args.only else run()
    path = results.save(args.name, rows, args.out, args.only)
    if args.name == "decode" and not args.only.startswith("profile"):
        from rawgraph.bench.decode import plot

        print(f"plot: {plot(rows, path.with_suffix('.png'))}")
    print(results.table(rows, list(dict.fromkeys(k for r in rows for k in r))))
    if args.name == "serve":
        from rawgraph.bench.serve import summary

        print(summary(rows))
    print(f"\nwritten {path}")
    return 0


def _check_kernels(args: argparse.Namespace) -> int:
    from rawgraph.cuda import nvcc

    if not re.fullmatch(r"sm_\d+a?", args.arch):
        raise UsageError(f"check-kernels --arch {args.arch!r}: a target such as sm_90")
    if args.compiler != "nvrtc" and nvcc.nvcc_path() is None:
        raise UsageError("check-kernels: nvcc is not on PATH (install the CUDA toolkit, or "
                         "check with --compiler nvrtc alone)")
    reports = nvcc.compile_all(args.arch, nvcc=args.compiler != "nvrtc",
                               nvrtc=args.compiler != "nvcc")
    bad = [r for r in reports if not r.ok]
    for r in reports:
        print(r.summary())
    if bad:
        print(f"\n{len(bad)} of {len(reports)} kernel files failed", file=sys.stderr)
        for r in bad:
            print(r.log, file=sys.stderr)
        return 1
    what = {"both": "nvcc and NVRTC", "nvcc": "nvcc", "nvrtc": "NVRTC"}[args.compiler]
    spills = " with no spills" if args.compiler != "nvrtc" else ""
    print(f"\nall {len(reports)} kernel files compile for {args.arch} with {what}{spills}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    try:
        demo.check(args)
    except ValueError as e:
        raise UsageError(str(e), "rawgraph demo") from None
    ok, why = available()
    if not ok:  # a CPU-only machine (CI): say so plainly, nothing to demonstrate
        print(f"rawgraph demo needs a CUDA GPU ({why}); nothing ran.")
        return 0
    try:
        setup = demo.setup(args)
    except ValueError as e:  # a checkpoint or options the model refuses
        raise UsageError(str(e), "rawgraph demo") from None
    return demo.main(args, *setup)


def _serve(args: argparse.Namespace) -> int:
    try:
        serve_options.check(args)
    except ValueError as e:
        raise UsageError(str(e), "rawgraph serve") from None
    if not args.reference:
        ok, why = available()
        if not ok:
            raise UsageError(f"needs a CUDA GPU ({why}); --reference serves the NumPy "
                             f"decoder on the CPU", "rawgraph serve")
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise UsageError(f"needs the serve extra ({e.name} is missing): "
                         f"pip install 'rawgraph[serve]'", "rawgraph serve") from None
    from rawgraph.serve import command  # imports the serve extra's packages: only for serve

    try:
        return command.run(args)
    except ValueError as e:  # a checkpoint or options the model refuses
        raise UsageError(str(e), "rawgraph serve") from None


def _need_gpu(what: str) -> None:
    ok, why = available()
    if not ok:
        raise UsageError(f"{what} needs a CUDA GPU ({why})")


def parser() -> argparse.ArgumentParser:
    """The command line's parser (every option with help and its default)."""
    p = _Parser(prog="rawgraph", description="CUDA graphs for LLM inference without PyTorch.")
    sub = p.add_subparsers(dest="cmd", parser_class=_Parser, metavar="COMMAND")
    q = sub.add_parser("info", help="versions, device, compute capability, driver")
    q.add_argument("--json", action="store_true", help="print the facts as JSON")
    q.add_argument("--model", default=None, metavar="DIR|PRESET", help="also what rawgraph "
                   "reads of a checkpoint directory's config.json (or a preset): family, "
                   "shape, window")
    q.set_defaults(fn=_info)
    q = sub.add_parser("bench", help="run a benchmark (GPU), print a table, save JSON")
    q.add_argument("name", choices=BENCHES, help="which benchmark")
    q.add_argument("--out", default=None, help="directory for the JSON (default: a full "
                   "run replaces benchmarks/NAME.json, a partial one goes to .scratch/bench/)")
    q.add_argument("--only", default="", help="kernels: comma-separated parts of gemv,"
                   "quantized,attention,elementwise,gemm,prefill,sample; model, decode, prefill, "
                   "serve: a preset name; decode, prefill: long (16k-128k tokens); decode: fp8, "
                   "int4 (quantized weights beside 16-bit at 1-16 rows), "
                   "profile[:PRESET]:BATCH:CONTEXT, "
                   "prefill: profile[:PRESET]:CHUNK:PAST for a per-kernel breakdown; prefill: "
                   "prefix[:PRESET]; serve: closed")
    q.set_defaults(fn=_bench)
    demo.add_parser(sub).set_defaults(fn=_demo)
    serve_options.add_parser(sub).set_defaults(fn=_serve)
    q = sub.add_parser("check-kernels", help="compile kernels_cu/*.cu with nvcc (failing "
                       "on register spills) and NVRTC; no GPU needed")
    q.add_argument("--arch", default="sm_90", help="target architecture")
    q.add_argument("--compiler", default="both", choices=("both", "nvcc", "nvrtc"),
                   help="which compilers to check with")
    q.set_defaults(fn=_check_kernels)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rawgraph` console script."""
    p = parser()
    try:
        args = p.parse_args(argv)
        if args.cmd is None:
            p.print_help()
            return 0
        return args.fn(args)
    except UsageError as e:
        print(f"{e.prog}: error: {e}", file=sys.stderr)
        return 2
    except CheckpointError as e:
        print(f"rawgraph: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rawgraph: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
