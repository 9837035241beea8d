"""Programmatic dependent launch changes no bit: decode logits and tokens at LLaMA-1B shapes
(16 layers, a 1024-token context) equal those of plain launches, run after run, host-driven
and in the WHILE loop; so do prefill chunks' cache entries, hidden rows and first tokens.
Before activations stopped going through the non-coherent cache, PDL runs at these shapes
gave different tokens every time (the tiny model hid it)."""

import hashlib

import pytest

from rawgraph.cuda.launch import observers
from rawgraph.engine.loop import DecodeLoop
from rawgraph.engine.runner import Runner
from rawgraph.model.config import preset
from rawgraph.model.decoder import Model
from rawgraph.model.step import PrefillPiece, Shape
from rawgraph.ops.variant import DEFAULT

pytestmark = pytest.mark.gpu
STEPS, CTX = 12, 1024


@pytest.fixture(scope="module")
def model():
    m = Model(preset("llama-1b"), None, max_batch=2, max_context=CTX + 128, max_chunk=64,
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


def test_chained_attention_is_bit_identical(model):
    """Decode attention in the chain (its older tokens' K/V requested before its PDL wait,
    the newest token's chunk after it; `Variants.chained_attention`, the default) gives the
    plain launches' logits and tokens."""
    assert DEFAULT.chained_attention
    want = _host(model, pdl=False)
    seen = []  # (kernel, programmatic) of one eager step's launches
    observers().append(lambda _, launch: seen.append((launch.kernel.name, launch.pdl)))
    try:
        sizes = model.inputs.prepare([], _context(model), [1])
        model.launch(Shape(batch=1), sizes, None, pdl=True)
    finally:
        observers().pop()
    modes = {"combine" in name: pdl for name, pdl in seen if name.startswith("decode_attention")}
    assert modes == {False: True, True: False}  # attention in the chain, its combine plain
    for _ in range(3):
        assert _host(model, pdl=True) == want
    for _ in range(2):
        assert _loop(model, pdl=True) == want[0]


def _prefill(m, pdl, graphs):
    """Two chunks of one 100-token prompt continuing a 1024-token context, then a 20-token
    piece of a second sequence beside the last 30 of the first: (first tokens, a hash of
    the cache rows written and of the chunk's last hidden rows)."""
    r = Runner(m, graphs=graphs, buckets=[1], chunks=[64], pdl=pdl)
    _context(m)
    m.kv.tables.add(1)
    h, firsts = hashlib.sha256(), []
    for pieces in ([PrefillPiece(0, list(range(5, 69)), CTX - 1, final=False)],
                   [PrefillPiece(0, list(range(69, 99)), CTX + 63),
                    PrefillPiece(1, list(range(7, 27)), 0)]):
        first, _, _ = r.run(pieces, [], [])
        firsts.append(first)
        h.update(m.pre["r"][:64].get().tobytes())
    for layer in (0, m.cfg.layers - 1):
        k, v = m.kv.layer(layer)
        h.update(k.get().tobytes() + v.get().tobytes())
    r.close()
    return firsts, h.hexdigest()


def test_pdl_prefill_is_bit_identical_in_graphs_and_eagerly(model):
    want = _prefill(model, pdl=False, graphs=False)
    assert want[0][0] == [-1]  # the first chunk's piece does not end its prompt
    for graphs in (True, False, True):
        assert _prefill(model, pdl=True, graphs=graphs) == want
