"""Decode attention over the paged cache against a float64 reference; split-count patching."""

import cupy
import numpy as np
import pytest

from rawgraph import Range, Symbols, capture, ops
from rawgraph.ops import reference as ref
from rawgraph.ops.attention import default_splits, row_splits
from tests.helpers import POISON, host, layer0, paged_cache, poisoned, randn

pytestmark = pytest.mark.gpu
TOL = {"float16": 2e-3, "bfloat16": 1.6e-2}


def _setup(rng, dtype, q_heads, kv_heads, d, lens, batch_slots, block_size=16, **cache):
    kv, kh, vh = paged_cache(rng, dtype, kv_heads, d, lens, block_size=block_size, **cache)
    q, qh = randn(rng, (len(batch_slots), q_heads, d), dtype)
    cupy.cuda.Device().synchronize()  # inputs made on the default stream; kernels use another
    return kv, kh, vh, q, qh, cupy.asarray(np.array(batch_slots, np.int32))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(("q_heads", "kv_heads", "d"), [(32, 8, 64), (8, 8, 128), (12, 2, 128)])
def test_decode_attention_matches_reference(stream, rng, dtype, q_heads, kv_heads, d):
    lens = {0: 1, 1: 1000, 2: 63, 5: 257}
    slots = [1, 0, -1, 5, 2]
    kv, kh, vh, q, qh, slots_d = _setup(rng, dtype, q_heads, kv_heads, d, lens, slots)
    out = poisoned(q.shape, dtype)
    splits = default_splits(len(slots), kv_heads, dtype, d)
    ws = cupy.empty(ops.workspace_floats(len(slots), q_heads, d, splits), np.float32)
    ops.decode_attention(q, layer0(kv), slots_d, out, ws,
                         1536, stream=stream)
    stream.synchronize()
    want = ref.decode_attention(qh, kh, vh, kv.tables.table, kv.tables.lens,
                                np.array(slots), d**-0.5)
    got = host(out, dtype)
    ok = np.array(slots) >= 0
    np.testing.assert_allclose(got[ok], want[ok], rtol=TOL[dtype], atol=TOL[dtype])
    assert (cupy.asnumpy(out.view(np.uint16))[~ok] == POISON[dtype]).all()



@pytest.mark.parametrize("splits", [1, 3, 7, 16, 100])
def test_decode_attention_any_split_count_and_a_group_of_16(stream, rng, splits):
    # one split for a whole context, splits that end mid-chunk (1000 / 7), more splits than a
    # row has tokens (1 / 17 / 129 tokens: empty splits); 16 query heads per kv head fill the
    # tensor-core tile's rows
    lens = {0: 1, 1: 1000, 3: 17, 4: 129}
    slots = [3, 1, 0, 4]
    kv, kh, vh, q, qh, slots_d = _setup(rng, "bfloat16", 32, 2, 128, lens, slots)
    out = poisoned(q.shape, "bfloat16")
    ws = cupy.empty(ops.workspace_floats(len(slots), 32, 128, splits), np.float32)
    ops.decode_attention(q, layer0(kv), slots_d, out, ws,
                         1000, splits=splits, stream=stream)
    stream.synchronize()
    want = ref.decode_attention(qh, kh, vh, kv.tables.table, kv.tables.lens,
                                np.array(slots), 128**-0.5)
    np.testing.assert_allclose(host(out, "bfloat16"), want, rtol=TOL["bfloat16"],
                               atol=TOL["bfloat16"])


@pytest.mark.parametrize(("splits", "min_split"), [(16, 0), (40, 0), (79, 256), (157, 128),
                                                   (40, 512)])
def test_long_rows_take_splits_of_at_least_256_tokens(stream, rng, splits, min_split):
    # past 16 x 256 tokens a row is cut into splits of >= 256 tokens, up to `splits`; none
    # shorter than min_split (with fixed_splits(20000, p) as max_splits for p); the
    # splits the kernel wrote (m > -inf in the workspace) are the ones row_splits says
    lens = {0: 9000, 1: 4096, 2: 4097, 3: 300, 4: 20000, 5: 1024}
    slots = [4, 0, 1, 2, 3, 5]
    kv, kh, vh, q, qh, slots_d = _setup(rng, "float16", 32, 8, 64, lens, slots, block_size=64,
                                        num_blocks=620, max_blocks=320)
    out = poisoned(q.shape, "float16")
    ws = cupy.full(ops.workspace_floats(len(slots), 32, 64, splits), np.nan, np.float32)
    ops.decode_attention(q, layer0(kv), slots_d, out, ws,
                         20000, splits=splits, min_split=min_split, stream=stream)
    stream.synchronize()
    want = ref.decode_attention(qh, kh, vh, kv.tables.table, kv.tables.lens,
                                np.array(slots), 64**-0.5)
    np.testing.assert_allclose(host(out, "float16"), want, rtol=TOL["float16"],
                               atol=TOL["float16"])
    m = ws.get().reshape(len(slots), 32, splits, 64 + 2)[..., 64]
    for b, s in enumerate(slots):
        written = np.isfinite(m[b]) & (m[b] > -np.inf)
        want = row_splits(lens[s], splits, min_split)
        assert (written.sum(axis=1) == want).all(), (lens[s], splits, min_split)


