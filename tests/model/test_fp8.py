"""FP8 checkpoints as their tools lay them out (compressed-tensors per channel, per tensor and
per block; fbgemm_fp8; transformers' and vLLM's fp8, static and block-wise): the e4m3 codec,
weights dequantized at load exactly as the format's math says, the model against its
unquantized self, and every malformed or unsupported field refused by name."""

import json

import numpy as np
import pytest

from rawgraph import dtypes
from rawgraph.dtypes import to_float32, to_storage
from rawgraph.model import checkpoint, quant
from rawgraph.model.config import preset
from rawgraph.model.safetensors import CheckpointError, write
from rawgraph.model.weights import random_weights
from tests.helpers import check_quantized_load, drop_tensor, set_tensor

CFG = preset("tiny").replace(dtype="bfloat16", tie_embeddings=False)
TOKENS = np.array([5, 17, 300, 2, 99, 41, 7, 250])
CHANNEL = {"quant_method": "compressed-tensors", "format": "float-quantized",
           "quantization_status": "compressed", "kv_cache_scheme": None,
           "ignore": ["lm_head"], "config_groups": {"group_0": {
               "targets": ["Linear"],
               "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                           "symmetric": True, "dynamic": False, "group_size": None,
                           "block_structure": None, "observer": "minmax",
                           "observer_kwargs": {}, "actorder": None},
               "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                     "symmetric": True, "dynamic": True},
               "output_activations": None}}}


def _ct(strategy, block=None, acts="dynamic", ignore=("lm_head",)):
    qc = json.loads(json.dumps(CHANNEL))
    g = qc["config_groups"]["group_0"]
    g["weights"]["strategy"], g["weights"]["block_structure"] = strategy, block
    if acts == "static":
        g["input_activations"].update(strategy="tensor", dynamic=False)
    elif acts == "none":
        g["input_activations"] = None
    qc["ignore"] = list(ignore)
    return qc


FORMATS = {
    "ct-channel": _ct("channel"),
    "ct-tensor-static": _ct("tensor", acts="static"),
    "ct-block": _ct("block", [128, 128], acts="none", ignore=("re:.*lm_head",)),
    "ct-all-linear": _ct("channel", ignore=()),  # the head quantized too
    "fbgemm": {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
               "modules_to_not_convert": ["lm_head"]},
    "fp8-static": {"quant_method": "fp8", "activation_scheme": "static",
                   "ignored_layers": ["lm_head"]},
    "fp8-block": {"quant_method": "fp8", "activation_scheme": "dynamic",
                  "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]},
}


def _save(root, qc, *, scale_dtype="float32", tensors=None, edit=None):
    """An FP8 checkpoint of CFG in `qc`'s format; returns the weights it should load as
    (storage dtype) and the unquantized ones."""
    fp8 = quant.read(qc)
    plain = random_weights(CFG, 7) if tensors is None else tensors
    out, want = {}, dict(plain)
    for name, w in plain.items():
        module = name[:-len(".weight")]
        linear = name.endswith("_proj.weight") or name == "lm_head.weight"
        if not (linear and fp8.quantized(module)):
            out[name] = (CFG.dtype, w)
            continue
        bits, s = quant.quantize(to_float32(w, CFG.dtype), fp8)
        stored = s if scale_dtype == "float32" else to_storage(s, scale_dtype)
        out[name] = ("float8_e4m3", bits)
        out[f"{module}.{fp8.scale}"] = (scale_dtype, stored)
        if fp8.activations == "static":
            out[f"{module}.input_scale"] = ("float32", np.array(0.05, np.float32))
        want[name] = to_storage(fp8.dequantize(bits, to_float32(stored, scale_dtype)
                                               if scale_dtype != "float32" else s, ""),
                                CFG.dtype)
    if edit:
        edit(out)
    root.mkdir(parents=True, exist_ok=True)
    write(root / "model.safetensors", out)
    hf = CFG.to_hf() | {"quantization_config": qc}
    (root / "config.json").write_text(json.dumps(hf))
    return want, plain


def test_e4m3_decodes_as_the_format_says_and_encodes_to_the_nearest():
    e = dtypes.E4M3
    assert e[0x00] == 0 and e[0x38] == 1.0 and e[0x7E] == 448 and e[0x01] == 2.0**-9
    assert e[0xB8] == -1.0 and e[0x08] == 2.0**-6 and np.isnan(e[0x7F]) and np.isnan(e[0xFF])
    finite = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], np.uint8)
    assert (quant.e4m3_encode(quant.e4m3_decode(finite)) == finite).all()
    # halfway between 1.0 (0x38) and 1.125 (0x39): to the even code; past 448: saturated
    assert quant.e4m3_encode(np.array([1.0625, 1.1875, 1e6, -1e6, 2.0**-10, np.nan])).tolist() \
        == [0x38, 0x3A, 0x7E, 0xFE, 0x00, 0x7F]
    x = np.random.default_rng(0).standard_normal(10000).astype(np.float32) * 50
    back = quant.e4m3_decode(quant.e4m3_encode(x))
    assert (np.abs(back - x) <= np.abs(x) * 2.0**-4 + 2.0**-10).all()  # half of 3 bits


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_fp8_weights_load_dequantized(tmp_path, fmt):
    want, plain = _save(tmp_path, FORMATS[fmt])
    ck = checkpoint.load(tmp_path)
    err = check_quantized_load(ck, FORMATS[fmt]["quant_method"], want, plain,
                               fmt == "ct-all-linear", TOKENS)
    assert err < 0.08, err  # against the model it was quantized from: close


