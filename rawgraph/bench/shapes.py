"""The weight shapes the kernel benchmarks measure: LLaMA-1B's and 8B's projections, (n, k)
= (output features, input features), derived from the presets."""

from __future__ import annotations

from rawgraph.model.config import preset


def _projections(name: str) -> dict[str, tuple[int, int]]:
    c = preset(name)
    return {"qkv": ((c.heads + 2 * c.kv_heads) * c.head_dim, c.hidden),
            "o": (c.hidden, c.heads * c.head_dim),
            "gate_up": (2 * c.intermediate, c.hidden),
            "down": (c.hidden, c.intermediate),
            "lm_head": (c.vocab, c.hidden)}


SHAPES = {name: _projections(name) for name in ("llama-1b", "llama-8b")}
