"""The GPU decoder against the NumPy reference: logits and greedy tokens after prefill chunks
and decode steps, alone and batched; a few-layer 1B-shaped model; bad steps."""


import numpy as np
import pytest

from rawgraph.dtypes import to_float32
from rawgraph.model.config import preset
from rawgraph.model.decoder import Model
from rawgraph.model.reference import KVState, float_weights, forward, greedy
from rawgraph.model.step import PrefillPiece
from rawgraph.model.weights import random_weights
from rawgraph.ops import matmul
from rawgraph.ops.variant import Variants, choose

pytestmark = pytest.mark.gpu
# logits error relative to their scale: fp32 accumulation, activations rounded to the
# storage type after every op (as a framework computing in that type would)
TOL = {"float16": 0.02, "bfloat16": 0.08}


def _err(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def _logits(buf, row, dtype):
    return to_float32(buf[row].get(), dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_prefill_then_decode_logits_follow_the_reference(stream, dtype):
    cfg = preset("tiny").replace(dtype=dtype)
    tensors = random_weights(cfg, 11)
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, cfg.vocab, 60)]
    want = forward(cfg, float_weights(cfg, tensors), np.array(tokens), KVState())
    model = Model(cfg, tensors, max_batch=2, max_context=512, max_chunk=32, max_chunk_seqs=2)
    # the 40-token prompt as chunks of 32 + 8, then 20 decode steps
    model.prefill([PrefillPiece(0, tokens[:32], 0)], stream)
    assert _err(_logits(model.pre["logits"], 0, dtype), want[31]) < TOL[dtype]
    model.prefill([PrefillPiece(0, tokens[32:40], 32)], stream)
    assert _err(_logits(model.pre["logits"], 0, dtype), want[39]) < TOL[dtype]
    for i in range(40, 60):
        model.decode([0], [tokens[i]], stream)
        err = _err(_logits(model.dec["logits"], 0, dtype), want[i])
        assert err < TOL[dtype], f"step {i}: max error {err:.3g} of the logits' scale"
    model.close()


@pytest.mark.parametrize("runs_up_to", [0, 32])
def test_prefill_in_key_runs_follows_the_reference(stream, runs_up_to):
    # chunks of 32 with a block per head (0), and grouped in key runs whose count follows
    # the context (1 run up to 255 tokens, 2 from 256), then decode; logits after every chunk
    # and step
    cfg = preset("tiny")
    tensors = random_weights(cfg, 16)
    tokens = [int(t) for t in np.random.default_rng(3).integers(0, cfg.vocab, 330)]
    want = forward(cfg, float_weights(cfg, tensors), np.array(tokens), KVState())
    model = Model(cfg, tensors, max_batch=1, max_context=2048, max_chunk=32, max_chunk_seqs=1,
                  runs_up_to=runs_up_to)
    assert (model.runs(32) > 0) == (runs_up_to > 0)
    for start in range(0, 320, 32):
        model.prefill([PrefillPiece(0, tokens[start:start + 32], start)], stream)
        err = _err(_logits(model.pre["logits"], 0, cfg.dtype), want[start + 31])
        assert err < TOL[cfg.dtype], f"chunk at {start}: max error {err:.3g}"
    for i in range(320, 330):
        model.decode([0], [tokens[i]], stream)
        assert _err(_logits(model.dec["logits"], 0, cfg.dtype), want[i]) < TOL[cfg.dtype]
    model.close()


def test_greedy_tokens_match_the_reference_for_32_steps(stream):
    cfg = preset("tiny")
    tensors = random_weights(cfg, 12)
    prompt = [5, 6, 7, 8, 9, 10, 11]
    want = greedy(cfg, float_weights(cfg, tensors), prompt, 32)
    model = Model(cfg, tensors, max_batch=1, max_context=256, max_chunk=4, max_chunk_seqs=1)
    got = model.prefill([PrefillPiece(0, prompt[:4], 0)], stream)
    got = model.prefill([PrefillPiece(0, prompt[4:], 4)], stream)
    for _ in range(31):
        got.append(model.decode([0], [got[-1]], stream)[0])
    assert got == want
    model.close()


