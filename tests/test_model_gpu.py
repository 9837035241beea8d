"""The GPU decoder against the NumPy reference: logits and greedy tokens, alone and batched."""

import numpy as np
import pytest

from rawgraph.model.config import preset
from rawgraph.model.program import DecodeModel
from rawgraph.model.reference import KVState, float_weights, forward, greedy
from rawgraph.model.weights import random_weights

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_logits_follow_the_reference(stream, dtype):
    cfg = preset("tiny").replace(dtype=dtype)
    tensors = random_weights(cfg, 11)
    w = float_weights(cfg, tensors)
    model = DecodeModel(cfg, tensors, max_batch=2, max_context=512)
    tokens = list(np.random.default_rng(0).integers(0, cfg.vocab, 40))
    want = forward(cfg, w, np.array(tokens), KVState())
    tol = 0.02 if dtype == "float16" else 0.1
    for i, tok in enumerate(tokens):
        model.step([0], [int(tok)], stream)
        got = model.act["logits"][0].get()
        got = got.astype(np.float32) if dtype == "float16" else \
            (got.astype(np.uint32) << 16).view(np.float32)
        err = np.abs(got - want[i]).max() / np.abs(want[i]).max()
        assert err < tol, f"step {i}: max error {err:.3g} of the logits' scale"
    model.close()


def test_greedy_tokens_match_the_reference_for_32_steps(stream):
    cfg = preset("tiny")
    tensors = random_weights(cfg, 12)
    want = greedy(cfg, float_weights(cfg, tensors), [5, 6, 7, 8], 32)
    model = DecodeModel(cfg, tensors, max_batch=1, max_context=256)
    for tok in [5, 6, 7]:
        model.step([0], [tok], stream)
    got, nxt = [], 8
    for _ in range(32):
        nxt = model.step([0], [nxt], stream)[0]
        got.append(nxt)
    assert got == want
    model.close()


def test_batched_sequences_each_match_the_reference(stream):
    cfg = preset("tiny")
    tensors = random_weights(cfg, 13)
    w = float_weights(cfg, tensors)
    prompts = {0: [1, 2, 3], 2: [9, 8, 7, 6, 5], 3: [42]}
    want = {s: greedy(cfg, w, p, 12) for s, p in prompts.items()}
    model = DecodeModel(cfg, tensors, max_batch=4, max_context=128)
    feed = {s: list(p) for s, p in prompts.items()}
    got = {s: [] for s in prompts}
    while any(len(g) < 12 for g in got.values()):
        slots = [s for s in prompts if len(got[s]) < 12]
        out = model.step(slots, [feed[s].pop(0) for s in slots], stream)
        for s, tok in zip(slots, out):
            if not feed[s]:           # the prompt is consumed: tok is generated
                got[s].append(tok)
                feed[s].append(tok)
    assert got == want
    model.close()


def test_bad_steps_raise_before_anything_changes(stream):
    cfg = preset("tiny")
    model = DecodeModel(cfg, random_weights(cfg, 1), max_batch=2, max_context=16)
    model.step([0], [1], stream)
    for slots, tokens, match in [([0, 0], [1, 2], "distinct"), ([5], [1], "outside"),
                                 ([1], [cfg.vocab], "token ids"), ([0, 1, 1], [1, 1, 1], "rows")]:
        with pytest.raises(ValueError, match=match):
            model.step(slots, tokens, stream)
    assert model.kv.tables.lens[0] == 1 and model.kv.tables.active == {0}
    for _ in range(15):
        model.step([0], [1], stream)
    with pytest.raises(ValueError, match="max_context"):
        model.step([0], [1], stream)
    model.close()
