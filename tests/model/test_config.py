"""config.json in both spellings (classic and transformers 5), every RoPE type, and every
field that changes the math read or refused by name (CPU)."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rawgraph.model.config import ModelConfig, preset
from rawgraph.ops.rope import (
    DynamicScaling,
    LinearScaling,
    Llama3Scaling,
    YarnScaling,
    attention_factor,
    inv_freq,
)

# what transformers 5.17 writes for ModelConfig(..., rope_scaling={llama3 ...},
# rope_theta=500000).save_pretrained(dir), as saved on the GPU machine
V5 = {
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
    "intermediate_size": 128, "max_position_embeddings": 2048, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 1,
    "num_key_value_heads": 2, "pad_token_id": None, "pretraining_tp": 1, "rms_norm_eps": 1e-06,
    "rope_parameters": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                        "original_max_position_embeddings": 8192, "rope_theta": 500000.0,
                        "rope_type": "llama3"},
    "tie_word_embeddings": False, "transformers_version": "5.17.0", "use_cache": True,
    "vocab_size": 128, "dtype": "bfloat16",
}
CLASSIC = {k: v for k, v in V5.items() if k not in ("rope_parameters", "dtype")} | {
    "rope_theta": 500000.0, "torch_dtype": "bfloat16",
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}}


def test_both_spellings_read_the_same_model():
    a, b = ModelConfig.from_hf(V5), ModelConfig.from_hf(CLASSIC)
    assert a == b
    assert a.rope_theta == 500000.0 and a.rope_scaling == Llama3Scaling(8.0, 1.0, 4.0, 8192)
    assert a.dtype == "bfloat16" and a.rms_eps == 1e-6 and a.eos == (2,) and a.head_dim == 16
    old = {**CLASSIC, "rope_scaling": {**CLASSIC["rope_scaling"], "type": "llama3"}}
    del old["rope_scaling"]["rope_type"]  # the older spelling
    assert ModelConfig.from_hf(old) == a


def test_hugging_face_defaults_where_fields_are_absent():
    bare = {"model_type": "llama", "vocab_size": 64, "hidden_size": 128, "intermediate_size": 256,
            "num_hidden_layers": 2, "num_attention_heads": 2}
    c = ModelConfig.from_hf(bare)
    assert (c.rope_theta, c.rope_scaling, c.rms_eps, c.max_position) == (1e4, None, 1e-6, 2048)
    assert (c.kv_heads, c.head_dim, c.tie_embeddings, c.dtype) == (2, 64, False, "float16")
    v5_default = {**bare, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}
    assert ModelConfig.from_hf(v5_default).rope_theta == 5e5
    # rope_parameters' theta wins over a stray top-level one, as in transformers
    assert ModelConfig.from_hf({**v5_default, "rope_theta": 7.0}).rope_theta == 5e5


@pytest.mark.parametrize("scaling", [
    None, Llama3Scaling(8.0, 1.0, 4.0, 512), LinearScaling(4.0), DynamicScaling(2.0),
    YarnScaling(4.0, 1024), YarnScaling(8.0, 512, beta_fast=16.0, beta_slow=2.0,
                                        mscale=1.0, mscale_all_dim=0.5, truncate=False)])
def test_every_rope_type_round_trips(scaling):
    cfg = preset("tiny").replace(rope_scaling=scaling)
    assert ModelConfig.from_hf(cfg.to_hf()).replace(name="tiny") == cfg


def test_rope_frequency_tables():
    d, theta = 64, 10000.0
    plain = inv_freq(d, theta)
    np.testing.assert_array_equal(inv_freq(d, theta, DynamicScaling(4.0)), plain)
    np.testing.assert_allclose(inv_freq(d, theta, LinearScaling(4.0)), plain / 4, rtol=1e-7)
    y = inv_freq(d, theta, YarnScaling(16.0, 4096))  # ramp over dims 10..23 of 32
    np.testing.assert_allclose(y[:4], plain[:4], rtol=1e-6)  # fast dims: extrapolated
    np.testing.assert_allclose(y[-4:], plain[-4:] / 16, rtol=1e-6)  # slow: interpolated
    assert ((y <= plain * (1 + 1e-6)) & (y >= plain / 16 * (1 - 1e-6))).all()
    assert attention_factor(YarnScaling(16.0, 256)) == pytest.approx(0.1 * math.log(16) + 1)
    assert attention_factor(YarnScaling(16.0, 256, attention_factor=0.5)) == 0.5
    assert attention_factor(LinearScaling(2.0)) == 1.0


def test_attention_scale_carries_yarns_factor():
    cfg = preset("tiny")
    assert cfg.attention_scale == pytest.approx(64 ** -0.5)
    y = cfg.replace(rope_scaling=YarnScaling(4.0, 1024))
    assert y.attention_scale == pytest.approx((0.1 * math.log(4) + 1) ** 2 * 64 ** -0.5)


def _change(base: dict, **kw) -> dict:
    out = dict(base)
    for k, v in kw.items():
        if v is ...:
            out.pop(k, None)
        else:
            out[k] = v
    return out


@pytest.mark.parametrize(("cfg", "match"), [
    (["not", "an", "object"], "must be a JSON object, got a list"),
    (_change(V5, model_type="gemma"), "model_type 'gemma' is not supported: rawgraph runs "
                                      "llama, qwen2, qwen3, mistral"),
    (_change(V5, model_type=7), "model_type must be a string"),
    (_change(V5, model_type="qwen2", architectures=["LlamaForCausalLM"]),
     "rawgraph runs Qwen2ForCausalLM"),
    (_change(V5, model_type="qwen3", attention_bias=True), "attention_bias true"),
    (_change(V5, model_type="qwen2", num_experts=8), "mixture-of-experts"),
    (_change(V5, model_type="mistral", sliding_window=0), "sliding_window must be at least 1"),
    (_change(V5, model_type="qwen2", layer_types=["full_attention"] * 2),
     "layer_types must list"),
    (_change(V5, model_type="qwen3", use_sliding_window="yes", max_window_layers=0),
     "use_sliding_window must be true or false"),
    (_change(V5, model_type=..., architectures=["LlamaModel"]), r"architectures \['LlamaModel'\]"),
    (_change(V5, model_type=...), "neither model_type nor architectures"),
    (_change(V5, hidden_act="gelu"), "hidden_act 'gelu'"),
    (_change(V5, attention_bias=True), "attention_bias true"),
    (_change(V5, mlp_bias=True), "mlp_bias true"),
    (_change(V5, attention_bias="no"), "attention_bias must be true or false"),
    (_change(V5, quantization_config={"bits": 4}), "quantization_config"),
    (_change(V5, hidden_size="256"), "hidden_size must be an integer, got str '256'"),
    (_change(V5, vocab_size=128.0), "vocab_size must be an integer, got float"),
    (_change(V5, num_hidden_layers=True), "num_hidden_layers must be an integer, got bool"),
    (_change(V5, num_attention_heads=0, head_dim=...), "num_attention_heads must be at least 1"),
    (_change(V5, hidden_size=66, head_dim=...), "not a multiple of num_attention_heads"),
    (_change(V5, num_key_value_heads=3), "multiple of kv_heads"),
    (_change(V5, num_key_value_heads=0), "num_key_value_heads must be at least 1"),
    (_change(V5, intermediate_size=...), "intermediate_size is missing"),
    (_change(V5, rms_norm_eps=-1.0), "rms_norm_eps must be positive"),
    (_change(V5, rms_norm_eps="1e-5"), "rms_norm_eps must be a finite number"),
    (_change(V5, tie_word_embeddings="yes"), "tie_word_embeddings must be true or false"),
    (_change(V5, dtype="int8"), "dtype 'int8'"),
    (_change(V5, eos_token_id="2"), "eos_token_id"),
    (_change(V5, rope_parameters="llama3"), "rope_parameters must be an object"),
    (_change(CLASSIC, rope_scaling="llama3"), "rope_scaling must be an object"),
    (_change(V5, rope_parameters={**V5["rope_parameters"], "rope_type": "longrope"}),
     "rope_type 'longrope' is not supported"),
    (_change(V5, rope_parameters={**V5["rope_parameters"], "rope_type": "su"}), "'su'"),
    (_change(V5, rope_parameters={**V5["rope_parameters"], "rope_type": ["llama3"]}),
     "rope_type \\['llama3'\\] is not supported"),
    (_change(V5, rope_parameters={k: v for k, v in V5["rope_parameters"].items()
                                  if k != "factor"}), "rope_parameters.factor is missing"),
    (_change(CLASSIC, rope_scaling={k: v for k, v in CLASSIC["rope_scaling"].items()
                                    if k != "factor"}), "rope_scaling.factor is missing"),
    (_change(V5, rope_parameters={**V5["rope_parameters"], "low_freq_factor": 4.0}),
     "high_freq_factor .* must exceed"),
    (_change(V5, rope_parameters={**V5["rope_parameters"], "short_factor": [1.0]}),
     "short_factor is not a field of rope_type 'llama3'"),
    (_change(V5, rope_parameters={**V5["rope_parameters"], "partial_rotary_factor": 0.5}),
     "partial_rotary_factor 0.5"),
    (_change(V5, rope_parameters={"full_attention": {"rope_type": "default"}}), "per layer"),
    (_change(V5, rope_parameters={"rope_type": "linear", "rope_theta": "big", "factor": 2}),
     "rope_parameters.rope_theta must be a finite number"),
    (_change(V5, rope_parameters={"rope_type": "linear", "factor": float("nan")}),
     "factor must be a finite number"),
])
def test_config_refusals_name_the_field(cfg, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf(cfg)


# what transformers 5.17 writes for Qwen2Config, Qwen3Config, MistralConfig (the fields that
# matter here; the rest as LLaMA's)
QWEN = {k: v for k, v in V5.items() if k not in ("attention_bias", "mlp_bias", "pretraining_tp")
        } | {"rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
             "use_sliding_window": False, "sliding_window": None, "max_window_layers": 28,
             "layer_types": ["full_attention"]}


@pytest.mark.parametrize(("cfg", "family", "window"), [
    (QWEN | {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}, "qwen2", None),
    (QWEN | {"model_type": "qwen3", "attention_bias": False}, "qwen3", None),
    (_change(QWEN, model_type=..., architectures=["Qwen3ForCausalLM"]), "qwen3", None),
    (_change(QWEN, model_type="qwen2", layer_types=["sliding_attention"], sliding_window=64),
     "qwen2", 64),
    (_change(QWEN, model_type="qwen2", layer_types=..., use_sliding_window=True,
             max_window_layers=0, sliding_window=128), "qwen2", 128),
    (_change(QWEN, model_type="qwen2", layer_types=..., use_sliding_window=True,
             max_window_layers=1, sliding_window=128), "qwen2", None),  # no layer past 1
    (_change(V5, model_type="mistral", sliding_window=4096), "mistral", 4096),
    (_change(V5, model_type="mistral", sliding_window=None), "mistral", None),
])
def test_families_read_their_table_row_and_window(cfg, family, window):
    got = ModelConfig.from_hf(cfg)
    assert (got.family, got.sliding_window) == (family, window)
    assert got.fam.qkv_bias == (family == "qwen2") and got.fam.qk_norm == (family == "qwen3")
    back = ModelConfig.from_hf(got.to_hf())
    assert back == got.replace(name="checkpoint")  # to_hf: the family's own spelling
    assert back.to_hf()["architectures"] == [got.fam.architecture]


@pytest.mark.parametrize("name", ["qwen2.5-1.5b", "qwen3-8b", "mistral-7b"])
def test_family_presets_count_their_extra_tensors(name):
    from rawgraph.model.weights import shapes

    cfg = preset(name)
    llama = cfg.replace(family="llama")
    extra = set(shapes(cfg)) - set(shapes(llama))
    per_layer = {"qwen2": 3, "qwen3": 2, "mistral": 0}[cfg.family]
    assert len(extra) == per_layer * cfg.layers
    assert cfg.weight_bytes() - llama.weight_bytes() == 2 * sum(
        math.prod(shapes(cfg)[k]) for k in extra)


@pytest.mark.parametrize(("fields", "match"), [
    ({"family": "gemma"}, "family 'gemma' must be one of"),
    ({"sliding_window": 0}, "sliding_window must be a positive integer or None"),
    ({"kv_heads": 0}, "kv_heads must be a positive integer"),
    ({"heads": 0}, "heads must be a positive integer"),
    ({"hidden": "256"}, "hidden must be a positive integer"),
    ({"head_dim": 63}, "head_dim .* must be even"),
    ({"rms_eps": float("inf")}, "rms_eps must be a positive number"),
    ({"dtype": "float32"}, "float16 or bfloat16"),
])
def test_llama_config_checks_its_fields(fields, match):
    with pytest.raises(ValueError, match=match):
        preset("tiny").replace(**fields)


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40)
                     | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)
_KEYS = st.sampled_from([*V5, *V5["rope_parameters"], *CLASSIC, "type", "head_dim",
                         "partial_rotary_factor", "quantization_config"])


@settings(max_examples=1500, deadline=None)
@given(changes=st.lists(st.tuples(st.booleans(), _KEYS, _JSON), min_size=1, max_size=3),
       base=st.sampled_from([V5, CLASSIC]))
def test_any_config_reads_or_is_refused_with_a_value_error(changes, base):
    cfg = json.loads(json.dumps(base))
    for in_rope, key, value in changes:
        rope_field = "rope_parameters" if "rope_parameters" in cfg else "rope_scaling"
        target = cfg[rope_field] if in_rope and isinstance(cfg.get(rope_field), dict) else cfg
        target[key] = value
    try:
        got = ModelConfig.from_hf(cfg)
    except ValueError:
        return
    assert got.vocab > 0 and got.heads % got.kv_heads == 0 and got.rope_theta > 0


def test_eos_ids_from_config_json():
    hf = preset("tiny").to_hf()
    assert ModelConfig.from_hf(hf).eos == ()
    assert ModelConfig.from_hf({**hf, "eos_token_id": 7}).eos == (7,)
    cfg = ModelConfig.from_hf({**hf, "eos_token_id": [1, 2]})
    assert cfg.eos == (1, 2) and ModelConfig.from_hf(cfg.to_hf()).eos == (1, 2)
