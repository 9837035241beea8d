"""argmax and seeded sampling on the device: greedy rows equal argmax (ties, NaN, the LM head's
row maxima), drawn tokens follow the reference distribution after temperature / top-k /
top-p, draws are reproducible."""

import cupy
import numpy as np
import pytest

from rawgraph import ops
from rawgraph.dtypes import to_float32, to_storage
from rawgraph.ops import reference as ref
from tests.helpers import DTYPES, randn

pytestmark = pytest.mark.gpu


def _draw(stream, logits_host, dtype, temperature, top_k, top_p, seeds, positions):
    """Sample every row of `logits_host` (rows, vocab); returns tokens and the stored logits."""
    rows = logits_host.shape[0]
    stored = to_storage(np.ascontiguousarray(logits_host, np.float32), dtype)
    logits = cupy.asarray(stored)
    out = cupy.full(rows, -1, np.int32)

    def col(v, t):
        return cupy.asarray(np.broadcast_to(np.asarray(v, t), (rows,)).copy())

    cupy.cuda.Device().synchronize()
    ops.sample(logits, out, col(temperature, np.float32), col(top_k, np.int32),
               col(top_p, np.float32), col(seeds, np.uint64), col(positions, np.int32),
               stream=stream)
    stream.synchronize()
    return out.get(), to_float32(stored, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax(stream, rng, dtype):
    logits, lh = randn(rng, (7, 128256), dtype, 3.0)
    lh = lh.copy()
    lh[1, 7] = lh[1, 9] = lh[1].max() + 10   # tie: smallest index wins
    lh[0, 17] = lh[0, 19] = lh[0].max() + 10  # ... within one 8-token piece
    lh[3, 3 + 8192] = lh[3, 3] = lh[3].max() + 10  # ... across one thread's pieces
    lh[4, 128255] = lh[4, 20000] = lh[4].max() + 10  # ... far apart, the last token
    lh[2, :] = np.nan
    lh[2, 1234] = 1.0
    lh[5, :] = np.nan  # nothing: 0
    from rawgraph.dtypes import to_storage

    logits = cupy.asarray(to_storage(lh, dtype))
    out = cupy.full(7, -7, np.int32)
    ops.argmax(logits, out, 6, stream=stream)
    stream.synchronize()
    got = out.get()
    np.testing.assert_array_equal(got[:5], ref.argmax(lh[:5]))
    assert got.tolist() == [17, 7, 1234, 3, 20000, 0, -7]
    # vocabularies that end inside a piece, rows not 16-byte aligned
    for vocab in (1001, 9, 64):
        x, xh = randn(rng, (3, vocab), dtype)
        o = cupy.full(3, -7, np.int32)
        ops.argmax(x, o, stream=stream)
        stream.synchronize()
        np.testing.assert_array_equal(o.get(), ref.argmax(xh))
    with pytest.raises(ValueError, match="out must be a contiguous int32"):
        ops.argmax(logits, cupy.zeros(7, np.int64))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_greedy_rows_are_argmax(stream, rng, dtype):
    x = rng.standard_normal((6, 50000)) * 3
    x[1, 77] = x[1, 78] = 40  # a tie: the smaller index
    x[2, :] = np.nan
    x[2, 5] = 1.0
    x[3, 9 + 8192] = x[3, 9] = 40  # a tie across one thread's 8-token pieces
    x[4, :] = -np.inf  # all -inf: the first
    x[4, :3] = np.nan
    got, xs = _draw(stream, x, dtype, 0.0, 0, 1.0, 0, 0)
    assert got[1] == 77 and got[2] == 5 and got[3] == 9 and got[4] == 3
    np.testing.assert_array_equal(got, ref.argmax(xs))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
# 9 to 16 rows of a wide weight take the skinny GEMM; (2000, 8192): GEMV blocks of 16 warps
@pytest.mark.parametrize(("m", "n", "k"), [(1, 50000, 256), (5, 50000, 256), (8, 50000, 256),
                                           (1, 2000, 8192), (8, 2000, 8192), (12, 2000, 8192)])
def test_lm_head_row_max_gives_greedy_tokens_without_a_pass(stream, rng, dtype, m, n, k):
    # linear(..., row_max=) merges each row's greedy key as its blocks end; sample's greedy
    # rows take the token from it (ties: the smaller index; NaN logits skipped), a sampled
    # row draws what it draws without it, and every key is back to 0 for the next head
    rows = m + 1
    xh = rng.standard_normal((rows, k)).astype(np.float32)
    xh[::2] = np.abs(xh[::2])  # even rows: logits 5 and 9 (a tie) are the largest
    wh = (rng.standard_normal((n, k)) * k**-0.5).astype(np.float32)
    wh[5] = wh[9] = 0.5
    wh[2, 0::2], wh[2, 1::2] = np.inf, -np.inf  # logit 2: inf - inf, NaN
    x, w = (cupy.asarray(to_storage(a, dtype)) for a in (xh, wh))
    logits = cupy.zeros((rows, n), x.dtype)
    best = cupy.zeros(rows, np.uint64)
    temp = np.zeros(rows, np.float32)
    temp[0] = 1.0  # row 0 samples
    args = [cupy.asarray(a) for a in (temp, np.zeros(rows, np.int32), np.ones(rows, np.float32),
                                      np.arange(rows, dtype=np.uint64),
                                      np.zeros(rows, np.int32))]
    got, plain = cupy.full(rows, -1, np.int32), cupy.full(rows, -1, np.int32)
    cupy.cuda.Device().synchronize()
    for _ in range(2):  # the keys reset by the first round serve the second
        ops.linear(x, w, logits, m=m, row_max=best, stream=stream)
        ops.sample(logits, got, *args, rows=m, row_max=best, stream=stream)
    ops.sample(logits, plain, *args, rows=m, stream=stream)
    stream.synchronize()
    want = ref.argmax(to_float32(cupy.asnumpy(logits), dtype)[:m])
    greedy = temp[:m] == 0
    np.testing.assert_array_equal(got.get()[:m][greedy], want[greedy])
    assert (got.get()[:m:2][greedy[::2]] == 5).all()
    np.testing.assert_array_equal(got.get()[:m], plain.get()[:m])
    assert (best.get() == 0).all()
    with pytest.raises(ValueError, match="row_max: only the GEMV"):
        ops.linear(cupy.zeros((40, k), x.dtype), w, cupy.zeros((40, n), x.dtype),
                   row_max=cupy.zeros(40, np.uint64))
    with pytest.raises(ValueError, match="row_max must be a contiguous uint64"):
        ops.linear(x, w, logits, m=m, row_max=cupy.zeros(rows, np.int64))


@pytest.mark.parametrize(("temperature", "top_k", "top_p"),
                         [(1.0, 0, 1.0), (0.7, 20, 1.0), (1.3, 0, 0.8), (1.0, 50, 0.9),
                          (2.0, 1, 1.0)])
def test_draws_follow_the_reference_distribution(stream, rng, sanitizing, temperature, top_k,
                                                top_p):
    # one row per draw: under a sanitizer (100x slower) 2,000 draws; the bound below scales
    vocab, draws = 300, 2000 if sanitizing else 20000
    base = rng.standard_normal(vocab) * 2
    x = np.broadcast_to(base, (draws, vocab))
    got, xs = _draw(stream, x, "float16", temperature, top_k, top_p,
                    np.arange(draws, dtype=np.uint64) * 7919 + 3, 11)
    p = ref.sample_probs(xs[0], temperature, top_k, top_p)
    assert (got >= 0).all() and (p[got] > 0).all(), "a token outside the kept set was drawn"
    freq = np.bincount(got, minlength=vocab) / draws
    # each frequency within 5 binomial standard deviations (+ a floor for tiny p)
    sd = np.sqrt(p * (1 - p) / draws)
    assert (np.abs(freq - p) <= 5 * sd + 2e-3).all()
    if top_k == 1:
        assert (got == np.argmax(xs[0])).all()


def test_same_seed_same_token_and_positions_vary(stream, rng):
    x = np.broadcast_to(rng.standard_normal(32000), (64, 32000))
    a, _ = _draw(stream, x, "bfloat16", 1.0, 0, 1.0, 1234, np.arange(64))
    b, _ = _draw(stream, x, "bfloat16", 1.0, 0, 1.0, 1234, np.arange(64))
    c, _ = _draw(stream, x, "bfloat16", 1.0, 0, 1.0, 99, np.arange(64))
    np.testing.assert_array_equal(a, b)
    assert len(set(a.tolist())) > 20 and (a != c).any()


def test_per_row_parameters(stream, rng):
    x = rng.standard_normal((4, 1000)) * 4
    got, xs = _draw(stream, x, "float16", [0.0, 1.0, 1.0, 0.5], [0, 1, 0, 3], [1.0, 1.0, 1e-9, 1.0],
                    [5, 6, 7, 8], 0)
    top = np.argmax(xs, axis=1)
    assert got[0] == top[0] and got[1] == top[1] and got[2] == top[2]
    assert got[3] in np.argsort(-xs[3])[:3]


def test_sample_rejects_bad_input():
    logits = cupy.zeros((2, 10), np.float16)
    ok = [cupy.ones(2, np.float32), cupy.zeros(2, np.int32), cupy.ones(2, np.float32),
          cupy.zeros(2, np.uint64), cupy.zeros(2, np.int32)]
    out = cupy.zeros(2, np.int32)
    with pytest.raises(ValueError, match="seeds must be a contiguous uint64"):
        ops.sample(logits, out, *ok[:3], cupy.zeros(2, np.int64), ok[4])
    with pytest.raises(ValueError, match=r"temperature must be .* shape \(2,\)"):
        ops.sample(logits, out, cupy.ones(3, np.float32), *ok[1:])
    with pytest.raises(ValueError, match="logits must be"):
        ops.sample(cupy.zeros(10, np.float16), out, *ok)


@pytest.mark.parametrize("advance", [0, 1])
def test_handoff_writes_the_host_copy_and_moves_rows_on(stream, rng, advance):
    # greedy and drawn rows, one padding row (no sequence): the tokens are the same as
    # without the hand-on, the mapped host copy holds them, and with advance each row with a
    # sequence has its token as the next input, its position + 1 and its cache length + 1
    from rawgraph.memory.mapped import MappedArray

    rows, vocab = 5, 3000
    x = rng.standard_normal((rows, vocab)).astype(np.float32) * 3
    logits = cupy.asarray(to_storage(x, "float16"))
    args = [cupy.asarray(np.array([0, 1.0, 0.8, 0, 1.3], np.float32)),
            cupy.asarray(np.array([0, 0, 40, 0, 0], np.int32)),
            cupy.asarray(np.array([1, 0.9, 1, 1, 1], np.float32)),
            cupy.asarray(np.arange(rows, dtype=np.uint64) + 7)]
    pos0 = np.array([10, 21, 30, 41, 50], np.int32)  # either half of a row's pair
    slots, lens0 = np.array([3, 0, -1, 2, 1], np.int32), np.arange(100, 106, dtype=np.int32)
    plain, out = cupy.full(rows, -1, np.int32), cupy.full(rows, -1, np.int32)
    ids, pos = cupy.full(rows, -7, np.int32), cupy.asarray(pos0)
    lens, host = cupy.asarray(lens0), MappedArray(2 * rows)
    cupy.cuda.Device().synchronize()
    ops.sample(logits, plain, *args, cupy.asarray(pos0), stream=stream)
    ops.sample(logits, out, *args, pos, stream=stream,
               handoff=ops.Handoff(ids, cupy.asarray(slots), lens, advance,
                                   host.dev.reshape(rows, 2)))
    stream.synchronize()
    want = plain.get()
    np.testing.assert_array_equal(out.get(), want)
    # row r's token in the half of its pair its position's parity picks; the other untouched
    pairs = host.host.reshape(rows, 2)
    np.testing.assert_array_equal(pairs[np.arange(rows), pos0 % 2], want)
    assert (pairs[np.arange(rows), 1 - pos0 % 2] == 0).all()
    live = slots >= 0
    moved = live & bool(advance)
    np.testing.assert_array_equal(ids.get(), np.where(moved, want, -7))
    np.testing.assert_array_equal(pos.get(), pos0 + moved)
    want_lens = lens0.copy()
    want_lens[slots[moved]] += 1
    np.testing.assert_array_equal(lens.get(), want_lens)
    with pytest.raises(ValueError, match="advance = 2 must be 0 or 1"):
        ops.sample(logits, out, *args, pos, handoff=ops.Handoff(ids, cupy.asarray(slots), lens,
                                                                  2, host.dev.reshape(rows, 2)))
    with pytest.raises(ValueError, match=r"handoff host must be .* shape \(5, 2\)"):
        ops.sample(logits, out, *args, pos, handoff=ops.Handoff(ids, cupy.asarray(slots), lens,
                                                                  1, host.dev[:rows]))
    host.close()
