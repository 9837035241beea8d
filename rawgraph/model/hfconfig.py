"""config.json as Hugging Face writes it, in both spellings, read strictly.

The classic spelling has `rope_theta`, `rope_scaling` ({rope_type or type, factor, ...}) and
`torch_dtype`; transformers 5 writes `rope_parameters` ({rope_type, rope_theta, factor, ...})
and `dtype`. Every field that changes the math is read, with Hugging Face's defaults where it
is absent, or the config is refused with a message naming the field: a wrong type, a value out
of range, a RoPE type or an architecture rawgraph does not run. Nothing falls back silently.
"""

from __future__ import annotations

import math
from typing import Any

from rawgraph.model import quant
from rawgraph.model.family import FAMILIES, Family, family
from rawgraph.ops.rope import DynamicScaling, LinearScaling, Llama3Scaling, RopeScaling, YarnScaling

_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size")
_DTYPES = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float16", None: "float16"}
# keys a RoPE dict may hold besides rope_type / type / rope_theta, per type (Hugging Face's
# validation lists; anything else is refused rather than ignored)
_ROPE_KEYS = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"},
    "yarn": {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
             "beta_slow", "mscale", "mscale_all_dim", "truncate"},
}
_COMMON = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}


def _type_name(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def integer(d: dict, key: str, where: str = "", *, default: Any = ..., low: int = 1) -> int:
    """d[key] as an int >= low (JSON integers only: no bools, floats or strings)."""
    v = d.get(key, default)
    if v is ...:
        raise ValueError(f"{where}{key} is missing")
    if type(v) is not int:
        raise ValueError(f"{where}{key} must be an integer, got {_type_name(v)} {v!r}")
    if v < low:
        raise ValueError(f"{where}{key} must be at least {low}, got {v}")
    return v


def number(d: dict, key: str, where: str = "", *, default: Any = ...,
           positive: bool = True) -> float:
    """d[key] as a finite float (a JSON number; > 0 unless positive=False)."""
    v = d.get(key, default)
    if v is ...:
        raise ValueError(f"{where}{key} is missing")
    if type(v) not in (int, float) or not math.isfinite(v):
        raise ValueError(f"{where}{key} must be a finite number, got {_type_name(v)} {v!r}")
    if positive and v <= 0:
        raise ValueError(f"{where}{key} must be positive, got {v}")
    return float(v)


def flag(d: dict, key: str, default: bool) -> bool:
    """d[key] as a JSON boolean."""
    v = d.get(key, default)
    if type(v) is not bool:
        raise ValueError(f"{key} must be true or false, got {_type_name(v)} {v!r}")
    return v


def _architecture(cfg: dict) -> Family:
    """The family config.json names (model_type, architectures, or both agreeing)."""
    model_type, arch = cfg.get("model_type"), cfg.get("architectures")
    if model_type is None and arch is None:
        raise ValueError("neither model_type nor architectures says what model this is")
    if arch is not None and (not isinstance(arch, list)
                             or not all(isinstance(a, str) for a in arch)):
        raise ValueError(f"architectures must be a list of names, got {arch!r}")
    if model_type is not None:
        if not isinstance(model_type, str):
            raise ValueError(f"model_type must be a string, got {_type_name(model_type)}")
        fam = family(model_type)
        if arch is not None and fam.architecture not in arch:
            raise ValueError(f"architectures {arch} is not supported for model_type "
                             f"{model_type!r}: rawgraph runs {fam.architecture}")
        return fam
    known = [f for f in FAMILIES.values() if f.architecture in arch]
    if not known:
        raise ValueError(f"architectures {arch} is not supported: rawgraph runs "
                         f"{', '.join(f.architecture for f in FAMILIES.values())}")
    return known[0]


def _math_fields(cfg: dict, fam: Family) -> None:
    """Fields that would change the math and that rawgraph does not run."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported (silu only)")
    # LLaMA's and Qwen3's attention_bias puts a bias on o_proj too; Qwen2's q, k, v biases
    # are the family's own (its config has no such field)
    for key in ("attention_bias", "mlp_bias"):
        if flag(cfg, key, False):
            raise ValueError(f"{key} true is not supported ({fam.name} projections without "
                             f"biases{' but q, k, v' if fam.qkv_bias else ''})")
    for key in ("num_experts", "num_local_experts"):  # the MoE variants of these families
        if cfg.get(key):
            raise ValueError(f"{key} {cfg[key]!r}: mixture-of-experts models are not supported")
    quant.read(cfg.get("quantization_config"))  # FP8 and 4-bit formats, each field checked


def window(cfg: dict, fam: Family, layers: int) -> int | None:
    """The sliding key window any layer has, as the family's config states it: Mistral's
    `sliding_window` (null: none); Qwen's `sliding_window` on the layers `layer_types` marks
    "sliding_attention" (or, without layer_types, those from `max_window_layers` on when
    `use_sliding_window`). None: every layer attends to its whole context."""
    if fam.window is None:
        return None
    if fam.window == "sliding_window":
        v = cfg.get("sliding_window")
        return None if v is None else integer(cfg, "sliding_window")
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or not set(types) <= {
                "full_attention", "sliding_attention"}:
            raise ValueError(f"layer_types must list full_attention or sliding_attention for "
                             f"each of the {layers} layers, got {types!r}")
        slides = "sliding_attention" in types
    else:
        first = integer(cfg, "max_window_layers", default=layers, low=0)
        slides = flag(cfg, "use_sliding_window", False) and first < layers
    if not slides:
        return None
    return integer(cfg, "sliding_window", default=4096)


def rope(cfg: dict, max_position: int) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling) from rope_parameters (transformers 5) or rope_theta +
    rope_scaling (classic, `type` as the older spelling of `rope_type`)."""
    field = "rope_parameters" if cfg.get("rope_parameters") is not None else "rope_scaling"
    p = cfg.get(field)
    if p is None:
        p = {}
    if not isinstance(p, dict):
        raise ValueError(f"{field} must be an object or null, got {_type_name(p)} {p!r}")
    if p and all(isinstance(v, dict) for v in p.values()):
        raise ValueError(f"{field}: RoPE parameters per layer type ({sorted(p)}) are not "
                         f"supported")
    w = f"{field}."
    kind = p.get("rope_type", p.get("type", "default"))
    if not isinstance(kind, str) or kind not in _ROPE_KEYS:
        raise ValueError(f"{w}rope_type {kind!r} is not supported (one of "
                         f"{', '.join(sorted(_ROPE_KEYS))})")
    extra = sorted(set(p) - _COMMON - _ROPE_KEYS[kind])
    if extra:
        raise ValueError(f"{w}{extra[0]} is not a field of rope_type {kind!r}")
    theta = number(p, "rope_theta", w, default=None) if "rope_theta" in p else \
        number(cfg, "rope_theta", default=10000.0)
    partial = p.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(f"partial_rotary_factor {partial!r} is not supported (RoPE over the "
                         f"whole head only)")
    if kind == "default":
        return theta, None
    factor = number(p, "factor", w)
    if kind == "linear":
        return theta, LinearScaling(factor)
    if kind == "dynamic":
        return theta, DynamicScaling(factor)
    # Hugging Face: a top-level original_max_position_embeddings wins, then the dict's, then
    # max_position_embeddings
    if "original_max_position_embeddings" in cfg:
        original = integer(cfg, "original_max_position_embeddings")
    else:
        original = integer(p, "original_max_position_embeddings", w, default=max_position)
    if kind == "llama3":
        low, high = number(p, "low_freq_factor", w), number(p, "high_freq_factor", w)
        if high <= low:
            raise ValueError(f"{w}high_freq_factor ({high}) must exceed low_freq_factor ({low})")
        return theta, Llama3Scaling(factor, low, high, original)
    opt = {k: number(p, k, w, default=None) for k in
           ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")
           if p.get(k) is not None}
    return theta, YarnScaling(factor, original, truncate=flag(p, "truncate", True), **opt)


def dtype_of(cfg: dict) -> str:
    """The storage dtype: the checkpoint's float16 or bfloat16; float32 (or none named)
    runs in float16."""
    name = cfg.get("dtype", cfg.get("torch_dtype"))
    if not (name is None or isinstance(name, str)) or name not in _DTYPES:
        raise ValueError(f"dtype {name!r} is not supported (float16, bfloat16 or float32)")
    return _DTYPES[name]


def eos_ids(cfg: dict) -> tuple[int, ...]:
    """eos_token_id as config.json writes it: absent or null, one id, or a list."""
    v = cfg.get("eos_token_id")
    ids = [] if v is None else v if isinstance(v, list) else [v]
    if not all(type(x) is int and x >= 0 for x in ids):
        raise ValueError(f"eos_token_id must be a token id or a list of them, got {v!r}")
    return tuple(ids)


def read(cfg: Any) -> dict[str, Any]:
    """The ModelConfig fields of a config.json dict (ValueError naming the field)."""
    if not isinstance(cfg, dict):
        raise ValueError(f"config.json must be a JSON object, got a {_type_name(cfg)}")
    fam = _architecture(cfg)
    dims = {k: integer(cfg, k) for k in _REQUIRED}
    _math_fields(cfg, fam)
    heads = dims["num_attention_heads"]
    kv_heads = integer(cfg, "num_key_value_heads", default=None) \
        if cfg.get("num_key_value_heads") is not None else heads
    if cfg.get("head_dim") is not None:
        head_dim = integer(cfg, "head_dim")
    elif dims["hidden_size"] % heads:
        raise ValueError(f"hidden_size ({dims['hidden_size']}) is not a multiple of "
                         f"num_attention_heads ({heads}) and head_dim is not given")
    else:
        head_dim = dims["hidden_size"] // heads
    max_position = integer(cfg, "max_position_embeddings", default=2048)
    theta, scaling = rope(cfg, max_position)
    name = cfg.get("_name_or_path") or "checkpoint"
    return dict(vocab=dims["vocab_size"], hidden=dims["hidden_size"],
                layers=dims["num_hidden_layers"], heads=heads, kv_heads=kv_heads,
                head_dim=head_dim, intermediate=dims["intermediate_size"], rope_theta=theta,
                rope_scaling=scaling, rms_eps=number(cfg, "rms_norm_eps", default=1e-6),
                tie_embeddings=flag(cfg, "tie_word_embeddings", False),
                max_position=max_position, dtype=dtype_of(cfg),
                name=name if isinstance(name, str) else "checkpoint", eos=eos_ids(cfg),
                family=fam.name,
                sliding_window=window(cfg, fam, dims["num_hidden_layers"]))


def write(c: Any) -> dict[str, Any]:
    """A classic-spelling config.json dict for ModelConfig `c`, as its family writes it."""
    fam = c.fam
    out: dict[str, Any] = {
        "architectures": [fam.architecture], "model_type": fam.name,
        "vocab_size": c.vocab, "hidden_size": c.hidden, "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads, "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim, "intermediate_size": c.intermediate,
        "rope_theta": c.rope_theta, "rms_norm_eps": c.rms_eps,
        "tie_word_embeddings": c.tie_embeddings, "max_position_embeddings": c.max_position,
        "hidden_act": "silu", "torch_dtype": c.dtype,
    }
    if fam.window == "sliding_window":
        out["sliding_window"] = c.sliding_window
    elif fam.window == "use_sliding_window":  # the window on every layer, or on none
        out.update(use_sliding_window=c.sliding_window is not None, max_window_layers=0,
                   sliding_window=c.sliding_window)
    if c.eos:
        out["eos_token_id"] = c.eos[0] if len(c.eos) == 1 else list(c.eos)
    s = c.rope_scaling
    if isinstance(s, Llama3Scaling):
        out["rope_scaling"] = {"rope_type": "llama3", "factor": s.factor,
                               "low_freq_factor": s.low_freq_factor,
                               "high_freq_factor": s.high_freq_factor,
                               "original_max_position_embeddings":
                                   s.original_max_position_embeddings}
    elif isinstance(s, (LinearScaling, DynamicScaling)):
        out["rope_scaling"] = {"rope_type": "linear" if isinstance(s, LinearScaling)
                               else "dynamic", "factor": s.factor}
    elif isinstance(s, YarnScaling):
        out["rope_scaling"] = {"rope_type": "yarn", "factor": s.factor,
                               "original_max_position_embeddings":
                                   s.original_max_position_embeddings,
                               "beta_fast": s.beta_fast, "beta_slow": s.beta_slow,
                               "truncate": s.truncate,
                               **{k: getattr(s, k) for k in ("attention_factor", "mscale",
                                                             "mscale_all_dim")
                                  if getattr(s, k) is not None}}
    return out
