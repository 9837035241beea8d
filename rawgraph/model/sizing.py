"""How many sequences a GPU holds for a model at a context length: the default batch of
`rawgraph serve`, sized as serving engines size theirs (a share of the device's memory, less
what the weights and the fixed buffers take, divided by what one sequence takes at the
longest context: its KV cache, its rule state and its rows of the decode buffers)."""

from __future__ import annotations

import math

from rawgraph.memory.paged import BLOCK_SIZE
from rawgraph.model.config import ModelConfig
from rawgraph.model.weights import layout, quantized_bytes, quantized_copies
from rawgraph.ops.logits import BIAS_CAP, LP_STRIDE
from rawgraph.ops.matmul import DECODE_ROWS

UTILIZATION = 0.9          # of the device's memory (vLLM's gpu_memory_utilization default)
RESERVE = 2 << 30          # the CUDA context, graphs (the pool's 1 GiB budget), the allocator
ELEMENT = 2                # bytes of a float16 / bfloat16 value


def weight_bytes(cfg: ModelConfig, quantize: str | None = None, keep_16bit: bool = True
                 ) -> int:
    """The weights' bytes on the device (`quantize` "fp8" or "int4": with their quantized
    copies, `weights.quantized_bytes`; `keep_16bit` False: the layers' projections quantized
    alone, and three scratches as large as the largest, `Model(keep_16bit=)`)."""
    copies = quantized_copies(cfg, quantize) if quantize else {}
    alone = {} if keep_16bit else {n: s for n, s in copies.items() if n != "lm_head"}
    sixteen = sum(ELEMENT * math.prod(shape) for name, (shape, _) in layout(cfg).items()
                  if name not in alone)
    scratch = 3 * ELEMENT * max((n * k for n, k in alone.values()), default=0)
    return sixteen + scratch + sum(quantized_bytes(quantize, n, k)  # type: ignore[arg-type]
                                   for n, k in copies.values())


def _row_bytes(cfg: ModelConfig) -> int:
    """One token row of a step's activations, and its head's (logits and their processed
    copy, log-probabilities)."""
    cols = 2 * cfg.hidden + cfg.q_size + 2 * cfg.kv_size + cfg.q_size + 3 * cfg.intermediate
    return ELEMENT * (cols + 2 * cfg.vocab + cfg.hidden) + 8 * LP_STRIDE + 16


def sequence_bytes(cfg: ModelConfig, max_context: int) -> int:
    """What one sequence of up to `max_context` tokens takes: its KV cache, its rule state
    (token counts and bias entries) and its decode row."""
    blocks = math.ceil(max_context / BLOCK_SIZE)
    kv = 2 * cfg.layers * cfg.kv_heads * cfg.head_dim * ELEMENT * blocks * BLOCK_SIZE
    return kv + 4 * cfg.vocab + 12 * BIAS_CAP + _row_bytes(cfg)


def max_batch(cfg: ModelConfig, max_context: int, total: int, free: int, *,
              max_chunk: int = 2048, quantize: str | None = None,
              keep_16bit: bool = True) -> int:
    """The most sequences (at most DECODE_ROWS, a multiple of 8 from 8 up) that fit in
    UTILIZATION of a device with `total` bytes of which `free` are free now, beside the
    weights, a prefill chunk of `max_chunk` rows (twice: a mixed iteration's too) and
    RESERVE (`quantize`, `keep_16bit` as for `weight_bytes`). ValueError when not one
    fits."""
    weights = weight_bytes(cfg, quantize, keep_16bit)
    budget = int(UTILIZATION * total) - (total - free) - weights - RESERVE \
        - 2 * max_chunk * _row_bytes(cfg)
    n = budget // sequence_bytes(cfg, max_context)
    if n < 1:
        need = sequence_bytes(cfg, max_context) + weights + RESERVE
        raise ValueError(f"not one sequence of {max_context} tokens fits: the model needs "
                         f"about {need / 2**30:.1f} GiB, {UTILIZATION:.0%} of the device's "
                         f"{free / 2**30:.1f} GiB free leaves less")
    n = min(DECODE_ROWS, n)
    return n if n < 8 else n - n % 8
