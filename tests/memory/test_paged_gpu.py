"""Paged KV cache on the device: captured graphs keep reading the right blocks while block
tables change between replays (one host-to-device copy per step)."""

import cupy
import numpy as np
import pytest

from rawgraph import capture, ops
from rawgraph.memory.arena import Arena
from rawgraph.memory.paged import PagedKVCache
from rawgraph.ops import reference as ref
from tests.helpers import host, poisoned, randn

pytestmark = pytest.mark.gpu
ROW, BS, SEQS, MAXB = 64, 4, 4, 8


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_kv_append_and_gather_match_reference(stream, rng, dtype):
    kv = PagedKVCache(layers=1, kv_heads=2, head_dim=32, block_size=BS, num_blocks=16,
                      max_seqs=SEQS, max_blocks_per_seq=MAXB, dtype=dtype)
    t = kv.tables
    for s, n in [(0, 5), (1, 9), (3, 1)]:
        t.add(s)
        t.append(s, n)
    kv.sync(stream)
    slots = np.array([0] * 5 + [1] * 9 + [3, -1], np.int32)
    pos = np.array(list(range(5)) + list(range(9)) + [0, 0], np.int32)
    k_new, k_host = randn(rng, (16, ROW), dtype)
    v_new, _ = randn(rng, (16, ROW), dtype)
    k_layer, v_layer = kv.layer(0)
    k_layer[...] = poisoned(k_layer.shape, dtype)
    before = host(k_layer, dtype)
    ops.kv_append(k_new, v_new, ops.Cache(k_layer, v_layer, kv.block_tables),
                  cupy.asarray(slots), cupy.asarray(pos), stream=stream)
    stream.synchronize()
    want = ref.kv_append(before, k_host, t.table, slots, pos)
    np.testing.assert_array_equal(host(k_layer, dtype), want)  # NaN poison compares equal
    out = poisoned((MAXB * BS, ROW), dtype)
    ops.kv_gather(k_layer, kv.block_tables, kv.seq_lens, 1, out, stream=stream)
    stream.synchronize()
    got = host(out, dtype)
    np.testing.assert_array_equal(got[:9], ref.kv_gather(want, t.table[1], 9))
    assert np.isnan(got[9:]).all()


def test_graph_follows_table_updates_over_many_steps(stream, rng):
    arena = Arena(1 << 24, "persistent")
    kv = PagedKVCache(layers=1, kv_heads=2, head_dim=32, block_size=BS, num_blocks=24,
                      max_seqs=SEQS, max_blocks_per_seq=MAXB, arena=arena)
    t = kv.tables
    k_new = arena.array("step.k", (SEQS, ROW), np.float16)
    v_new = arena.array("step.v", (SEQS, ROW), np.float16)
    meta = arena.array("step.meta", (2, SEQS), np.int32)        # seq slots, positions
    outs = [arena.array(f"out{s}", (MAXB * BS, ROW), np.float16) for s in range(3)]
    k_layer, v_layer = kv.layer(0)
    with capture(stream, name="decode") as cap:
        ops.kv_append(k_new, v_new, ops.Cache(k_layer, v_layer, kv.block_tables), meta[0],
                      meta[1], stream=stream)
        for s, out in enumerate(outs):
            ops.kv_gather(k_layer, kv.block_tables, kv.seq_lens, s, out, stream=stream)
    ex = cap.graph.instantiate(upload_stream=stream)
    expect: dict[int, list] = {0: [], 1: []}
    t.add(0)
    t.add(1)
    for step in range(22):
        if step == 9:                                  # seq 2 forks seq 0 mid-block
            t.fork(0, 2)
            expect[2] = list(expect[0])
        if step == 15:                                 # seq 1 finishes; its blocks are reused
            t.free(1)
            del expect[1]
        active = sorted(expect)
        rows = rng.standard_normal((SEQS, ROW)).astype(np.float16)
        slots = np.full(SEQS, -1, np.int32)
        pos = np.zeros(SEQS, np.int32)
        for i, s in enumerate(active):
            t.append(s, 1)
            slots[i], pos[i] = s, t.lens[s] - 1
            expect[s].append(rows[i])
        k_new.set(rows, stream)
        v_new.set(-rows, stream)                       # kv_append reads both
        meta.set(np.stack([slots, pos]), stream)
        kv.sync(stream)                                # COW copies + one copy of the tables
        with stream:
            for out in outs:
                out.fill(0)
        ex.launch(stream)
        stream.synchronize()
        # the step's copy carried the lengths and only the rows up to the last changed one;
        # the device still holds the whole table
        assert (kv.block_tables.get() == t.table).all() and (kv.seq_lens.get() == t.lens).all()
        for s in active:
            got = outs[s].get()
            np.testing.assert_array_equal(got[:len(expect[s])], np.stack(expect[s]))
    assert t.alloc.num_free == int((t.alloc.refs == 0).sum()) > 0
    ex.close()
    cap.graph.close()
