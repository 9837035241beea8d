"""A whole decode loop in one WHILE-node graph launch: the same tokens as the host-driven
loop of bucket graphs, stops at stop ids and budgets, leaves the cache where the host loop
would."""

import numpy as np
import pytest

from rawgraph.cuda.stream import new_stream
from rawgraph.engine.loop import DecodeLoop
from rawgraph.engine.runner import Runner
from rawgraph.model.config import preset
from rawgraph.model.decoder import Model
from rawgraph.model.step import PrefillPiece
from rawgraph.model.weights import random_weights
from rawgraph.ops import SamplingParams

pytestmark = pytest.mark.gpu
CFG = preset("tiny")
TENSORS = random_weights(CFG, 31)
PROMPTS = {0: [3, 1, 4, 1, 5], 2: [9, 2, 6], 3: [5, 3, 5, 8, 9, 7, 9]}
SAMPLING = {0: SamplingParams(), 2: SamplingParams(0.9, 30, 0.95, seed=5), 3: SamplingParams()}


def _prefilled():
    model = Model(CFG, TENSORS, max_batch=4, max_context=256, max_chunk=16, max_chunk_seqs=4)
    s = new_stream()
    first = model.prefill([PrefillPiece(x, p, 0, SAMPLING[x]) for x, p in PROMPTS.items()], s)
    return model, dict(zip(PROMPTS, first)), s


def _host_loop(budgets, stops):
    model, first, _ = _prefilled()
    runner = Runner(model, buckets=[4], chunks=[16])
    out = {s: [] for s in PROMPTS}
    last = dict(first)
    live = list(PROMPTS)
    while live:
        _, nxt, _ = runner.run([], live, [last[s] for s in live])
        for s, tok in zip(list(live), nxt):
            out[s].append(tok)
            last[s] = tok
            if tok == stops[s] or len(out[s]) == budgets[s]:
                live.remove(s)
    lens = {s: int(model.kv.tables.lens[s]) for s in PROMPTS}
    runner.close()
    model.close()
    return first, out, lens


def test_loop_matches_the_host_driven_loop_and_stops_where_it_should():
    budgets = {0: 20, 2: 33, 3: 9}
    first, want, _ = _host_loop(budgets, {0: -1, 2: -1, 3: -1})
    stops = {0: want[0][6], 2: -1, 3: -1}  # row 0 stops at its 7th token (or earlier)
    first, want, want_lens = _host_loop(budgets, stops)
    model, first2, s = _prefilled()
    assert first2 == first
    loop = DecodeLoop(model, bucket=4, max_steps=64, stream=s)
    slots = list(PROMPTS)
    got = loop.run(slots, [first[x] for x in slots], [budgets[x] for x in slots],
                   [stops[x] for x in slots])
    assert dict(zip(slots, got)) == want
    assert {x: int(model.kv.tables.lens[x]) for x in slots} == want_lens
    loop.close()
    model.close()


def test_loop_then_host_steps_continue_the_same_sequences():
    budgets = {0: 12, 2: 12, 3: 12}
    _, want, _ = _host_loop(budgets, {0: -1, 2: -1, 3: -1})
    model, first, s = _prefilled()
    # 5 on the device, 7 by host; the loop's attention captured for contexts up to 16 only
    loop = DecodeLoop(model, bucket=4, max_steps=5, stream=s, max_len=16)
    slots = list(PROMPTS)
    with pytest.raises(ValueError, match="max_len = 8"):  # 7 + 5 tokens would not fit
        DecodeLoop(model, bucket=4, max_steps=5, stream=s, max_len=8).run(
            slots, [first[x] for x in slots], [12] * 3)
    got = loop.run(slots, [first[x] for x in slots], [12] * 3)
    assert all(len(g) == 5 for g in got)
    runner = Runner(model, buckets=[4], chunks=[16])
    last = [g[-1] for g in got]
    for _ in range(7):
        _, last, _ = runner.run([], slots, last)
        for g, tok in zip(got, last):
            g.append(tok)
    assert dict(zip(slots, got)) == want
    runner.close()
    loop.close()
    model.close()