@pytest.mark.parametrize("block_size", [8, 24, 32, 48])
def test_decode_attention_block_sizes_and_scattered_tables(stream, rng, block_size):
    # 32 and 48 are multiples of the 16-token chunk (one table lookup per chunk, chunks at
    # every offset in their block), 8 and 24 are not (a lookup per token, chunks across
    # blocks); the sequences grow in turns, so each one's blocks are scattered in the cache
    from rawgraph.memory.paged import PagedKVCache

    kv = PagedKVCache(layers=1, kv_heads=2, head_dim=128, block_size=block_size,
                      num_blocks=1200 // block_size, max_seqs=4,
                      max_blocks_per_seq=720 // block_size, dtype="float16")
    for s in (0, 1, 2):
        kv.tables.add(s)
    for step in range(7):
        for s, n in ((0, 97), (1, 3), (2, 1)):
            kv.tables.append(s, n + step)
    kv.sync()
    assert (np.diff(kv.tables.table[0][kv.tables.table[0] >= 0]) != 1).any()  # not in order
    k, kh = randn(rng, kv.k.shape[1:], "float16")
    v, vh = randn(rng, kv.v.shape[1:], "float16")
    kv.k[0], kv.v[0] = k, v
    q, qh = randn(rng, (3, 16, 128), "float16")
    cupy.cuda.Device().synchronize()
    slots = [2, 0, 1]
    out = poisoned(q.shape, "float16")
    ws = cupy.empty(ops.workspace_floats(3, 16, 128, 5), np.float32)
    ops.decode_attention(q, layer0(kv), cupy.asarray(np.array(slots, np.int32)), out, ws, 700,
                         splits=5, stream=stream)
    stream.synchronize()
    want = ref.decode_attention(qh, kh, vh, kv.tables.table, kv.tables.lens, np.array(slots),
                                128**-0.5)
    np.testing.assert_allclose(host(out, "float16"), want, rtol=TOL["float16"],
                               atol=TOL["float16"])


def test_decode_attention_combines_more_splits_than_it_requests_at_once(stream, rng):
    # the combine requests 16 splits' values at a time and one split's max per thread (64
    # threads at D = 64): 71 splits of a 4500-token row take both loops' later rounds
    lens = {0: 4500, 1: 1300, 2: 1}
    kv, kh, vh = paged_cache(rng, "float16", 8, 64, lens, num_blocks=400, max_blocks=300)
    q, qh = randn(rng, (3, 32, 64), "float16")
    cupy.cuda.Device().synchronize()
    slots = cupy.asarray(np.array([0, 1, 2], np.int32))
    out = poisoned(q.shape, "float16")
    ws = cupy.empty(ops.workspace_floats(3, 32, 64, 80), np.float32)
    ops.decode_attention(q, layer0(kv), slots, out, ws,
                         4500, splits=80, stream=stream)
    stream.synchronize()
    want = ref.decode_attention(qh, kh, vh, kv.tables.table, kv.tables.lens,
                                np.array([0, 1, 2]), 64**-0.5)
    np.testing.assert_allclose(host(out, "float16"), want, rtol=2e-3, atol=2e-3)


def test_split_count_is_patched_as_contexts_grow(stream, rng):
    lens = {0: 40, 1: 200}
    kv, kh, vh, q, qh, slots = _setup(rng, "float16", 32, 8, 64, lens, [0, 1])
    S = Symbols(max_len=Range(1, 1536))
    S.set(max_len=256)
    out = cupy.empty(q.shape, np.float16)
    ws = cupy.empty(ops.workspace_floats(2, 32, 64, 12), np.float32)
    with capture(stream) as cap:
        ops.decode_attention(q, layer0(kv), slots, out, ws,
                             S.max_len, splits=12, stream=stream, symbols=S)
    eager = cupy.empty_like(out)
    with cap.graph as g, g.instantiate() as ex:
        assert [n.grid for n in g.nodes] == [(16, 4, 1), (64, 1, 1)]  # 256 / 64 splits
        for grow in (0, 300, 1000):
            kv.tables.append(1, grow)
            kv.sync(stream)
            longest = int(kv.tables.lens.max())
            assert ex.set(max_len=longest) in (0, 2)
            ex.launch(stream)
            # eager with the most splits: the same bits (a row's splits follow from its length)
            ops.decode_attention(q, layer0(kv), slots,
                                 eager, ws, 1536, splits=12, stream=stream)
            stream.synchronize()
            want = ref.decode_attention(qh, kh, vh, kv.tables.table, kv.tables.lens,
                                        np.array([0, 1]), 64**-0.5)
            np.testing.assert_allclose(host(out, "float16"), want, rtol=2e-3, atol=2e-3)
            assert (out == eager).all()
        assert ex.plan.nodes[0].grid == (16, 12, 1)  # 1500 tokens: min(12, 24)


def test_decode_attention_rejects_bad_input(rng):
    kv, _, _, q, _, slots = _setup(rng, "float16", 32, 8, 64, {0: 5}, [0, 0])
    ws = cupy.empty(ops.workspace_floats(2, 32, 64, 4), np.float32)  # 4 splits
    out = cupy.empty(q.shape, np.float16)
    args = (layer0(kv), slots, out, ws)
    with pytest.raises(ValueError, match="head_dim 32"):
        ops.decode_attention(cupy.empty((2, 32, 32), np.float16), *args, 512)
    with pytest.raises(ValueError, match="at least"):
        ops.decode_attention(q, *args, 1024, splits=9)
    with pytest.raises(ValueError, match="splits = 0"):
        ops.decode_attention(q, *args, 1024, splits=0)
    with pytest.raises(ValueError, match="block tables hold at most 1536"):
        ops.decode_attention(q, *args, 5000)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        ops.decode_attention(cupy.empty((2, 30, 64), np.float16), layer0(kv), slots,
                             cupy.empty((2, 30, 64), np.float16), ws, 8)
