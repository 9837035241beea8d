"""Mixed iterations (`Runner(mixed=True)`): a prefill chunk and a decode step as one pass over
the weights. Their logits follow the NumPy reference, graphs replay the eager launches bit for
bit (the same graph patched for another chunk), and an engine running them gives the
reference's greedy tokens."""

import numpy as np
import pytest

from rawgraph.dtypes import to_float32
from rawgraph.engine import Engine
from rawgraph.engine.runner import Runner
from rawgraph.memory.blocks import BlockTables
from rawgraph.model import DeviceStateError
from rawgraph.model.reference import KVState, float_weights, forward
from rawgraph.model.step import PrefillPiece
from rawgraph.ops.variant import choose
from tests.engine.test_engine_gpu import CFG, NEAR_TIE, TENSORS, _model, _reference, _stream

pytestmark = pytest.mark.gpu
TOL = 0.02  # logits error relative to their scale (float16; as tests/model/test_model_gpu)


def _err(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def _iterations(graphs):
    """Two sequences decoding while two others prefill in mixed iterations of the same
    (bucket 2, chunk 16) graph: one with a final and a non-final piece, one finishing the
    second prompt. Returns [(decode rows' logits, the chunk's head logits)] and the
    sequences' tokens."""
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(0, CFG.vocab, n)] for n in (6, 9, 7, 12)]
    model = _model()
    runner = Runner(model, graphs=graphs, buckets=[2, 4], chunks=[16, 32], mixed=True)
    seqs = {s: list(p) for s, p in enumerate(prompts)}
    first, _, _ = runner.run([PrefillPiece(s, prompts[s], 0) for s in (0, 1)], [], [])
    for s, t in zip((0, 1), first):
        seqs[s].append(t)
    out = []
    for pieces in ([PrefillPiece(2, prompts[2], 0),
                    PrefillPiece(3, prompts[3][:5], 0, final=False)],
                   [PrefillPiece(3, prompts[3][5:], 5)]):
        first, nxt, _ = runner.run(pieces, [0, 1], [seqs[0][-1], seqs[1][-1]])
        out.append((model.dec["logits"][:2].get(), model.pre["logits"][:len(pieces)].get()))
        for s, t in zip((0, 1), nxt):
            seqs[s].append(t)
        for p, t in zip(pieces, first):
            assert (t >= 0) == p.final
            if p.final:
                seqs[p.slot].append(t)
    runner.close()
    model.close()
    return out, seqs, prompts