def test_loop_rejects_bad_requests_before_launching():
    model, _, s = _prefilled()
    loop = DecodeLoop(model, bucket=2, max_steps=8, stream=s)
    with pytest.raises(ValueError, match="1 to 2 rows"):
        loop.run([0, 2, 3], [1, 1, 1], [4, 4, 4])
    with pytest.raises(ValueError, match="budgets"):
        loop.run([0], [1], [0])
    before = model.kv.tables.lens.copy()
    with pytest.raises(ValueError, match="max_len = 256"):  # the model's max_context
        DecodeLoop(model, bucket=1, max_steps=400, stream=s).run([0], [1], [400])
    with pytest.raises(ValueError, match="max_len 300"):
        DecodeLoop(model, bucket=1, max_steps=4, stream=s, max_len=300)
    assert np.array_equal(model.kv.tables.lens, before)
    loop.close()
    model.close()


def _follows(cfg, w, prompt, tokens, tol=0.01):
    """`tokens` continue `prompt` greedily under the float32 reference, teacher-forced: each
    token's reference logit lies within `tol` x the largest |logit| of the top one (a float16
    model's logits stay within 0.02 of it, test_model_gpu.TOL), so it is the argmax wherever
    the top two lie further apart."""
    from rawgraph.model import reference

    state = reference.KVState()
    logits = reference.forward(cfg, w, np.asarray(prompt), state)
    for i, tok in enumerate(tokens):
        row = logits[-1]
        assert row[tok] >= row.max() - tol * np.abs(row).max(), (i, tok, int(row.argmax()))
        logits = reference.forward(cfg, w, np.asarray([tok]), state)


@pytest.mark.parametrize("seed", [0, 3])
def test_loop_matches_the_engine_on_a_wide_gqa_group(seed):
    """The case of issue #26 item 3: 8 query heads on one KV head, head_dim 128, weights
    (norms included) ~ N(0, 0.05), a 37-token prompt and 32 greedy tokens. Such logits nearly
    tie (seed 3: the first token's top two differ by 3e-6), so a prompt prefilled with the
    kernels of another chunk size (the tiled GEMM of max_chunk instead of the skinny one the
    engine's 64-token chunk runs) could decode differently; `Model.prefill` picks the
    engine's chunk, and the loop gives the engine's tokens to the bit, for the row alone and
    among others, with the loop's attention captured for the model's context or a tight one.
    The engine's tokens follow the float32 reference tie-aware (`_follows`): at a near tie
    the token either side is right, and which one float16 picks moves with any rounding."""
    from rawgraph.engine import Engine
    from rawgraph.model import reference
    from rawgraph.model.config import ModelConfig
    from rawgraph.model.weights import shapes

    cfg = ModelConfig(vocab=4096, hidden=1024, layers=4, heads=8, kv_heads=1, head_dim=128,
                      intermediate=2048, rope_theta=1e5, dtype="float16")
    rng = np.random.default_rng(seed)
    tensors = {k: (rng.standard_normal(s) * 0.05).astype(np.float16)
               for k, s in shapes(cfg).items()}
    prompt = [int(x) for x in rng.integers(0, cfg.vocab, 37)]
    model = Model(cfg, tensors, max_batch=4, max_context=1024, max_chunk=512, max_chunk_seqs=4)
    engine = Engine(model, progress=False)
    want = engine.generate([prompt], 32)[0]
    _follows(cfg, reference.float_weights(cfg, tensors), prompt, want)
    engine.close()
    s = new_stream()
    others = {1: [5, 6, 7], 2: [int(x) for x in rng.integers(0, cfg.vocab, 90)]}
    for bucket, max_len, rows in ((1, None, {}), (4, 128, others), (4, None, others)):
        first = [model.prefill([PrefillPiece(x, p, 0)], s)[0]
                 for x, p in {0: prompt, **rows}.items()]
        loop = DecodeLoop(model, bucket=bucket, max_steps=40, stream=s, max_len=max_len)
        got = loop.run([0, *rows], first, [31] * len(first))
        assert [first[0], *got[0]] == want, (bucket, max_len)
        loop.close()
        for x in [0, *rows]:
            model.free(x)
    model.close()
