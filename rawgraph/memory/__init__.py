"""Memory that graphs can rely on: a persistent arena, shared scratch, a paged KV cache, mapped
host memory that kernels write a step's outputs into, and pinned staging for host-to-device
copies. Graphs freeze addresses, so memory is planned, not allocated on the way."""

from rawgraph.memory.arena import Arena
from rawgraph.memory.blocks import BlockAllocator, BlockTables, OutOfBlocks
from rawgraph.memory.graphalloc import GraphAllocator
from rawgraph.memory.layout import ArenaFullError, Layout, Region
from rawgraph.memory.mapped import MappedArray
from rawgraph.memory.paged import PagedKVCache
from rawgraph.memory.prefix import PrefixCache
from rawgraph.memory.scratch import Scratch, ScratchBusyError, ScratchSet
from rawgraph.memory.staging import Staging

__all__ = ["Arena", "ArenaFullError", "BlockAllocator", "BlockTables", "GraphAllocator",
           "Layout", "MappedArray", "OutOfBlocks", "PagedKVCache", "PrefixCache", "Region",
           "Scratch", "ScratchBusyError", "ScratchSet", "Staging"]
