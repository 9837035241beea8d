"""The QKV path: RoPE fused into the KV-cache append (rope_append) against rope then kv_append,
qkv_rope against linear then rope_append, and fused QKV views read and written in place."""

import cupy
import numpy as np
import pytest
from cupy.lib.stride_tricks import as_strided

from rawgraph import ops
from rawgraph.dtypes import to_storage
from rawgraph.ops import reference as ref
from rawgraph.ops.matmul import path as linear_path
from tests.helpers import (
    DTYPES,
    POISON,
    ULP,
    bits,
    host,
    layer0,
    paged_cache,
    poisoned,
    randn,
)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", DTYPES)
# (32, 8, 128): more (head, piece) units than threads, each thread looping; (3, 1, 8): pieces
# of 4 pairs (D % 16 != 0)
@pytest.mark.parametrize(("q_heads", "kv_heads", "d"),
                         [(32, 8, 64), (32, 8, 128), (4, 4, 128), (3, 1, 8)])
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
    k_before = bits(k)
    cupy.cuda.Device().synchronize()
    ops.rope_append(q, k, v, ops.Cache(cache[0], cache[1], tables), slots, pos, f,
                    stream=stream)
    k2h = as_strided(k2, (n, kv_heads, d), (k2.strides[0], d * k2.itemsize, k2.itemsize))
    ops.rope(q2, k2h, pos, f, stream=stream)
    ops.kv_append(k2, v2, ops.Cache(cache[2], cache[3], tables), slots, pos, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(bits(q), bits(q2))
    np.testing.assert_array_equal(bits(cache[0]), bits(cache[2]))
    np.testing.assert_array_equal(bits(cache[1]), bits(cache[3]))
    np.testing.assert_array_equal(bits(k), k_before)  # k itself is not rotated
    assert (bits(cache[0]) != POISON[dtype]).any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("q_heads", "kv_heads", "d"), [(12, 2, 128), (32, 8, 128), (4, 2, 64),
                                                        (3, 1, 8)])
