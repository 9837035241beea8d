"""Every op that takes a count (rows, tokens, lengths, query rows), captured once with the
count a symbol and patched through counts on both sides of every variant threshold and at
its range's ends, gives at each count the bits an eager call with that count as a plain int
gives; whatever the symbol's range (ops.variant, ops.norm). Each replay twice."""

import cupy
import numpy as np
import pytest

from rawgraph import Range, Symbols, capture, ops
from rawgraph.ops.matmul import linear_key
from rawgraph.ops.variant import spans
from tests.helpers import DTYPES, layer0, paged_cache, poisoned, randn

pytestmark = pytest.mark.gpu


def _snapshot(arrays):
    return [cupy.asnumpy(a).view(np.uint8).copy() for a in arrays]


def patched_equals_eager(stream, run, writes, lo, hi, counts, at=None):
    """Capture `run(count, symbols)` with the count a symbol in [lo, hi] set to `at`, then
    for each count: the eager run (a plain int) against the graph patched to it, replayed
    twice. `writes`: every device array the op writes (each run starts from their first
    contents: poison for outputs, inputs an op changes in place). Returns the counts."""
    first = [a.copy() for a in writes]

    def reset():
        for a, f in zip(writes, first):
            a[...] = f

    S = Symbols(c=Range(lo, hi))
    S.set(c=hi if at is None else at)
    reset()
    with capture(stream) as cap:
        run(S.c, S)
    ex = cap.graph.instantiate(upload_stream=stream)
    counts = sorted({c for c in counts if lo <= c <= hi} | {lo, hi})
    for c in counts:
        reset()
        run(c, None)
        stream.synchronize()
        want = _snapshot(writes)
        ex.set(c=c)
        for replay in range(2):
            reset()
            ex.launch(stream)
            stream.synchronize()
            for i, (g, w) in enumerate(zip(_snapshot(writes), want)):
                bad = int((g != w).sum())
                assert bad == 0, (f"count {c} (range [{lo}, {hi}], captured at {S.env['c']}), "
                                  f"replay {replay}: {bad} bytes of output {i} differ from eager")
    ex.close()
    cap.graph.close()
    return counts


