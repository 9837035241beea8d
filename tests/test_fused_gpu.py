"""The fused forms of a decode step against their parts and the NumPy references:
RMSNorm or SiLU(gate) * up inside the GEMV (norm_linear, silu_linear), RoPE inside the cache
append (rope_append), and decode attention's in-kernel combine."""

import cupy
import numpy as np
import pytest

from rawgraph import Range, Symbols, capture, ops
from rawgraph.ops import reference as ref
from rawgraph.ops.attention import max_splits_for
from tests.helpers import POISON, ULP, host, paged_cache, poisoned, randn

pytestmark = pytest.mark.gpu
DTYPES = ["float16", "bfloat16"]
SHAPES = [(1, 2048, 2048), (3, 3072, 2048), (8, 520, 8192), (13, 264, 1032), (32, 2048, 2048),
          (20, 136, 64), (40, 1000, 520), (100, 256, 264)]  # GEMV up to 32 rows, then not


def _bits(a) -> np.ndarray:
    return cupy.asnumpy(a.view(np.uint16))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize("residual", [False, True])
def test_norm_linear(stream, rng, dtype, m, n, k, residual):
    rows = m + 2
    x, xh = randn(rng, (rows, k), dtype, 3.0)
    g, gh = randn(rng, (k,), dtype)
    w, wh = randn(rng, (n, k), dtype, k**-0.5)
    y, h = poisoned((rows, n), dtype), poisoned((rows, k), dtype)
    r, rh = randn(rng, (rows, n), dtype) if residual else (None, None)
    cupy.cuda.Device().synchronize()
    ops.norm_linear(x, g, w, y, h, eps=1e-5, residual=r, m=m, stream=stream)
    stream.synchronize()
    normed, _ = ref.rmsnorm(xh[:m], gh, 1e-5, dtype)
    want = ref.linear(normed, wh, dtype, None if rh is None else rh[:m])
    # the norm's sum of squares runs in another order than the reference's: a normalized
    # element may round the other way, hence one ulp more than the plain linear layer
    np.testing.assert_allclose(host(y, dtype)[:m], want, rtol=3 * ULP[dtype],
                               atol=3 * ULP[dtype])
    assert (_bits(y)[m:] == POISON[dtype]).all()
    assert (_bits(h) == POISON[dtype]).all() == (m <= 32)  # h is the fallback's buffer


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_silu_linear_equals_its_parts(stream, rng, dtype, m, n, k):
    rows = m + 1
    gu, guh = randn(rng, (rows, 2 * k), dtype, 2.0)
    w, wh = randn(rng, (n, k), dtype, k**-0.5)
    r, rh = randn(rng, (rows, n), dtype)
    y, act = poisoned((rows, n), dtype), poisoned((rows, k), dtype)
    y2, act2 = poisoned((rows, n), dtype), poisoned((rows, k), dtype)
    cupy.cuda.Device().synchronize()
    ops.silu_linear(gu, w, y, act, residual=r, m=m, stream=stream)
    ops.silu_mul(gu, act2, m, stream=stream)
    ops.linear(act2, w, y2, residual=r, m=m, stream=stream)
    stream.synchronize()
    # the fused GEMV feeds the tensor cores the same activation bits in the same order
    np.testing.assert_array_equal(_bits(y), _bits(y2))
    want = ref.linear(ref.silu_mul(guh[:m], dtype), wh, dtype, rh[:m])
    np.testing.assert_allclose(host(y, dtype)[:m], want, rtol=2 * ULP[dtype],
                               atol=2 * ULP[dtype])


def test_fused_linear_patches_rows_and_rejects_bad_input(stream, rng):
    x, _ = randn(rng, (8, 264), "float16")
    g, _ = randn(rng, (264,), "float16")
    w, _ = randn(rng, (136, 264), "float16", 0.1)
    y, h = cupy.zeros((8, 136), np.float16), cupy.zeros((8, 264), np.float16)
    S = Symbols(b=Range(1, 8))
    S.set(b=3)
    cupy.cuda.Device().synchronize()
    with capture(stream) as cap:
        ops.norm_linear(x, g, w, y, h, m=S.b, stream=stream, symbols=S)
    want = cupy.zeros_like(y)
    ops.norm_linear(x, g, w, want, h, m=8, stream=stream)
    with cap.graph as gr, gr.instantiate() as ex:
        assert ex.set(b=8) == 1
        ex.launch(stream)
        ex.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(y.get(), want.get())
    with pytest.raises(ValueError, match="gamma has shape"):
        ops.norm_linear(x, g[:8], w, y, h)
    with pytest.raises(ValueError, match="h has shape"):
        ops.norm_linear(x, g, w, y, h[:, :8])
    with pytest.raises(ValueError, match=r"x must be \(rows, 2k\)"):
        ops.silu_linear(x, w, y, h)
    gu = cupy.zeros((8, 528), np.float16)
    with pytest.raises(ValueError, match="act has shape"):
        ops.silu_linear(gu, w, y, h[:, :8])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("q_heads", "kv_heads", "d"), [(32, 8, 64), (4, 4, 128), (3, 1, 8)])
