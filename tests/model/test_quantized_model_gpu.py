"""A model with quantized projections (`Model(quantize="fp8")` / `"int4"`): its copies are the
GPU quantizer's of the weights the projections read (norms folded in); with every projection
on the quantized GEMV (chunks and steps of at most 16 rows) its logits follow the NumPy
reference of those dequantized weights; its decode steps stay close to the 16-bit model's;
graphs replay its eager launches."""

import numpy as np
import pytest

from rawgraph.dtypes import to_float32
from rawgraph.engine.runner import Runner
from rawgraph.model.config import preset
from rawgraph.model.decoder import Model
from rawgraph.model.reference import KVState, float_weights, forward
from rawgraph.model.step import PrefillPiece
from rawgraph.model.weights import quantized_copies, random_weights
from rawgraph.ops import Fp8Weight, Int4Weight
from rawgraph.ops import reference as ref
from rawgraph.ops.elementwise import GATE_UP_GROUP
from rawgraph.ops.quantized import I4_GROUP, pack_int4, takes_quantized, unpack_int4

pytestmark = pytest.mark.gpu
TOL = {"float16": 0.02, "bfloat16": 0.08}  # as the 16-bit model's against its reference
# the quantized model's decode logits from the 16-bit model's (relative L2): about twice what
# the NumPy reference of the same quantization gives with every position quantized
# (tests/model/test_reference.py: fp8 0.047, int4 0.184); this test quantizes only the steps
QUANTIZATION_L2 = {"fp8": 0.1, "int4": 0.35}
QUANTIZE = ("fp8", "int4")


@pytest.fixture(autouse=True)
def _ada_or_newer():
    if not takes_quantized("e4m3"):
        pytest.skip("FP8 kernels need compute capability 8.9")


