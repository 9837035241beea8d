"""What the benchmarks feed the models and kernels: LLaMA-1B's and 8B's projections, (n, k) =
(output features, input features), derived from the presets; and the prompts time to first
token is measured on (`prompt`), which benchmarks/torch_reference.py feeds PyTorch too."""

from __future__ import annotations

import random

from rawgraph.model.config import preset


def _projections(name: str) -> dict[str, tuple[int, int]]:
    c = preset(name)
    return {"qkv": ((c.heads + 2 * c.kv_heads) * c.head_dim, c.hidden),
            "o": (c.hidden, c.heads * c.head_dim),
            "gate_up": (2 * c.intermediate, c.hidden),
            "down": (c.hidden, c.intermediate),
            "lm_head": (c.vocab, c.hidden)}


SHAPES = {name: _projections(name) for name in ("llama-1b", "llama-8b")}


def prompt(tokens: int, vocab: int) -> list[int]:
    """`tokens` seeded pseudo-random ids in [1, vocab), the same every run and on both sides
    of a comparison. Not one id repeated: on the H200, held at its power cap through a long
    prefill, cuBLAS's GEMMs draw a quarter less energy when every row of x is the same (8B
    gate_up at 2,048 rows: 3.9 against 5.4 J for ten, 1,665 against 1,440 MHz), so such a
    prompt ran PyTorch's whole forward 16% faster than real text does (48.3 against 56.1
    ms) and ours 2% (benchmarks/NOTES.md, "How to measure")."""
    if tokens < 1 or vocab < 2:
        raise ValueError(f"prompt of {tokens} tokens over a vocabulary of {vocab}")
    rng = random.Random(tokens)
    return [rng.randrange(1, vocab) for _ in range(tokens)]
