"""Benchmark result files: JSON with date, commit and GPU. A full run is the benchmark's
current result, `benchmarks/<name>.json` (history lives in git); a partial run (`--only`)
is an experiment and goes under `.scratch/bench/`."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from rawgraph.cuda.device import info

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "benchmarks"
SCRATCH_DIR = ROOT / ".scratch" / "bench"


def commit() -> str:
    """The git commit being measured ($RAWGRAPH_COMMIT wins: a copy of the tree, as on the
    GPU machine, may carry an older .git), "+modified" when tracked files differ from it."""
    if os.environ.get("RAWGRAPH_COMMIT"):
        return os.environ["RAWGRAPH_COMMIT"]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout.strip()
    try:
        head = git("rev-parse", "HEAD")
        return head + ("+modified" if git("status", "--porcelain", "--untracked-files=no")
                       else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def save(name: str, rows: list[dict[str, Any]], out_dir: str | Path | None = None,
         only: str = "") -> Path:
    """Write {bench, only, date, commit, device, rows}: a full run (no `only`, no
    `out_dir`) to benchmarks/<name>.json, replacing the last; otherwise a dated file in
    `out_dir` (default .scratch/bench/)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    doc = {"bench": name, "only": only, "date": now.isoformat(timespec="seconds"),
           "commit": commit(), "device": info(), "rows": rows}
    if out_dir is None and not only:
        out, path_name = RESULTS_DIR, f"{name}.json"
    else:
        tag = "-" + "".join(c if c.isalnum() else "_" for c in only) if only else ""
        out, path_name = Path(out_dir or SCRATCH_DIR), f"{name}{tag}-{now:%Y%m%d-%H%M%S}.json"
    out.mkdir(parents=True, exist_ok=True)
    path = out / path_name
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    """A fixed-width text table of `rows` with columns `cols`."""
    cells = [[_cell(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths]), *map(line, cells)])


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)
