"""A generation request and its life in the engine: waiting, prefilling, decoding, finished.

Everything a request carries is checked when it is made, so a bad request is refused (with a
message naming the field) before it reaches an engine.
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rawgraph.ops.logits import MAX_BANS
from rawgraph.ops.sampling import SamplingParams

_ids = itertools.count()


def token_ids(ids: Any, what: str = "prompt") -> list[int]:
    """`ids` as a list of Python ints: a list, tuple or range of integers, or a 1-D NumPy
    integer array. TypeError for anything else (floats, strings, bools, nested lists),
    ValueError for negative ids."""
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise TypeError(f"{what}: a NumPy array of token ids must be 1-D integers, got "
                            f"{ids.dtype} of shape {ids.shape}")
        out = ids.tolist()
    elif isinstance(ids, (list, tuple, range)):
        out = list(ids)
        # plain ints (the usual case) pass in one C-level pass; a prompt's ids are checked
        # on its way to the first token (an ABC check per id took 4.7 ms at 8,192 ids)
        if not set(map(type, out)) <= {int}:
            bad = next((i for i, t in enumerate(out) if isinstance(t, bool)
                        or not isinstance(t, numbers.Integral)), None)
            if bad is not None:
                raise TypeError(f"{what}: token ids must be integers, got "
                                f"{type(out[bad]).__name__} {out[bad]!r} at index {bad}")
            out = [int(t) for t in out]
    else:
        raise TypeError(f"{what} must be a list of token ids (or a 1-D integer array), got "
                        f"{type(ids).__name__}")
    if out and min(out) < 0:
        raise ValueError(f"{what}: token ids must be >= 0, got {min(out)}")
    return out


def _count(v: Any, what: str, low: int) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{what} must be an integer, got {type(v).__name__} {v!r}")
    if v < low:
        raise ValueError(f"{what} = {v} must be >= {low}")
    return int(v)


def _stop(v: Any) -> frozenset[int]:
    if isinstance(v, (numbers.Integral, str, bytes)) or not isinstance(v, Iterable):
        raise TypeError(f"stop must be a collection of token ids (e.g. {{{v!r}}}), got "
                        f"{type(v).__name__} {v!r}")
    ids = list(v) if not isinstance(v, np.ndarray) else v
    return frozenset(token_ids(ids, "stop"))


@dataclass(frozen=True)
class Logprob:
    """A token's log-probability under the model (its raw distribution), and the `top`
    alternatives asked for: (token id, log-probability), larger first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(eq=False)
class Request:
    """`prompt` token ids in, up to `max_new_tokens` ids out; stops early at a `stop` id.

    `arrival` is the engine step at which the request shows up (0: at once), so a script of
    requests can arrive over time. The engine fills the fields below the line; a request
    runs once (make a new one to run the same prompt again). Requests compare by identity.
    """

    prompt: list[int]
    max_new_tokens: int = 32
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: frozenset[int] = frozenset()
    arrival: int = 0
    name: str = ""
    # ---- engine state
    slot: int = -1
    prefilled: int = 0  # prompt tokens already in the cache
    cached: int = 0  # of those, the ones its prefix found cached (not prefilled by it)
    keys: list[int] = field(default_factory=list, repr=False)  # its prompt blocks' keys
    output: list[int] = field(default_factory=list)
    finish: str = ""  # "stop", "length" or "abort" once done
    first_step: int = -1
    last_step: int = -1
    logprobs: list[Logprob] = field(default_factory=list)  # per output (sampling.logprobs)
    prompt_logprobs: list[Logprob | None] = field(default_factory=list)  # sampling's; [0] None

    def __post_init__(self) -> None:
        self.prompt = token_ids(self.prompt)
        if not self.prompt:
            raise ValueError("a request needs at least one prompt token")
        self.max_new_tokens = _count(self.max_new_tokens, "max_new_tokens", 1)
        if not isinstance(self.sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got "
                            f"{type(self.sampling).__name__}")
        self.stop = _stop(self.stop)
        if self.sampling.min_tokens and len(self.stop) > MAX_BANS:
            raise ValueError(f"min_tokens bans the {len(self.stop)} stop ids, at most "
                             f"{MAX_BANS}")
        self.arrival = _count(self.arrival, "arrival", 0)
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {type(self.name).__name__}")
        self.name = self.name or f"req{next(_ids)}"

    @property
    def decoding(self) -> bool:
        """The prompt is in the cache and tokens are being generated."""
        return self.prefilled == len(self.prompt) and not self.finish
