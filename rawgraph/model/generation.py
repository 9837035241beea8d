"""generation_config.json: a checkpoint's default sampling parameters and end-of-sequence
ids, as transformers writes them (only the fields that differ from its defaults). A server
applies them to requests that do not set their own, as vLLM does."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rawgraph.model.checkpoint import json_object
from rawgraph.model.hfconfig import eos_ids
from rawgraph.model.safetensors import CheckpointError

FILE = "generation_config.json"
# fields that change what is sampled and are not applied yet: named at the server's start
_UNAPPLIED = {"min_p": 0.0, "no_repeat_ngram_size": 0,
              "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0}


@dataclass(frozen=True)
class GenerationConfig:
    """The defaults a checkpoint asks for (None: not set, the server's own default)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    eos: tuple[int, ...] = ()
    unapplied: tuple[str, ...] = ()  # "name=value" of the fields set that are not applied

    def sampling(self) -> dict[str, Any]:
        """The sampling defaults that are set: temperature, top_p, top_k,
        repetition_penalty."""
        return {k: v for k in ("temperature", "top_p", "top_k", "repetition_penalty")
                if (v := getattr(self, k)) is not None}


def _number(cfg: dict, name: str, low: float, high: float, where: str,
            open_low: bool = False) -> float | None:
    v = cfg.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or not low <= v <= high or (open_low and v == low):
        raise CheckpointError(f"{where}: {name} must be a number in {'(' if open_low else '['}"
                              f"{low}, {high}], got {v!r}")
    return float(v)


def read(root: Path) -> GenerationConfig:
    """The generation config of the checkpoint in `root` (none set when the file is absent);
    CheckpointError naming the file and the field for a value that is not what it should
    be."""
    path = Path(root) / FILE
    cfg = json_object(path)
    if cfg is None:
        return GenerationConfig()
    top_k = cfg.get("top_k")
    if top_k is not None and (type(top_k) is not int or not 0 <= top_k < 2**31):
        raise CheckpointError(f"{path}: top_k must be an integer in [0, 2**31), got {top_k!r}")
    try:
        eos = eos_ids(cfg)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None
    unapplied = tuple(f"{k}={cfg[k]}" for k, neutral in _UNAPPLIED.items()
                      if cfg.get(k) is not None and cfg[k] != neutral)
    return GenerationConfig(_number(cfg, "temperature", 0.0, math.inf, str(path)),
                            _number(cfg, "top_p", 0.0, 1.0, str(path), open_low=True), top_k,
                            _number(cfg, "repetition_penalty", 0.0, 2.0, str(path),
                                    open_low=True), eos, unapplied)
