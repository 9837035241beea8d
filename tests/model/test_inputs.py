"""An iteration's host side (`model.inputs.Inputs`) without a GPU: the metadata it writes
for decode steps, follow steps, prefill chunks and mixed iterations, the sizes it returns,
and the refusals that change nothing. The staging is host memory here (the device's copy is
the host's); the GPU tests check the copies themselves (`Inputs.check`)."""

from types import SimpleNamespace

import numpy as np
import pytest

from rawgraph.memory.blocks import BlockAllocator, BlockTables
from rawgraph.memory.staging import _layout
from rawgraph.model.inputs import Inputs
from rawgraph.model.step import Limits, PrefillPiece, Shape, last_step
from rawgraph.ops.sampling import SamplingParams

LIMITS = Limits(max_batch=4, max_chunk=32, max_chunk_seqs=2, max_context=64, vocab=100)


class HostStaging:
    """memory.Staging's interface on host memory: `dev` is `host`; pushes are recorded."""

    def __init__(self, fields):
        self.host = {n: np.zeros(c, dt) for n, (dt, c) in fields.items()}
        self.dev = self.host
        self._offsets = {n: o for n, (_, _, o) in _layout(fields)[0].items()}
        self.pushes = 0

    def begin(self):
        return self.host

    def offset(self, name):
        return self._offsets[name]

    def push(self, stream, nbytes=None, *, start=0):
        self.pushes += 1


def _inputs(blocks=16):
    t = BlockTables(BlockAllocator(blocks), 16, 4, 4)
    kv = SimpleNamespace(tables=t, block_size=16, syncs=0, synced=[])

    def sync(stream=None, lens=None):  # as PagedKVCache.sync leaves the tables
        t.pending_copies.clear()
        t.changed.clear()
        t.lens_moved = False
        kv.syncs += 1
        kv.synced.append(stream)
    kv.sync = sync
    return Inputs(LIMITS, kv, np.zeros(2, np.int32), staging=HostStaging), t


def test_a_decode_step_grows_its_rows_and_writes_their_metadata():
    x, t = _inputs()
    x.prepare([PrefillPiece(0, [1, 2, 3], 0), PrefillPiece(2, [4] * 20, 0)], [], None,
              decode_stream="d", prefill_stream="p")
    x.set_sampling(2, SamplingParams(temperature=0.5, seed=9))
    sizes = x.prepare([], [2, 0], [7, 8], decode_stream="d")
    assert sizes == {"max_len": 21} and t.lens[[0, 2]].tolist() == [4, 21]
    h = x.dec_meta.host
    assert h["ids"].tolist() == [7, 8, 0, 0] and h["slots"].tolist() == [2, 0, -1, -1]
    assert h["pos"].tolist() == [20, 3, 0, 0]  # each row's new token's position
    assert h["seeds"][0] == 9 and h["temperature"][0] == np.float32(0.5)
    assert x.kv.synced[-1] == "d"


def test_a_follow_step_copies_only_what_changed_and_takes_joining_rows():
    x, t = _inputs()
    x.prepare([PrefillPiece(0, [1, 2], 0), PrefillPiece(1, [3, 4], 0)], [], None)
    x.prepare([], [0, 1], [5, 6])
    last = last_step([0, 1], t, x.kv.syncs)
    pushes, syncs = x.dec_meta.pushes, x.kv.syncs
    sizes = x.prepare([], [0, 1], None, follow=True, last=last)
    assert sizes == {"max_len": 4} and t.lens[[0, 1]].tolist() == [4, 4]
    assert x.dec_meta.pushes == pushes and x.kv.syncs == syncs  # nothing moved on the host
    # row 1's sequence left (an empty row), a sequence joins in row 2, fed from the host
    x.prepare([PrefillPiece(3, [9, 9, 9], 0)], [], None)
    t.free(1)
    last = last_step([0, -1], t, x.kv.syncs)
    sizes = x.prepare([], [0, -1, 3], [-1, -1, 42], follow=True, last=last)
    h = x.dec_meta.host
    assert sizes == {"max_len": 5} and h["slots"][:3].tolist() == [0, -1, 3]
    assert h["ids"][2] == 42 and h["pos"][2] == 3  # the joining row: its token and position
    with pytest.raises(ValueError, match="not the continued step's"):
        x.prepare([], [3, 0], None, follow=True, last=last_step([0, 3], t, x.kv.syncs))
    with pytest.raises(ValueError, match="fed"):  # a piece index past the chunk's pieces
        x.prepare([], [0, -1, 3], None, follow=True, last=last, fed=[-1, -1, 5])


