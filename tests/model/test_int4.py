"""4-bit checkpoints as AWQ's and GPTQ's tools lay them out: words unpacked exactly (every
nibble value, zero points, AWQ's column order, GPTQ's v1 zero offset, g_idx in activation
order), weights dequantized at load as the format's math says, the model against its
unquantized self, and every malformed or unsupported field refused by name."""

import json

import numpy as np
import pytest

from rawgraph.dtypes import to_float32, to_storage
from rawgraph.model import checkpoint, quant
from rawgraph.model.config import preset
from rawgraph.model.safetensors import CheckpointError, write
from rawgraph.model.weights import random_weights
from tests.helpers import check_quantized_load, drop_tensor, set_tensor

CFG = preset("tiny").replace(dtype="float16", tie_embeddings=False)
TOKENS = np.array([5, 17, 300, 2, 99, 41, 7, 250])
FORMATS = {
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
            "version": "gemm", "modules_to_not_convert": None},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
             "sym": True, "true_sequential": True, "damp_percent": 0.01,
             "checkpoint_format": "gptq", "lm_head": False, "static_groups": False},
    "gptq-v2-g64-asym": {"quant_method": "gptq", "bits": 4, "group_size": 64,
                         "desc_act": False, "sym": False, "checkpoint_format": "gptq_v2",
                         "pack_dtype": "int32", "meta": {"quantizer": ["gptqmodel:4.0"]}},
    "gptq-per-row-lm-head": {"quant_method": "gptq", "bits": 4, "group_size": -1,
                             "desc_act": False, "sym": True, "lm_head": True},
}
Q = "model.layers.0.self_attn.q_proj"


