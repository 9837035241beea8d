"""Programmatic dependent launch changes no bit: decode logits and tokens at LLaMA-1B shapes
(16 layers, a 1024-token context) equal those of plain launches, run after run, host-driven
and in the WHILE loop. Before activations stopped going through the non-coherent cache, PDL
runs at these shapes gave different tokens every time (the tiny model hid it)."""

import hashlib

import pytest

from rawgraph.engine.loop import DecodeLoop
from rawgraph.engine.runner import Runner
from rawgraph.model.config import preset
from rawgraph.model.decoder import Model

pytestmark = pytest.mark.gpu
STEPS, CTX = 12, 1024


@pytest.fixture(scope="module")
def model():
    m = Model(preset("llama-1b"), None, max_batch=2, max_context=CTX + 64, max_chunk=64,
              max_chunk_seqs=2)
    m.kv.k.fill(0)  # a defined context: random weights over a zeroed cache
    m.kv.v.fill(0)
    yield m
    m.close()


def _context(m):
    t = m.kv.tables
    t.reset()
    t.add(0)
    t.append(0, CTX - 1)
    return [0]


def _host(m, pdl):
    r = Runner(m, buckets=[1], chunks=[64], pdl=pdl)
    slots, last, toks, h = _context(m), [1], [], hashlib.sha256()
    for _ in range(STEPS):
        _, last, _ = r.run([], slots, last)
        toks.append(last[0])
        h.update(m.dec["logits"][:1].get().tobytes())
    r.close()
    return toks, h.hexdigest()


def _loop(m, pdl):
    r = Runner(m, buckets=[1], chunks=[64], pdl=pdl)
    loop = DecodeLoop(m, 1, STEPS, r.decode_stream, pdl=pdl)
    got = loop.run(_context(m), [1], [STEPS])[0]
    loop.close()
    r.close()
    return got


def test_pdl_decode_is_bit_identical_at_llama_1b_shapes(model):
    want = _host(model, pdl=False)
    for _ in range(3):
        assert _host(model, pdl=True) == want
    for _ in range(2):
        assert _loop(model, pdl=True) == want[0]
