"""PagedKVCache: KV blocks on the device, block tables and lengths in one device buffer.

The host side (`BlockTables`) decides; `sync(stream)` makes the device agree with one
host-to-device copy per step, after running the block copies that copy-on-write queued. The
copy holds the lengths and the table rows up to the last one that changed, not the whole
table: most steps only lengths change (a 128K-token context's table row is 32 KiB). Graphs
read tables and lengths from the fixed device buffer, so they stay valid across steps without
a patch.
"""

from __future__ import annotations

import math
from typing import Any

import cupy
import numpy as np

from rawgraph.cuda.stream import cupy_stream
from rawgraph.dtypes import storage_dtype
from rawgraph.memory.arena import Arena
from rawgraph.memory.blocks import BlockAllocator, BlockTables
from rawgraph.memory.staging import Staging

# Tokens a block, by default. Prefill attention brings K/V by TMA a box per block a tile:
# 64-token blocks take a box a tile, 16-token ones four, and the boxes' count, not the bytes,
# bounded the kernel (d = 128, 4,096 tokens: 441 us at 16, 350 at 64; time to first token of
# 8,192 tokens, chunks of 2,048: 1B -7 to -9%, 8B -3%; decode steps within 1%). What a
# sequence leaves unused of its last block, under 64 tokens, is the price.
BLOCK_SIZE = 64


class PagedKVCache:
    """K and V caches of shape (layers, num_blocks, block_size, kv_heads * head_dim)."""

    def __init__(self, *, layers: int, kv_heads: int, head_dim: int, block_size: int,
                 num_blocks: int, max_seqs: int, max_blocks_per_seq: int,
                 dtype: str = "float16", arena: Arena | None = None):
        self.layers, self.block_size, self.row = layers, block_size, kv_heads * head_dim
        self.tables = BlockTables(BlockAllocator(num_blocks), block_size, max_seqs,
                                  max_blocks_per_seq)
        shape = (layers, num_blocks, block_size, self.row)
        st = storage_dtype(dtype)
        new = (lambda name, s, d: arena.array(name, s, d)) if arena else (
            lambda name, s, d: cupy.empty(s, d))
        self.k, self.v = new("kv.k", shape, st), new("kv.v", shape, st)
        # lengths and tables: one pinned mirror, one copy per step; lengths first, so that the
        # copy is the lengths and the table rows up to the last one that changed
        fields = {"lens": (np.int32, max_seqs),
                  "tables": (np.int32, max_seqs * max_blocks_per_seq)}
        self._meta = Staging(fields, new("kv.tables", (Staging.size(fields),), np.uint8))
        # device views the kernels take: (max_seqs, max_blocks) tables and (max_seqs,) lengths
        self.block_tables = self._meta.dev["tables"].reshape(max_seqs, max_blocks_per_seq)
        self.seq_lens = self._meta.dev["lens"]
        self.syncs = 0  # sync() calls so far: a changed count means the lengths were rewritten
        self.sync(cupy.cuda.Stream.null)
        self._meta.begin()  # the empty tables are on the device before any stream uses them

    @property
    def nbytes(self) -> int:
        """Device bytes of the K and V blocks."""
        return 2 * math.prod(self.k.shape) * self.k.itemsize

    def layer(self, i: int) -> tuple[cupy.ndarray, cupy.ndarray]:
        """(k, v) of layer i: (num_blocks, block_size, row) each."""
        return self.k[i], self.v[i]

    def sync(self, stream: Any = None, lens: dict[int, int] | None = None) -> None:
        """Run queued copy-on-write block copies, then copy tables and lengths to the device
        (one host-to-device copy), all ordered on `stream`. `lens` overrides the lengths the
        device sees for some slots (a loop on the device that reserved blocks ahead starts
        from the current length and advances it itself)."""
        s = cupy_stream(stream)
        t = self.tables
        with s:
            for src, dst, rows in t.pending_copies:
                self.k[:, dst, :rows] = self.k[:, src, :rows]
                self.v[:, dst, :rows] = self.v[:, src, :rows]
        t.pending_copies.clear()
        h = self._meta.begin()  # the previous step's copy has read the pinned buffer
        self.syncs += 1
        h["lens"][:] = t.lens
        for slot, length in (lens or {}).items():
            h["lens"][slot] = length
        rows = np.fromiter(t.changed, np.int64, len(t.changed))
        t.changed.clear()
        t.lens_moved = False
        mirror = h["tables"].reshape(t.table.shape)
        mirror[rows] = t.table[rows]  # the pinned mirror's other rows already match
        upto = int(rows.max()) + 1 if len(rows) else 0  # table rows this copy carries
        self._meta.push(s, self._meta.offset("tables") + upto * t.table[0].nbytes)
