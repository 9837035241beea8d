"""Checkpoints: round trips, dtype conversion, interop with the safetensors package, and every
malformed file or directory refused with a CheckpointError naming the file and the key
(including a property test that mutates a valid file at random) (CPU)."""

import json
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rawgraph.dtypes import from_bf16_bits
from rawgraph.model import checkpoint
from rawgraph.model.config import ModelConfig, preset
from rawgraph.model.safetensors import CheckpointError, read_header, write
from rawgraph.model.weights import random_weights
from rawgraph.ops.rope import Llama3Scaling

TINY = preset("tiny")
MICRO = ModelConfig(vocab=16, hidden=8, layers=1, heads=2, kv_heads=1, head_dim=4,
                    intermediate=16, name="micro")

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
    (lambda r: (r / "config.json").write_text('{"model_type": "gpt2"}'),
     "config.json: model_type 'gpt2' is not supported"),
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


def _header(f):
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _put_header(f, header, data):
    head = json.dumps(header).encode()
    f.write_bytes(struct.pack("<Q", len(head)) + head + data)


def _edit_header(edit, every=False):
    def mutate(root):
        for f in sorted(root.glob("*.safetensors"))[:None if every else 1]:
            header, data = _header(f)
            edit(header)
            _put_header(f, header, data)
    return mutate


def _first(header):
    return next(k for k in header if k != "__metadata__")


def _overlap(header):
    """Point a tensor at the bytes of another of the same size."""
    size = {}
    for k, e in header.items():
        if k != "__metadata__":
            b, end = e["data_offsets"]
            if end - b in size:
                e["data_offsets"] = header[size[end - b]]["data_offsets"]
                return
            size[end - b] = k


def _edit_config(edit):
    def mutate(root):
        cfg = json.loads((root / "config.json").read_text())
        edit(cfg)
        (root / "config.json").write_text(json.dumps(cfg))
    return mutate


def _edit_index(edit):
    def mutate(root):
        idx = json.loads((root / checkpoint.INDEX).read_text())
        edit(idx)
        (root / checkpoint.INDEX).write_text(json.dumps(idx))
    return mutate


def _shard_dir(root):
    f = sorted(root.glob("*.safetensors"))[0]
    f.unlink()
    f.mkdir()


@pytest.mark.parametrize(("mutate", "match"), [
    (lambda r: (r / "config.json").write_text("[1, 2]"),
     "config.json: config.json must be a JSON object, got a list"),
    (lambda r: (r / "config.json").write_text("{oops"), "config.json: not JSON"),
    (lambda r: (r / "config.json").write_bytes(b"\xff\xfe"), "config.json: not JSON"),
    (_edit_config(lambda c: c.update(num_attention_heads=0, head_dim=None)),
     "config.json: num_attention_heads must be at least 1"),
    (_edit_config(lambda c: c.update(hidden_size="256")),
     "config.json: hidden_size must be an integer, got str '256'"),
    (_edit_config(lambda c: c.update(rope_scaling={"rope_type": "llama3", "low_freq_factor": 1,
                                                   "high_freq_factor": 4})),
     "config.json: rope_scaling.factor is missing"),
    (_edit_config(lambda c: c.update(rope_scaling="llama3")),
     "config.json: rope_scaling must be an object or null, got str"),
    (_edit_header(lambda h: h.clear() or h.update({"__metadata__": []})),
     "__metadata__ must be an object"),
    (_edit_header(lambda h: h[_first(h)].pop("data_offsets")), "has no 'data_offsets'"),
    (_edit_header(lambda h: h[_first(h)].update(data_offsets=[-64, 0])),
     r"data_offsets must be \[begin, end\]"),
    (_edit_header(lambda h: h[_first(h)].update(data_offsets=[0, "8"])), "data_offsets"),
    (_edit_header(lambda h: h[_first(h)].update(shape=[-1, 4])), "shape must be a list"),
    (_edit_header(lambda h: h.update({_first(h): [1, 2]})), "header entry must be an object"),
    (_edit_header(_overlap, every=True), "share bytes"),
    (_edit_index(lambda i: i.update(weight_map=list(i["weight_map"]))), "not a safetensors index"),
    (_edit_index(lambda i: i.update(weight_map={k: "../x.safetensors"
                                                for k in i["weight_map"]})), "outside"),
    (lambda r: (r / checkpoint.INDEX).write_text("[]"), "not a safetensors index"),
    (_shard_dir, r"missing \(or not files\)"),
    (lambda r: (r / "tokenizer.json").mkdir(), "tokenizer.json: not a file"),
])
def test_malformed_checkpoints_name_the_file_and_field(tmp_path, mutate, match):
    with pytest.raises(CheckpointError, match=match):
        checkpoint.load(_bad(tmp_path, mutate))


