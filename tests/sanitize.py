"""Run the kernel tests and a replay of captured LLaMA-1B-shaped graphs under
compute-sanitizer's four tools, and print one summary line per tool.

    python3 tests/sanitize.py [--tools memcheck,racecheck,synccheck,initcheck] [--jobs 4]
                              [--logs DIR] [-- extra pytest arguments]

Each tool runs pytest over KERNEL_TESTS (every op family against its NumPy reference, the
stream-ordering test, and tests/model/test_replay_gpu.py: a decode graph and a prefill chunk
graph replayed), one process per tool and test file (`--shard`), as many side by side as `--jobs`
(each log ends with its slowest tests). racecheck checks rawgraph's kernels only. Exit status
0 only when every tool reports 0 errors (racecheck: 0 hazards) and every test passes under
each. Run it alone on the GPU: beside another GPU process (the GPU suite), test setups failed
with cudaErrorInvalidAddressSpace from stream creation and pinned allocations.
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
KERNEL_TESTS = ("cuda/test_kernels_gpu.py", "ops/test_elementwise_gpu.py", "ops/test_norm_gpu.py",
                "ops/test_rope_gpu.py", "ops/test_linear_gpu.py", "ops/test_gemm_gpu.py",
                "ops/test_decode_attention_gpu.py", "ops/test_prefill_attention_gpu.py",
                "ops/test_qkv_gpu.py", "ops/test_sample_gpu.py", "ops/test_logits_gpu.py",
                "ops/test_ordering_gpu.py",
                "memory/test_paged_gpu.py", "cuda/test_stream_read_gpu.py",
                "model/test_replay_gpu.py")
_ERRORS = re.compile(r"=+ ERROR SUMMARY: (\d+) errors?")
_HAZARDS = re.compile(r"=+ RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, "
                      r"(\d+) warnings?\)")
_KERNEL = re.compile(r'extern "C" __global__ void(?:\s+__\w+__\([^)]*\))*\s+(\w+)\s*\(')
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


def rawgraph_kernels(root: Path) -> list[str]:
    """Every kernel rawgraph defines: the extern "C" __global__ names in kernels_cu/*.cu."""
    found = set()
    for cu in sorted(root.glob("*.cu")):
        found.update(_KERNEL.findall(cu.read_text()))
    return sorted(found)


def run_one(tool: str, tests: list[str], extra: list[str], log: Path, kernels: list[str]
            ) -> tuple[int, str, float]:
    """One compute-sanitizer run of pytest over `tests`, its output streamed to `log` (what
    it printed survives a timeout); (return code, output, seconds)."""
    opts = []
    if tool == "memcheck":
        # memcheck also reports failed driver calls; rawgraph checks each of its own (a
        # failure fails the test), and one fails by design: counting a kernel's parameters by
        # asking until the driver refuses (Kernel.param_info; CUDA 13.0 has no
        # cuFuncGetParamCount)
        opts = ["--report-api-errors", "no"]
    elif tool == "racecheck":
        # racecheck follows every shared-memory access: CuPy's own kernels that the tests
        # use to make inputs and random weights (reductions over 10^8 values) would take
        # most of its time, and their races are not ours to find. The other tools check
        # every kernel (initcheck must see CuPy's writes to know memory is initialized).
        opts = ["--kernel-name", "regex=^(" + "|".join(kernels) + ")$"]
    cmd = ["compute-sanitizer", "--tool", tool, *opts, "--error-exitcode", "97",
           sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
           "--durations=5", *tests, *extra]
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1",
                                 "RAWGRAPH_SANITIZER": tool}).returncode
    return rc, log.read_text(errors="replace"), time.perf_counter() - t0


def summary_line(tool: str, shards: list[list[str]], runs: list[tuple[int, str, float]]
                 ) -> tuple[bool, str]:
    """A tool's runs over every shard of the tests in one line, with the slowest shard."""
    clean, line = summarize(tool, "\n".join(out for _, out, _ in runs),
                            max(rc for rc, _, _ in runs))
    slow = max(range(len(runs)), key=lambda i: runs[i][2])
    return clean, f"{line} [slowest {Path(shards[slow][0]).stem} {runs[slow][2]:.0f} s]"


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
    kernels = rawgraph_kernels(here.parent / "kernels_cu")
    t0, results = time.perf_counter(), []
    with ThreadPoolExecutor(args.jobs) as pool:  # every (tool, shard) run side by side
        futures = {tool: [pool.submit(run_one, tool, shard, args.extra,
                                      args.logs / f"{tool}-{Path(shard[0]).stem}.log", kernels)
                          for shard in shards] for tool in tools}
        for tool in tools:
            results.append(summary_line(tool, shards, [f.result() for f in futures[tool]]))
            print(results[-1][1], flush=True)
    print(f"{len(tools)} tools in {time.perf_counter() - t0:.0f} s")
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
