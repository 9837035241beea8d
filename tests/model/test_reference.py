"""Presets, seeded random weights and the NumPy reference forward (CPU only)."""

import numpy as np
import pytest

from rawgraph.dtypes import round_to
from rawgraph.model.config import preset
from rawgraph.model.reference import KVState, float_weights, forward, greedy
from rawgraph.model.weights import random_weights, shapes
from rawgraph.ops.rope import Llama3Scaling

TINY = preset("tiny")


def test_presets_and_sizes():
    assert preset("llama-1b").decode_bytes() == 2_471_628_800  # DESIGN's 2.47 GB per step
    assert preset("llama-8b").kv_size == 1024 and preset("tiny").q_size == 256
    assert preset("llama-70b").weight_bytes() > 140e9  # 16-bit: more than one H200 holds
    with pytest.raises(ValueError, match="unknown preset"):
        preset("llama-405b")
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        TINY.replace(kv_heads=3)


def test_random_weights_are_seeded_and_shaped():
    a, b, c = random_weights(TINY, 1), random_weights(TINY, 1), random_weights(TINY, 2)
    assert set(a) == set(shapes(TINY)) and all(a[k].shape == s for k, s in shapes(TINY).items())
    assert all(np.array_equal(a[k], b[k]) for k in a) and not np.array_equal(
        a["model.norm.weight"], c["model.norm.weight"])


@pytest.mark.parametrize("cfg", [TINY, TINY.replace(rope_scaling=Llama3Scaling(factor=4.0),
                                                    tie_embeddings=True, dtype="bfloat16")])
def test_incremental_decode_matches_full_forward(cfg):
    w = float_weights(cfg, random_weights(cfg, 6))
    tokens = np.random.default_rng(0).integers(0, cfg.vocab, 12)
    full = forward(cfg, w, tokens, KVState())
    state = KVState()
    parts = [forward(cfg, w, tokens[:5], state)]
    parts += [forward(cfg, w, tokens[i:i + 1], state) for i in range(5, 12)]
    np.testing.assert_allclose(np.concatenate(parts), full, rtol=1e-4, atol=1e-4)
    assert state.length == 12 and np.isfinite(full).all() and full.std() > 0.1


def test_greedy_is_deterministic_and_follows_the_logits():
    w = float_weights(TINY, random_weights(TINY, 7))
    a = greedy(TINY, w, [1, 2, 3], 8)
    assert a == greedy(TINY, w, [1, 2, 3], 8) and len(a) == 8
    state = KVState()
    first = forward(TINY, w, np.array([1, 2, 3]), state)[-1]
    assert a[0] == int(np.argmax(first))


def test_gate_up_rows_interleave_in_groups_of_8():
    # the fused weight the model loads, and the activation's reference on its output, agree
    # with gate and up applied separately
    from rawgraph.ops import reference as ref
    from rawgraph.ops.elementwise import stack_gate_up

    rng = np.random.default_rng(0)
    gate, up = rng.standard_normal((24, 16)), rng.standard_normal((24, 16))
    w = stack_gate_up(gate, up)
    assert w.shape == (48, 16)
    assert (w[:8] == gate[:8]).all() and (w[8:16] == up[:8]).all()
    assert (w[16:24] == gate[8:16]).all() and (w[40:] == up[16:]).all()
    x = rng.standard_normal((3, 16)).astype(np.float32)
    g, u = x @ gate.T, x @ up.T
    want = round_to(round_to(g / (1 + np.exp(-g)), "float16") * u, "float16")
    np.testing.assert_allclose(ref.silu_mul((x @ w.T).astype(np.float32), "float16"), want,
                               rtol=1e-3, atol=1e-3)
    with pytest.raises(ValueError, match="multiple of 8"):
        stack_gate_up(gate[:12], up[:12])


def _family_weights(cfg, seed):
    return float_weights(cfg, random_weights(cfg, seed))


def test_qwen2_with_zero_biases_is_llama():
    cfg = TINY.replace(family="qwen2")
    w = _family_weights(cfg, 5)
    tokens = np.arange(3, 40)
    zero = {k: (0 * v if k.endswith(".bias") else v) for k, v in w.items()}
    got = forward(cfg, zero, tokens, KVState())
    assert np.array_equal(got, forward(TINY, zero, tokens, KVState()))
    assert not np.allclose(forward(cfg, w, tokens, KVState()), got, rtol=1e-3)