@pytest.mark.parametrize("chained", [False, True])
def test_mixed_iterations_follow_the_reference_and_replay_bit_for_bit(chained):
    with choose(chained_attention=chained):  # decode attention in the chain, or plain
        got, seqs, prompts = _iterations(graphs=True)
        eager, eager_seqs, _ = _iterations(graphs=False)
    assert seqs == eager_seqs
    for (d, p), (de, pe) in zip(got, eager):
        assert np.array_equal(d.view(np.uint16), de.view(np.uint16))
        assert np.array_equal(p.view(np.uint16), pe.view(np.uint16))
    w = float_weights(CFG, TENSORS)

    def want(tokens):
        return forward(CFG, w, np.asarray(tokens), KVState())[-1]

    # iteration 1: rows 0 and 1 fed their first tokens; piece 0 ends prompt 2
    (d1, p1), (d2, p2) = got
    for r in (0, 1):
        assert _err(to_float32(d1[r], CFG.dtype), want(seqs[r][:-2])) < TOL
        assert _err(to_float32(d2[r], CFG.dtype), want(seqs[r][:-1])) < TOL
    assert _err(to_float32(p1[0], CFG.dtype), want(prompts[2])) < TOL
    assert _err(to_float32(p2[0], CFG.dtype), want(prompts[3])) < TOL  # after its two pieces


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize(("rows", "start"), [(1, 137), (2, 130), (3, 141), (1, 144)])
def test_a_long_prompts_last_piece_beside_decode_rows_follows_the_reference(rows, start,
                                                                             graphs):
    """A 150-token prompt's last piece (6 to 20 tokens, its context past 128) in a mixed
    iteration beside 1 to 3 decoding rows: the chunk head's logits are the prompt's."""
    rng = np.random.default_rng(11)
    long = [int(t) for t in rng.integers(0, CFG.vocab, 150)]
    short = [[int(t) for t in rng.integers(0, CFG.vocab, 5)] for _ in range(rows)]
    model = _model()
    runner = Runner(model, graphs=graphs, buckets=[1, 2, 4], chunks=[16, 24, 32, 64],
                    mixed=True)
    first, _, _ = runner.run([PrefillPiece(1 + i, p, 0) for i, p in enumerate(short)], [], [])
    at = 0
    while at < start:  # the long prompt up to `start`, in chunks of its own
        k = min(64, start - at)
        runner.run([PrefillPiece(0, long[at:at + k], at, final=False)], [], [])
        at += k
    last, _, _ = runner.run([PrefillPiece(0, long[start:], start)], list(range(1, rows + 1)),
                            first)
    got = to_float32(model.pre["logits"][:1].get()[0], CFG.dtype)
    want = forward(CFG, float_weights(CFG, TENSORS), np.asarray(long), KVState())[-1]
    runner.close()
    model.close()
    assert last[0] >= 0 and _err(got, want) < TOL


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("fed", [False, True])
def test_a_join_growing_the_bucket_beside_a_long_prompt_leaves_its_cache_alone(fed, graphs):
    """Rows in place at the runner: a 150-token prompt prefilled in pieces
    beside two decoding rows continued on the device, a third sequence joining them midway
    (its first token from the host, or on the device from the chunk that ended its prompt;
    the bucket growing 2 -> 4 in a continued step): the prompt's last logits are the
    reference's, and the joined row's next token is the reference's greedy one."""
    rng = np.random.default_rng(13)
    long = [int(t) for t in rng.integers(0, CFG.vocab, 150)]
    short = [[int(t) for t in rng.integers(0, CFG.vocab, 5)] for _ in range(3)]
    model = _model()
    runner = Runner(model, graphs=graphs, buckets=[1, 2, 4], chunks=[16, 24, 32, 64],
                    mixed=True)
    first, _, _ = runner.run([PrefillPiece(0, short[0], 0), PrefillPiece(1, short[1], 0)],
                             [], [])
    runner.launch([PrefillPiece(3, long[:24], 0, final=False)], [0, 1], first)
    ended = runner.launch([PrefillPiece(2, short[2], 0),  # slot 2's prompt ends here
                           PrefillPiece(3, long[24:43], 24, final=False)], [0, 1], None,
                          follow=True)
    piece = [PrefillPiece(3, long[43:67], 43, final=False)]
    if fed:  # its first token not read yet: taken on the device
        join = runner.launch(piece, [0, 1, 2], None, follow=True, fed=[-1, -1, 0])
    else:
        join = runner.launch(piece, [0, 1, 2], [-1, -1, runner.collect(ended)[0][0]],
                             follow=True)
    at = 67
    while at < 150:  # the rest of the long prompt beside the three rows, on the device
        k = min(24, 150 - at)
        p = runner.launch([PrefillPiece(3, long[at:at + k], at, final=at + k == 150)],
                          [0, 1, 2], None, follow=True)
        at += k
    last = runner.collect(p)[0][0]
    got = to_float32(model.pre["logits"][:1].get()[0], CFG.dtype)
    f2, joined = runner.collect(ended)[0][0], runner.collect(join)[1][2]
    runner.close()
    model.close()
    w = float_weights(CFG, TENSORS)
    assert last >= 0 and _err(got, forward(CFG, w, np.asarray(long), KVState())[-1]) < TOL
    ref = forward(CFG, w, np.asarray([*short[2], f2]), KVState())[-1]
    top = np.sort(ref)
    assert joined == int(np.argmax(ref)) or top[-1] - top[-2] < NEAR_TIE


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("mixed", [False, True])
def test_a_long_prompt_in_pieces_beside_continued_steps_follows_the_reference(mixed, graphs):
    """A 150-token prompt prefilled in 24-token pieces beside two decoding rows, each step
    continuing the last on the device (`follow`): most pieces end in the cache block they
    began in, so no table row changes, and the device must still be told the prompt's new
    length before its chunk attends (else it attends to the length before the piece). The
    prompt's last logits are the reference's."""
    rng = np.random.default_rng(17)
    long = [int(t) for t in rng.integers(0, CFG.vocab, 150)]
    short = [[int(t) for t in rng.integers(0, CFG.vocab, 5)] for _ in range(2)]
    model = _model()
    runner = Runner(model, graphs=graphs, buckets=[2, 4], chunks=[16, 24, 32, 64],
                    mixed=mixed)
    first, _, _ = runner.run([PrefillPiece(0, short[0], 0), PrefillPiece(1, short[1], 0)],
                             [], [])
    p = runner.launch([PrefillPiece(2, long[:24], 0, final=False)], [0, 1], first)
    at = 24
    while at < 150:
        k = min(24, 150 - at)
        p = runner.launch([PrefillPiece(2, long[at:at + k], at, final=at + k == 150)], [0, 1],
                          None, follow=True)
        at += k
    last = runner.collect(p)[0][0]
    got = to_float32(model.pre["logits"][:1].get()[0], CFG.dtype)
    want = forward(CFG, float_weights(CFG, TENSORS), np.asarray(long), KVState())[-1]
    runner.close()
    model.close()
    assert last >= 0 and _err(got, want) < TOL