@pytest.mark.parametrize("extra", ["bias", "qk_norm", "both"])
def test_rope_append_with_a_family_s_extras(stream, rng, dtype, q_heads, kv_heads, d, extra):
    # Qwen2's q, k, v biases and Qwen3's head norms, finished by the kernel before RoPE,
    # against ref.qkv_extras then the plain kernel: the bias bit for bit (one fp32 add, one
    # rounding both ways), the norm within 1 ulp (rsqrtf against 1 / sqrt in float64)
    n, bs, row, eps = 6, 4, kv_heads * d, 1e-6
    width = (q_heads + 2 * kv_heads) * d
    qkv, qkvh = randn(rng, (n, width), dtype, 3.0)
    bias, bias_h = randn(rng, (width,), dtype, 0.5) if extra != "qk_norm" else (None, None)
    norm, norm_h = randn(rng, (2 * d,), dtype) if extra != "bias" else (None, None)
    cache = [poisoned((8, bs, row), dtype) for _ in range(4)]  # k, v; their expected
    tables = cupy.asarray(np.array([[3, 1], [0, -1], [5, 7]], np.int32))
    slots = cupy.asarray(np.array([0, 1, -1, 2, 0, 1], np.int32))  # row 2: padding
    pos = cupy.asarray(np.array([2, 3, 0, 6, 5, 4], np.int32))  # row 5: unmapped block
    f = cupy.asarray(ops.inv_freq(d, 1000000.0))
    q, k, v = ops.qkv_views(qkv, q_heads, d)
    k_before = bits(k)
    qh, kh, vh = (qkvh[:, :q_heads * d].reshape(n, q_heads, d),
                  qkvh[:, q_heads * d:q_heads * d + row].reshape(n, kv_heads, d),
                  qkvh[:, q_heads * d + row:].reshape(n, kv_heads, d))
    qe, ke, ve = ref.qkv_extras(qh, kh, vh, bias_h, norm_h, eps, dtype)
    want = cupy.asarray(to_storage(np.concatenate([x.reshape(n, -1) for x in (qe, ke, ve)],
                                                  1), dtype))  # exact: already rounded
    q2, k2, v2 = ops.qkv_views(want, q_heads, d)
    cupy.cuda.Device().synchronize()
    ops.rope_append(q, k, v, ops.Cache(cache[0], cache[1], tables), slots, pos, f,
                    extras=ops.Extras(bias, norm, eps), stream=stream)
    ops.rope_append(q2, k2, v2, ops.Cache(cache[2], cache[3], tables), slots, pos, f,
                    stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(bits(k), k_before)  # k_new itself is left as it was
    got = [host(x, dtype) for x in (q, cache[0], cache[1])]
    exp = [host(x, dtype) for x in (q2, cache[2], cache[3])]
    written = bits(cache[2]) != POISON[dtype]
    assert ((bits(cache[0]) != POISON[dtype]) == written).all() and written.any()
    tol = 0 if extra == "bias" else ULP[dtype]
    for g, e in zip(got, exp):
        g, e = np.nan_to_num(g), np.nan_to_num(e)  # the poison of unwritten cache rows
        np.testing.assert_allclose(g, e, rtol=tol, atol=tol)
    if extra == "bias":
        np.testing.assert_array_equal(bits(q), bits(q2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 7, 16, 40, 300])  # the GEMV, skinny and tiled GEMM paths
@pytest.mark.parametrize("extra", ["bias", "qk_norm"])
def test_qkv_rope_with_extras_equals_linear_then_rope_append(stream, rng, dtype, m, extra):
    # the GEMV epilogue's bias (the fused path) and the head norm (GEMV then rope_append)
    # give linear + rope_append's bits on every path
    q_heads, kv_heads, d, k, bs = 12, 2, 128, 1536, 4
    rows, width, row = m + 1, (q_heads + 2 * kv_heads) * d, kv_heads * d
    x, _ = randn(rng, (rows, k), dtype)
    w, _ = randn(rng, (width, k), dtype, k**-0.5)
    bias = randn(rng, (width,), dtype, 0.5)[0] if extra == "bias" else None
    norm = randn(rng, (2 * d,), dtype)[0] if extra == "qk_norm" else None
    qkv, qkv2 = poisoned((rows, width), dtype), poisoned((rows, width), dtype)
    cache = [poisoned((rows, bs, row), dtype) for _ in range(4)]
    tables = cupy.asarray(np.arange(rows, dtype=np.int32)[:, None])
    slots = cupy.arange(rows, dtype=cupy.int32)
    positions = cupy.asarray(rng.integers(0, bs, rows).astype(np.int32))
    f = cupy.asarray(ops.inv_freq(d, 1000000.0))
    extras = ops.Extras(bias, norm, 1e-6)
    cupy.cuda.Device().synchronize()
    ops.qkv_rope(x, w, qkv, ops.Cache(cache[0], cache[1], tables), slots, positions, f,
                 head_dim=d, m=m, extras=extras, stream=stream)
    ops.linear(x, w, qkv2, m=m, stream=stream)
    q2, k2, v2 = ops.qkv_views(qkv2, q_heads, d)
    ops.rope_append(q2, k2, v2, ops.Cache(cache[2], cache[3], tables), slots, positions, f, m,
                    extras=extras, stream=stream)
    stream.synchronize()
    q_cols = q_heads * d  # the fused GEMV keeps k and v with their bias; q is the same
    np.testing.assert_array_equal(bits(qkv)[:, :q_cols], bits(qkv2)[:, :q_cols])
    np.testing.assert_array_equal(bits(cache[0]), bits(cache[2]))
    np.testing.assert_array_equal(bits(cache[1]), bits(cache[3]))
    assert (bits(cache[0]) != POISON[dtype]).any()


def test_rope_append_rejects_bad_extras(rng):
    kv, _, _ = paged_cache(rng, "float16", 2, 64, {0: 3})
    q = cupy.zeros((4, 8, 64), np.float16)
    k = cupy.zeros((4, 128), np.float16)
    idx = cupy.zeros(4, np.int32)
    f = cupy.zeros(32, np.float32)
    args = (k, k, layer0(kv), idx, idx, f)
    with pytest.raises(ValueError, match="bias has shape"):
        ops.rope_append(q, *args, extras=ops.Extras(bias=cupy.zeros(64, np.float16)))
    with pytest.raises(ValueError, match="bias is bfloat16"):
        ops.rope_append(q, *args, extras=ops.Extras(bias=cupy.zeros(12 * 64, np.uint16)))
    with pytest.raises(ValueError, match="qk_norm has shape"):
        ops.rope_append(q, *args, extras=ops.Extras(qk_norm=cupy.zeros(64, np.float16)))
    with pytest.raises(ValueError, match="head norm's eps"):
        ops.rope_append(q, *args, extras=ops.Extras(qk_norm=cupy.zeros(128, np.float16),
                                                    eps=0.0))
    with pytest.raises(TypeError, match=r"ops\.Extras"):
        ops.rope_append(q, *args, extras={"bias": None})


def test_rope_append_rejects_bad_input(rng):
    kv, _, _ = paged_cache(rng, "float16", 2, 64, {0: 3})
    q = cupy.zeros((4, 8, 64), np.float16)
    k = cupy.zeros((4, 128), np.float16)
    idx = cupy.zeros(4, np.int32)
    f = cupy.zeros(32, np.float32)
    args = (layer0(kv), idx, idx)
    with pytest.raises(TypeError, match=r"ops\.Cache"):
        ops.rope_append(q, k, k, (kv.k[0], kv.v[0], kv.block_tables), idx, idx, f)
    with pytest.raises(ValueError, match="q must be"):
        ops.rope_append(q[:3], k, k, *args, f)
    with pytest.raises(ValueError, match="inv_freq"):
        ops.rope_append(q, k, k, *args, f[:8])
    with pytest.raises(ValueError, match="k_new must be"):
        ops.rope_append(q, k[:, :64], k, *args, f)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "q_heads", "kv_heads", "d", "k"),
                         [(1, 32, 8, 64, 2048), (6, 8, 2, 128, 512), (13, 4, 4, 16, 264),
                          (16, 32, 8, 64, 256), (6, 3, 1, 8, 64), (24, 4, 2, 64, 128),
                          (2, 16, 2, 128, 8192), (12, 16, 2, 128, 8192), (4, 24, 8, 128, 1000),
                          (2, 48, 8, 128, 520), (5, 8, 2, 128, 8192), (14, 8, 2, 128, 8192)])