def test_a_header_that_is_a_list_or_a_directory(tmp_path):
    f = tmp_path / "x.safetensors"
    head = b"[1, 2]  "
    f.write_bytes(struct.pack("<Q", len(head)) + head)
    with pytest.raises(CheckpointError, match=r"x\.safetensors: header must be a JSON object"):
        read_header(f)
    checkpoint.save(tmp_path / "ck", MICRO, random_weights(MICRO, 1))
    (tmp_path / "ck" / "model.safetensors").unlink()
    (tmp_path / "ck" / "model.safetensors").mkdir()
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a file"):
        checkpoint.load(tmp_path / "ck")
    with pytest.raises(CheckpointError, match="not a directory"):
        checkpoint.load(f)


# ---- the property: any mutation of a valid file loads correctly or is refused -----------

_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70)
                     | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
_FIELD = st.sampled_from(["dtype", "shape", "data_offsets", None])


@st.composite
def _mutation(draw):
    kind = draw(st.sampled_from(["field", "offsets", "bytes", "truncate", "extend", "length"]))
    if kind == "field":  # one header field (or a whole entry, or a new one) replaced
        return kind, (draw(st.integers(0, 30)), draw(_FIELD), draw(_JSON))
    if kind == "offsets":  # plausible numbers: shifted, swapped, out of bounds
        return kind, (draw(st.integers(0, 30)), draw(st.integers(-64, 64)),
                      draw(st.integers(-64, 64)))
    if kind == "bytes":
        return kind, draw(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                                   min_size=1, max_size=4))
    return kind, draw(st.integers(0, 10**6))


def _apply(raw: bytes, kind: str, arg) -> bytes:
    n = struct.unpack("<Q", raw[:8])[0]
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    names = [k for k in header if k != "__metadata__"]
    if kind in ("field", "offsets"):
        name = names[arg[0] % len(names)] if arg[0] < 25 else f"new.{arg[0]}"
        entry = header.setdefault(name, {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]})
        if kind == "field":
            if arg[1] is None:
                header[name] = arg[2]
            else:
                entry[arg[1]] = arg[2]
        else:
            b, e = entry["data_offsets"]
            entry["data_offsets"] = [b + arg[1], e + arg[2]]
        head = json.dumps(header).encode()
        return struct.pack("<Q", len(head)) + head + data
    if kind == "bytes":
        out = bytearray(raw)
        for pos, v in arg:
            out[pos % len(out)] = v
        return bytes(out)
    if kind == "truncate":
        return raw[:arg % len(raw)]
    if kind == "extend":
        return raw + bytes(arg % 97)
    return struct.pack("<Q", arg) + raw[8:]  # the header length


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(mutations=st.lists(_mutation(), min_size=1, max_size=3))
def test_mutated_files_load_correctly_or_are_refused(tmp_path_factory, mutations):
    root = tmp_path_factory.mktemp("ck")
    checkpoint.save(root, MICRO, random_weights(MICRO, 7))
    f = root / "model.safetensors"
    raw = f.read_bytes()
    for kind, arg in mutations:
        try:
            raw = _apply(raw, kind, arg)
        except (ValueError, KeyError, TypeError, struct.error, IndexError, AttributeError):
            break  # the file no longer has a header to edit: load what it is
    f.write_bytes(raw)
    try:
        got = checkpoint.load(root)
    except CheckpointError:
        return
    # loaded: every tensor holds exactly the bytes its header entry names
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    for name, arr in got.tensors.items():
        b, e = header[name]["data_offsets"]
        assert arr.tobytes() == raw[8 + n + b:8 + n + e], name
        assert tuple(header[name]["shape"]) == arr.shape


def test_tensors_handed_to_a_model_are_checked_first():
    from rawgraph.model.weights import check_tensors

    w = random_weights(MICRO, 2)
    check_tensors(MICRO, w)
    with pytest.raises(ValueError, match=r"'model\.norm\.weight' is missing"):
        check_tensors(MICRO, {k: v for k, v in w.items() if k != "model.norm.weight"})
    with pytest.raises(ValueError, match=r"is float32 \(8,\); the config needs float16 \(8,\)"):
        check_tensors(MICRO, {**w, "model.norm.weight": np.ones(8, np.float32)})


@pytest.mark.parametrize(("family", "extra"), [
    ("qwen2", {"head_dim": 64}), ("qwen3", {"head_dim": 128, "tie_embeddings": True}),
    ("mistral", {"sliding_window": 4096})])
def test_family_checkpoints_round_trip_and_name_their_tensors(tmp_path, family, extra):
    cfg = TINY.replace(family=family, dtype="bfloat16", **extra)
    w = random_weights(cfg, 5)
    checkpoint.save(tmp_path, cfg, w)
    got = checkpoint.load(tmp_path)
    assert got.config.replace(name=cfg.name) == cfg
    assert set(got.tensors) == set(w) and all(np.array_equal(got.tensors[k], w[k]) for k in w)
    extras = [k for k in w if "bias" in k or "_norm." in k]
    if family == "mistral":
        assert not extras
        return
    # a family tensor missing is named; LLaMA's config over it names the strays
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"model_type": "llama",
                                                               "architectures": None}))
    with pytest.raises(CheckpointError, match=r"unexpected tensors.*LlamaForCausalLM"):
        checkpoint.load(tmp_path)
