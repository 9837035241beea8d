"""Run the kernel tests and a replay of captured LLaMA-1B-shaped graphs under
compute-sanitizer's four tools, and print one summary line per tool.

    python3 tests/sanitize.py [--tools memcheck,racecheck,synccheck,initcheck] [--jobs 4]
                              [--logs DIR] [-- extra pytest arguments]

Each tool runs pytest over KERNEL_TESTS (every op family against its NumPy reference, the
stream-ordering test, and tests/test_replay_gpu.py: a decode graph and a prefill chunk graph
replayed), one tool after another, each over one process per test file (`--shard`), as many
side by side as `--jobs`. Exit
status 0 only when every tool reports 0 errors (racecheck: 0 hazards) and every test passes
under each.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
KERNEL_TESTS = ("test_ops_gpu.py", "test_ops2_gpu.py", "test_attention_gpu.py",
                "test_prefill_gpu.py", "test_sample_gpu.py", "test_rope_append_gpu.py",
                "test_ordering_gpu.py", "test_replay_gpu.py")
_ERRORS = re.compile(r"=+ ERROR SUMMARY: (\d+) errors?")
_HAZARDS = re.compile(r"=+ RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, "
                      r"(\d+) warnings?\)")
_PYTEST = re.compile(r"^=* ?(\d+ (?:passed|failed|error).*? in [\d.]+s.*?) ?=*$", re.M)


def summarize(tool: str, log: str, returncode: int) -> tuple[bool, str]:
    """(clean, one line) from a tool's output (one run's, or several joined): its error (or
    hazard) count and the tests pytest counted."""
    errors = [int(m) for m in _ERRORS.findall(log)]
    hazards = [tuple(map(int, m)) for m in _HAZARDS.findall(log)]
    counts: dict[str, int] = {}
    for line in _PYTEST.findall(log):
        for n, what in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", line):
            what = "errors" if what.startswith("error") else what
            counts[what] = counts.get(what, 0) + int(n)
    result = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no pytest summary (crashed?)"
    seen = bool(errors or hazards)
    count = sum(errors) + sum(h[0] for h in hazards)
    what = f"{sum(h[0] for h in hazards)} hazards ({sum(h[1] for h in hazards)} errors)" \
        if tool == "racecheck" and hazards else f"{sum(errors)} errors"
    clean = seen and count == 0 and returncode == 0 and counts.get("passed", 0) > 0 \
        and not counts.get("failed") and not counts.get("errors")
    return clean, f"{tool:10s} {what if seen else 'no summary'}; {result}"


def run_one(tool: str, tests: list[str], extra: list[str], log: Path
            ) -> tuple[int, str, float]:
    """One compute-sanitizer run of pytest over `tests`, its output streamed to `log` (what
    it printed survives a timeout); (return code, output, seconds)."""
    # memcheck also reports failed driver calls; rawgraph checks each of its own (a failure
    # fails the test), and one fails by design: counting a kernel's parameters by asking
    # until the driver refuses (Kernel.param_info; CUDA 13.0 has no cuFuncGetParamCount)
    api = ["--report-api-errors", "no"] if tool == "memcheck" else []
    cmd = ["compute-sanitizer", "--tool", tool, *api, "--error-exitcode", "97",
           sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
           *tests, *extra]
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
    return rc, log.read_text(errors="replace"), time.perf_counter() - t0


def run_tool(tool: str, shards: list[list[str]], extra: list[str], logs: Path,
             pool: ThreadPoolExecutor) -> tuple[bool, str]:
    """A tool over every shard of the tests (side by side); one summary line, with the
    slowest shard."""
    t0 = time.perf_counter()
    futures = [pool.submit(run_one, tool, shard, extra,
                           logs / f"{tool}-{Path(shard[0]).stem}.log") for shard in shards]
    runs = [f.result() for f in futures]
    clean, line = summarize(tool, "\n".join(out for _, out, _ in runs),
                            max(rc for rc, _, _ in runs))
    slow = max(range(len(runs)), key=lambda i: runs[i][2])
    return clean, (f"{line} [{time.perf_counter() - t0:.0f} s; slowest "
                   f"{Path(shards[slow][0]).stem} {runs[slow][2]:.0f} s]")


def main(argv: list[str] | None = None) -> int:
    """Run the tools; print one line per tool; 0 when all are clean."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--tools", default=",".join(TOOLS), help="comma-separated tools")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 4,
                   help="sanitizer processes side by side")
    p.add_argument("--shard", choices=("file", "none"), default="file",
                   help="one process per test file, or one per tool")
    p.add_argument("--logs", type=Path, default=Path(".scratch/sanitize"),
                   help="directory for each process's full log")
    p.add_argument("extra", nargs="*", help="more pytest arguments (after --)")
    args = p.parse_args(argv)
    tools = args.tools.split(",")
    if set(tools) - set(TOOLS):
        p.error(f"unknown tools {sorted(set(tools) - set(TOOLS))}; choose from {TOOLS}")
    if shutil.which("compute-sanitizer") is None:
        p.error("compute-sanitizer is not on PATH (it comes with the CUDA toolkit)")
    here = Path(__file__).resolve().parent
    tests = [str(here / t) for t in KERNEL_TESTS]
    shards = [[t] for t in tests] if args.shard == "file" else [tests]
    args.logs.mkdir(parents=True, exist_ok=True)
    results = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for tool in tools:  # one tool at a time, its shards side by side
            results.append(run_tool(tool, shards, args.extra, args.logs, pool))
            print(results[-1][1], flush=True)
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
