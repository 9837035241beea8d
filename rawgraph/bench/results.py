"""Benchmark result files: JSON with date, commit and GPU, under benchmarks/results/."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from rawgraph.cuda.device import info

RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def commit() -> str:
    """The git commit being measured ($RAWGRAPH_COMMIT wins: the GPU machine has no .git)."""
    if os.environ.get("RAWGRAPH_COMMIT"):
        return os.environ["RAWGRAPH_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def save(name: str, rows: list[dict[str, Any]], out_dir: str | Path | None = None) -> Path:
    """Write {bench, date, commit, device, rows} to <out_dir>/<name>-<date>.json."""
    now = datetime.datetime.now(datetime.timezone.utc)
    doc = {"bench": name, "date": now.isoformat(timespec="seconds"), "commit": commit(),
           "device": info(), "rows": rows}
    out = Path(out_dir or RESULTS_DIR)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{now:%Y%m%d-%H%M%S}.json"
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
