"""Operations: input checks at the boundary, then one kernel launch each."""

from rawgraph.ops.elementwise import add, silu_mul
from rawgraph.ops.kv import kv_append, kv_gather
from rawgraph.ops.norm import rmsnorm

__all__ = ["add", "kv_append", "kv_gather", "rmsnorm", "silu_mul"]
