"""The PyTorch peer of a benchmark: `benchmarks/torch_reference.py` in a subprocess, on the
same shapes, in the same run (rawgraph never imports torch; the script is in a source
checkout only, and torch on some machines only)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the checkout (or site-packages) holding rawgraph/
SCRIPT = ROOT / "benchmarks" / "torch_reference.py"


def missing() -> str | None:
    """Why the peer cannot run here, or None when it can."""
    if os.environ.get("RAWGRAPH_NO_PEER"):  # an A/B of two rawgraph versions needs no peer
        return "RAWGRAPH_NO_PEER is set"
    if not SCRIPT.is_file():
        return f"{SCRIPT} not found (a source checkout has it)"
    if importlib.util.find_spec("torch") is None:
        return "torch is not importable"
    return None


def measure(what: str, cases: list[tuple[int, ...]], *, preset: str | None = None,
            compile_b1: bool = False, timeout_s: float = 900.0) -> tuple[list[dict], str]:
    """The script's rows for `cases` of `what` (decode, attention, matmul, prefill), and
    what went wrong ("" when nothing did). Never raises for a missing or failing peer: the
    benchmark's own rows stand without it."""
    why = missing()
    if why:
        return [], why
    cmd = [sys.executable, str(SCRIPT), what, "--cases",
           ",".join(":".join(map(str, c)) for c in cases)]
    cmd += ["--preset", preset] if preset else []
    cmd += ["--compile"] if compile_b1 else []
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                             env=_env())
    except subprocess.TimeoutExpired:
        return [], f"the PyTorch reference took over {timeout_s:.0f} s"
    if out.returncode:
        return [], "the PyTorch reference failed: " + out.stderr.strip()[-500:]
    try:  # the rows are the last line (a library may have printed before it)
        return json.loads(out.stdout.strip().splitlines()[-1]), ""
    except (IndexError, ValueError):
        return [], "the PyTorch reference printed no rows: " + out.stdout.strip()[-200:]


def _env() -> dict[str, str]:
    """The script's environment: this rawgraph first on its import path. The script takes
    its shapes from rawgraph's presets, and run from a checkout that is not installed (the
    bench started from the checkout's root, say) it would not find them: its own folder,
    benchmarks/, is what Python puts first."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def index(rows: list[dict], *keys: str) -> dict[tuple, dict[str, Any]]:
    """The peer's rows by the values of `keys` (those it measured, not skipped)."""
    return {tuple(r[k] for k in keys): r for r in rows if "skipped" not in r}
