"""A NumPy float32 forward pass of the decoder, independent of the GPU code.

It computes what Hugging Face's *ForCausalLM of the config's family computes (its q, k, v
biases, its per-head q and k norms, its sliding window), in float32 without intermediate
rounding: the yardstick the GPU model is tested against (with tolerances for its fp16/bf16
storage), and the source of reference greedy tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rawgraph.dtypes import to_float32
from rawgraph.model.config import ModelConfig
from rawgraph.ops.rope import DynamicScaling, attention_factor, inv_freq


@dataclass
class KVState:
    """Keys and values seen so far, per layer: (tokens, kv_heads, head_dim) float32."""

    k: list[np.ndarray] = field(default_factory=list)
    v: list[np.ndarray] = field(default_factory=list)

    @property
    def length(self) -> int:
        """Tokens cached."""
        return self.k[0].shape[0] if self.k else 0


def float_weights(cfg: ModelConfig, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Storage tensors as float32 (bf16 bits decoded); lm_head filled in when tied."""
    w = {k: to_float32(np.asarray(v), cfg.dtype) for k, v in tensors.items()}
    if cfg.tie_embeddings:
        w["lm_head.weight"] = w["model.embed_tokens.weight"]
    return w


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, pos: np.ndarray, freqs: np.ndarray, scale: float) -> np.ndarray:
    half = x.shape[-1] // 2
    a = (pos.astype(np.float32)[:, None] * freqs)[:, None, :]  # fp32 angles, as HF
    c, s = np.cos(a) * np.float32(scale), np.sin(a) * np.float32(scale)  # scale: YaRN's
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def forward(cfg: ModelConfig, w: dict[str, np.ndarray], tokens: np.ndarray,
            state: KVState) -> np.ndarray:
    """Logits (len(tokens), vocab) for tokens following the `state.length` cached ones;
    appends their keys and values to `state`."""
    t = np.asarray(tokens, np.int64)
    start, n = state.length, len(t)
    pos = np.arange(start, start + n)
    if isinstance(cfg.rope_scaling, DynamicScaling) and start + n > cfg.max_position:
        raise ValueError(f"dynamic RoPE past max_position_embeddings = {cfg.max_position} "
                         f"changes its frequencies with the context; not modelled")
    freqs = inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    af = attention_factor(cfg.rope_scaling)
    g = cfg.heads // cfg.kv_heads
    keys = np.arange(start + n)[None, :]
    causal = pos[:, None] >= keys  # (n, all tokens)
    if cfg.sliding_window is not None:  # Hugging Face's: the last `window` keys, itself too
        causal &= keys > pos[:, None] - cfg.sliding_window
    fam = cfg.fam
    x = w["model.embed_tokens.weight"][t]
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        h = _rmsnorm(x, w[p + "input_layernorm.weight"], cfg.rms_eps)
        q, k, v = (h @ w[p + f"self_attn.{x}_proj.weight"].T for x in "qkv")
        if fam.qkv_bias:
            q, k, v = (y + w[p + f"self_attn.{x}_proj.bias"] for y, x in zip((q, k, v), "qkv"))
        q = q.reshape(n, cfg.heads, cfg.head_dim)
        k = k.reshape(n, cfg.kv_heads, cfg.head_dim)
        v = v.reshape(n, cfg.kv_heads, cfg.head_dim)
        if fam.qk_norm:  # over each head, before RoPE
            q = _rmsnorm(q, w[p + "self_attn.q_norm.weight"], cfg.rms_eps)
            k = _rmsnorm(k, w[p + "self_attn.k_norm.weight"], cfg.rms_eps)
        q, k = _rope(q, pos, freqs, af), _rope(k, pos, freqs, af)
        if len(state.k) <= i:
            state.k.append(k)
            state.v.append(v)
        else:
            state.k[i] = np.concatenate([state.k[i], k])
            state.v[i] = np.concatenate([state.v[i], v])
        kk = np.repeat(state.k[i], g, axis=1)  # (all, heads, d): GQA
        vv = np.repeat(state.v[i], g, axis=1)
        s = np.einsum("nhd,mhd->hnm", q, kk) / np.float32(np.sqrt(cfg.head_dim))
        s = np.where(causal[None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hnm,mhd->nhd", s, vv).reshape(n, cfg.q_size)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = _rmsnorm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = _rmsnorm(x, w["model.norm.weight"], cfg.rms_eps)
    return x @ w["lm_head.weight"].T


def greedy(cfg: ModelConfig, w: dict[str, np.ndarray], prompt: list[int],
           steps: int) -> list[int]:
    """Greedy continuation of `prompt`: `steps` new token ids."""
    state = KVState()
    logits = forward(cfg, w, np.asarray(prompt), state)
    out = []
    for _ in range(steps):
        nxt = int(np.argmax(logits[-1]))
        out.append(nxt)
        logits = forward(cfg, w, np.asarray([nxt]), state)
    return out
