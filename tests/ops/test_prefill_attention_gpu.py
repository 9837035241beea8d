"""Causal prefill attention over the paged cache against a float64 reference: GQA, varlen,
chunked, random lengths, a block per head and GQA-grouped tiles in key runs (a count given,
or following the context), the grid and the runs patched in a graph, refused input."""

import cupy
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rawgraph import Range, Symbols, capture, ops
from rawgraph.cuda.device import multiprocessors
from rawgraph.cuda.stream import new_stream
from rawgraph.ops import reference as ref
from tests.helpers import DTYPES, POISON, host, layer0, paged_cache, poisoned, randn

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True, params=["wgmma+tma", "wgmma", "mma.sync"])
def prefill_kernel(request):
    """Every test on each kernel family: Hopper's wgmma (prefill_attention_sm90.cu) with K/V
    tiles by TMA and gathered with cp.async, and mma.sync (prefill_attention.cu), which other
    GPUs take."""
    wgmma = request.param != "mma.sync"
    with ops.choose(prefill_wgmma=wgmma, prefill_tma=request.param == "wgmma+tma"):
        if wgmma and not ops.attention.prefill_wgmma():
            pytest.skip("prefill_attention_sm90.cu needs compute capability 9.0")
        yield


# attention: fp32 softmax, P rounded to the storage type before P V (as FlashAttention does)
ATOL = {"float16": 2e-3, "bfloat16": 1.6e-2}


def _runs(chunk, q_heads, kv_heads):
    """(splits, run_keys) of grouped prefill attention for chunks of `chunk` tokens."""
    group = q_heads // kv_heads
    tile = ops.attention.grouped_rows(chunk, group) // group
    return ops.attention.prefill_runs(chunk, tile, kv_heads, multiprocessors())


def _workspace(tokens, q_heads, kv_heads, d, splits, chunk=None):
    """NaN-filled runs' workspace (every float the combine uses must have been written):
    for `splits` runs, or ("context") for those of chunks of `chunk` tokens."""
    if splits == "context":
        splits = _runs(chunk, q_heads, kv_heads)[0]
    return cupy.full(ops.workspace_floats(tokens, q_heads, d, splits or 1), np.nan, np.float32)


def _poison_tails(kv, lens, dtype):
    """NaN in every cache row no sequence holds: past each length in its last block, and in
    the blocks of no table. Kernels must not let them reach a result (a masked key's P is 0,
    but 0 x NaN is NaN): the gathers zero-fill those rows, the TMA loads zero V's."""
    k, v, bs = kv.k[0].view(np.uint16), kv.v[0].view(np.uint16), kv.block_size
    used = set()
    for slot, n in lens.items():
        blocks = kv.tables.table[slot][:-(-n // bs)]
        used.update(int(b) for b in blocks)
        if n % bs:
            k[int(blocks[-1]), n % bs:] = v[int(blocks[-1]), n % bs:] = POISON[dtype]
    free = cupy.asarray(sorted(set(range(k.shape[0])) - used), np.int64)
    k[free] = v[free] = POISON[dtype]


def _prefill_case(stream, rng, dtype, q_heads, kv_heads, d, lens, seqs, splits=None,
                  block_size=16):
    """seqs: [(slot, q_len)]: the last q_len cached tokens of each slot are the queries;
    `splits`: None (a block per head), key runs per grouped query tile, or "context" (as
    many as the longest sequence's context gives). Cache rows past the lengths hold NaN."""
    kv, kh, vh = paged_cache(rng, dtype, kv_heads, d, lens, block_size=block_size,
                             num_blocks=512, max_blocks=300)
    _poison_tails(kv, lens, dtype)
    cu = np.concatenate([[0], np.cumsum([n for _, n in seqs])]).astype(np.int32)
    q, qh = randn(rng, (int(cu[-1]), q_heads, d), dtype)
    out = poisoned(q.shape, dtype)
    slots = np.array([s for s, _ in seqs], np.int32)
    # every input on the device before the kernel's stream starts: the copies CuPy makes on
    # the current stream are not ordered with a non-blocking stream
    cu_d, slots_d = cupy.asarray(cu), cupy.asarray(slots)
    ws = _workspace(q.shape[0], q_heads, kv_heads, d, splits, max(n for _, n in seqs))
    kw = {"context": max(lens[s] for s, _ in seqs if s >= 0)} if splits == "context" else \
        {"splits": splits}
    cupy.cuda.Device().synchronize()
    ops.prefill_attention(q, layer0(kv), ops.Chunk(cu_d, slots_d, max(n for _, n in seqs)), out,
                          ops.PrefillPlan(workspace=ws, **kw), stream=stream)
    stream.synchronize()
    want = ref.prefill_attention(qh, kh, vh, kv.tables.table, kv.tables.lens, cu, slots,
                                 d**-0.5)
    got = host(out, dtype)
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=ATOL[dtype], atol=ATOL[dtype])
    assert (cupy.asnumpy(out.view(np.uint16))[~ok] == POISON[dtype]).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("q_heads", "kv_heads", "d"), [(32, 8, 64), (8, 8, 128), (12, 2, 128)])
