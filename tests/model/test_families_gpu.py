"""Qwen2, Qwen3 and Mistral on the GPU against the NumPy reference of the same family table:
logits after prefill chunks and decode steps (both dtypes), decode rows 1 to 256 (the GEMV
with the bias in its epilogue, the skinny and the tiled GEMM, each followed by rope_append
where the head norm needs it), graphs bit for bit equal to eager launches in plain and mixed
iterations, and the WHILE-node loop equal to the host-driven one."""

import numpy as np
import pytest

from rawgraph.cuda.stream import new_stream
from rawgraph.dtypes import to_float32, to_storage
from rawgraph.engine.loop import DecodeLoop
from rawgraph.engine.runner import Runner
from rawgraph.model.config import preset
from rawgraph.model.decoder import Model
from rawgraph.model.reference import KVState, float_weights, forward
from rawgraph.model.step import PrefillPiece
from rawgraph.model.weights import random_weights

pytestmark = pytest.mark.gpu
TOL = {"float16": 0.02, "bfloat16": 0.08}  # as tests/model/test_model_gpu.py's
TINY = preset("tiny")
# Qwen3's head_dim (128) is not hidden / heads (64): q and o are 512 wide against 256
FAMILIES = {"qwen2": TINY.replace(family="qwen2"),
            "qwen3": TINY.replace(family="qwen3", head_dim=128),
            "mistral": TINY.replace(family="mistral", sliding_window=512)}


def _err(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def _tensors(cfg, seed):
    """Random weights with large biases, so a bias dropped or misplaced shows."""
    t = random_weights(cfg, seed)
    rng = np.random.default_rng(seed)
    for name in [n for n in t if n.endswith(".bias")]:
        t[name] = to_storage(rng.standard_normal(t[name].shape).astype(np.float32), cfg.dtype)
    return t


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_chunks_and_steps_follow_the_reference(stream, family, dtype):
    cfg = FAMILIES[family].replace(dtype=dtype)
    tensors = _tensors(cfg, 21)
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, cfg.vocab, 60)]
    w = float_weights(cfg, tensors)
    want = forward(cfg, w, np.array(tokens), KVState())
    model = Model(cfg, tensors, max_batch=2, max_context=512, max_chunk=32, max_chunk_seqs=2)
    model.prefill([PrefillPiece(0, tokens[:32], 0)], stream)
    got = [to_float32(model.pre["logits"][0].get(), dtype)]
    model.prefill([PrefillPiece(0, tokens[32:40], 32)], stream)
    got.append(to_float32(model.pre["logits"][0].get(), dtype))
    for i in range(40, 60):
        model.decode([0], [tokens[i]], stream)
        got.append(to_float32(model.dec["logits"][0].get(), dtype))
    model.close()
    rows = [31, *range(39, 59)]
    errs = [_err(g, want[r]) for g, r in zip(got, rows)]
    assert max(errs) < TOL[dtype], errs
    if family != "mistral":  # the test sees the family's extra: without it, far further off
        plain = forward(cfg.replace(family="llama"), w, np.array(tokens), KVState())
        assert _err(plain[59], want[59]) > 3 * max(errs), (_err(plain[59], want[59]), errs)


@pytest.mark.parametrize(("rows", "bucket"), [(1, 1), (12, 16), (40, 64), (100, 128),
                                              (256, 256)])
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_decode_rows_1_to_256_follow_the_reference(stream, family, rows, bucket):
    # a prefill chunk of every prompt, then one decode step in a graph bucket: the GEMV (up
    # to 16 rows: the bias in its epilogue, or the head norm in rope_append after it), the
    # skinny GEMM (40) and the tiled GEMM (100, 256) each with rope_append's extras
    cfg = FAMILIES[family]
    tensors = _tensors(cfg, 22)
    w = float_weights(cfg, tensors)
    rng = np.random.default_rng(rows)
    prompts = [[int(t) for t in rng.integers(0, cfg.vocab, 2 + s % 4)] for s in range(rows)]
    nxt = [int(t) for t in rng.integers(0, cfg.vocab, rows)]
    model = Model(cfg, tensors, max_batch=bucket, max_context=32, max_chunk=1024,
                  max_chunk_seqs=bucket)
    model.prefill([PrefillPiece(s, p, 0) for s, p in enumerate(prompts)], stream)
    chunk = to_float32(model.pre["logits"][:rows].get(), cfg.dtype)
    runner = Runner(model, buckets=[bucket], chunks=[1024])
    runner.run([], list(range(rows)), nxt)
    got = to_float32(model.dec["logits"][:rows].get(), cfg.dtype)
    runner.close()
    model.close()
    for r in range(rows):
        want = forward(cfg, w, np.array([*prompts[r], nxt[r]]), KVState())
        assert _err(chunk[r], want[-2]) < TOL[cfg.dtype], f"chunk row {r}"
        assert _err(got[r], want[-1]) < TOL[cfg.dtype], f"decode row {r}"


