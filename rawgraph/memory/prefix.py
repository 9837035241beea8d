"""Automatic prefix caching: the full KV blocks of prompts, found again by their tokens.

A full block is keyed by the key of the block before it and its own token ids, a chain from
the prompt's first block, so one key names a whole prefix (the tokens alone: what a block
holds does not depend on how the request samples). A request takes the longest run of cached
blocks that its prompt starts with and prefills only the rest. Blocks no sequence holds stay
cached, idle in the allocator, until it needs them for fresh ones: then the least recently
used go first (`BlockAllocator`), so caching never refuses what would fit without it.

Keys are Python hashes (deterministic for tuples of ints); a match also compares each block's
tokens and the key before it, so two prefixes that hash alike are never confused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rawgraph.memory.blocks import BlockAllocator

ROOT = 0  # the key before a prompt's first block


@dataclass(frozen=True)
class _Entry:
    parent: int                # the key of the block before (ROOT: the prompt's first)
    tokens: tuple[int, ...]    # the block's token ids
    block: int


class PrefixCache:
    """An index of full KV blocks by prefix over a `BlockAllocator`, which keeps the blocks
    it indexes when their last reference goes and tells it when it evicts one. One per
    allocator (`of`): two indexes over one pool would each miss the other's evictions."""

    @staticmethod
    def of(alloc: BlockAllocator, block_size: int) -> PrefixCache:
        """The allocator's prefix cache, made on first use."""
        return alloc.cache if alloc.cache is not None else PrefixCache(alloc, block_size)

    def __init__(self, alloc: BlockAllocator, block_size: int):
        if alloc.cache is not None:
            raise ValueError("this allocator has a prefix cache already (PrefixCache.of)")
        self.alloc, self.block_size = alloc, block_size
        alloc.cache = self
        self._by_key: dict[int, _Entry] = {}
        self._key_of: dict[int, int] = {}  # block -> its key
        alloc.keep = self._key_of.__contains__
        alloc.evict = self._forget

    @property
    def blocks(self) -> int:
        """Blocks cached (held by sequences or idle)."""
        return len(self._key_of)

    def keys(self, tokens: Sequence[int], n: int, known: list[int]) -> list[int]:
        """The keys of the first n full blocks of `tokens`; `known` holds those computed
        before (a request's, kept between calls) and is extended in place."""
        bs = self.block_size
        for i in range(len(known), n):
            known.append(hash((known[-1] if known else ROOT, tuple(tokens[i * bs:(i + 1) * bs]))))
        return known

    def match(self, tokens: Sequence[int], most: int, known: list[int]) -> list[int]:
        """The blocks of the longest cached run of `tokens`' first full blocks, at most
        `most` of them (a prompt keeps at least its last token to prefill: its logits give
        the first token). Nothing changes but `known` (see `keys`)."""
        self.keys(tokens, most, known)
        bs, out, before = self.block_size, [], ROOT
        for i in range(most):
            e = self._by_key.get(known[i])
            if (e is None or e.parent != before
                    or e.tokens != tuple(tokens[i * bs:(i + 1) * bs])):
                break
            out.append(e.block)
            before = known[i]
        return out

    def insert(self, tokens: Sequence[int], row: Sequence[int], n: int, known: list[int]
               ) -> None:
        """Cache the first n full blocks of a sequence whose tokens start with `tokens` and
        whose table row is `row`, those not cached yet (a prefix another sequence cached
        first keeps that sequence's block; this one's stays its own)."""
        self.keys(tokens, n, known)
        bs, before = self.block_size, ROOT
        for i in range(n):
            key, b = known[i], int(row[i])
            if key not in self._by_key and b not in self._key_of:
                self._by_key[key] = _Entry(before, tuple(tokens[i * bs:(i + 1) * bs]), b)
                self._key_of[b] = key
            before = key

    def _forget(self, block: int) -> None:
        """The allocator evicted `block`: its prefix is no longer cached."""
        key = self._key_of.pop(block, None)
        if key is not None and self._by_key[key].block == block:
            del self._by_key[key]

    def clear(self) -> None:
        """Forget every idle block (they go back to the allocator's free list); blocks that
        sequences hold stay cached."""
        self.alloc.flush()