def test_qwen3_head_norms_make_q_and_k_scale_free():
    # the head norm divides each head of q and k by its RMS: scaling q_proj and k_proj leaves
    # the logits (all but eps) as they were, where LLaMA's attention would sharpen
    cfg = TINY.replace(family="qwen3", head_dim=128, rms_eps=1e-12)
    w = _family_weights(cfg, 6)
    tokens = np.arange(3, 30)
    scaled = {k: (4 * v if "q_proj" in k or "k_proj" in k else v) for k, v in w.items()}
    base = forward(cfg, w, tokens, KVState())
    np.testing.assert_allclose(forward(cfg, scaled, tokens, KVState()), base, rtol=2e-4,
                               atol=2e-4 * np.abs(base).max())
    llama = cfg.replace(family="llama")
    assert not np.allclose(forward(llama, scaled, tokens, KVState()),
                           forward(llama, w, tokens, KVState()), rtol=1e-2)


def test_a_sliding_window_changes_only_what_lies_past_it():
    cfg = TINY.replace(family="mistral", sliding_window=16)
    w = _family_weights(cfg, 7)
    tokens = np.arange(3, 43)
    full = forward(cfg.replace(sliding_window=None), w, tokens, KVState())
    got = forward(cfg, w, tokens, KVState())
    assert np.array_equal(got[:16], full[:16])  # every key of these rows is within 16
    assert not np.allclose(got[16:], full[16:], rtol=1e-3)
    assert np.array_equal(forward(cfg.replace(sliding_window=40), w, tokens, KVState()), full)
    # in pieces: the window counts positions, not the tokens of one call
    state = KVState()
    pieces = [forward(cfg, w, tokens[:20], state), forward(cfg, w, tokens[20:], state)]
    np.testing.assert_allclose(np.concatenate(pieces), got, rtol=1e-5, atol=1e-5)


def _quantized_like_the_model(cfg, w: dict, quantize: str) -> dict:
    """Float weights as `Model(quantize=)` computes with them: each projection with its
    norm folded in (rounded to the storage), quantized and dequantized (ops.reference), the
    norm divided out again; the LM head quantized as it is."""
    from rawgraph.dtypes import round_to
    from rawgraph.ops import reference as ref

    def roundtrip(a):
        if quantize == "fp8":
            return ref.dequantize_fp8(*ref.quantize_fp8(a)).astype(np.float32)
        q, s, z = ref.quantize_int4(a, 128, cfg.dtype)
        return ref.dequantize_int4(q, s, z, 128, cfg.dtype)

    out = dict(w)
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        for names, norm in (([attn + f"{x}_proj.weight" for x in "qkv"], "input_layernorm"),
                            ([mlp + "gate_proj.weight", mlp + "up_proj.weight"],
                             "post_attention_layernorm"),
                            ([attn + "o_proj.weight", mlp + "down_proj.weight"], None)):
            g = w[p + norm + ".weight"] if norm else np.float32(1)
            for n in names:
                out[n] = roundtrip(round_to(w[n] * g, cfg.dtype)) / g
    out["lm_head.weight"] = roundtrip(w["lm_head.weight"])
    return out


@pytest.mark.parametrize(("quantize", "low", "high"), [("fp8", 0.03, 0.07), ("int4", 0.12, 0.25)])
def test_the_quantizations_cost_tiny_what_their_bits_give(quantize, low, high):
    # relative L2 of 16 decode positions' logits, every weight quantized as the model does
    # (fp8 0.047, int4 0.184 at these seeds): the scale of the GPU test's bounds
    w = float_weights(TINY, random_weights(TINY, 9))
    tokens = np.random.default_rng(2).integers(0, TINY.vocab, 80)
    base = forward(TINY, w, tokens, KVState())[64:]
    got = forward(TINY, _quantized_like_the_model(TINY, w, quantize), tokens, KVState())[64:]
    assert low < np.linalg.norm(got - base) / np.linalg.norm(base) < high