@pytest.mark.parametrize("decode_chunk", [None, 24])
def test_an_engine_of_mixed_iterations_matches_eager_and_the_reference(decode_chunk):
    outs = []
    for graphs in (False, True):
        model = _model()
        engine = Engine(model, graphs=graphs, mixed=True, progress=False,
                        decode_chunk=decode_chunk)
        reqs = engine.run(_stream())
        outs.append([r.output for r in reqs])
        if graphs:
            used = [k for k in engine.runner.pool.entries if k.kind == "mixed"]
            assert used, "no iteration was mixed"
            if decode_chunk:  # pieces beside decoding rows kept to it
                assert max(i.prefill_tokens for i in engine.stats.iters
                           if i.decode_rows) == decode_chunk
        engine.close()
        model.close()
    assert outs[0] == outs[1]
    w = float_weights(CFG, TENSORS)
    compared = 0
    for r, out in zip(_stream(), outs[1]):
        if r.sampling.temperature == 0:
            want, sure = _reference(r.prompt, r.max_new_tokens, w)
            assert out[:sure + 1] == want[:sure + 1] or out[:sure] == want[:sure], r.name
            compared += sure
    assert compared >= 20


@pytest.mark.parametrize(("mixed", "decode_chunk", "graphs"),
                         [(True, 24, False), (True, 24, True), (False, 40, True),
                          (True, None, True)])
def test_every_iteration_finds_its_inputs_on_the_device(mixed, decode_chunk, graphs,
                                                        monkeypatch):
    # RAWGRAPH_CHECK_INPUTS=1: before each iteration's kernels, the device's lengths, tables
    # and decode rows' slots, positions and ids against the host's (a skipped copy raises);
    # the tokens are those of the same run unchecked
    outs = []
    for check in ("0", "1"):
        monkeypatch.setenv("RAWGRAPH_CHECK_INPUTS", check)
        model = _model()
        engine = Engine(model, graphs=graphs, progress=False, mixed=mixed,
                        decode_chunk=decode_chunk)
        assert engine.runner.check_inputs == (check == "1")
        outs.append([r.output for r in engine.run(_stream(3, 12))])
        engine.close()
        model.close()
    assert outs[0] == outs[1]


@pytest.mark.parametrize("mixed", [False, True])
def test_the_check_names_the_lengths_a_skipped_copy_left(mixed, monkeypatch):
    # a fault put in on purpose: a prefill piece that stays in its block leaves the lengths
    # unmarked, so a step continuing the last one beside it copies nothing
    append = BlockTables.append

    def append_unmarked(self, s, n=1):
        moved = self.lens_moved
        append(self, s, n)
        self.lens_moved = moved
    monkeypatch.setattr(BlockTables, "append", append_unmarked)
    rng = np.random.default_rng(17)
    long = [int(t) for t in rng.integers(0, CFG.vocab, 60)]
    model = _model()
    runner = Runner(model, graphs=False, mixed=mixed, check_inputs=True)
    first, _, _ = runner.run([PrefillPiece(0, [1, 2, 3], 0), PrefillPiece(1, [4, 5], 0)], [],
                             [])
    runner.launch([PrefillPiece(2, long[:24], 0, final=False)], [0, 1], first)
    with pytest.raises(DeviceStateError, match="slot 2: the device has length 24"):
        runner.launch([PrefillPiece(2, long[24:43], 24, final=False)], [0, 1], None,
                      follow=True)
    runner.close()
    model.close()