def test_bf16_scales_are_read_as_stored(tmp_path):
    want, _ = _save(tmp_path, FORMATS["ct-channel"], scale_dtype="bfloat16")
    ck = checkpoint.load(tmp_path)
    assert all(np.array_equal(ck.tensors[k], v) for k, v in want.items())


Q = "model.layers.0.self_attn.q_proj"



@pytest.mark.parametrize(("qc_edit", "edit", "match"), [
    (lambda qc: qc.update(quant_method="bitsandbytes"), None,
     "quant_method: 'bitsandbytes' is not supported"),
    (lambda qc: qc.update(foo=1), None, "quantization_config.foo: not supported"),
    (lambda qc: qc["config_groups"]["group_0"]["weights"].update(num_bits=4), None,
     "only 8-bit float"),
    (lambda qc: qc["config_groups"]["group_0"]["weights"].update(type="int"), None,
     "only 8-bit float"),
    (lambda qc: qc["config_groups"]["group_0"]["weights"].update(strategy="group"), None,
     "strategy: 'group'"),
    (lambda qc: qc["config_groups"]["group_0"]["weights"].update(dynamic=True), None,
     "weights.dynamic"),
    (lambda qc: qc.update(kv_cache_scheme={"num_bits": 8}), None, "kv_cache_scheme"),
    (lambda qc: qc["config_groups"].update(group_1={}), None, "one group"),
    (lambda qc: qc["config_groups"]["group_0"].update(targets=["re:.*down_proj"]), None,
     "targets"),
    (None, drop_tensor(f"{Q}.weight_scale"), "1 tensors missing"),
    (None, set_tensor(f"{Q}.weight_scale", "float32", np.ones((3, 1), np.float32)),
     "per-channel scales have shape"),
    (None, set_tensor(f"{Q}.weight_scale", "float32", -np.ones((256, 1), np.float32)),
     "positive and finite"),
    (None, set_tensor(f"{Q}.weight", "bfloat16", np.zeros((256, 256), np.uint16)),
     "F8_E4M3 expected"),
    (None, set_tensor("lm_head.weight", "float8_e4m3", np.zeros((512, 256), np.uint8)),
     "leaves lm_head unquantized"),
    (None, set_tensor(f"{Q}.bias", "float32", np.zeros(256, np.float32)), "1 unexpected tensors"),
])
def test_what_the_loader_refuses_it_names(tmp_path, qc_edit, edit, match):
    qc = json.loads(json.dumps(FORMATS["ct-channel"]))
    if qc_edit:
        qc_edit(qc)
        hf = CFG.to_hf() | {"quantization_config": qc}
        tmp_path.mkdir(exist_ok=True)
        (tmp_path / "config.json").write_text(json.dumps(hf))
        write(tmp_path / "model.safetensors", {"x": ("float32", np.zeros(1, np.float32))})
    else:
        _save(tmp_path, qc, edit=edit)
    with pytest.raises((CheckpointError, ValueError), match=match):
        checkpoint.load(tmp_path)


def test_fp8_weights_without_a_quantization_config_are_refused(tmp_path):
    _save(tmp_path, FORMATS["ct-channel"])
    hf = json.loads((tmp_path / "config.json").read_text())
    del hf["quantization_config"]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match="unexpected tensors"):  # the scales
        checkpoint.load(tmp_path)
    for f in tmp_path.glob("*.safetensors"):  # the scales gone, the F8 weights alone
        f.unlink()
    plain = random_weights(CFG, 7)
    write(tmp_path / "model.safetensors", {k: (CFG.dtype, v) for k, v in plain.items()} | {
        f"{Q}.weight": ("float8_e4m3", np.zeros((256, 256), np.uint8))})
    with pytest.raises(CheckpointError, match=r"F8_E4M3, but config\.json has no "
                                              r"quantization_config"):
        checkpoint.load(tmp_path)


def test_torch_casts_to_e4m3_as_the_codec_does():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(1).standard_normal(100000).astype(np.float32) * 100
    x[:4] = [1.0625, -1.1875, 500.0, 2.0**-10]
    t = torch.from_numpy(np.clip(x, -448, 448)).to(torch.float8_e4m3fn).view(torch.uint8)
    assert (t.numpy() == quant.e4m3_encode(x)).all()


def test_info_says_how_the_weights_were_stored(tmp_path, capsys):
    from rawgraph.cli import main

    _save(tmp_path, FORMATS["fp8-block"])
    assert main(["info", "--model", str(tmp_path)]) == 0
    assert "dequantized at load from FP8 e4m3 (fp8, per block)" in capsys.readouterr().out


def test_static_activations_need_their_input_scales(tmp_path):
    _save(tmp_path, FORMATS["fp8-static"], edit=drop_tensor(f"{Q}.input_scale"))
    with pytest.raises(CheckpointError, match="1 tensors missing"):
        checkpoint.load(tmp_path)
