"""The decoder's tensors: their Hugging Face names and shapes, and seeded random weights."""

from __future__ import annotations

import numpy as np

from rawgraph.dtypes import to_storage
from rawgraph.model.config import LlamaConfig


def layer_shapes(cfg: LlamaConfig, i: int) -> dict[str, tuple]:
    """Names and [out, in] shapes of layer i's tensors."""
    p = f"model.layers.{i}."
    return {
        p + "input_layernorm.weight": (cfg.hidden,),
        p + "self_attn.q_proj.weight": (cfg.q_size, cfg.hidden),
        p + "self_attn.k_proj.weight": (cfg.kv_size, cfg.hidden),
        p + "self_attn.v_proj.weight": (cfg.kv_size, cfg.hidden),
        p + "self_attn.o_proj.weight": (cfg.hidden, cfg.q_size),
        p + "post_attention_layernorm.weight": (cfg.hidden,),
        p + "mlp.gate_proj.weight": (cfg.intermediate, cfg.hidden),
        p + "mlp.up_proj.weight": (cfg.intermediate, cfg.hidden),
        p + "mlp.down_proj.weight": (cfg.hidden, cfg.intermediate),
    }


def shapes(cfg: LlamaConfig) -> dict[str, tuple]:
    """Every tensor a checkpoint of `cfg` holds (lm_head only when not tied)."""
    out = {"model.embed_tokens.weight": (cfg.vocab, cfg.hidden)}
    for i in range(cfg.layers):
        out.update(layer_shapes(cfg, i))
    out["model.norm.weight"] = (cfg.hidden,)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = (cfg.vocab, cfg.hidden)
    return out


def random_weights(cfg: LlamaConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random weights in `cfg.dtype` storage (bf16 as uint16 bits), deterministic.

    Projections ~ N(0, 1/fan_in), norms ~ 1 + N(0, 0.1), embeddings ~ N(0, 1): activations stay
    O(1) through the layers, so logits are informative in tests.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes(cfg).items():
        if len(shape) == 1:
            x = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
        elif name == "model.embed_tokens.weight":
            x = rng.standard_normal(shape, dtype=np.float32)
        else:
            x = rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[1]))
        out[name] = to_storage(x, cfg.dtype)
    return out
