"""Model families: what sets Qwen2, Qwen3 and Mistral apart from LLaMA, as data.

All four are the same decoder: pre-norm layers of grouped-query attention with RoPE and a SiLU
gated MLP, RMSNorm everywhere. A family row says what its layers add to LLaMA's, and the few
places that read it (the tensors a checkpoint holds, `weights.layout`, the QKV part of a layer,
the NumPy reference, config.json) ask the row, never the family's name:

- `qkv_bias`: the q, k and v projections carry biases (Qwen2); added to the projection's
  rounded outputs before RoPE, by the kernel that rotates them (`ops.rope_append`, or the
  decode GEMV's epilogue).
- `qk_norm`: an RMSNorm over each head of q and of k, with weights of head_dim, before RoPE
  (Qwen3); applied by `ops.rope_append`, which holds a token's heads whole.
- `window`: the config.json field that turns a sliding key window on. rawgraph's attention
  has no window: a model whose window is shorter than its `max_context` is refused, one whose
  window is as long runs exactly (no query reaches a key the window would hide).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """One row of the family table (see the module docstring)."""

    name: str  # config.json's model_type
    architecture: str  # the name in config.json's architectures
    qkv_bias: bool = False
    qk_norm: bool = False
    window: str | None = None  # "sliding_window" (Mistral), "use_sliding_window" (Qwen)

    def layer_tensors(self, q_size: int, kv_size: int, head_dim: int) -> dict[str, tuple]:
        """The tensors a layer has beyond LLaMA's: name under `model.layers.{i}.` -> shape."""
        out: dict[str, tuple] = {}
        if self.qkv_bias:
            out.update({"self_attn.q_proj.bias": (q_size,), "self_attn.k_proj.bias": (kv_size,),
                        "self_attn.v_proj.bias": (kv_size,)})
        if self.qk_norm:
            out.update({"self_attn.q_norm.weight": (head_dim,),
                        "self_attn.k_norm.weight": (head_dim,)})
        return out


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("llama", "LlamaForCausalLM"),
    Family("qwen2", "Qwen2ForCausalLM", qkv_bias=True, window="use_sliding_window"),
    Family("qwen3", "Qwen3ForCausalLM", qk_norm=True, window="use_sliding_window"),
    Family("mistral", "MistralForCausalLM", window="sliding_window"),
)}


def family(name: str) -> Family:
    """The row of family `name` (a model_type); ValueError listing the known ones."""
    if name not in FAMILIES:
        raise ValueError(f"model_type {name!r} is not supported: rawgraph runs "
                         f"{', '.join(FAMILIES)}")
    return FAMILIES[name]