def test_a_prefill_chunk_returns_its_sizes_and_lays_out_its_pieces():
    x, _ = _inputs()
    pieces = [PrefillPiece(1, [1, 2, 3], 0, final=False), PrefillPiece(3, [4, 5], 0)]
    sizes = x.prepare(pieces, [], None, decode_stream="d", prefill_stream="p")
    assert sizes == {"n": 5, "seqs": 2, "max_q_len": 3, "pre_len": 3}
    h = x.pre_meta.host
    assert h["cu"].tolist() == [0, 3, 5] and h["seqs"].tolist() == [1, 3]
    assert h["last"].tolist() == [2, 4] and h["last_pos"].tolist() == [2, 1]
    assert h["final"].tolist() == [0, 1] and h["pos"][:5].tolist() == [0, 1, 2, 0, 1]
    sizes = x.prepare([PrefillPiece(1, [6] * 7, 3)], [], None)
    assert sizes == {"n": 7, "seqs": 1, "max_q_len": 7, "pre_len": 10}


def test_a_mixed_iteration_lays_decode_rows_then_the_chunks_tokens_in_one_array():
    x, _ = _inputs()
    x.prepare([PrefillPiece(0, [1, 2], 0)], [], None)
    sizes = x.prepare([PrefillPiece(2, [3, 4, 5], 0)], [0], [9], mixed=Shape(2, 8))
    assert sizes == {"n": 3, "seqs": 1, "max_q_len": 3, "pre_len": 3, "max_len": 3}
    m = x.mix_meta.host
    assert m["ids"].tolist()[:5] == [9, 0, 3, 4, 5] and m["slots"].tolist()[:6] == [
        0, -1, 2, 2, 2, -1]
    assert m["pos"].tolist()[:5] == [2, 0, 0, 1, 2]


def test_refused_iterations_change_nothing():
    x, t = _inputs()
    x.prepare([PrefillPiece(0, [1, 2], 0)], [], None)
    before = t.lens.copy(), set(t.active), t.alloc.num_free
    for bad in (([], [0, 0], [1, 2]), ([], [0], [100]), ([PrefillPiece(1, [1] * 33, 0)], [], None),
                ([PrefillPiece(0, [1], 5)], [], None), ([PrefillPiece(1, [1], 0)], [0], None)):
        with pytest.raises(ValueError):
            x.prepare(*bad)
    assert (t.lens == before[0]).all() and set(t.active) == before[1]
    assert t.alloc.num_free == before[2]


def test_an_iteration_with_both_parts_is_checked_whole_before_the_chunk_changes_anything():
    from rawgraph.memory.blocks import OutOfBlocks

    x, t = _inputs()
    x.prepare([PrefillPiece(0, [1, 2], 0)], [], None)
    before = t.lens.copy(), set(t.active), t.alloc.num_free
    chunk = [PrefillPiece(1, [5] * 8, 0)]
    for slots, tokens, match in (([0], [100], "token ids"), ([1], [3], "both prefill and "
                                 "decode"), ([0, 0], [3, 3], "distinct")):
        with pytest.raises(ValueError, match=match):  # the decode part fails: no chunk either
            x.prepare(chunk, slots, tokens)
        assert (t.lens == before[0]).all() and set(t.active) == before[1]
    y, u = _inputs(blocks=3)  # slot 0's first block full: its next token takes a new one
    y.prepare([PrefillPiece(0, [1] * 16, 0)], [], None)
    with pytest.raises(OutOfBlocks, match="this iteration needs 3 new KV blocks, 2 free"):
        y.prepare([PrefillPiece(1, [5] * 16, 0), PrefillPiece(2, [5] * 16, 0)], [0], [3])
    assert u.alloc.num_free == 2 and u.active == {0} and u.lens[0] == 16
    last = last_step([0], t, x.kv.syncs)
    with pytest.raises(ValueError, match="not the continued step's"):
        x.prepare(chunk, [2], None, follow=True, last=last)
    assert set(t.active) == before[1]
    for fed in ([2], [-2], [0, 0]):  # a piece index past max_chunk_seqs, below -1; a row too many
        with pytest.raises(ValueError, match="one per row, a chunk's piece index"):
            x.prepare(chunk, [0], None, follow=True, last=last, fed=fed)
        assert (t.lens == before[0]).all() and set(t.active) == before[1]
    sizes = x.prepare(chunk, [0], [3])  # and a good one goes through whole
    assert sizes == {"n": 8, "seqs": 1, "max_q_len": 8, "pre_len": 8, "max_len": 3}
