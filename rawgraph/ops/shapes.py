"""Input checks at the Python boundary: shapes, dtypes, contiguity, alignment, row counts.

Every op checks its inputs here and raises ValueError naming the problem before launching.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rawgraph.dtypes import kind_of
from rawgraph.symbols import Expr, Range, Symbols, current


def tensor(arr: Any, name: str, shape: tuple | None = None, dtype: str | None = None,
           align: int = 16) -> str:
    """Check one device tensor; returns its rawgraph dtype ('float16'/'bfloat16')."""
    if not hasattr(arr, "data") or not hasattr(arr, "shape"):
        raise ValueError(f"{name} must be a CuPy array, got {type(arr).__name__}")
    kind = kind_of(arr)
    if dtype is not None and kind != dtype:
        raise ValueError(f"{name} is {kind}, expected {dtype}")
    if shape is not None and tuple(arr.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(arr.shape)}, expected {tuple(shape)}")
    if not arr.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if arr.data.ptr % align:
        raise ValueError(f"{name} must be {align}-byte aligned (address {arr.data.ptr:#x})")
    return kind


def array(arr: Any, name: str, dtype: Any, shape: tuple) -> None:
    """ValueError unless arr is a contiguous device array of `dtype` and `shape` (an extent
    None: any)."""
    got = tuple(getattr(arr, "shape", ()))
    if not hasattr(arr, "data") or np.dtype(getattr(arr, "dtype", None)) != np.dtype(dtype) \
            or len(got) != len(shape) or any(s is not None and g != s for g, s in zip(got, shape)) \
            or not arr.flags.c_contiguous:
        want = tuple("n" if s is None else s for s in shape)
        raise ValueError(f"{name} must be a contiguous {np.dtype(dtype)} device array of shape "
                         f"{want}, got {getattr(arr, 'dtype', '?')} {got}".replace("'n'", "n"))


def row_array(arr: Any, name: str, dtype: Any, rows: int) -> None:
    """ValueError unless arr is a contiguous device array of `dtype` and shape (rows,)."""
    array(arr, name, dtype, (rows,))


def multiple(v: int, k: int, what: str) -> None:
    """ValueError unless v % k == 0."""
    if v % k:
        raise ValueError(f"{what} = {v} must be a multiple of {k}")


def top(n: Any, what: str, symbols: Symbols | None) -> int:
    """The largest value `n` takes: itself, or an expression at the top of its symbols'
    ranges (assumes it grows with them, as lengths do)."""
    if not isinstance(n, Expr):
        return n
    symbols = current(symbols)
    if symbols is None:
        raise ValueError(f"{what} is symbolic ({n!r}): pass symbols= (or launch inside "
                         f"`with symbols:`)")
    hi = {}
    for s in n.symbols():
        spec = symbols.specs.get(s)
        if not isinstance(spec, Range):
            raise ValueError(f"{what} reads symbol {s!r}, which needs a Range")
        hi[s] = spec.hi
    return n.eval(hi)


def count(n: Any, capacity: int, what: str, symbols: Symbols | None) -> Any:
    """Check a row/element count, concrete or symbolic, against the buffers' capacity.

    For an expression, every symbol it reads must have a Range, and the expression at the
    top of those ranges (and its current value) must fit: a later patch can then never make
    the kernel touch memory past the buffers. (Assumes the count grows with its symbols,
    as lengths do.)
    """
    if n is None:
        return capacity
    if isinstance(n, Expr):
        hi = top(n, what, symbols)
        if hi > capacity:
            raise ValueError(f"{what} = {n!r} reaches {hi} at the top of its symbols' ranges, "
                             f"more than the buffers hold ({capacity})")
        return n
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= capacity:
        raise ValueError(f"{what} = {n!r} must be an integer in [1, {capacity}]")
    return n


def overlap(a: Any, b: Any) -> bool:
    """Whether two device arrays share any byte."""
    a0, b0 = a.data.ptr, b.data.ptr
    return a0 < b0 + b.nbytes and b0 < a0 + a.nbytes


def rows(arr: Any, name: str, inner: tuple, dtype: str | None = None,
         align: int = 16) -> tuple[str, int]:
    """Check a device array of rows (rows, *inner) whose rows may be strided: a view into a
    wider matrix, such as q, k and v of a fused QKV projection. Inner dimensions must be
    contiguous, the base and the row stride `align`-byte aligned. Returns (dtype, row stride
    in elements)."""
    if not hasattr(arr, "data") or not hasattr(arr, "strides"):
        raise ValueError(f"{name} must be a CuPy array, got {type(arr).__name__}")
    kind = kind_of(arr)
    if dtype is not None and kind != dtype:
        raise ValueError(f"{name} is {kind}, expected {dtype}")
    if tuple(arr.shape[1:]) != tuple(inner) or arr.ndim != len(inner) + 1:
        raise ValueError(f"{name} has shape {tuple(arr.shape)}, expected (rows, "
                         f"{', '.join(map(str, inner))})")
    c_strides = [arr.itemsize * int(np.prod(inner[i + 1:])) for i in range(len(inner))]
    stride = arr.strides[0]
    if list(arr.strides[1:]) != c_strides or stride % arr.itemsize \
            or (arr.shape[0] > 1 and stride < arr.itemsize * int(np.prod(inner))):
        raise ValueError(f"{name} must have contiguous rows (strides {arr.strides})")
    if arr.data.ptr % align or (stride % align and arr.shape[0] > 1):
        raise ValueError(f"{name} must be {align}-byte aligned, rows too (address "
                         f"{arr.data.ptr:#x}, row stride {stride} B)")
    return kind, stride // arr.itemsize if arr.shape[0] > 1 else int(np.prod(inner))