def boundaries(lo, hi, key):
    """Both sides of every change of `key` over [lo, hi], and the range's ends."""
    S = Symbols(c=Range(lo, hi))
    out = {lo, hi}
    for parts in spans(S.c, S, key).values():
        for a, b in parts:
            out |= {a, b}
    return sorted(out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hi", [4096, 1023])  # a warp per row, a block per row in the graph
def test_rmsnorm(stream, rng, dtype, hi):
    x, _ = randn(rng, (4096, 2048), dtype)
    r, _ = randn(rng, (4096, 2048), dtype)
    w, _ = randn(rng, (2048,), dtype)
    out, r_out = poisoned((4096, 2048), dtype), poisoned((4096, 2048), dtype)

    def run(c, S):
        ops.rmsnorm(x, w, out, residual=r, residual_out=r_out, rows=c, stream=stream, symbols=S)

    counts = [1, 17, 100, 513, 1000, 1023, 1024, 1025, 2048, 4000]
    patched_equals_eager(stream, run, [out, r_out], 1, hi, counts, at=hi // 2)


LINEAR_SHAPES = [(3072, 2048), (16384, 512), (2048, 8192)]  # 1B qkv, wide, 8B-like down


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k"), LINEAR_SHAPES)
@pytest.mark.parametrize("hi", [512, 64])
def test_linear(stream, rng, dtype, n, k, hi):
    x, _ = randn(rng, (512, k), dtype)
    w, _ = randn(rng, (n, k), dtype, k**-0.5)
    res, _ = randn(rng, (512, n), dtype)
    y = poisoned((512, n), dtype)

    def run(c, S):
        ops.linear(x, w, y, residual=res, m=c, stream=stream, symbols=S)

    counts = boundaries(1, hi, lambda v: linear_key(v, n, k))
    assert len({linear_key(v, n, k)[0] for v in counts}) == (3 if hi > 64 else 2)
    patched_equals_eager(stream, run, [y], 1, hi, counts, at=hi // 3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_tiled_gemm_plans(stream, rng, dtype):
    """The tiled GEMM's tiles and splits over 65-2,048 rows (every plan change)."""
    n, k = 3072, 2048
    x, _ = randn(rng, (2048, k), dtype)
    w, _ = randn(rng, (n, k), dtype, k**-0.5)
    y = poisoned((2048, n), dtype)

    def run(c, S):
        ops.linear(x, w, y, m=c, stream=stream, symbols=S)

    counts = boundaries(65, 2048, lambda v: linear_key(v, n, k))
    patched_equals_eager(stream, run, [y], 65, 2048, counts, at=100)


def _cache_inputs(rng, dtype, tokens, kv_heads, d):
    """A paged cache of 8 sequences with room for tokens / 8 + 1 each, and (slot, position)
    for each token (token i: slot i % 8, position i // 8)."""
    per = tokens // 8 + 1
    kv, _, _ = paged_cache(rng, dtype, kv_heads, d, dict.fromkeys(range(8), per), max_blocks=64)
    i = np.arange(tokens)
    return kv, cupy.asarray((i % 8).astype(np.int32)), cupy.asarray((i // 8).astype(np.int32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [False, True])
def test_qkv_rope(stream, rng, dtype, norm):
    heads, kv_heads, d, hidden, rows = 16, 4, 64, 1024, 256
    n = (heads + 2 * kv_heads) * d
    kv, slots, pos = _cache_inputs(rng, dtype, rows, kv_heads, d)
    x, _ = randn(rng, (rows, hidden), dtype)
    w, _ = randn(rng, (n, hidden), dtype, hidden**-0.5)
    qkv, normed = poisoned((rows, n), dtype), poisoned((rows, hidden), dtype)
    f = cupy.asarray(ops.inv_freq(d, 500000.0, ops.Llama3Scaling()))
    kw = {"norm_eps": 1e-5, "normed": normed} if norm else {}

    def run(c, S):
        ops.qkv_rope(x, w, qkv, ops.Cache(kv.k[0], kv.v[0], kv.block_tables), slots, pos, f,
                     head_dim=d, m=c, stream=stream, symbols=S, **kw)

    counts = boundaries(1, rows, lambda v: linear_key(v, n, hidden))
    patched_equals_eager(stream, run, [qkv, normed, kv.k, kv.v], 1, rows, counts, at=40)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [False, True])
def test_gate_up_silu(stream, rng, dtype, norm):
    hidden, inter, rows = 1024, 2048, 512
    x, _ = randn(rng, (rows, hidden), dtype)
    w, _ = randn(rng, (2 * inter, hidden), dtype, hidden**-0.5)
    gu, out = poisoned((rows, 2 * inter), dtype), poisoned((rows, inter), dtype)
    normed = poisoned((rows, hidden), dtype)
    kw = {"norm_eps": 1e-5, "normed": normed} if norm else {}

    def run(c, S):
        ops.gate_up_silu(x, w, gu, out, m=c, stream=stream, symbols=S, **kw)

    counts = boundaries(1, rows, lambda v: linear_key(v, 2 * inter, hidden))
    patched_equals_eager(stream, run, [gu, out, normed], 1, rows, counts, at=200)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_and_cache_appends(stream, rng, dtype):
    heads, kv_heads, d, rows = 8, 2, 128, 256
    kv, slots, pos = _cache_inputs(rng, dtype, rows, kv_heads, d)
    q, _ = randn(rng, (rows, heads, d), dtype)
    k, _ = randn(rng, (rows, kv_heads, d), dtype)
    v, _ = randn(rng, (rows, kv_heads * d), dtype)
    f = cupy.asarray(ops.inv_freq(d, 10000.0))

    def run(c, S):
        ops.rope(q, k, pos, f, c, stream=stream, symbols=S)
        cache = ops.Cache(kv.k[0], kv.v[0], kv.block_tables)
        ops.kv_append(k.reshape(rows, -1), v, cache, slots, pos, c, stream=stream, symbols=S)
        ops.rope_append(q, k.reshape(rows, -1), v, cache, slots, pos, f, c, stream=stream,
                        symbols=S)

    patched_equals_eager(stream, run, [q, k, kv.k, kv.v], 1, rows, [2, 100, 255], at=7)


@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_and_embedding(stream, rng, dtype):
    rows, dim, vocab = 300, 512, 1000
    gu, _ = randn(rng, (rows, 2 * dim), dtype, 2.0)
    a, _ = randn(rng, (rows, dim), dtype)
    b, _ = randn(rng, (rows, dim), dtype)
    table, _ = randn(rng, (vocab, dim), dtype)
    ids = cupy.asarray(rng.integers(0, vocab, rows).astype(np.int32))
    act, s, e = (poisoned((rows, dim), dtype) for _ in range(3))

    def run(c, S):
        ops.silu_mul(gu, act, rows=c, stream=stream, symbols=S)
        ops.add(a, b, s, c * dim, stream=stream, symbols=S)
        ops.embedding(ids, table, e, c, stream=stream, symbols=S)

    patched_equals_eager(stream, run, [act, s, e], 1, rows, [2, 64, 299], at=5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sampling(stream, rng, dtype):
    rows, vocab = 64, 4096
    logits, _ = randn(rng, (rows, vocab), dtype, 3.0)
    temp = cupy.asarray(np.where(np.arange(rows) % 3 == 0, 0.0, 0.8).astype(np.float32))
    top_k = cupy.asarray((np.arange(rows) % 4 * 10).astype(np.int32))
    top_p = cupy.asarray(np.where(np.arange(rows) % 2, 0.9, 1.0).astype(np.float32))
    seeds = cupy.asarray(rng.integers(0, 2**63, rows).astype(np.uint64))
    positions = cupy.asarray(np.arange(rows, dtype=np.int32))
    out, best = cupy.full(rows, -7, np.int32), cupy.full(rows, -7, np.int32)

    def run(c, S):
        ops.sample(logits, out, temp, top_k, top_p, seeds, positions, c, stream=stream,
                   symbols=S)
        ops.argmax(logits, best, c, stream=stream, symbols=S)

    patched_equals_eager(stream, run, [out, best], 1, rows, [2, 33, 63], at=9)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
def test_decode_attention(stream, rng, dtype, d):
    """max_len bounds every row's length and sets the split blocks launched (patched as
    contexts grow); each row's splits follow its own length, so the bits do not move."""
    q_heads, kv_heads, batch = 16, 4, 6
    lens = {0: 1, 1: 17, 2: 300, 3: 1000, 4: 2049, 5: 3000}
    kv, _, _ = paged_cache(rng, dtype, kv_heads, d, lens, num_blocks=600, max_blocks=300)
    q, _ = randn(rng, (batch, q_heads, d), dtype)
    slots = cupy.asarray(np.array([0, 1, 2, 3, 4, 5], np.int32))
    out = poisoned(q.shape, dtype)
    splits = 32
    ws = cupy.zeros(ops.workspace_floats(batch, q_heads, d, splits), np.float32)

    def run(c, S):
        ops.decode_attention(q, layer0(kv), slots, out, ws, c, splits=splits, stream=stream,
                             symbols=S)

    patched_equals_eager(stream, run, [out], 3000, 4800, [3001, 4096, 4097], at=3500)


def _prefill_inputs(rng, dtype, q_heads, kv_heads, d, seqs, lens):
    kv, _, _ = paged_cache(rng, dtype, kv_heads, d, lens, num_blocks=512, max_blocks=300)
    cu = np.concatenate([[0], np.cumsum([n for _, n in seqs])]).astype(np.int32)
    q, _ = randn(rng, (512, q_heads, d), dtype)
    out = poisoned(q.shape, dtype)
    return kv, q, out, cupy.asarray(cu), cupy.asarray(np.array([s for s, _ in seqs], np.int32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_attention_query_tile(stream, rng, dtype):
    """The query tile follows max_q_len's value (64 rows below 256 at d = 128, 128 from)."""
    seqs, lens = [(0, 200), (1, 60)], {0: 200, 1: 900}
    kv, q, out, cu, slots = _prefill_inputs(rng, dtype, 16, 4, 128, seqs, lens)

    def run(c, S):
        ops.prefill_attention(q, layer0(kv), ops.Chunk(cu, slots, c), out, stream=stream,
                              symbols=S)

    patched_equals_eager(stream, run, [out], 200, 512, [255, 256, 257], at=300)


@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_attention_key_runs(stream, rng, dtype):
    """Grouped tiles in key runs whose count follows the chunk (max_q_len's value)."""
    seqs, lens = [(0, 16), (1, 5)], {0: 4000, 1: 3000}
    kv, q, out, cu, slots = _prefill_inputs(rng, dtype, 16, 4, 64, seqs, lens)
    ws = cupy.zeros(ops.workspace_floats(512, 16, 64, 64), np.float32)

    def run(c, S):
        ops.prefill_attention(q, layer0(kv), ops.Chunk(cu, slots, c, n=21), out,
                              ops.PrefillPlan(context=4000, workspace=ws), stream=stream,
                              symbols=S)

    group = 4
    key = lambda v: (ops.attention.grouped_rows(v, group),  # noqa: E731
                     ops.attention.prefill_runs(v, ops.attention.grouped_rows(v, group) // group,
                                                4, ops.attention.multiprocessors()))
    counts = boundaries(16, 512, key)
    assert len(counts) > 2
    patched_equals_eager(stream, run, [out, ws], 16, 512, counts, at=100)
