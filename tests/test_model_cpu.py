"""Model configuration, checkpoints and the NumPy reference forward (CPU only)."""

import json
import struct

import numpy as np
import pytest

from rawgraph.dtypes import from_bf16_bits, round_to
from rawgraph.model import checkpoint
from rawgraph.model.config import LlamaConfig, preset
from rawgraph.model.reference import KVState, float_weights, forward, greedy
from rawgraph.model.safetensors import CheckpointError, read_header, write
from rawgraph.model.weights import random_weights, shapes
from rawgraph.ops.rope import Llama3Scaling

TINY = preset("tiny")


def test_presets_and_sizes():
    assert preset("llama-1b").decode_bytes() == 2_471_628_800  # DESIGN's 2.47 GB per step
    assert preset("llama-8b").kv_size == 1024 and preset("tiny").q_size == 256
    with pytest.raises(ValueError, match="unknown preset"):
        preset("llama-70b")
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        TINY.replace(kv_heads=3)


def test_hf_config_roundtrip_and_rejections():
    cfg = preset("llama-1b")
    assert LlamaConfig.from_hf(cfg.to_hf()).replace(name="llama-1b") == cfg
    for change, match in [({"architectures": ["MistralForCausalLM"], "model_type": "mistral"},
                           "unsupported architecture"),
                          ({"rope_scaling": {"rope_type": "yarn", "factor": 4}}, "yarn"),
                          ({"hidden_act": "gelu"}, "gelu"), ({"attention_bias": True}, "bias")]:
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_hf({**cfg.to_hf(), **change})
    hf = cfg.to_hf()
    del hf["hidden_size"]
    with pytest.raises(ValueError, match="hidden_size"):
        LlamaConfig.from_hf(hf)


def test_random_weights_are_seeded_and_shaped():
    a, b, c = random_weights(TINY, 1), random_weights(TINY, 1), random_weights(TINY, 2)
    assert set(a) == set(shapes(TINY)) and all(a[k].shape == s for k, s in shapes(TINY).items())
    assert all(np.array_equal(a[k], b[k]) for k in a) and not np.array_equal(
        a["model.norm.weight"], c["model.norm.weight"])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shard", [None, 200_000])
def test_checkpoint_roundtrip(tmp_path, dtype, shard):
    cfg = TINY.replace(dtype=dtype, rope_scaling=Llama3Scaling(factor=8.0), tie_embeddings=True)
    w = random_weights(cfg, 3)
    checkpoint.save(tmp_path, cfg, w, shard_bytes=shard)
    if shard:
        assert len(list(tmp_path.glob("*.safetensors"))) > 1
    got = checkpoint.load(tmp_path)
    assert got.config.replace(name=cfg.name) == cfg and got.tokenizer is None
    assert all(np.array_equal(got.tensors[k], w[k]) for k in w)


def test_dtype_conversion_on_load(tmp_path):
    w = random_weights(TINY.replace(dtype="bfloat16"), 4)
    checkpoint.save(tmp_path, TINY.replace(dtype="bfloat16"), w)
    got = checkpoint.load(tmp_path, dtype="float16")
    k = "model.norm.weight"
    np.testing.assert_array_equal(got.tensors[k], from_bf16_bits(w[k]).astype(np.float16))
    big = dict(w)
    big[k] = np.full_like(w[k], 0x4780)  # bf16 65536: beyond float16
    checkpoint.save(tmp_path, TINY.replace(dtype="bfloat16"), big)
    with pytest.raises(CheckpointError, match="beyond float16"):
        checkpoint.load(tmp_path, dtype="float16")


def test_official_safetensors_reads_ours_and_we_read_theirs(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    x = np.arange(12, dtype=np.float16).reshape(3, 4)
    y = np.linspace(0, 1, 5, dtype=np.float32)
    write(tmp_path / "ours.safetensors", {"x": ("float16", x), "y": ("float32", y)})
    theirs = st.load_file(str(tmp_path / "ours.safetensors"))
    assert np.array_equal(theirs["x"], x) and np.array_equal(theirs["y"], y)
    st.save_file({"a": x, "b": y}, str(tmp_path / "theirs.safetensors"))
    info = read_header(tmp_path / "theirs.safetensors")
    assert info["a"].shape == (3, 4) and info["b"].dtype == "float32"


def _bad(tmp_path, mutate):
    cfg = TINY
    checkpoint.save(tmp_path, cfg, random_weights(cfg, 5), shard_bytes=300_000)
    mutate(tmp_path)
    return tmp_path


def _drop_key(root):
    idx = json.loads((root / checkpoint.INDEX).read_text())
    del idx["weight_map"]["model.layers.1.mlp.up_proj.weight"]
    (root / checkpoint.INDEX).write_text(json.dumps(idx))


def _extra_key(root):
    idx = json.loads((root / checkpoint.INDEX).read_text())
    idx["weight_map"]["model.layers.0.self_attn.q_norm.weight"] = next(
        iter(idx["weight_map"].values()))
    (root / checkpoint.INDEX).write_text(json.dumps(idx))


def _truncate(root):
    f = sorted(root.glob("*.safetensors"))[0]
    f.write_bytes(f.read_bytes()[:-10])


def _bad_header(root):
    f = sorted(root.glob("*.safetensors"))[0]
    f.write_bytes(struct.pack("<Q", 7) + b"{oops!}" + b"\0" * 64)


def _wrong_shape(root):
    cfg = json.loads((root / "config.json").read_text())
    cfg["intermediate_size"] = 768
    (root / "config.json").write_text(json.dumps(cfg))


def _int_tensor(root):
    f = sorted(root.glob("*.safetensors"))[0]
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = raw[8:8 + n].replace(b'"F16"', b'"I16"', 1)
    f.write_bytes(raw[:8] + head + raw[8 + n:])


@pytest.mark.parametrize(("mutate", "match"), [
    (lambda r: (r / "config.json").unlink(), "no config.json"),
    (lambda r: (r / "config.json").write_text('{"model_type": "gpt2"}'), "unsupported"),
    (lambda r: sorted(r.glob("*.safetensors"))[-1].unlink(), "missing"),
    (_drop_key, "tensors missing"),
    (_extra_key, "unexpected tensors"),
    (_truncate, "expected .* inside the file"),
    (_bad_header, "not JSON"),
    (_wrong_shape, "has shape"),
    (_int_tensor, "dtype I16"),
])
def test_bad_checkpoints_name_the_problem(tmp_path, mutate, match):
    with pytest.raises(CheckpointError, match=match):
        checkpoint.load(_bad(tmp_path, mutate))


def test_load_rejects_missing_dirs(tmp_path):
    with pytest.raises(CheckpointError, match="not a directory"):
        checkpoint.load(tmp_path / "nope")
    (tmp_path / "config.json").write_text(json.dumps(TINY.to_hf()))
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        checkpoint.load(tmp_path)


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
