"""The decoder's tensors: their Hugging Face names and shapes, the device layout they are
stacked into, the checks a checkpoint's tensors pass on their way in, and seeded random
weights (on the host, or filled on the device)."""

from __future__ import annotations

import functools
from typing import Any

import cupy
import numpy as np

from rawgraph.dtypes import storage_dtype, to_storage
from rawgraph.model.config import ModelConfig
from rawgraph.model.safetensors import CheckpointError
from rawgraph.ops.quantized import FP8_K, I4_GROUP


def layer_shapes(cfg: ModelConfig, i: int) -> dict[str, tuple]:
    """Names and [out, in] shapes of layer i's tensors (LLaMA's, then its family's)."""
    p = f"model.layers.{i}."
    extra = cfg.fam.layer_tensors(cfg.q_size, cfg.kv_size, cfg.head_dim)
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
        **{p + name: shape for name, shape in extra.items()},
    }


def shapes(cfg: ModelConfig) -> dict[str, tuple]:
    """Every tensor a checkpoint of `cfg` holds (lm_head only when not tied)."""
    out = {"model.embed_tokens.weight": (cfg.vocab, cfg.hidden)}
    for i in range(cfg.layers):
        out.update(layer_shapes(cfg, i))
    out["model.norm.weight"] = (cfg.hidden,)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = (cfg.vocab, cfg.hidden)
    return out


def random_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random weights in `cfg.dtype` storage (bf16 as uint16 bits), deterministic.

    Projections ~ N(0, 1/fan_in), norms ~ 1 + N(0, 0.1), biases ~ N(0, 0.1), embeddings
    ~ N(0, 1): activations stay O(1) through the layers, so logits are informative in tests.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes(cfg).items():
        if len(shape) == 1:
            x = float(not name.endswith(".bias")) + 0.1 * rng.standard_normal(shape,
                                                                               dtype=np.float32)
        elif name == "model.embed_tokens.weight":
            x = rng.standard_normal(shape, dtype=np.float32)
        else:
            x = rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[1]))
        out[name] = to_storage(x, cfg.dtype)
    return out


# (norm, projection): each layer's RMSNorm weights ride in the projection that reads the
# norm's output (`ops.fold_norm`, at load), so a decode step's norm is the GEMV's scale per
# row and no kernel of its own; the final norm stays (its LM head may be the embedding)
NORM_FOLDS = (("input_layernorm", "qkv"), ("post_attention_layernorm", "gate_up"))


