"""Token embedding lookup (ids on the device)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rawgraph.cuda.kernel import Kernel
from rawgraph.ops import shapes
from rawgraph.symbols import Symbols

_SIG = "const int* ids, const {t}* table, {t}* out, int n, int dim, int vocab"
EMBEDDING = {"float16": Kernel("embedding", "embedding_f16", _SIG.format(t="__half")),
             "bfloat16": Kernel("embedding", "embedding_bf16", _SIG.format(t="__nv_bfloat16"))}


def embedding(ids: Any, table: Any, out: Any, n: Any = None, *, stream: Any = None,
              symbols: Symbols | None = None) -> None:
    """out[t] = table[ids[t]] for t < n (n may be symbolic); ids outside the vocab give zeros."""
    if getattr(table, "ndim", 0) != 2:
        raise ValueError(f"table must be (vocab, dim), got {getattr(table, 'shape', '?')}")
    vocab, dim = table.shape
    shapes.multiple(dim, 8, "dim")
    dt = shapes.tensor(table, "table")
    if getattr(out, "ndim", 0) != 2 or out.shape[1] != dim:
        raise ValueError(f"out must be (tokens, {dim}), got {getattr(out, 'shape', '?')}")
    shapes.tensor(out, "out", dtype=dt)
    if not hasattr(ids, "data") or np.dtype(ids.dtype) != np.int32 or ids.shape != out.shape[:1]:
        raise ValueError(f"ids must be int32 of shape {out.shape[:1]}")
    n = shapes.count(n, out.shape[0], "n", symbols)
    EMBEDDING[dt].launch(n, 128, (ids, table, out, n, dim, vocab), stream, symbols=symbols)
