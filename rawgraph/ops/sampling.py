"""Choosing tokens on the device: greedy argmax (no host sync)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rawgraph.cuda.kernel import Kernel
from rawgraph.ops import shapes
from rawgraph.symbols import Symbols

ARGMAX = {"float16": Kernel("argmax", "argmax_f16",
                            "const __half* logits, int* out, int rows, int vocab"),
          "bfloat16": Kernel("argmax", "argmax_bf16",
                             "const __nv_bfloat16* logits, int* out, int rows, int vocab")}


def argmax(logits: Any, out: Any, rows: Any = None, *, stream: Any = None,
           symbols: Symbols | None = None) -> None:
    """out[r] = argmax(logits[r]) for r < rows (smallest index on ties; NaNs skipped)."""
    if getattr(logits, "ndim", 0) != 2:
        raise ValueError(f"logits must be (rows, vocab), got {getattr(logits, 'shape', '?')}")
    dt = shapes.tensor(logits, "logits", align=2)
    if not hasattr(out, "data") or np.dtype(out.dtype) != np.int32 \
            or out.shape != logits.shape[:1]:
        raise ValueError(f"out must be int32 of shape {logits.shape[:1]}")
    rows = shapes.count(rows, logits.shape[0], "rows", symbols)
    ARGMAX[dt].launch(rows, 1024, (logits, out, rows, logits.shape[1]), stream,
                      symbols=symbols)