def test_rope_append_equals_rope_then_append(stream, rng, dtype, q_heads, kv_heads, d):
    n, bs, row = 6, 4, kv_heads * d
    qkv, _ = randn(rng, (n, (q_heads + 2 * kv_heads) * d), dtype)
    qkv2 = qkv.copy()
    cache = [poisoned((8, bs, row), dtype) for _ in range(4)]  # k, v; k2, v2
    tables = cupy.asarray(np.array([[3, 1], [0, -1], [5, 7]], np.int32))
    slots = cupy.asarray(np.array([0, 1, -1, 2, 0, 1], np.int32))  # row 2: padding
    pos = cupy.asarray(np.array([2, 3, 0, 6, 5, 4], np.int32))  # row 5: unmapped block
    f = cupy.asarray(ops.inv_freq(d, 500000.0, ops.Llama3Scaling()))

    def views(a):
        q = a[:, :q_heads * d].reshape(n, q_heads, d)
        return q, a[:, q_heads * d:(q_heads + kv_heads) * d], a[:, (q_heads + kv_heads) * d:]

    (q, k, v), (q2, k2, v2) = views(qkv), views(qkv2)
    k_before = _bits(k)
    cupy.cuda.Device().synchronize()
    ops.rope_append(q, k, v, cache[0], cache[1], tables, slots, pos, f, stream=stream)
    ops.rope(q2, k2.reshape(n, kv_heads, d), pos, f, stream=stream)
    ops.kv_append(k2, v2, cache[2], cache[3], tables, slots, pos, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(_bits(q), _bits(q2))
    np.testing.assert_array_equal(_bits(cache[0]), _bits(cache[2]))
    np.testing.assert_array_equal(_bits(cache[1]), _bits(cache[3]))
    np.testing.assert_array_equal(_bits(k), k_before)  # k itself is not rotated
    assert (_bits(cache[0]) != POISON[dtype]).any()


def test_rope_append_rejects_bad_input(rng):
    kv, _, _ = paged_cache(rng, "float16", 2, 64, {0: 3})
    q = cupy.zeros((4, 8, 64), np.float16)
    k = cupy.zeros((4, 128), np.float16)
    idx = cupy.zeros(4, np.int32)
    f = cupy.zeros(32, np.float32)
    args = (kv.k[0], kv.v[0], kv.block_tables, idx, idx)
    with pytest.raises(ValueError, match="q must be"):
        ops.rope_append(q[:3], k, k, *args, f)
    with pytest.raises(ValueError, match="inv_freq"):
        ops.rope_append(q, k, k, *args, f[:8])
    with pytest.raises(ValueError, match="k_new must be"):
        ops.rope_append(q, k[:, :64], k, *args, f)


def test_decode_attention_combine_is_deterministic_and_resets_its_counters(stream, rng):
    lens = {0: 700, 1: 33, 2: 1}
    slots = [1, 0, 2, -1]
    kv, kh, vh = paged_cache(rng, "float16", 8, 64, lens)
    q, qh = randn(rng, (4, 32, 64), "float16")
    ws = ops.decode_workspace(4, 32, 64, 768, 64, 8)
    sl = cupy.asarray(np.array(slots, np.int32))
    cupy.cuda.Device().synchronize()
    outs = []
    for _ in range(3):
        out = poisoned(q.shape, "float16")
        ops.decode_attention(q, kv.k[0], kv.v[0], kv.block_tables, kv.seq_lens, sl, out, ws,
                             768, split_tokens=64, stream=stream)
        outs.append(_bits(out))
    stream.synchronize()
    assert (ws[:32].view(np.int32).get() == 0).all()  # every (row, kv head) counter
    assert all((o == outs[0]).all() for o in outs)
    want = ref.decode_attention(qh, kh, vh, kv.tables.table, kv.tables.lens, np.array(slots),
                                64**-0.5)
    np.testing.assert_allclose(host(out, "float16")[:3], want[:3], rtol=2e-3, atol=2e-3)
    assert (outs[0][3] == POISON["float16"]).all()


def test_decode_attention_combines_in_passes_when_splits_are_many(stream, rng):
    # 16 query heads of D = 128 over 1800 one-token splits: the weights of all 16 heads do
    # not fit the ring's shared memory at once, so the combine runs two passes of heads
    lens = {0: 1800}
    kv, kh, vh = paged_cache(rng, "bfloat16", 2, 128, lens, num_blocks=128, max_blocks=120)
    q, qh = randn(rng, (1, 32, 128), "bfloat16")
    assert 16 * 1801 > max_splits_for(128) + 1 >= 1801
    ws = ops.decode_workspace(1, 32, 128, 1800, 1, 2)
    out = poisoned(q.shape, "bfloat16")
    cupy.cuda.Device().synchronize()
    ops.decode_attention(q, kv.k[0], kv.v[0], kv.block_tables, kv.seq_lens,
                         cupy.zeros(1, np.int32), out, ws, 1800, split_tokens=1, stream=stream)
    stream.synchronize()
    want = ref.decode_attention(qh, kh, vh, kv.tables.table, kv.tables.lens, np.array([0]),
                                128**-0.5)
    np.testing.assert_allclose(host(out, "bfloat16"), want, rtol=1.6e-2, atol=1.6e-2)


def test_decode_attention_refuses_more_splits_than_its_combine_takes(rng):
    kv, _, _ = paged_cache(rng, "float16", 8, 64, {0: 5}, max_blocks=1100)
    q = cupy.zeros((1, 32, 64), np.float16)
    ws = cupy.zeros(16, np.float32)
    with pytest.raises(ValueError, match="the combine takes at most 16383"):
        ops.decode_attention(q, kv.k[0], kv.v[0], kv.block_tables, kv.seq_lens,
                             cupy.zeros(1, np.int32), q.copy(), ws, 17000, split_tokens=1)
