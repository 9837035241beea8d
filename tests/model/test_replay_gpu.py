"""A decode graph and a prefill chunk graph of LLaMA-1B shapes (two layers) captured and
replayed several times, patched between replays, against the same launches run eagerly: the
same tokens and bit-identical logits; a 16-row bucket also against the NumPy reference.
Small enough to run under compute-sanitizer (tests/sanitize.py)."""

import numpy as np
import pytest

from rawgraph.dtypes import to_float32
from rawgraph.engine.runner import Runner
from rawgraph.model.config import preset
from rawgraph.model.decoder import Model
from rawgraph.model.reference import KVState, float_weights, forward
from rawgraph.model.step import PrefillPiece
from rawgraph.model.weights import random_weights

pytestmark = pytest.mark.gpu
CFG = preset("llama-1b").replace(layers=2)
TOL = {"float16": 0.02, "bfloat16": 0.08}  # as tests/model/test_model_gpu.py's


def _run(graphs: bool):
    model = Model(CFG, None, max_batch=4, max_context=512, max_chunk=256, max_chunk_seqs=4,
                  seed=3)
    runner = Runner(model, graphs=graphs, buckets=[4], chunks=[256])
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(0, CFG.vocab, n)] for n in (200, 50, 300)]
    out = []
    first, _, _ = runner.run([PrefillPiece(0, prompts[0], 0), PrefillPiece(1, prompts[1], 0)],
                             [], [])
    out.append(first)
    # a 300-token prompt: a full chunk, then a partial one (the same graph, patched) beside
    # decode steps of the first two
    _, toks, _ = runner.run([PrefillPiece(2, prompts[2][:256], 0, final=False)], [0, 1], first)
    last, toks2, _ = runner.run([PrefillPiece(2, prompts[2][256:], 256)], [0, 1], toks)
    out += [toks, toks2, last]
    toks = toks2
    rows, toks = [0, 1, 2], [*toks, last[0]]
    for _ in range(3):  # the decode graph replayed, its split count patched as needed
        _, toks, _ = runner.run([], rows, toks)
        out.append(toks)
    logits = (model.dec["logits"].get(), model.pre["logits"].get())
    runner.close()
    model.close()
    return out, logits


def test_llama1b_graphs_replay_the_eager_launches():
    eager, graph = _run(False), _run(True)
    assert eager[0] == graph[0]
    for a, b in zip(eager[1], graph[1]):
        assert np.array_equal(a.view(np.uint16), b.view(np.uint16))


def _sixteen_rows(graphs: bool, tensors: dict, prompts: list[list[int]]):
    model = Model(CFG, tensors, max_batch=16, max_context=64, max_chunk=256, max_chunk_seqs=16)
    runner = Runner(model, graphs=graphs, buckets=[16], chunks=[256])
    rows = list(range(len(prompts)))
    toks, _, _ = runner.run([PrefillPiece(s, p, 0) for s, p in enumerate(prompts)], [], [])
    out = [toks]
    for _ in range(3):
        _, toks, _ = runner.run([], rows, toks)
        out.append(toks)
    logits = model.dec["logits"][:len(rows)].get()
    runner.close()
    model.close()
    return out, logits


def test_a_16_row_bucket_replays_the_eager_launches_and_follows_the_reference():
    # 12 rows in the 16 bucket: LLaMA-1B's gate_up and LM head (wide weights) take the
    # skinny GEMM (on Hopper skinny_sm90.cu, with down_proj's 16-row GEMV behind it launched
    # plainly), qkv, o and down the 16-row GEMV in segments; the graph against the same
    # launches run eagerly, bit for bit, and the last step's logits against the reference
    tensors = random_weights(CFG, 14)
    rng = np.random.default_rng(4)
    prompts = [[int(t) for t in rng.integers(0, CFG.vocab, 3 + r % 5)] for r in range(12)]
    eager, graph = _sixteen_rows(False, tensors, prompts), _sixteen_rows(True, tensors, prompts)
    assert eager[0] == graph[0]
    assert np.array_equal(eager[1].view(np.uint16), graph[1].view(np.uint16))
    w = float_weights(CFG, tensors)
    steps = eager[0]
    for r, p in enumerate(prompts):
        seq = [*p, *(steps[i][r] for i in range(3))]  # the last step's input is steps[2]
        want = forward(CFG, w, np.array(seq), KVState())[-1]
        got = to_float32(eager[1][r], CFG.dtype)
        err = float(np.abs(got - want).max() / np.abs(want).max())
        assert err < TOL[CFG.dtype], f"row {r}: max error {err:.3g} of the logits' scale"