def _iterations(cfg, tensors, graphs, mixed):
    """Prefill, decode steps beside a long prompt's pieces (mixed iterations or not), then
    plain steps: every iteration's tokens and the final logits."""
    model = Model(cfg, tensors, max_batch=4, max_context=512, max_chunk=64, max_chunk_seqs=4)
    runner = Runner(model, graphs=graphs, buckets=[2, 4], chunks=[16, 64], mixed=mixed)
    rng = np.random.default_rng(4)
    prompts = [[int(t) for t in rng.integers(0, cfg.vocab, n)] for n in (9, 20, 100)]
    first, _, _ = runner.run([PrefillPiece(0, prompts[0], 0), PrefillPiece(1, prompts[1], 0)],
                             [], [])
    out = [first]
    _, toks, _ = runner.run([PrefillPiece(2, prompts[2][:64], 0, final=False)], [0, 1], first)
    last, toks, _ = runner.run([PrefillPiece(2, prompts[2][64:], 64)], [0, 1], toks)
    out += [toks, last]
    toks = [*toks, last[0]]
    for _ in range(4):
        _, toks, _ = runner.run([], [0, 1, 2], toks)
        out.append(toks)
    logits = (model.dec["logits"].get(), model.pre["logits"].get())
    runner.close()
    model.close()
    return out, logits


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_graphs_replay_the_eager_launches(family, mixed):
    cfg = FAMILIES[family].replace(dtype="bfloat16")
    tensors = _tensors(cfg, 23)
    eager, graph = _iterations(cfg, tensors, False, mixed), _iterations(cfg, tensors, True, mixed)
    assert eager[0] == graph[0]
    for a, b in zip(eager[1], graph[1]):
        assert np.array_equal(a.view(np.uint16), b.view(np.uint16))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_loop_matches_the_host_driven_steps(family):
    cfg = FAMILIES[family]
    tensors = _tensors(cfg, 24)
    prompts = {0: [3, 1, 4, 1, 5], 1: [9, 2, 6], 3: [5, 3, 5, 8, 9, 7, 9]}
    budgets = {0: 12, 1: 20, 3: 7}

    def prefilled():
        model = Model(cfg, tensors, max_batch=4, max_context=256, max_chunk=16,
                      max_chunk_seqs=4)
        s = new_stream()
        first = model.prefill([PrefillPiece(x, p, 0) for x, p in prompts.items()], s)
        return model, dict(zip(prompts, first)), s

    model, first, _ = prefilled()
    runner = Runner(model, buckets=[4], chunks=[16])
    want, last, live = {s: [] for s in prompts}, dict(first), list(prompts)
    while live:
        _, nxt, _ = runner.run([], live, [last[s] for s in live])
        for s, tok in zip(list(live), nxt):
            want[s].append(tok)
            last[s] = tok
            if len(want[s]) == budgets[s]:
                live.remove(s)
    runner.close()
    model.close()
    model, first2, s = prefilled()
    assert first2 == first
    loop = DecodeLoop(model, bucket=4, max_steps=32, stream=s)
    slots = list(prompts)
    got = loop.run(slots, [first[x] for x in slots], [budgets[x] for x in slots],
                   [-1] * len(slots))
    assert dict(zip(slots, got)) == want
    loop.close()
    model.close()


def test_a_context_past_the_sliding_window_is_refused():
    cfg = FAMILIES["mistral"]
    with pytest.raises(ValueError, match="past the model's sliding_window"):
        Model(cfg, None, max_batch=1, max_chunk_seqs=1, max_context=cfg.sliding_window + 1)