def test_prefill_attention_varlen_and_chunked(stream, rng, dtype, q_heads, kv_heads, d):
    # slot 0: a whole 200-token prompt; 1: a 64-token chunk after 900 cached tokens;
    # 2: one token; 3: skipped (slot -1 rows stay unwritten); 5: 130 of 131 tokens
    lens = {0: 200, 1: 964, 2: 1, 5: 131}
    seqs = [(0, 200), (1, 64), (2, 1), (-1, 7), (5, 130)]
    _prefill_case(stream, rng, dtype, q_heads, kv_heads, d, lens, seqs)


@pytest.mark.parametrize("block_size", [8, 24, 32, 48, 64, 128, 256])
@pytest.mark.parametrize("d", [64, 128])
def test_prefill_attention_over_paged_blocks_of_any_size(stream, rng, block_size, d):
    # the varlen case in blocks smaller than, equal to and larger than a 64-key tile: by TMA
    # (powers of two: a tile of several boxes; one box; part of a block) or gathered (24, 48)
    lens = {0: 200, 1: 964, 2: 1, 5: 131}
    seqs = [(0, 200), (1, 64), (2, 1), (-1, 7), (5, 130)]
    _prefill_case(stream, rng, "float16", 8, 2, d, lens, seqs, block_size=block_size)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [1, 2, 3, 16, "context"])
@pytest.mark.parametrize(("q_heads", "kv_heads", "d"), [(32, 8, 64), (12, 2, 128), (8, 8, 64)])
def test_prefill_attention_in_key_runs(stream, rng, dtype, splits, q_heads, kv_heads, d):
    # the varlen case in grouped tiles (4 heads of 16 tokens; 6 heads of 10 tokens and 4
    # rows of padding; one head) in 1, 2, 3 and 16 runs per query tile and as many as a
    # 964-token context gives: runs past a row's last key (all masked for it), empty runs
    # (16 runs of 1-4 tiles), the combine skipping slot -1's rows, one run writing out
    lens = {0: 200, 1: 964, 2: 1, 5: 131}
    seqs = [(0, 200), (1, 64), (2, 1), (-1, 7), (5, 130)]
    _prefill_case(stream, rng, dtype, q_heads, kv_heads, d, lens, seqs, splits)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(lens=st.lists(st.integers(1, 700), min_size=1, max_size=4),
       frac=st.floats(0.01, 1.0), d=st.sampled_from([64, 128]),
       group=st.sampled_from([1, 4, 8]), dtype=st.sampled_from(DTYPES),
       splits=st.sampled_from([None, None, 1, 2, 5, "context"]))
def test_prefill_attention_random_lengths(lens, frac, d, group, dtype, splits):
    seqs = [(i, max(1, int(n * frac))) for i, n in enumerate(lens)]
    with new_stream() as stream:  # current: the inputs are made on it
        _prefill_case(stream, np.random.default_rng(sum(lens)), dtype, 2 * group, 2, d,
                      dict(enumerate(lens)), seqs, splits)


