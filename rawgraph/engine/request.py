"""A generation request and its life in the engine: waiting, prefilling, decoding, finished."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from rawgraph.ops.sampling import SamplingParams

_ids = itertools.count()


@dataclass
class Request:
    """`prompt` token ids in, up to `max_new_tokens` ids out; stops early at a `stop` id.

    `arrival` is the engine step at which the request shows up (0: at once), so a script of
    requests can arrive over time. The engine fills the fields below the line.
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
    output: list[int] = field(default_factory=list)
    finish: str = ""  # "stop" or "length" once done
    first_step: int = -1
    last_step: int = -1

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("a request needs at least one prompt token")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens = {self.max_new_tokens} must be >= 1")
        self.name = self.name or f"req{next(_ids)}"

    @property
    def decoding(self) -> bool:
        """The prompt is in the cache and tokens are being generated."""
        return self.prefilled == len(self.prompt) and not self.finish
