"""Paged KV cache bookkeeping on the host: a block allocator and per-sequence block tables.

Pure Python/NumPy (tested on the CPU). Every operation checks first and changes state only
when it can complete: running out of blocks raises OutOfBlocks and leaves every sequence as
it was.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np


class OutOfBlocks(MemoryError):
    """Not enough free KV blocks for the request."""


class BlockAllocator:
    """Fixed-size blocks with a free list and reference counts (shared prefixes).

    A block a prefix cache keeps (`keep(block)` true) does not go back to the free list when
    its last reference goes: it waits, idle, with its keys and values, for a request to take
    it again (`share`). Idle blocks count as free: `allocate` hands out never-kept blocks
    first, then evicts idle ones, least recently used first (`evict(block)` tells the cache).
    """

    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"need at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self.refs = np.zeros(num_blocks, np.int32)
        self.idle: OrderedDict[int, None] = OrderedDict()  # kept, unreferenced; LRU first
        self.keep: Callable[[int], bool] = lambda b: False
        self.evict: Callable[[int], None] = lambda b: None
        self.cache: Any = None  # the prefix cache that set keep and evict (one at most)
        self.evictions = 0

    def reset(self) -> None:
        """Every block free, handed out from 0 again (only when none is referenced); idle
        blocks are evicted."""
        if (self.refs != 0).any():
            raise ValueError(f"{int((self.refs != 0).sum())} blocks are still referenced")
        self.flush()
        self._free = list(range(self.num_blocks - 1, -1, -1))

    def flush(self) -> None:
        """Evict every idle block to the free list."""
        for b in self.idle:
            self.evict(b)
        self._free.extend(reversed(self.idle))
        self.idle.clear()

    @property
    def num_free(self) -> int:
        """Blocks not referenced by any sequence (idle cached ones included)."""
        return len(self._free) + len(self.idle)

    def allocate(self, n: int, why: str = "") -> list[int]:
        """n fresh blocks (refcount 1), or OutOfBlocks with nothing taken."""
        if n > self.num_free:
            raise OutOfBlocks(f"need {n} KV blocks{why}, only {self.num_free} of "
                              f"{self.num_blocks} are free")
        out = [self._free.pop() for _ in range(min(n, len(self._free)))]
        while len(out) < n:  # the least recently used cached blocks make room
            b, _ = self.idle.popitem(last=False)
            self.evict(b)
            self.evictions += 1
            out.append(b)
        self.refs[out] = 1
        return out

    def share(self, blocks: list[int]) -> None:
        """One more reference to each block (an idle one is taken out of the idle list)."""
        for b in blocks:
            if self.refs[b] == 0:
                if b not in self.idle:
                    raise ValueError(f"block {b} is free: nothing to share")
                del self.idle[b]
        self.refs[blocks] += 1

    def release(self, blocks: list[int]) -> None:
        """One reference less; blocks nobody references go back to the free list, or wait
        idle where the cache keeps them: given in a sequence's order, its last block goes
        first (its first blocks, the ones other prompts share, stay longest)."""
        for b in reversed(blocks):
            if self.refs[b] <= 0:
                raise ValueError(f"block {b} released more often than referenced")
            self.refs[b] -= 1
            if self.refs[b] == 0:
                if self.keep(b):
                    self.idle[b] = None
                else:
                    self._free.append(b)


class BlockTables:
    """Block tables and lengths of up to `max_seqs` sequences, as the kernels read them.

    `table[s, i]` is the block holding tokens [i * block_size, (i + 1) * block_size) of the
    sequence in slot s; `lens[s]` its length. Unused entries are -1 / 0. Block copies needed
    by copy-on-write are queued in `pending_copies` for the device side to run, and the rows
    of `table` changed since the device last copied them are in `changed` (most steps change
    lengths only: a row changes when its sequence starts, ends or enters a new block).
    `lens_moved` says a length changed since then other than by `append_one`'s one token a
    sequence (a decode step's, which a step continuing it moves on by itself, on the device):
    a prefill piece's tokens, say, which the device cannot know of until a copy.
    """

    def __init__(self, allocator: BlockAllocator, block_size: int, max_seqs: int,
                 max_blocks_per_seq: int):
        self.alloc, self.block_size = allocator, block_size
        self.table = np.full((max_seqs, max_blocks_per_seq), -1, np.int32)
        self.lens = np.zeros(max_seqs, np.int32)
        self.active: set[int] = set()
        # sequences started in each slot so far: which one a slot holds (a sequence that
        # ends and a new one in its slot are told apart even at the same length)
        self.started = np.zeros(max_seqs, np.int64)
        # (src block, dst block, rows): the rows of src that hold tokens (the rest were
        # never written; copying them would read uninitialized memory)
        self.pending_copies: list[tuple[int, int, int]] = []
        self.changed: set[int] = set(range(max_seqs))  # rows the device has not seen
        self.lens_moved = True  # lengths the device has not seen (the copy clears both)

    @property
    def max_tokens(self) -> int:
        """The longest sequence a table row can describe."""
        return self.table.shape[1] * self.block_size

    def _blocks(self, s: int) -> list[int]:
        n = -(-int(self.lens[s]) // self.block_size)
        return [int(b) for b in self.table[s, :n]]

    def _check_slot(self, s: int, active: bool) -> None:
        if not 0 <= s < self.table.shape[0]:
            raise ValueError(f"sequence slot {s} outside [0, {self.table.shape[0]})")
        if (s in self.active) != active:
            raise ValueError(f"sequence slot {s} is {'not ' if active else ''}in use")

    def add(self, s: int) -> None:
        """Start an empty sequence in slot s."""
        self._check_slot(s, active=False)
        self.active.add(s)
        self.started[s] += 1
        self.lens[s] = 0
        self.lens_moved = True

    def adopt(self, s: int, blocks: list[int]) -> None:
        """Start a sequence in slot s over `blocks`, full blocks that hold its first
        len(blocks) * block_size tokens already (a cached prefix: shared, never written)."""
        self._check_slot(s, active=False)
        if not 0 < len(blocks) <= self.table.shape[1]:
            raise ValueError(f"sequence {s}: {len(blocks)} blocks for a table row of "
                             f"{self.table.shape[1]}")
        self.alloc.share(blocks)
        self.add(s)
        self.table[s, :len(blocks)] = blocks
        self.lens[s] = len(blocks) * self.block_size
        self.changed.add(s)

    def append(self, s: int, n: int = 1) -> None:
        """Make room for n more tokens of sequence s (new blocks, copy-on-write of a shared
        last block); raises before changing anything if blocks or table space run out."""
        self._check_slot(s, active=True)
        old, new = int(self.lens[s]), int(self.lens[s]) + n
        if new > self.max_tokens:
            raise ValueError(f"sequence {s}: {new} tokens exceed the table's {self.max_tokens}")
        have = -(-old // self.block_size)
        fresh = -(-new // self.block_size) - have
        last = int(self.table[s, have - 1]) if have else -1
        cow = old % self.block_size != 0 and last >= 0 and self.alloc.refs[last] > 1 and n > 0
        got = self.alloc.allocate(fresh + cow, f" to append {n} tokens to sequence {s}")
        if cow:  # the partly filled last block is shared: write into a private copy
            copy = got.pop()
            self.pending_copies.append((last, copy, old % self.block_size))
            self.alloc.release([last])
            self.table[s, have - 1] = copy
        self.table[s, have:have + fresh] = got
        self.lens[s] = new
        self.lens_moved = True
        if got or cow:
            self.changed.add(s)

    def append_one(self, slots: np.ndarray) -> None:
        """One more token for each sequence in `slots` (distinct, active): the decode step's
        growth, vectorized; all or nothing. Rows whose shared last block needs copy-on-write
        take the general path."""
        old = self.lens[slots]
        if old.max() >= self.max_tokens:
            s = int(slots[np.argmax(old >= self.max_tokens)])
            raise ValueError(f"sequence {s}: {int(self.lens[s]) + 1} tokens exceed the "
                             f"table's {self.max_tokens}")
        partial = old % self.block_size != 0
        if partial.all():  # the common step: every row goes on in its last block
            last = self.table[slots, old // self.block_size]
            if self.alloc.refs[last].max() <= 1:  # none of them shared: no copy-on-write
                self.lens[slots] = old + 1
                return
        last = self.table[slots, np.maximum(-(-old // self.block_size) - 1, 0)]
        cow = partial & (last >= 0) & (self.alloc.refs[np.maximum(last, 0)] > 1)
        fresh = slots[~partial]
        if len(fresh) + int(cow.sum()) > self.alloc.num_free:
            raise OutOfBlocks(f"need {len(fresh) + int(cow.sum())} KV blocks for one more "
                              f"token each, only {self.alloc.num_free} are free")
        got = self.alloc.allocate(len(fresh))
        self.table[fresh, old[~partial] // self.block_size] = got
        self.changed.update(fresh.tolist())
        self.lens[slots[~cow]] += 1
        for s in slots[cow]:
            self.append(int(s), 1)

    def reset(self) -> None:
        """End every sequence and hand blocks out in the original order again (0, 1, ...):
        the same requests then land in the same blocks, run after run."""
        for s in list(self.active):
            self.free(s)
        self.alloc.reset()
        self.pending_copies.clear()

    def truncate(self, s: int, n: int) -> None:
        """Shorten sequence s to its first n tokens; blocks past them go back."""
        self._check_slot(s, active=True)
        old = int(self.lens[s])
        if not 0 <= n <= old:
            raise ValueError(f"sequence {s}: cannot truncate {old} tokens to {n}")
        keep, have = -(-n // self.block_size), -(-old // self.block_size)
        self.alloc.release([int(b) for b in self.table[s, keep:have]])
        self.table[s, keep:have] = -1
        self.lens[s] = n
        self.lens_moved = True
        self.changed.add(s)

    def fork(self, src: int, dst: int) -> None:
        """Sequence dst starts as a copy of src, sharing its blocks (copy on write later)."""
        self._check_slot(src, active=True)
        self._check_slot(dst, active=False)
        blocks = self._blocks(src)
        self.alloc.share(blocks)
        self.active.add(dst)
        self.started[dst] += 1
        self.table[dst] = -1
        self.table[dst, :len(blocks)] = blocks
        self.lens[dst] = self.lens[src]
        self.lens_moved = True
        self.changed.add(dst)

    def free(self, s: int) -> None:
        """End sequence s; its blocks go back unless another sequence shares them."""
        self._check_slot(s, active=True)
        self.alloc.release(self._blocks(s))
        self.table[s] = -1
        self.lens[s] = 0
        self.active.discard(s)
        self.lens_moved = True
        self.changed.add(s)