def test_qkv_rope_equals_linear_then_rope_append(stream, rng, dtype, m, q_heads, kv_heads, d,
                                                 k):
    # the GEMV with the append in its epilogue (up to 16 rows, head_dim % 16 == 0) gives
    # linear + rope_append's bits: q, k, v in qkv, both caches; rows past m untouched
    bs, row, rows = 4, kv_heads * d, m + 1
    width = (q_heads + 2 * kv_heads) * d
    x, _ = randn(rng, (rows, k), dtype)
    w, _ = randn(rng, (width, k), dtype, k**-0.5)
    qkv, qkv2 = poisoned((rows, width), dtype), poisoned((rows, width), dtype)
    cache = [poisoned((2 * rows + 2, bs, row), dtype) for _ in range(4)]  # k, v; k2, v2
    blocks = rng.permutation(2 * rows + 2).astype(np.int32).reshape(rows + 1, 2)
    blocks[1, 1] = -1  # unmapped
    tables = cupy.asarray(blocks)
    slot = np.arange(rows, dtype=np.int32)
    if m > 2:
        slot[2] = -1  # a padding row
    pos = rng.integers(0, 2 * bs, rows).astype(np.int32)
    pos[1] = bs + 1  # row 1 (slot 1) lands in its unmapped block
    f = cupy.asarray(ops.inv_freq(d, 500000.0, ops.Llama3Scaling()))
    slots, positions = cupy.asarray(slot), cupy.asarray(pos)
    cupy.cuda.Device().synchronize()
    ops.qkv_rope(x, w, qkv, ops.Cache(cache[0], cache[1], tables), slots, positions, f,
                 head_dim=d, m=m, stream=stream)
    ops.linear(x, w, qkv2, m=m, stream=stream)
    q2, k2, v2 = ops.qkv_views(qkv2, q_heads, d)
    ops.rope_append(q2, k2, v2, ops.Cache(cache[2], cache[3], tables), slots, positions, f, m,
                    stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(bits(qkv), bits(qkv2))
    np.testing.assert_array_equal(bits(cache[0]), bits(cache[2]))
    np.testing.assert_array_equal(bits(cache[1]), bits(cache[3]))
    assert (bits(qkv)[m:] == POISON[dtype]).all()
    assert (bits(cache[0]) != POISON[dtype]).any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "q_heads", "kv_heads", "d", "k"),
                         [(1, 32, 8, 64, 2048), (6, 8, 2, 128, 512), (16, 4, 4, 16, 264),
                          (3, 32, 8, 128, 4096), (2, 16, 2, 128, 8192), (10, 16, 2, 128, 8192),
                          (24, 4, 2, 64, 128), (4, 8, 2, 128, 8192), (11, 8, 2, 128, 8192)])