def test_prefill_attention_grid_is_patched(stream, rng):
    kv, kh, vh = paged_cache(rng, "float16", 2, 64, {0: 300}, num_blocks=512, max_blocks=300)
    q, qh = randn(rng, (256, 4, 64), "float16")
    out = cupy.zeros(q.shape, np.float16)
    cu = cupy.zeros(2, np.int32)
    slots = cupy.zeros(1, np.int32)
    S = Symbols(q_len=Range(1, 256))
    S.set(q_len=256)
    cupy.cuda.Device().synchronize()
    with capture(stream) as cap:
        ops.prefill_attention(q, layer0(kv), ops.Chunk(cu, slots, S.q_len), out, stream=stream,
                              symbols=S)
    with cap.graph as g, g.instantiate() as ex:
        for n in (256, 44, 100):
            cu.set(np.array([0, n], np.int32))
            stream.synchronize()
            ex.set(q_len=n)
            assert ex.plan.nodes[0].grid[0] == -(-n // 64)  # head dim 64: 64-row blocks
            ex.launch(stream)
            stream.synchronize()
            want = ref.prefill_attention(qh[:n], kh, vh, kv.tables.table, kv.tables.lens,
                                         np.array([0, n]), np.array([0]), 64**-0.5)
            np.testing.assert_allclose(host(out[:n], "float16"), want, rtol=2e-3, atol=2e-3)


def _replayed(out, eager, n, slot, qh, kh, vh, kv):
    """A replay's first n rows (float16, d=64) are the eager launch's bits and, within the
    tolerance, the reference's for the last n cached tokens of `slot`."""
    np.testing.assert_array_equal(cupy.asnumpy(out[:n].view(np.uint16)),
                                  cupy.asnumpy(eager[:n].view(np.uint16)))
    want = ref.prefill_attention(qh[:n], kh, vh, kv.tables.table, kv.tables.lens,
                                 np.array([0, n]), np.array([slot]), 64**-0.5)
    np.testing.assert_allclose(host(out[:n], "float16"), want, rtol=2e-3, atol=2e-3)


def test_prefill_attention_in_runs_replays_the_eager_bits_with_the_grid_patched(stream, rng):
    # 4 runs per query tile, captured for 256 query rows and patched to 44 and 100: each
    # replay gives the eager launch's bits (runs and combine), and the reference
    kv, kh, vh = paged_cache(rng, "float16", 2, 64, {0: 1300}, num_blocks=512, max_blocks=300)
    q, qh = randn(rng, (256, 4, 64), "float16")
    out, eager = cupy.zeros(q.shape, np.float16), cupy.zeros(q.shape, np.float16)
    ws = cupy.zeros(ops.workspace_floats(256, 4, 64, 4), np.float32)
    cu, slots = cupy.zeros(2, np.int32), cupy.zeros(1, np.int32)
    S = Symbols(q_len=Range(1, 256))
    S.set(q_len=256)
    cupy.cuda.Device().synchronize()
    with capture(stream) as cap:
        ops.prefill_attention(q, layer0(kv), ops.Chunk(cu, slots, S.q_len), out,
                              ops.PrefillPlan(splits=4, workspace=ws), stream=stream, symbols=S)
    with cap.graph as g, g.instantiate() as ex:
        for n in (256, 44, 100):
            cu.set(np.array([0, n], np.int32))  # the last n of the 1300 cached tokens
            stream.synchronize()
            # the captured query tile (128 rows at 256): runs cut a tile's key tiles, so the
            # tile decides the runs' bounds and the eager launch must take the same one
            ops.prefill_attention(q, layer0(kv), ops.Chunk(cu, slots, n), eager,
                                  ops.PrefillPlan(128, splits=4, workspace=ws), stream=stream)
            ex.set(q_len=n)
            for _ in range(2):
                ex.launch(stream)
            stream.synchronize()
            _replayed(out, eager, n, 0, qh, kh, vh, kv)


def test_prefill_attention_runs_follow_the_context_when_patched(stream, rng):
    # grouped, in runs for chunks of 64 tokens, the run blocks launched from a symbolic
    # context: one graph, captured at the largest context, patched to sequences whose own
    # lengths give 1 run (100 tokens), 2 (300) and many (3,000): two replays give the eager
    # launch's bits and the reference's values; grid.y follows (kv_heads x runs)
    lens = {0: 3000, 1: 300, 2: 100}
    kv, kh, vh = paged_cache(rng, "float16", 2, 64, lens, num_blocks=512, max_blocks=300)
    q, qh = randn(rng, (64, 8, 64), "float16")
    out, eager = cupy.zeros(q.shape, np.float16), cupy.zeros(q.shape, np.float16)
    ws = _workspace(64, 8, 2, 64, "context", 64)
    cu, slots = cupy.zeros(2, np.int32), cupy.zeros(1, np.int32)
    S = Symbols(q_len=Range(1, 64), ctx=Range(1, 4800))
    S.set(q_len=64, ctx=4800)
    cupy.cuda.Device().synchronize()
    with capture(stream) as cap:
        ops.prefill_attention(q, layer0(kv), ops.Chunk(cu, slots, S.q_len, n=S.q_len), out,
                              ops.PrefillPlan(64, context=S.ctx, workspace=ws), stream=stream,
                              symbols=S)
    splits, keys = ops.attention.prefill_runs(64, 16, 2, multiprocessors())
    assert [ops.attention.row_runs(n, splits, keys) for n in (100, 300)] == [1, 2]
    assert ops.attention.row_runs(3000, splits, keys) > 2
    with cap.graph as g, g.instantiate() as ex:
        for slot, n in ((0, 16), (2, 64), (1, 40), (0, 64), (2, 1)):
            cu.set(np.array([0, n], np.int32))  # the last n of the slot's cached tokens
            slots.set(np.array([slot], np.int32))
            stream.synchronize()
            ops.prefill_attention(q, layer0(kv), ops.Chunk(cu, slots, n), eager,
                                  ops.PrefillPlan(64, context=lens[slot], chunk_size=64,
                                                  workspace=ws), stream=stream)
            ex.set(q_len=n, ctx=lens[slot])
            assert ex.plan.nodes[0].grid[1] == 2 * ops.attention.row_runs(lens[slot], splits, keys)
            for _ in range(2):
                ex.launch(stream)
            stream.synchronize()
            _replayed(out, eager, n, slot, qh, kh, vh, kv)


@pytest.mark.parametrize("d", [64, 128])
def test_a_sequences_runs_do_not_depend_on_the_rest_of_the_chunk(stream, rng, d):
    # a 16-token piece over 1,000 cached tokens gives the same bits alone and in a chunk
    # whose other piece has a longer context (more run blocks launched) or more tokens
    lens = {0: 1000, 1: 4000, 2: 60}
    kv, _, _ = paged_cache(rng, "float16", 2, d, lens, num_blocks=512, max_blocks=300)
    q, _ = randn(rng, (64, 8, d), "float16")
    ws = _workspace(64, 8, 2, d, "context", 64)
    got = []
    for seqs in ([(0, 16)], [(1, 32), (0, 16)], [(0, 16), (2, 48)]):
        cu = np.concatenate([[0], np.cumsum([n for _, n in seqs])]).astype(np.int32)
        at = cu[[s for s, _ in seqs].index(0)]
        qq = cupy.zeros_like(q)
        qq[at:at + 16] = q[:16]
        out = cupy.zeros(q.shape, np.float16)
        cu_d, slots_d = cupy.asarray(cu), cupy.asarray([s for s, _ in seqs], np.int32)
        cupy.cuda.Device().synchronize()
        ops.prefill_attention(qq, layer0(kv), ops.Chunk(cu_d, slots_d, max(n for _, n in seqs)),
                              out, ops.PrefillPlan(64, context=max(lens[s] for s, _ in seqs),
                                                   chunk_size=64, workspace=ws),
                              stream=stream)
        stream.synchronize()
        got.append(cupy.asnumpy(out[at:at + 16].view(np.uint16)))
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_array_equal(got[0], got[2])


def test_prefill_attention_rejects_bad_input(rng):
    kv, _, _ = paged_cache(rng, "float16", 2, 64, {0: 10}, num_blocks=512, max_blocks=300)
    q = cupy.zeros((10, 4, 64), np.float16)
    cu, slots = cupy.array([0, 10], np.int32), cupy.zeros(1, np.int32)
    cache, chunk = layer0(kv), ops.Chunk(cu, slots, 10)
    with pytest.raises(ValueError, match="head_dim 32"):
        ops.prefill_attention(cupy.zeros((10, 4, 32), np.float16), cache, chunk,
                              cupy.zeros((10, 4, 32), np.float16))
    with pytest.raises(ValueError, match="cu_seqlens has shape"):
        ops.prefill_attention(q, cache, ops.Chunk(cupy.zeros(3, np.int32), slots, 10),
                              cupy.zeros_like(q))
    with pytest.raises(ValueError, match="max_q_len reaches 11"):
        ops.prefill_attention(q, cache, ops.Chunk(cu, slots, 11), cupy.zeros_like(q))
    with pytest.raises(ValueError, match="workspace must be float32 with at least 5280"):
        ops.prefill_attention(q, cache, chunk, cupy.zeros_like(q),
                              ops.PrefillPlan(splits=2, workspace=cupy.zeros(100, np.float32)))
    with pytest.raises(ValueError, match="context reaches 4801"):
        ops.prefill_attention(q, cache, chunk, cupy.zeros_like(q),
                              ops.PrefillPlan(context=4801,
                                              workspace=cupy.zeros(1 << 20, np.float32)))
    with pytest.raises(ValueError, match="66 heads in a tile of 64 rows"):
        q66 = cupy.zeros((10, 132, 64), np.float16)
        ops.prefill_attention(q66, cache, chunk, cupy.zeros_like(q66),
                              ops.PrefillPlan(64, splits=1))
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        ops.prefill_attention(cupy.zeros((10, 3, 64), np.float16), cache, chunk,
                              cupy.zeros((10, 3, 64), np.float16))
    with pytest.raises(ValueError, match="needs its seq_lens"):
        ops.prefill_attention(q, ops.Cache(kv.k[0], kv.v[0], kv.block_tables), chunk,
                              cupy.zeros_like(q))
    with pytest.raises(TypeError, match=r"ops\.Chunk and an ops\.PrefillPlan"):
        ops.prefill_attention(q, cache, (cu, slots, 10), cupy.zeros_like(q))
