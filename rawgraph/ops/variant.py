"""An op's variant chosen by a count (rows, tokens, query rows) that may be a patched symbol.

Ops pick kernels by how many rows they run: the GEMV, the skinny or the tiled GEMM, a row
tile, a split of k. Variants round differently, so the choice must not depend on whether the
count was a plain int or a symbol, nor on the symbol's range: the result at a count is the
one an eager call with that count gives. `by_count` makes it so for a symbolic count: eagerly
it runs the variant of the count's current value; captured, every variant the count's range
reaches is recorded inside `when(Case(count, spans))`, and the executable graph runs each
only while the count lies in its spans (a patch switches them, `rawgraph.graph.patch`).

Which kernel forms the ops may take at all is a table, `Variants`: the defaults are what
rawgraph runs; a benchmark or a test that times or checks another form says so with
`with choose(split_k=False): ...` (or `Model(variants=...)`, which launches under its own),
never by rewriting a module's constants. A graph keeps the forms it was captured with.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

from rawgraph.cuda.launch import observers, when
from rawgraph.graph.capture import capture_status
from rawgraph.symbols import Case, Expr, Range, Symbols, current


@dataclass(frozen=True)
class Variants:
    """The kernel forms the ops may choose from (benchmarks/NOTES.md says why each default
    is what it is). Each switch changes speed only, never a result's bits, except where its
    comment says otherwise."""

    split_k: bool = True  # the wgmma GEMM splits k in clusters where its tiles are few
    persistent: bool = True  # its unsplit tiles in one wave, each block looping over tiles
    gemm_tiles: tuple[tuple[int, int], ...] | None = None  # its unsplit tiles (None: all)
    # rows from which the skinny path takes the wgmma form on Hopper (above 64: never), and
    # the most rows it takes (128: 65-128 rows through its 128-row x tile, not the GEMM;
    # other bits than the GEMM's)
    wgmma_skinny_from: int = 1
    wgmma_skinny_to: int = 64
    fused_silu: bool = True  # SiLU(gate) * up in gate_up's epilogue where the kernel has one
    prefill_wgmma: bool = True  # prefill attention on wgmma on Hopper (else mma.sync)
    prefill_tma: bool = True  # its K/V tiles by TMA (else gathered by cp.async)
    norm_warp_rows_from: int = 1024  # rmsnorm a warp a row where rows can reach this
    chained_attention: bool = True  # decode attention in the programmatic chain
    # every linear takes the tiled GEMM, its tile and split planned for this many rows
    # whatever its count: one kernel and one k order for a row in any batch (the
    # batch-invariant mode's, `Model(batch_invariant=True)`; None: each count its own path;
    # other bits than the default's)
    gemm_rows: int | None = None
    # on Hopper, every linear takes the wgmma skinny GEMM whatever its count (an x tile of
    # 32, 64 or 128 rows by the count, more rows in tiles of 128; k split by the weight's
    # shape alone): a row's k order the same in any batch if wgmma's sums do not depend on
    # its n (tests/ops/test_linear_gpu.py checks it), at the skinny GEMM's rate of reading
    # W rather than the tiled GEMM's. The batch-invariant mode's candidate decode path, not
    # yet measured on a GPU (it takes precedence over gemm_rows; other bits than the
    # default's)
    skinny_always: bool = False


DEFAULT = Variants()
_local = threading.local()


def chosen() -> Variants:
    """The variants in force on this thread: the innermost `choose` block's, else DEFAULT."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else DEFAULT


@contextlib.contextmanager
def choose(variants: Variants | None = None, **changes: Any) -> Iterator[Variants]:
    """Launches inside take `variants` (default: those in force) with `changes` applied
    (TypeError naming an unknown one); the table before is back after the block."""
    v = dataclasses.replace(variants or chosen(), **changes)
    stack = _local.__dict__.setdefault("stack", [])
    stack.append(v)
    try:
        yield v
    finally:
        stack.pop()


# the most values of a count whose variants are listed one by one (a larger range names
# `bound`, as the engine's graphs do with m_max)
MAX_VALUES = 1 << 17


def by_count(count: Any, run: Callable[[int], None], key: Callable[[int], Hashable], *,
             stream: Any = None, symbols: Symbols | None = None) -> None:
    """Launch the variant of an op that a count of `count` takes.

    `run(v)` launches what the op launches for a count of v (its kernels' arguments keep
    `count` itself, symbolic or not); `key(v)` names that variant, equal for counts that
    launch the same kernels. A plain int: run(count). A symbol's expression, eagerly: the
    variant of its current value. Captured by `rawgraph.capture`: the one variant if the
    range reaches one, else each variant (run at the smallest count that takes it) inside
    `when`, its nodes run while the count takes it. (A count below 1 takes the variant
    of 1.)
    """
    if not isinstance(count, Expr):
        run(count)
        return
    table = current(symbols)
    if table is None:
        raise ValueError(f"count {count!r} is symbolic: pass symbols= (or launch inside "
                         f"`with symbols:`)")
    if capture_status(stream) != "active":
        run(max(count.eval(table.env), 1))
        return
    groups = spans(count, table, key)
    if len(groups) == 1:
        run(max(next(iter(groups.values()))[0][0], 1))
        return
    if not observers():
        raise ValueError(f"count {count!r} reaches {len(groups)} variants of this op: capture "
                         f"it with rawgraph.capture, whose graph switches them as the count "
                         f"is patched (a bare stream capture would run them all)")
    for parts in groups.values():
        with when(Case(count, tuple(parts))):
            run(max(parts[0][0], 1))


def spans(count: Expr, table: Symbols, key: Callable[[int], Hashable]
          ) -> dict[Hashable, list[tuple[int, int]]]:
    """key -> the closed intervals of count values that take it, in ascending order, over
    the values `count` reaches: from its value at the bottom of its symbols' ranges to its
    value at the top (a count grows with its symbols, as lengths do). A count below 1 takes
    the variant of 1."""
    lo, hi = {}, {}
    for s in count.symbols():
        spec = table.specs.get(s)
        if not isinstance(spec, Range):
            raise ValueError(f"count {count!r} reads symbol {s!r}, which needs a Range")
        lo[s], hi[s] = spec.lo, spec.hi
    first, last = count.eval(lo), count.eval(hi)
    if last - first >= MAX_VALUES:
        raise ValueError(f"count {count!r} spans {last - first + 1} values, more than the "
                         f"{MAX_VALUES} whose variants are listed: name the bound the kernels "
                         f"are chosen for (m_max, chunk)")
    out: dict[Hashable, list[tuple[int, int]]] = {}
    prev = None
    for v in range(first, last + 1):
        k = key(max(v, 1))
        parts = out.setdefault(k, [])
        if k == prev:
            parts[-1] = (parts[-1][0], v)
        else:
            parts.append((v, v))
        prev = k
    return out
