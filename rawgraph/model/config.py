"""ModelConfig: the decoder's family and dimensions, with named presets and Hugging Face
config.json."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rawgraph.model import hfconfig
from rawgraph.model.family import FAMILIES, Family
from rawgraph.ops.rope import Llama3Scaling, RopeScaling, attention_factor


@dataclass(frozen=True)
class ModelConfig:
    """Family, dimensions and constants of a decoder (`family`: a row of
    rawgraph.model.family.FAMILIES; `sliding_window`: the key window its config states, None
    when none)."""

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
    family: str = "llama"
    sliding_window: int | None = None

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
        if self.family not in FAMILIES:
            problems.append(f"family {self.family!r} must be one of {', '.join(FAMILIES)}")
        w = self.sliding_window
        if w is not None and (type(w) is not int or w < 1):
            problems.append(f"sliding_window must be a positive integer or None, got {w!r}")
        if self.dtype not in ("float16", "bfloat16"):
            problems.append(f"dtype {self.dtype!r} must be float16 or bfloat16")
        if problems:
            raise ValueError(f"invalid ModelConfig {self.name!r}: " + "; ".join(problems))

    @property
    def fam(self) -> Family:
        """This model's row of the family table."""
        return FAMILIES[self.family]

    @property
    def q_size(self) -> int:
        """Columns of the query projection."""
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Columns of the key (or value) projection."""
        return self.kv_heads * self.head_dim

    def _layer_params(self) -> int:
        extra = self.fam.layer_tensors(self.q_size, self.kv_size, self.head_dim).values()
        return (self.hidden * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden
                + 3 * self.hidden * self.intermediate + 2 * self.hidden
                + sum(math.prod(s) for s in extra))

    def weight_bytes(self) -> int:
        """Bytes of all weights in 16-bit storage."""
        head = 0 if self.tie_embeddings else self.vocab * self.hidden
        return 2 * (self.layers * self._layer_params() + self.vocab * self.hidden + head
                    + self.hidden)

    def decode_bytes(self) -> int:
        """Weight bytes one decode step must read: every layer and the LM head (the embedding
        table contributes one row per token)."""
        return 2 * (self.layers * self._layer_params() + self.vocab * self.hidden + self.hidden)

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (e.g. fewer layers)."""
        return dataclasses.replace(self, **changes)

    @staticmethod
    def from_hf(cfg: dict[str, Any], dtype: str | None = None) -> ModelConfig:
        """From a Hugging Face config.json dict, in either spelling (rope_parameters and
        dtype, or rope_theta, rope_scaling and torch_dtype); ValueError naming the field that
        is missing, malformed or unsupported. `dtype` overrides the checkpoint's."""
        fields = hfconfig.read(cfg)
        if dtype is not None:
            fields["dtype"] = dtype
        return ModelConfig(**fields)

    def to_hf(self) -> dict[str, Any]:
        """A Hugging Face style config.json dict for this configuration (classic spelling)."""
        return hfconfig.write(self)

    @property
    def attention_scale(self) -> float:
        """The softmax scale of attention: 1 / sqrt(head_dim), times the square of the factor
        RoPE scales q and k by (YaRN)."""
        return attention_factor(self.rope_scaling) ** 2 / math.sqrt(self.head_dim)


PRESETS: dict[str, ModelConfig] = {
    # seconds to run anywhere; the demo's and the tests' default (head_dim 64: GPU kernels)
    "tiny": ModelConfig(vocab=512, hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64,
                        intermediate=512, rope_theta=10000.0, max_position=2048, name="tiny"),
    "llama-1b": ModelConfig(vocab=128256, hidden=2048, layers=16, heads=32, kv_heads=8,
                            head_dim=64, intermediate=8192, rope_theta=500000.0,
                            rope_scaling=Llama3Scaling(), tie_embeddings=True,
                            max_position=131072, dtype="bfloat16", name="llama-1b"),
    "llama-8b": ModelConfig(vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8,
                            head_dim=128, intermediate=14336, rope_theta=500000.0,
                            rope_scaling=Llama3Scaling(factor=8.0), max_position=131072,
                            dtype="bfloat16", name="llama-8b"),
    # Llama-3.1-70B's shape: its 16-bit weights (141 GB) do not fit one H200; quantized alone
    # (`Model(quantize=..., keep_16bit=False)`) they do: 70 GB in FP8, 35 GB in 4-bit
    "llama-70b": ModelConfig(vocab=128256, hidden=8192, layers=80, heads=64, kv_heads=8,
                             head_dim=128, intermediate=28672, rope_theta=500000.0,
                             rope_scaling=Llama3Scaling(factor=8.0), max_position=131072,
                             dtype="bfloat16", name="llama-70b"),
    # the other families' shapes users run (Qwen2.5-1.5B-Instruct, Qwen3-8B, Mistral-7B v0.3)
    "qwen2.5-1.5b": ModelConfig(vocab=151936, hidden=1536, layers=28, heads=12, kv_heads=2,
                                head_dim=128, intermediate=8960, rope_theta=1000000.0,
                                rms_eps=1e-6, tie_embeddings=True, max_position=32768,
                                dtype="bfloat16", name="qwen2.5-1.5b", family="qwen2"),
    "qwen3-8b": ModelConfig(vocab=151936, hidden=4096, layers=36, heads=32, kv_heads=8,
                            head_dim=128, intermediate=12288, rope_theta=1000000.0,
                            rms_eps=1e-6, max_position=40960, dtype="bfloat16",
                            name="qwen3-8b", family="qwen3"),
    "mistral-7b": ModelConfig(vocab=32768, hidden=4096, layers=32, heads=32, kv_heads=8,
                              head_dim=128, intermediate=14336, rope_theta=1000000.0,
                              max_position=32768, dtype="bfloat16", name="mistral-7b",
                              family="mistral"),
}


def preset(name: str) -> ModelConfig:
    """A named configuration (PRESETS: tiny, llama-1b, llama-8b and the other families')."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]
