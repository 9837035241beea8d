"""LlamaConfig: the decoder's dimensions, with named presets and Hugging Face config.json."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rawgraph.model import hfconfig
from rawgraph.ops.rope import Llama3Scaling, RopeScaling, attention_factor


@dataclass(frozen=True)
class LlamaConfig:
    """Dimensions and constants of a LLaMA-architecture decoder."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_eps: float = 1e-5
    tie_embeddings: bool = False
    max_position: int = 8192
    dtype: str = "float16"
    name: str = "custom"
    eos: tuple[int, ...] = ()  # end-of-sequence ids (config.json's eos_token_id)

    def __post_init__(self) -> None:
        problems = []
        for f in ("vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate",
                  "max_position"):
            v = getattr(self, f)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
                problems.append(f"{f} must be a positive integer, got {v!r}")
        if not problems:  # the checks below divide by these
            if self.heads % self.kv_heads:
                problems.append(f"heads ({self.heads}) must be a multiple of kv_heads "
                                f"({self.kv_heads})")
            if self.head_dim % 2:
                problems.append(f"head_dim ({self.head_dim}) must be even")
        for f in ("rope_theta", "rms_eps"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < math.inf:
                problems.append(f"{f} must be a positive number, got {v!r}")
        if self.dtype not in ("float16", "bfloat16"):
            problems.append(f"dtype {self.dtype!r} must be float16 or bfloat16")
        if problems:
            raise ValueError(f"invalid LlamaConfig {self.name!r}: " + "; ".join(problems))

    @property
    def q_size(self) -> int:
        """Columns of the query projection."""
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Columns of the key (or value) projection."""
        return self.kv_heads * self.head_dim

    def _layer_params(self) -> int:
        return (self.hidden * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden
                + 3 * self.hidden * self.intermediate + 2 * self.hidden)

    def weight_bytes(self) -> int:
        """Bytes of all weights in 16-bit storage."""
        head = 0 if self.tie_embeddings else self.vocab * self.hidden
        return 2 * (self.layers * self._layer_params() + self.vocab * self.hidden + head
                    + self.hidden)

    def decode_bytes(self) -> int:
        """Weight bytes one decode step must read: every layer and the LM head (the embedding
        table contributes one row per token)."""
        return 2 * (self.layers * self._layer_params() + self.vocab * self.hidden + self.hidden)

    def replace(self, **changes: Any) -> LlamaConfig:
        """A copy with some fields changed (e.g. fewer layers)."""
        return dataclasses.replace(self, **changes)

    @staticmethod
    def from_hf(cfg: dict[str, Any], dtype: str | None = None) -> LlamaConfig:
        """From a Hugging Face config.json dict, in either spelling (rope_parameters and
        dtype, or rope_theta, rope_scaling and torch_dtype); ValueError naming the field that
        is missing, malformed or unsupported. `dtype` overrides the checkpoint's."""
        fields = hfconfig.read(cfg)
        if dtype is not None:
            fields["dtype"] = dtype
        return LlamaConfig(**fields)

    def to_hf(self) -> dict[str, Any]:
        """A Hugging Face style config.json dict for this configuration (classic spelling)."""
        return hfconfig.write(self)

    @property
    def attention_scale(self) -> float:
        """The softmax scale of attention: 1 / sqrt(head_dim), times the square of the factor
        RoPE scales q and k by (YaRN)."""
        return attention_factor(self.rope_scaling) ** 2 / math.sqrt(self.head_dim)


PRESETS: dict[str, LlamaConfig] = {
    # seconds to run anywhere; the demo's and the tests' default (head_dim 64: GPU kernels)
    "tiny": LlamaConfig(vocab=512, hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64,
                        intermediate=512, rope_theta=10000.0, max_position=2048, name="tiny"),
    "llama-1b": LlamaConfig(vocab=128256, hidden=2048, layers=16, heads=32, kv_heads=8,
                            head_dim=64, intermediate=8192, rope_theta=500000.0,
                            rope_scaling=Llama3Scaling(), tie_embeddings=True,
                            max_position=131072, dtype="bfloat16", name="llama-1b"),
    "llama-8b": LlamaConfig(vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8,
                            head_dim=128, intermediate=14336, rope_theta=500000.0,
                            rope_scaling=Llama3Scaling(factor=8.0), max_position=131072,
                            dtype="bfloat16", name="llama-8b"),
}


def preset(name: str) -> LlamaConfig:
    """A named configuration: tiny, llama-1b or llama-8b."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]
