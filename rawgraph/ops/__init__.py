"""Operations: input checks at the boundary, then one kernel launch each (qkv_rope and
gate_up_silu: up to three when they cannot take the GEMV)."""

from rawgraph.ops.attention import (
                                 Chunk,
                                 PrefillPlan,
                                 decode_attention,
                                 prefill_attention,
                                 workspace_floats,
)
from rawgraph.ops.elementwise import add, silu_mul, stack_gate_up
from rawgraph.ops.embedding import embedding
from rawgraph.ops.fused import gate_up_silu, qkv_rope
from rawgraph.ops.kv import Cache, Extras, kv_append, kv_gather, qkv_views, rope_append
from rawgraph.ops.logits import (
                                 LP_STRIDE,
                                 Logprobs,
                                 RowRules,
                                 RuleState,
                                 process,
                                 rules_mark,
                                 rules_start,
)
from rawgraph.ops.matmul import linear
from rawgraph.ops.norm import fold_norm, rmsnorm
from rawgraph.ops.quantized import Fp8Weight, Int4Weight, fp8_weight, int4_weight
from rawgraph.ops.rope import (
                                 DynamicScaling,
                                 LinearScaling,
                                 Llama3Scaling,
                                 RopeScaling,
                                 YarnScaling,
                                 attention_factor,
                                 inv_freq,
                                 rope,
)
from rawgraph.ops.sampling import Handoff, SamplingParams, argmax, sample
from rawgraph.ops.variant import Variants, choose

__all__ = [
                                 "LP_STRIDE",
                                 "Cache",
                                 "Chunk",
                                 "DynamicScaling",
                                 "Extras",
                                 "Fp8Weight",
                                 "Handoff",
                                 "Int4Weight",
                                 "LinearScaling",
                                 "Llama3Scaling",
                                 "Logprobs",
                                 "PrefillPlan",
                                 "RopeScaling",
                                 "RowRules",
                                 "RuleState",
                                 "SamplingParams",
                                 "Variants",
                                 "YarnScaling",
                                 "add",
                                 "argmax",
                                 "attention_factor",
                                 "choose",
                                 "decode_attention",
                                 "embedding",
                                 "fold_norm",
                                 "fp8_weight",
                                 "gate_up_silu",
                                 "int4_weight",
                                 "inv_freq",
                                 "kv_append",
                                 "kv_gather",
                                 "linear",
                                 "prefill_attention",
                                 "process",
                                 "qkv_rope",
                                 "qkv_views",
                                 "rmsnorm",
                                 "rope",
                                 "rope_append",
                                 "rules_mark",
                                 "rules_start",
                                 "sample",
                                 "silu_mul",
                                 "stack_gate_up",
                                 "workspace_floats",
]