def test_qkv_rope_of_normalized_x(stream, rng, dtype, m, q_heads, kv_heads, d, k):
    # norm_eps: the projection of rmsnorm(x) (its weight folded into w). The GEMV (up to 16
    # rows) scales its sums by each row's 1 / rms and leaves `normed` alone; 24 rows write
    # rmsnorm(x) to `normed` (rounded: hence 4 ulp, not 2) and project that. Against the
    # float64 reference: k, v as projected, q rotated; the cache row of each token as well.
    bs, rows, eps = 4, m + 1, 1e-5
    width, kv = (q_heads + 2 * kv_heads) * d, kv_heads * d
    x, xh = randn(rng, (rows, k), dtype, 3.0)
    w, wh = randn(rng, (width, k), dtype, k**-0.5)
    qkv, normed = poisoned((rows, width), dtype), poisoned((rows, k), dtype)
    cache = [poisoned((rows, bs, kv), dtype) for _ in range(2)]
    tables = cupy.asarray(np.arange(rows, dtype=np.int32)[:, None])  # token c: block c
    pos = rng.integers(0, bs, rows).astype(np.int32)
    f = ops.inv_freq(d, 500000.0, ops.Llama3Scaling())
    slots, positions = cupy.arange(rows, dtype=cupy.int32), cupy.asarray(pos)
    cupy.cuda.Device().synchronize()
    ops.qkv_rope(x, w, qkv, ops.Cache(cache[0], cache[1], tables), slots, positions,
                 cupy.asarray(f), head_dim=d, m=m, norm_eps=eps, normed=normed, stream=stream)
    stream.synchronize()
    proj = ref.linear(xh[:m], wh, dtype, norm_eps=eps)
    q = ref.rope(proj[:, :q_heads * d].reshape(m, q_heads, d), pos[:m], f, dtype)
    kr = ref.rope(proj[:, q_heads * d:-kv].reshape(m, kv_heads, d), pos[:m], f, dtype)
    got, tol = host(qkv, dtype), 4 * ULP[dtype]
    np.testing.assert_allclose(got[:m, :q_heads * d], q.reshape(m, -1), rtol=tol, atol=tol)
    np.testing.assert_allclose(got[:m, q_heads * d:], proj[:, q_heads * d:], rtol=tol, atol=tol)
    assert (bits(qkv)[m:] == POISON[dtype]).all()
    kc, vc = host(cache[0], dtype), host(cache[1], dtype)
    np.testing.assert_allclose(kc[np.arange(m), pos[:m]], kr.reshape(m, -1), rtol=tol, atol=tol)
    np.testing.assert_allclose(vc[np.arange(m), pos[:m]], proj[:, -kv:], rtol=tol, atol=tol)
    gemv = linear_path(m, width) == "gemv"
    assert (bits(normed) == POISON[dtype]).all() == gemv


