"""A decode graph and a prefill chunk graph of LLaMA-1B shapes (two layers) captured and
replayed several times, patched between replays, against the same launches run eagerly: the
same tokens and bit-identical logits. Small enough to run under compute-sanitizer
(tests/sanitize.py)."""

import numpy as np
import pytest

from rawgraph.engine.runner import Runner
from rawgraph.model.config import preset
from rawgraph.model.decoder import Model
from rawgraph.model.step import PrefillPiece

pytestmark = pytest.mark.gpu
CFG = preset("llama-1b").replace(layers=2)


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
