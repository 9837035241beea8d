"""The fused kernels of a decode step against their parts and the NumPy references: RoPE
inside the cache append (rope_append), decode attention's in-kernel combine."""

import cupy
import numpy as np
import pytest
from cupy.lib.stride_tricks import as_strided

from rawgraph import ops
from rawgraph.ops import reference as ref
from rawgraph.ops.attention import max_splits_for
from tests.helpers import POISON, host, paged_cache, poisoned, randn

pytestmark = pytest.mark.gpu
DTYPES = ["float16", "bfloat16"]


def _bits(a) -> np.ndarray:
    return cupy.asnumpy(a.view(np.uint16))


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
    k2h = as_strided(k2, (n, kv_heads, d), (k2.strides[0], d * k2.itemsize, k2.itemsize))
    ops.rope(q2, k2h, pos, f, stream=stream)
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
    ws = ops.decode_workspace(4, 32, 64, 768, 64)
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
    assert (ws[:ops.attention.COUNTERS].get() == 0).all()
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
    ws = ops.decode_workspace(1, 32, 128, 1800, 1)
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


def test_decode_attention_batches_of_any_size_share_one_workspace(stream, rng):
    # the counters sit at the same place whatever the batch: a launch over 1 row writes
    # partial results where a launch over 4 rows would otherwise keep its counters
    lens = {0: 300, 1: 5, 2: 129, 3: 64}
    kv, kh, vh = paged_cache(rng, "float16", 2, 64, lens)
    ws = ops.decode_workspace(4, 8, 64, 320, 16)
    cupy.cuda.Device().synchronize()
    for slots in ([0], [0, 1, 2, 3], [2], [3, 2, 1, 0]):
        q, qh = randn(rng, (len(slots), 8, 64), "float16")
        out = poisoned(q.shape, "float16")
        ops.decode_attention(q, kv.k[0], kv.v[0], kv.block_tables, kv.seq_lens,
                             cupy.asarray(np.array(slots, np.int32)), out, ws, 320,
                             split_tokens=16, stream=stream)
        stream.synchronize()
        want = ref.decode_attention(qh, kh, vh, kv.tables.table, kv.tables.lens,
                                    np.array(slots), 64**-0.5)
        np.testing.assert_allclose(host(out, "float16"), want, rtol=2e-3, atol=2e-3)
