"""RoPE fused into the KV-cache append (rope_append) against rope then kv_append."""

import cupy
import numpy as np
import pytest
from cupy.lib.stride_tricks import as_strided

from rawgraph import ops
from tests.helpers import POISON, paged_cache, poisoned, randn

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
