"""Operations: input checks at the boundary, then one kernel launch each."""

from rawgraph.ops.elementwise import add, silu_mul
from rawgraph.ops.norm import rmsnorm

__all__ = ["add", "rmsnorm", "silu_mul"]