def test_batched_chunks_and_steps_each_match_the_reference(stream):
    cfg = preset("tiny")
    tensors = random_weights(cfg, 13)
    w = float_weights(cfg, tensors)
    prompts = {0: [1, 2, 3], 2: [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11], 3: [42]}
    want = {s: greedy(cfg, w, p, 12) for s, p in prompts.items()}
    model = Model(cfg, tensors, max_batch=4, max_context=128, max_chunk=16, max_chunk_seqs=3)
    firsts = model.prefill([PrefillPiece(s, p, 0) for s, p in prompts.items()], stream)
    got = {s: [t] for s, t in zip(prompts, firsts)}
    while any(len(g) < 12 for g in got.values()):
        slots = [s for s in prompts if len(got[s]) < 12]
        for s, tok in zip(slots, model.decode(slots, [got[s][-1] for s in slots], stream)):
            got[s].append(tok)
    assert got == want
    model.close()


@pytest.mark.parametrize(("kernel", "rows", "bucket"), [("gemm", 100, 128), ("gemm", 200, 256),
                                                      ("skinny", 100, 128)])
def test_decode_steps_past_64_rows_follow_the_reference(stream, kernel, rows, bucket):
    # 100 rows: the projections take the tiled GEMM (past the skinny GEMM's 64; on Hopper k
    # split in clusters where its tiles are few), or on Hopper the wgmma skinny GEMM's 128-row
    # x tile where switched on; 200 rows in the largest bucket, 256; one graph bucket (and
    # eagerly, the same launches); every row's logits against its own float reference
    from rawgraph.engine.runner import Runner

    if kernel == "skinny" and not matmul.hopper():
        pytest.skip("the 128-row skinny GEMM is skinny_sm90.cu's (compute capability 9.0)")
    variants = Variants(wgmma_skinny_to=128 if kernel == "skinny" else 64)
    cfg = preset("tiny")
    tensors = random_weights(cfg, 15)
    w = float_weights(cfg, tensors)
    rng = np.random.default_rng(2)
    prompts = [[int(t) for t in rng.integers(0, cfg.vocab, 2 + s % 4)] for s in range(rows)]
    nxt = [int(t) for t in rng.integers(0, cfg.vocab, rows)]
    want = [forward(cfg, w, np.array([*p, t]), KVState())[-1] for p, t in zip(prompts, nxt)]
    with choose(variants):
        assert matmul.path(rows, cfg.hidden) == kernel
    model = Model(cfg, tensors, max_batch=bucket, max_context=32, max_chunk=1024,
                  max_chunk_seqs=bucket, variants=variants)
    model.prefill([PrefillPiece(s, p, 0) for s, p in enumerate(prompts)], stream)
    runner = Runner(model, buckets=[bucket], chunks=[1024])
    runner.run([], list(range(rows)), nxt)
    for r in range(rows):
        err = _err(_logits(model.dec["logits"], r, cfg.dtype), want[r])
        assert err < TOL[cfg.dtype], f"row {r}: max error {err:.3g} of the logits' scale"
    runner.close()
    model.close()


def test_few_layer_1b_shaped_logits(stream):
    cfg = preset("llama-1b").replace(layers=2, dtype="bfloat16")
    tensors = random_weights(cfg, 14)
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, cfg.vocab, 24)]
    want = forward(cfg, float_weights(cfg, tensors), np.array(tokens), KVState())
    model = Model(cfg, tensors, max_batch=1, max_context=64, max_chunk=128, max_chunk_seqs=1)
    model.prefill([PrefillPiece(0, tokens[:20], 0)], stream)  # GEMM path (chunk of 128)
    assert _err(_logits(model.pre["logits"], 0, cfg.dtype), want[19]) < TOL[cfg.dtype]
    for i in range(20, 24):
        model.decode([0], [tokens[i]], stream)
        assert _err(_logits(model.dec["logits"], 0, cfg.dtype), want[i]) < TOL[cfg.dtype]
    model.close()