def test_qkv_views_and_qkv_rope_reject_bad_input(rng):
    qkv = cupy.zeros((4, 12 * 64), np.float16)
    q, k, v = ops.qkv_views(qkv, 8, 64)
    assert q.shape == (4, 8, 64) and k.shape == v.shape == (4, 128)
    with pytest.raises(ValueError, match="q heads of 64"):
        ops.qkv_views(qkv, 9, 64)
    kv, _, _ = paged_cache(rng, "float16", 2, 64, {0: 3})
    idx = cupy.zeros(4, np.int32)
    x, w = cupy.zeros((4, 64), np.float16), cupy.zeros((12 * 64, 64), np.float16)
    f = cupy.zeros(32, np.float32)
    cache = layer0(kv)
    with pytest.raises(ValueError, match="k_cache"):  # a strided slice of the cache
        ops.qkv_rope(x, w, qkv, ops.Cache(kv.k[0][:, :, :64], kv.v[0], kv.block_tables), idx,
                     idx, f, head_dim=64)
    with pytest.raises(ValueError, match="w has 768 rows: not q heads of 96"):
        ops.qkv_rope(x, w, qkv, cache, idx, idx, f, head_dim=96)
    with pytest.raises(ValueError, match="qkv has shape"):
        ops.qkv_rope(x, w, qkv[:, :64], cache, idx, idx, f, head_dim=64)
    with pytest.raises(ValueError, match="epsilon must be >= 0"):
        ops.qkv_rope(x, w, qkv, cache, idx, idx, f, head_dim=64, norm_eps=-1.0)
    with pytest.raises(ValueError, match="pass `normed`"):  # 40 rows: not the GEMV
        ops.qkv_rope(cupy.zeros((40, 64), np.float16), w, cupy.zeros((40, 12 * 64), np.float16),
                     cache, cupy.zeros(40, np.int32), cupy.zeros(40, np.int32), f, head_dim=64,
                     norm_eps=1e-5)


def test_fused_qkv_views_are_read_and_written_in_place(stream, rng):
    """rope, kv_append and both attentions take strided row views of one (n, q + 2 kv)
    projection output, and give what they give on contiguous copies."""
    from cupy.lib.stride_tricks import as_strided

    from rawgraph.memory.paged import PagedKVCache

    n, H, KV, D = 24, 8, 2, 64
    width = (H + 2 * KV) * D
    qkv, _ = randn(rng, (n, width), "float16")
    item = qkv.itemsize
    q = as_strided(qkv, (n, H, D), (width * item, D * item, item))
    kf = qkv[:, H * D:(H + KV) * D]
    k = as_strided(kf, (n, KV, D), (width * item, D * item, item))
    v = qkv[:, (H + KV) * D:]
    qc, kc, vc = q.copy(), k.copy(), cupy.ascontiguousarray(v)
    pos = cupy.arange(n, dtype=np.int32)
    f = cupy.asarray(ops.inv_freq(D))
    ops.rope(q, k, pos, f, stream=stream)
    ops.rope(qc, kc, pos, f, stream=stream)
    stream.synchronize()
    assert (q == qc).all() and (k == kc).all()
    caches = []
    for k_new, v_new in ((kf, v), (kc.reshape(n, KV * D), vc)):
        kv = PagedKVCache(layers=1, kv_heads=KV, head_dim=D, block_size=16, num_blocks=8,
                          max_seqs=1, max_blocks_per_seq=8)
        kv.tables.add(0)
        kv.tables.append(0, n)
        kv.sync(stream)
        slots = cupy.zeros(n, np.int32)
        ops.kv_append(k_new, v_new, layer0(kv), slots, pos, stream=stream)
        caches.append(kv)
    stream.synchronize()
    a, b = caches
    for cache in ("k", "v"):  # blocks 0 and 1 hold the 24 tokens (16 + 8)
        x, y = getattr(a, cache)[0], getattr(b, cache)[0]
        assert (x[0] == y[0]).all() and (x[1, :8] == y[1, :8]).all(), cache
    outs = []
    for qq in (q, qc):
        out = cupy.zeros((n, H, D), np.float16)
        pieces = ops.Chunk(cupy.array([0, n], np.int32), cupy.zeros(1, np.int32), n)
        ops.prefill_attention(qq, layer0(a), pieces, out, stream=stream)
        dec = cupy.zeros((1, H, D), np.float16)
        ws = cupy.zeros(ops.workspace_floats(1, H, D, 3), np.float32)
        ops.decode_attention(qq[n - 1:], layer0(a), cupy.zeros(1, np.int32), dec, ws, n,
                             splits=3, stream=stream)
        outs.append((out, dec))
    stream.synchronize()
    assert (outs[0][0] == outs[1][0]).all() and (outs[0][1] == outs[1][1]).all()
    # the decode kernel agrees with the prefill kernel's last row (P rounded to fp16 there)
    np.testing.assert_allclose(outs[0][1][0].get(), outs[0][0][n - 1].get(), atol=4e-3)
