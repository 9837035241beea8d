"""LlamaConfig: the decoder's dimensions, with named presets and Hugging Face config.json."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rawgraph.ops.rope import Llama3Scaling


def _ids(v: Any) -> tuple[int, ...]:
    """eos_token_id as config.json writes it: absent, one id, or a list."""
    if v is None:
        return ()
    return tuple(int(x) for x in (v if isinstance(v, list) else [v]))


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
    rope_scaling: Llama3Scaling | None = None
    rms_eps: float = 1e-5
    tie_embeddings: bool = False
    max_position: int = 8192
    dtype: str = "float16"
    name: str = "custom"
    eos: tuple[int, ...] = ()  # end-of-sequence ids (config.json's eos_token_id)

    def __post_init__(self) -> None:
        problems = []
        if self.heads % self.kv_heads:
            problems.append(f"heads ({self.heads}) must be a multiple of kv_heads "
                            f"({self.kv_heads})")
        if self.head_dim % 2:
            problems.append(f"head_dim ({self.head_dim}) must be even")
        if self.dtype not in ("float16", "bfloat16"):
            problems.append(f"dtype {self.dtype!r} must be float16 or bfloat16")
        for f in ("vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate"):
            if getattr(self, f) <= 0:
                problems.append(f"{f} must be positive")
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
        """From a Hugging Face config.json dict; raises ValueError naming what is unsupported."""
        arch = cfg.get("architectures") or []
        if cfg.get("model_type") != "llama" and "LlamaForCausalLM" not in arch:
            raise ValueError(f"unsupported architecture {arch or cfg.get('model_type')!r}: "
                             f"rawgraph runs LlamaForCausalLM checkpoints")
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size"):
            if key not in cfg:
                raise ValueError(f"config.json lacks {key!r}")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported (silu only)")
        if cfg.get("attention_bias") or cfg.get("mlp_bias"):
            raise ValueError("attention_bias / mlp_bias are not supported")
        heads = cfg["num_attention_heads"]
        scaling = cfg.get("rope_scaling")
        rope = None
        if scaling:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind != "llama3":
                raise ValueError(f"rope_scaling type {kind!r} is not supported (llama3 only)")
            rope = Llama3Scaling(float(scaling["factor"]), float(scaling["low_freq_factor"]),
                                 float(scaling["high_freq_factor"]),
                                 int(scaling["original_max_position_embeddings"]))
        torch_dtype = cfg.get("torch_dtype", "float16")
        return LlamaConfig(
            vocab=cfg["vocab_size"], hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"],
            heads=heads, kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate=cfg["intermediate_size"], rope_theta=float(cfg.get("rope_theta", 1e4)),
            rope_scaling=rope, rms_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position=int(cfg.get("max_position_embeddings", 8192)),
            dtype=dtype or ("bfloat16" if torch_dtype == "bfloat16" else "float16"),
            name=cfg.get("_name_or_path") or "checkpoint", eos=_ids(cfg.get("eos_token_id")))

    def to_hf(self) -> dict[str, Any]:
        """A Hugging Face style config.json dict for this configuration."""
        out: dict[str, Any] = {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": self.vocab, "hidden_size": self.hidden,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
            "intermediate_size": self.intermediate, "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_eps, "tie_word_embeddings": self.tie_embeddings,
            "max_position_embeddings": self.max_position, "hidden_act": "silu",
            "torch_dtype": self.dtype,
        }
        if self.eos:
            out["eos_token_id"] = self.eos[0] if len(self.eos) == 1 else list(self.eos)
        if self.rope_scaling is not None:
            s = self.rope_scaling
            out["rope_scaling"] = {"rope_type": "llama3", "factor": s.factor,
                                   "low_freq_factor": s.low_freq_factor,
                                   "high_freq_factor": s.high_freq_factor,
                                   "original_max_position_embeddings":
                                       s.original_max_position_embeddings}
        return out


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