def test_sampled_tokens_are_reproducible_and_vary_with_the_seed(stream):
    from rawgraph.ops import SamplingParams

    cfg = preset("tiny")
    tensors = random_weights(cfg, 15)

    def run(seed):
        model = Model(cfg, tensors, max_batch=1, max_context=64, max_chunk=8, max_chunk_seqs=1)
        sp = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=seed)
        out = model.prefill([PrefillPiece(0, [1, 2, 3], 0, sp)], stream)
        for _ in range(20):
            out += model.decode([0], [out[-1]], stream, [sp])
        model.close()
        return out

    a, b, c = run(7), run(7), run(8)
    assert a == b and a != c


def test_bad_steps_raise_before_anything_changes(stream):
    cfg = preset("tiny")
    model = Model(cfg, random_weights(cfg, 1), max_batch=2, max_context=16, max_chunk=8,
                  max_chunk_seqs=2)
    model.decode([0], [1], stream)
    for slots, tokens, match in [([0, 0], [1, 2], "distinct"), ([5], [1], "distinct"),
                                 ([1], [cfg.vocab], "token ids"), ([0, 1, 1], [1, 1, 1], "rows")]:
        with pytest.raises(ValueError, match=match):
            model.decode(slots, tokens, stream)
    for pieces, match in [([PrefillPiece(1, [1] * 9, 0)], "1 to 8 tokens"),
                          ([PrefillPiece(0, [1], 0)], "continue its sequence at position 1"),
                          ([PrefillPiece(1, [], 0)], "1 to 8 tokens"),
                          ([PrefillPiece(1, [cfg.vocab], 0)], "token ids")]:
        with pytest.raises(ValueError, match=match):
            model.prefill(pieces, stream)
    assert model.kv.tables.lens[0] == 1 and model.kv.tables.active == {0}
    model.prefill([PrefillPiece(0, [1] * 8, 1)], stream)
    for _ in range(7):
        model.decode([0], [1], stream)
    with pytest.raises(ValueError, match="max_context"):
        model.decode([0], [1], stream)
    model.close()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_nan_and_infinite_weights_are_refused(tmp_path, dtype):
    from rawgraph.dtypes import to_storage
    from rawgraph.model import checkpoint
    from rawgraph.model.safetensors import CheckpointError

    cfg = preset("tiny").replace(dtype=dtype)
    tensors = random_weights(cfg, 3)
    for name, bad in (("model.layers.1.mlp.up_proj.weight", np.nan),  # interleaved in gate_up
                      ("model.layers.0.self_attn.k_proj.weight", np.inf),  # a slice of qkv
                      ("model.norm.weight", -np.inf)):
        x = to_float32(tensors[name], dtype).copy()
        x.flat[7] = bad
        broken = {**tensors, name: to_storage(x, dtype)}
        with pytest.raises(CheckpointError, match=f"tensor '{name}' holds 1 NaN or infinite"):
            Model(cfg, broken, max_batch=1, max_context=64, max_chunk=16, max_chunk_seqs=1)
        checkpoint.save(tmp_path / name, cfg, broken, shard_bytes=200_000)
        ck = checkpoint.load(tmp_path / name)
        with pytest.raises(CheckpointError, match=r"model-\d+-of-\d+\.safetensors: tensor"):
            Model.from_checkpoint(ck, max_batch=1, max_context=64, max_chunk=16,
                                  max_chunk_seqs=1)
    model = Model(cfg, tensors, max_batch=1, max_context=64, max_chunk=16, max_chunk_seqs=1)
    assert model.prefill([PrefillPiece(0, [1, 2, 3], 0)], None)[0] >= 0  # still serving
    model.close()
