"""Operations: input checks at the boundary, then one kernel launch each (two where a fused
form falls back to its parts: norm_linear and silu_linear beyond the GEMV's 32 rows)."""

from rawgraph.ops.attention import (
    decode_attention,
    decode_workspace,
    prefill_attention,
    workspace_floats,
)
from rawgraph.ops.elementwise import add, silu_mul
from rawgraph.ops.embedding import embedding
from rawgraph.ops.kv import kv_append, kv_gather, rope_append
from rawgraph.ops.linear import linear, norm_linear, silu_linear
from rawgraph.ops.norm import rmsnorm
from rawgraph.ops.rope import Llama3Scaling, inv_freq, rope
from rawgraph.ops.sampling import SamplingParams, argmax, sample

__all__ = ["Llama3Scaling", "SamplingParams", "add", "argmax", "decode_attention",
           "decode_workspace", "embedding",
           "inv_freq", "kv_append", "kv_gather", "linear", "norm_linear", "prefill_attention",
           "rmsnorm", "rope", "rope_append", "sample", "silu_linear", "silu_mul",
           "workspace_floats"]