def _err(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def _dequantized(model: Model) -> dict[str, np.ndarray]:
    """The float32 checkpoint tensors a quantized model computes with: each copy dequantized,
    its folded norm divided out (the reference applies the norm weight to x), gate and up
    taken apart."""
    cfg, w = model.cfg, model.w
    out = {}

    def deq(name):
        f = w[name]
        if isinstance(f, Fp8Weight):
            return ref.dequantize_fp8(f.codes.get(), f.scale.get())
        assert isinstance(f, Int4Weight)
        return ref.dequantize_int4(unpack_int4(f.packed.get()),
                                   to_float32(f.scales.get(), cfg.dtype), f.zeros.get(),
                                   f.group, cfg.dtype)

    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        g_in = to_float32(w[p + "input_layernorm"].get(), cfg.dtype)
        g_post = to_float32(w[p + "post_attention_layernorm"].get(), cfg.dtype)
        qkv = deq(p + "qkv") / g_in
        q, k, v = np.split(qkv, [cfg.q_size, cfg.q_size + cfg.kv_size])
        out |= {p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                p + "self_attn.v_proj.weight": v, p + "self_attn.o_proj.weight": deq(p + "o_proj")}
        gu = (deq(p + "gate_up") / g_post).reshape(-1, 2, GATE_UP_GROUP, cfg.hidden)
        out |= {p + "mlp.gate_proj.weight": gu[:, 0].reshape(-1, cfg.hidden),
                p + "mlp.up_proj.weight": gu[:, 1].reshape(-1, cfg.hidden),
                p + "mlp.down_proj.weight": deq(p + "down_proj"),
                p + "input_layernorm.weight": g_in, p + "post_attention_layernorm.weight": g_post}
    out["model.norm.weight"] = to_float32(w["norm"].get(), cfg.dtype)
    out["model.embed_tokens.weight"] = to_float32(w["embed"].get(), cfg.dtype)
    out["lm_head.weight"] = deq("lm_head")
    return out


@pytest.mark.parametrize("quantize", QUANTIZE)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_copies_are_the_quantizers_of_the_folded_weights(quantize, dtype):
    cfg = preset("tiny").replace(dtype=dtype)
    model = Model(cfg, random_weights(cfg, 5), max_batch=4, max_context=256, max_chunk=16,
                  max_chunk_seqs=4, quantize=quantize)
    try:
        copies = quantized_copies(cfg, quantize)
        assert set(copies) == {n for n, w in model.w.items()
                               if isinstance(w, (Fp8Weight, Int4Weight))}
        for name in copies:
            w = model.w[name]
            wide = to_float32(w.wide.get(), dtype)
            if quantize == "fp8":
                codes, scale = ref.quantize_fp8(wide)
                np.testing.assert_array_equal(w.codes.get(), codes, err_msg=name)
                np.testing.assert_array_equal(w.scale.get(), scale, err_msg=name)
                continue
            q, s, z = ref.quantize_int4(wide, I4_GROUP, dtype)
            np.testing.assert_array_equal(w.packed.get(), pack_int4(q), err_msg=name)
            np.testing.assert_array_equal(to_float32(w.scales.get(), dtype), s, err_msg=name)
            np.testing.assert_array_equal(w.zeros.get(), z, err_msg=name)
    finally:
        model.close()


@pytest.mark.parametrize("quantize", QUANTIZE)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_quantized_model_on_the_gemv_follows_the_reference_of_its_weights(stream, quantize,
                                                                            dtype):
    # chunks of 16 tokens and steps of 1 row: every projection reads the quantized copies;
    # the logits after each chunk and step against the reference of the dequantized weights
    cfg = preset("tiny").replace(dtype=dtype)
    model = Model(cfg, random_weights(cfg, 7), max_batch=2, max_context=256, max_chunk=16,
                  max_chunk_seqs=2, quantize=quantize)
    try:
        tokens = [int(t) for t in np.random.default_rng(1).integers(0, cfg.vocab, 48)]
        want = forward(cfg, _dequantized(model), np.array(tokens), KVState())
        for start in (0, 16):
            model.prefill([PrefillPiece(0, tokens[start:start + 16], start)], stream)
            got = to_float32(model.pre["logits"][0].get(), dtype)
            assert _err(got, want[start + 15]) < TOL[dtype]
        for i in range(32, 48):
            model.decode([0], [tokens[i]], stream)
            err = _err(to_float32(model.dec["logits"][0].get(), dtype), want[i])
            assert err < TOL[dtype], f"step {i}: {err:.3g}"
    finally:
        model.close()


@pytest.mark.parametrize("quantize", QUANTIZE)
def test_a_quantized_models_steps_stay_near_the_16_bit_models(stream, quantize):
    # prefill with the 16-bit weights (chunks of 64 take the tiled paths), then 16 decode
    # steps on the quantized GEMV beside the 16-bit model's: relative L2 of the logits
    cfg = preset("tiny")  # fp16: its own rounding well under the quantization's
    tensors = random_weights(cfg, 9)
    tokens = [int(t) for t in np.random.default_rng(2).integers(0, cfg.vocab, 80)]
    logits = {}
    for q in (None, quantize):
        model = Model(cfg, tensors, max_batch=2, max_context=256, max_chunk=64,
                      max_chunk_seqs=2, quantize=q)
        model.prefill([PrefillPiece(0, tokens[:64], 0)], stream)
        steps = []
        for i in range(64, 80):
            model.decode([0], [tokens[i]], stream)
            steps.append(to_float32(model.dec["logits"][0].get(), cfg.dtype))
        logits[q] = np.stack(steps)
        model.close()
    a, b = logits[quantize], logits[None]
    l2 = float(np.linalg.norm(a - b) / np.linalg.norm(b))
    assert 0 < l2 < QUANTIZATION_L2[quantize], l2
    print(f"{quantize} vs 16-bit decode logits: relative L2 {l2:.4f}, top-1 agreement "
          f"{(a.argmax(1) == b.argmax(1)).mean():.2f}")
    # the reference of the 16-bit weights sees the same distance (the quantization's, not a bug)
    want = forward(cfg, float_weights(cfg, tensors), np.array(tokens), KVState())[64:80]
    assert float(np.linalg.norm(b - want) / np.linalg.norm(want)) < l2


def _run(tensors, graphs: bool, quantize: str, keep_16bit: bool = True):
    """Prefill three prompts, then 12 decode steps of all three (the quantized GEMV at 4 rows):
    every iteration's tokens and the last step's logits."""
    cfg = preset("tiny")
    model = Model(cfg, tensors, max_batch=4, max_context=256, max_chunk=64, max_chunk_seqs=4,
                  quantize=quantize, keep_16bit=keep_16bit)
    runner = Runner(model, graphs=graphs, buckets=[4], chunks=[64])
    prompts = [[5, 9, 11], [6, 9, 12, 40], [7, 1]]
    toks, _, _ = runner.run([PrefillPiece(s, p, 0) for s, p in enumerate(prompts)], [], [])
    out = [toks]
    for _ in range(12):
        _, toks, _ = runner.run([], [0, 1, 2], toks)
        out.append(toks)
    logits = model.dec["logits"].get()
    runner.close()
    model.close()
    return out, logits


@pytest.mark.parametrize("quantize", QUANTIZE)
def test_a_quantized_models_graphs_replay_its_eager_launches(quantize):
    tensors = random_weights(preset("tiny"), 3)
    (eager, a), (graph, b) = _run(tensors, False, quantize), _run(tensors, True, quantize)
    assert eager == graph
    assert np.array_equal(a.view(np.uint16), b.view(np.uint16))


@pytest.mark.parametrize("quantize", QUANTIZE)
def test_a_model_kept_quantized_alone_follows_the_reference_of_its_weights(stream, quantize):
    # keep_16bit=False: the layers' projections exist only quantized; chunks of 64 tokens
    # dequantize each into the scratch (the tiled paths), steps of 1 row read them on the
    # GEMV; the logits after each chunk and step against the reference of the dequantized
    # weights, and greedy tokens eager and in graphs alike
    cfg = preset("tiny")  # fp16, as _run's
    tensors = random_weights(cfg, 8)
    model = Model(cfg, tensors, max_batch=2, max_context=256, max_chunk=64, max_chunk_seqs=2,
                  quantize=quantize, keep_16bit=False)
    try:
        alone = {n: w.wide is None for n, w in model.w.items()
                 if isinstance(w, (Fp8Weight, Int4Weight))}
        assert set(alone) == set(quantized_copies(cfg, quantize))
        assert all(a for n, a in alone.items() if n != "lm_head") and not alone["lm_head"]
        assert "wq" in model.dec and "wq" in model.pre
        tokens = [int(t) for t in np.random.default_rng(4).integers(0, cfg.vocab, 80)]
        want = forward(cfg, _dequantized(model), np.array(tokens), KVState())
        model.prefill([PrefillPiece(0, tokens[:64], 0)], stream)
        got = to_float32(model.pre["logits"][0].get(), cfg.dtype)
        assert _err(got, want[63]) < TOL[cfg.dtype]
        for i in range(64, 80):
            model.decode([0], [tokens[i]], stream)
            err = _err(to_float32(model.dec["logits"][0].get(), cfg.dtype), want[i])
            assert err < TOL[cfg.dtype], f"step {i}: {err:.3g}"
    finally:
        model.close()
    (eager, a), (graph, b) = (_run(tensors, g, quantize, False) for g in (False, True))
    assert eager == graph and np.array_equal(a.view(np.uint16), b.view(np.uint16))
