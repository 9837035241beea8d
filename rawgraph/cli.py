"""The `rawgraph` command: info, demo, bench, check-kernels."""

from __future__ import annotations

import argparse
import json
import sys

from rawgraph.cuda.device import info
from rawgraph.engine import demo


def _info(args: argparse.Namespace) -> int:
    facts = info()
    if args.json:
        print(json.dumps(facts, indent=2))
        return 0
    width = max(map(len, facts))
    for k, v in facts.items():
        print(f"{k.ljust(width)}  {v}")
    if facts["device"] is None:
        print("(no CUDA device: CPU-side features only; GPU tests will be skipped)")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from rawgraph.bench import results

    if args.name == "primitives":
        from rawgraph.bench.primitives import run
    elif args.name == "memory":
        from rawgraph.bench.memory import run
    elif args.name == "kernels":
        from rawgraph.bench.kernels import run
    elif args.name == "model":
        from rawgraph.bench.model import run
    elif args.name == "decode":
        from rawgraph.bench.decode import run
    else:  # argparse restricts the choices
        raise AssertionError(args.name)
    rows = run(args.only) if args.only else run()
    path = results.save(args.name, rows, args.out)
    if args.name == "decode" and not args.only.startswith("profile"):
        from rawgraph.bench.decode import plot

        print(f"plot: {plot(rows, path.with_suffix('.png'))}")
    print(results.table(rows, list(dict.fromkeys(k for r in rows for k in r))))
    print(f"\nwritten {path}")
    return 0


def _check_kernels(args: argparse.Namespace) -> int:
    from rawgraph.cuda.nvcc import compile_all

    reports = compile_all(args.arch)
    bad = [r for r in reports if not r.ok]
    for r in reports:
        print(r.summary())
    if bad:
        print(f"\n{len(bad)} of {len(reports)} kernel files failed", file=sys.stderr)
        for r in bad:
            print(r.log, file=sys.stderr)
        return 1
    print(f"\nall {len(reports)} kernel files compile for {args.arch} with no spills")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rawgraph` console script."""
    p = argparse.ArgumentParser(prog="rawgraph", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("info", help="versions, device, compute capability, driver")
    q.add_argument("--json", action="store_true")
    q.set_defaults(fn=_info)
    q = sub.add_parser("bench", help="run a benchmark, print a table, save JSON")
    q.add_argument("name", choices=["primitives", "memory", "kernels", "model", "decode"])
    q.add_argument("--out", default=None, help="directory for the JSON (benchmarks/results/)")
    q.add_argument("--only", default="", help="kernels: comma-separated parts of gemv,attention,"
                   "elementwise,gemm,prefill,sample; model, decode: a preset name")
    q.set_defaults(fn=_bench)
    demo.add_parser(sub)
    q = sub.add_parser("check-kernels", help="compile kernels_cu/*.cu with nvcc; fail on spills")
    q.add_argument("--arch", default="sm_90")
    q.set_defaults(fn=_check_kernels)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
