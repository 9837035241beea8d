"""IF nodes inside a capture: the body runs exactly when the setter kernel says so, its
condition follows patched arguments and device data between launches, and a prefill chunk
of pieces that end no prompt skips its LM head."""

import cupy
import numpy as np
import pytest

from rawgraph import capture
from rawgraph.cuda.stream import new_stream
from rawgraph.graph.capture import CaptureError
from rawgraph.graph.conditional import condition_handle, if_node, set_condition_any
from rawgraph.ops.elementwise import add
from rawgraph.symbols import Range, Symbols

pytestmark = pytest.mark.gpu
N = 4096


def test_if_node_runs_its_body_only_when_a_flag_is_set(stream):
    flags = cupy.zeros(4, np.int32)
    a = cupy.arange(N, dtype=np.float16)
    out = cupy.zeros(N, np.float16)
    after = cupy.zeros(N, np.float16)
    body = new_stream()
    sym = Symbols(n=Range(1, 4))
    sym.set(n=4)
    with capture(stream, name="if test") as cap:
        h = condition_handle(stream)
        set_condition_any(flags, sym.n, h, stream, symbols=sym)
        with if_node(stream, h, body):
            add(out, a, out, stream=body)  # out += a when the branch runs
        add(out, a, after, stream=stream)  # after the IF node: sees the branch's result
    with cap.graph as g, g.instantiate() as ex:
        kinds = [n.type for n in g.nodes]
        assert kinds.count("conditional") == 1 and "kernel" in kinds
        ex.launch(stream)
        stream.synchronize()
        assert not out.any() and (after == a).all()  # no flag: skipped
        flags[2] = 1
        for reps in (1, 2, 3):  # replays accumulate: the branch runs every time
            ex.launch(stream)
            stream.synchronize()
            assert (out == reps * a).all() and (after == (reps + 1) * a).all()
        ex.set(n=2)  # the flag now lies past n: skipped again
        ex.launch(stream)
        stream.synchronize()
        assert (out == 3 * a).all()


def test_if_node_needs_a_capture_and_leaves_the_stream_usable(stream):
    with pytest.raises(CaptureError, match="active capture"):
        condition_handle(stream)
    with pytest.raises(CaptureError, match="active capture"), if_node(stream, 0, new_stream()):
        pass
    floats = cupy.zeros(4, np.float32)
    with pytest.raises(ValueError, match="int32"), capture(stream):
        set_condition_any(floats, 4, 0, stream)
    x = cupy.ones(N, np.float16)
    add(x, x, x, stream=stream)  # the stream still works
    stream.synchronize()
    assert (x == 2).all()


def test_prefill_graph_skips_the_head_of_a_chunk_that_ends_no_prompt():
    from rawgraph.engine.runner import Runner
    from rawgraph.model.config import preset
    from rawgraph.model.decoder import Model
    from rawgraph.model.step import PrefillPiece
    from rawgraph.model.weights import random_weights

    cfg = preset("tiny")
    tensors = random_weights(cfg, 5)
    prompt = [int(t) for t in np.random.default_rng(0).integers(1, cfg.vocab, 24)]
    pieces = [PrefillPiece(0, prompt[:16], 0, final=False), PrefillPiece(0, prompt[16:], 16)]
    want = Model(cfg, tensors, max_batch=2, max_context=64, max_chunk=16, max_chunk_seqs=2)
    st = new_stream()
    assert want.prefill(pieces[:1], st) == [-1]
    want_tok = want.prefill(pieces[1:], st)
    model = Model(cfg, tensors, max_batch=2, max_context=64, max_chunk=16, max_chunk_seqs=2)
    runner = Runner(model, buckets=[1], chunks=[16])
    model.pre["next"].fill(-7)
    model.pre["logits"].fill(0)
    first, _, _ = runner.run(pieces[:1], [], [])
    assert first == [-1]
    assert (model.pre["next"] == -7).all() and not model.pre["logits"].any()  # skipped
    first, _, _ = runner.run(pieces[1:], [], [])
    assert first == want_tok
    np.testing.assert_array_equal(model.pre["logits"][:1].get(), want.pre["logits"][:1].get())
    runner.close()