def _words(values, axis, order=tuple(range(8))):
    """Eight 4-bit values a little-endian int32 word along `axis`, word slot i holding
    value order[i] of its eight, packed one element at a time (independent of
    quant.pack_nibbles)."""
    v = np.asarray(values, np.int64)
    if axis == 0:
        v = v.T
    rows, n = v.shape
    out = np.zeros((rows, n // 8), np.int64)
    for r in range(rows):
        for c in range(n // 8):
            word = 0
            for i in range(8):
                word |= int(v[r, 8 * c + order[i]]) << (4 * i)
            out[r, c] = word
    out = out.astype(np.uint32).view(np.int32)
    return out.T.copy() if axis == 0 else out


def _stored(parts):
    return {k: quant.Stored(v, {np.dtype(np.int32): "int32", np.dtype(np.float16): "float16",
                                 np.dtype(np.float32): "float32"}[v.dtype], f"tensor {k}")
            for k, v in parts.items()}


@pytest.mark.parametrize("method", ["awq", "gptq-v1", "gptq-v2"])
def test_hand_packed_words_unpack_exactly(method):
    # every nibble value in every word slot (so some words are negative int32s), zero
    # points 0-15 (1-16 stored less one by gptq's v1), two groups of 16 input columns
    rng = np.random.default_rng(3)
    out, k, group = 16, 32, 16
    q = (np.arange(out * k).reshape(out, k) * 7 + np.arange(out)[:, None]) % 16
    zero = rng.integers(1 if method == "gptq-v1" else 0, 16, (k // group, out))
    scale = rng.uniform(0.01, 0.1, (k // group, out)).astype(np.float16)
    want = (q - zero[np.arange(k) // group].T) * scale[np.arange(k) // group].T.astype(
        np.float32)
    if method == "awq":
        fmt = quant.read(FORMATS["awq"] | {"group_size": group})
        awq_order = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's pack: slot i holds column order[i]
        parts = {"qweight": _words(q.T, 1, awq_order), "qzeros": _words(zero, 1, awq_order),
                 "scales": scale}
    else:
        fmt = quant.read({"quant_method": "gptq", "bits": 4, "group_size": group,
                          "checkpoint_format": "gptq" if method == "gptq-v1" else "gptq_v2"})
        offset = 1 if method == "gptq-v1" else 0
        parts = {"qweight": _words(q.T, 0), "qzeros": _words(zero - offset, 1),
                 "scales": scale, "g_idx": (np.arange(k) // group).astype(np.int32)}
    assert (parts["qweight"] < 0).any()  # nibble 8-15 in the top slot
    got = fmt.weight(_stored(parts), (out, k))
    np.testing.assert_array_equal(got, want)
    # the packers write what the tools write
    assert all(np.array_equal(v, parts[n]) for n, v in quant.pack_int4(
        fmt, q, zero, scale.astype(np.float32)).items())


def test_gptq_groups_follow_g_idx_in_activation_order():
    rng = np.random.default_rng(4)
    out, k, group = 8, 64, 16
    q = rng.integers(0, 16, (out, k))
    g_idx = rng.permutation(np.arange(k) // group).astype(np.int32)  # 4 groups, shuffled
    zero, scale = rng.integers(1, 16, (4, out)), rng.uniform(0.01, 1, (4, out)).astype(np.float16)
    parts = {"qweight": _words(q.T, 0), "qzeros": _words(zero - 1, 1), "scales": scale,
             "g_idx": g_idx}
    want = (q - zero[g_idx].T) * scale[g_idx].T.astype(np.float32)
    fmt = quant.read(FORMATS["gptq"] | {"group_size": group, "desc_act": True})
    np.testing.assert_array_equal(fmt.weight(_stored(parts), (out, k)), want)
    assert fmt.extras(Q)[0][-1] == f"{Q}.g_idx"  # needed in activation order
    sequential = quant.read(FORMATS["gptq"] | {"group_size": group})
    with pytest.raises(ValueError, match="not sequential, but desc_act is false"):
        sequential.weight(_stored(parts), (out, k))
    with pytest.raises(ValueError, match=r"outside \[0, 4\)"):
        fmt.weight(_stored(parts | {"g_idx": g_idx + 1}), (out, k))


def test_nibbles_pack_and_unpack_along_either_axis():
    v = np.random.default_rng(5).integers(0, 16, (24, 40)).astype(np.uint8)
    for axis in (0, 1):
        words = quant.pack_nibbles(v, axis)
        assert words.dtype == np.int32 and words.shape == ((3, 40) if axis == 0 else (24, 5))
        np.testing.assert_array_equal(quant.unpack_nibbles(words, axis), v)


def _save(root, qc, edit=None):
    """A 4-bit checkpoint of CFG in `qc`'s format (round to nearest); returns the weights it
    should load as (storage dtype) and the unquantized ones."""
    fmt = quant.read(qc)
    plain = random_weights(CFG, 7)
    out, want = {}, dict(plain)
    for name, w in plain.items():
        module = name[:-len(".weight")]
        linear = name.endswith("_proj.weight") or name == "lm_head.weight"
        if not (linear and fmt.quantized(module)):
            out[name] = (CFG.dtype, w)
            continue
        sym = qc.get("sym", False)
        q, zero, scale = quant.quantize_int4(to_float32(w, CFG.dtype), fmt.group, sym)
        parts = quant.pack_int4(fmt, q, zero, scale)
        for part, v in parts.items():
            out[f"{module}.{part}"] = ({np.dtype(np.int32): "int32"}.get(v.dtype, "float16"), v)
        want[name] = to_storage(fmt.weight(_stored(parts), w.shape), CFG.dtype)
    if edit:
        edit(out)
    root.mkdir(parents=True, exist_ok=True)
    write(root / "model.safetensors", out)
    (root / "config.json").write_text(json.dumps(CFG.to_hf() | {"quantization_config": qc}))
    return want, plain


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_4_bit_weights_load_dequantized(tmp_path, fmt):
    want, plain = _save(tmp_path, FORMATS[fmt])
    ck = checkpoint.load(tmp_path)
    assert ck.files[f"{Q}.weight"].name == "model.safetensors"
    err = check_quantized_load(ck, FORMATS[fmt]["quant_method"], want, plain,
                               fmt == "gptq-per-row-lm-head", TOKENS)
    assert err < 0.35, err  # against the model it was quantized from: close



@pytest.mark.parametrize(("fmt", "qc_edit", "edit", "match"), [
    ("gptq", lambda qc: qc.update(bits=8), None, "bits: 8: 4-bit weights only"),
    ("gptq", lambda qc: qc.update(bits=3), None, "4-bit weights only"),
    ("awq", lambda qc: qc.update(version="gemv"), None, "version: 'gemv'"),
    ("awq", lambda qc: qc.update(zero_point=False), None, "zero_point"),
    ("gptq", lambda qc: qc.update(checkpoint_format="marlin"), None, "checkpoint_format"),
    ("gptq", lambda qc: qc.update(group_size=100), None, "group_size: 100"),
    ("gptq", lambda qc: qc.update(dynamic={"-:.*": {}}), None, "dynamic"),
    ("gptq", lambda qc: qc.update(desc_act="yes"), None, "desc_act"),
    ("gptq", lambda qc: qc.update(foo=1), None, "quantization_config.foo: not supported"),
    ("gptq", None, drop_tensor(f"{Q}.scales"), "1 tensors missing"),
    ("awq", None, drop_tensor(f"{Q}.qzeros"), "1 tensors missing"),
    ("gptq", None, set_tensor(f"{Q}.qweight", "int32", np.zeros((16, 256), np.int32)),
     r"qweight' has shape \(16, 256\), \(32, 256\) expected"),
    ("awq", None, set_tensor(f"{Q}.qweight", "int32", np.zeros((32, 256), np.int32)),
     r"\(256, 32\) expected"),
    ("gptq", None, set_tensor(f"{Q}.qweight", "float16", np.zeros((32, 256), np.float16)),
     "qweight' is float16; I32 words"),
    ("gptq", None, set_tensor(f"{Q}.scales", "int32", np.zeros((2, 256), np.int32)),
     "scales' is int32; a float16"),
    ("gptq", None, set_tensor(f"{Q}.scales", "float32", np.full((2, 256), np.inf, np.float32)),
     "not finite"),
    ("gptq", None, set_tensor(f"{Q}.g_idx", "int32", np.full(256, 7, np.int32)), "outside"),
    ("gptq", None, set_tensor(f"{Q}.weight", "float16", np.zeros((256, 256), np.float16)),
     "1 unexpected tensors"),
    ("gptq", None, set_tensor("lm_head.weight", "int32", np.zeros((512, 256), np.int32)),
     "I32, but quantization_config leaves lm_head unquantized"),
])
def test_what_the_loader_refuses_it_names(tmp_path, fmt, qc_edit, edit, match):
    qc = json.loads(json.dumps(FORMATS[fmt]))
    if qc_edit:
        qc_edit(qc)
        tmp_path.mkdir(exist_ok=True)
        (tmp_path / "config.json").write_text(json.dumps(CFG.to_hf() | {
            "quantization_config": qc}))
        write(tmp_path / "model.safetensors", {"x": ("float32", np.zeros(1, np.float32))})
    else:
        _save(tmp_path, qc, edit=edit)
    with pytest.raises((CheckpointError, ValueError), match=match):
        checkpoint.load(tmp_path)


def test_a_group_size_that_does_not_divide_the_input_is_refused_naming_the_tensor():
    fmt = quant.read(FORMATS["awq"] | {"group_size": 48})
    parts = {"qweight": np.zeros((64, 1), np.int32), "qzeros": np.zeros((1, 1), np.int32),
             "scales": np.zeros((1, 8), np.float16)}
    with pytest.raises(ValueError, match="tensor qweight: group_size 48 does not divide"):
        fmt.weight(_stored(parts), (8, 64))


def test_gptq_v1_cannot_store_a_zero_point_of_0():
    fmt = quant.read(FORMATS["gptq"] | {"group_size": 8})
    with pytest.raises(ValueError, match="zero point of 0"):
        quant.pack_int4(fmt, np.zeros((8, 8), np.uint8), np.zeros((1, 8), np.int64),
                        np.ones((1, 8), np.float32))


def test_info_says_how_the_weights_were_stored(tmp_path, capsys):
    from rawgraph.cli import main

    _save(tmp_path, FORMATS["awq"])
    assert main(["info", "--model", str(tmp_path)]) == 0
    assert "dequantized at load from 4 bits (awq, groups of 128)" in capsys.readouterr().out


def test_modules_to_not_convert_match_as_transformers_matches_them():
    fmt = quant.read(FORMATS["awq"] | {"modules_to_not_convert": ["layers.1.mlp", "o_proj"]})
    assert not fmt.quantized("model.layers.1.mlp.down_proj")
    assert not fmt.quantized("model.layers.0.self_attn.o_proj")
    assert fmt.quantized("model.layers.0.mlp.down_proj") and not fmt.quantized("lm_head")