def layout(cfg: ModelConfig) -> dict[str, tuple[tuple, tuple[str, ...]]]:
    """Device tensors: name -> (shape, the checkpoint tensors stacked into it). Q, K and V
    are one matrix (one GEMV; rope, the cache append and attention read strided views of
    its output), gate and up another, their rows interleaved in groups of 8 (`stack_gate_up`:
    one GEMV whose epilogue applies SiLU(gate) * up). Both hold their norm's weight once
    loaded (NORM_FOLDS); the norm weights stay as loaded, for inspection. A family's extras
    (rawgraph.model.family): "qkv_bias", the q, k and v biases end to end (q_size + 2
    kv_size,); "qk_norm", the q then the k head norm's weights (2 head_dim,)."""
    out: dict[str, tuple[tuple, tuple[str, ...]]] = {
        "embed": ((cfg.vocab, cfg.hidden), ("model.embed_tokens.weight",))}
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        for name in ("input_layernorm", "post_attention_layernorm"):
            out[p + name] = ((cfg.hidden,), (p + name + ".weight",))
        out[p + "qkv"] = ((cfg.q_size + 2 * cfg.kv_size, cfg.hidden),
                          tuple(p + f"self_attn.{x}_proj.weight" for x in "qkv"))
        if cfg.fam.qkv_bias:
            out[p + "qkv_bias"] = ((cfg.q_size + 2 * cfg.kv_size,),
                                   tuple(p + f"self_attn.{x}_proj.bias" for x in "qkv"))
        if cfg.fam.qk_norm:
            out[p + "qk_norm"] = ((2 * cfg.head_dim,),
                                  tuple(p + f"self_attn.{x}_norm.weight" for x in "qk"))
        out[p + "o_proj"] = ((cfg.hidden, cfg.q_size), (p + "self_attn.o_proj.weight",))
        out[p + "gate_up"] = ((2 * cfg.intermediate, cfg.hidden),
                              (p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"))
        out[p + "down_proj"] = ((cfg.hidden, cfg.intermediate), (p + "mlp.down_proj.weight",))
    out["norm"] = ((cfg.hidden,), ("model.norm.weight",))
    if not cfg.tie_embeddings:
        out["lm_head"] = ((cfg.vocab, cfg.hidden), ("lm_head.weight",))
    return out


# the layout tensors a quantizing model keeps a quantized copy of (`Model(quantize=)`): each
# layer's projections and the LM head (the embedding's own when tied)
QUANTIZED_WEIGHTS = ("qkv", "o_proj", "gate_up", "down_proj", "lm_head")
QUANTIZE_K = {"fp8": FP8_K, "int4": I4_GROUP}  # a copy's k must be a multiple of this


def quantized_copies(cfg: ModelConfig, quantize: str) -> dict[str, tuple[int, int]]:
    """The tensors `Model(quantize=quantize)` ("fp8", "int4") keeps a quantized copy of:
    name -> (n, k); those whose rows are not a multiple of QUANTIZE_K keep none."""
    dims = {name: shape for name, (shape, _) in layout(cfg).items()}
    if cfg.tie_embeddings:  # the LM head is the embedding; its copy its own
        dims["lm_head"] = dims["embed"]
    return {n: s for n, s in dims.items()  # type: ignore[misc]
            if n.rsplit(".", 1)[-1] in QUANTIZED_WEIGHTS and s[1] % QUANTIZE_K[quantize] == 0}


def quantized_bytes(quantize: str, n: int, k: int) -> int:
    """The bytes of an (n, k) weight's quantized copy: FP8 codes and a float32 scale a row;
    4-bit values, a 16-bit scale and a byte zero a group of I4_GROUP."""
    if quantize == "fp8":
        return n * k + 4 * n
    return n * k // 2 + 3 * n * (k // I4_GROUP)


def random_fill(view: cupy.ndarray, rng: Any, dtype: str, bias: bool = False) -> None:
    """N(0, 1/fan_in) for matrices, 1 + N(0, 0.1) for norm weights (N(0, 0.1) for a
    `bias`), in storage dtype."""
    if view.ndim == 1:
        x = float(not bias) + 0.1 * rng.standard_normal(view.shape, np.float32)
    else:
        x = rng.standard_normal(view.shape, np.float32) * np.float32(view.shape[1] ** -0.5)
    if dtype == "bfloat16":  # round to nearest even on the device, like to_bf16_bits
        u = x.view(np.uint32)
        view[...] = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    else:
        view[...] = x.astype(np.float16)


_NONFINITE = {"float16": 0x7C00, "bfloat16": 0x7F80}  # exponent bits all set: inf or NaN


@functools.cache
def _count_nonfinite() -> cupy.ReductionKernel:
    return cupy.ReductionKernel("uint16 x, uint16 mask", "int64 y", "(x & mask) == mask",
                                "a + b", "y = a", "0", "rawgraph_count_nonfinite")


def check_tensors(cfg: ModelConfig, tensors: dict[str, np.ndarray]) -> None:
    """ValueError naming a tensor the config needs that is missing, or has another shape or
    dtype than the config's storage (checkpoint.load has checked its own already)."""
    st = np.dtype(storage_dtype(cfg.dtype))
    for name, shape in shapes(cfg).items():
        t = tensors.get(name)
        if t is None:
            raise ValueError(f"tensor {name!r} is missing")
        if tuple(getattr(t, "shape", ())) != shape or getattr(t, "dtype", None) != st:
            raise ValueError(f"tensor {name!r} is {getattr(t, 'dtype', type(t).__name__)} "
                             f"{tuple(getattr(t, 'shape', ()))}; the config needs {st} {shape}")


def check_finite(views: list[tuple[str, cupy.ndarray]], dtype: str,
                  files: dict[str, Any]) -> None:
    """CheckpointError naming each tensor that holds NaN or infinities (one reduction per
    tensor on the device, one copy of the counts back)."""
    if not views:
        return
    mask, count = np.uint16(_NONFINITE[dtype]), _count_nonfinite()
    counts = cupy.stack([count(v.view(np.uint16), mask) for _, v in views]).get()
    bad = [(name, int(n)) for (name, _), n in zip(views, counts) if n]
    if bad:
        where = "; ".join(f"{files[k].name + ': ' if k in files else ''}tensor {k!r} holds {n} "
                          f"NaN or infinite values" for k, n in bad[:3])
        raise CheckpointError(where + (f" (and {len(bad) - 3} more tensors)" if len(bad) > 3
                                       else ""))
