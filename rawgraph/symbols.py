"""Named symbols (seq_len, past_len, batch, buffer pointers) and expressions over them.

Kernel arguments and grid dims may be expressions such as `cdiv(seq_len, 128)`. An eager
launch evaluates them with the symbols' current values; a captured launch also remembers
them, so the graph can later be patched in place when a symbol changes. Launches read their
table from `symbols=`, or from the current one: `with S:` makes S current on this thread
(as `with stream:` does a CuPy stream), so a sequence of ops need not pass it to each.
"""

from __future__ import annotations

import contextlib
import operator
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any


class Expr:
    """An integer expression over symbols; build with + - * // % and cdiv/smin/smax."""

    def eval(self, env: Mapping[str, int]) -> int:
        """The value under `env` (symbol name -> int)."""
        raise NotImplementedError

    def symbols(self) -> frozenset[str]:
        """Names of the symbols this expression reads."""
        raise NotImplementedError

    def render(self, ref: Callable[[str], str] | None = None) -> str:
        """Python source computing the value; `ref(name)` gives the source reading a symbol
        (default: `e[name]`, from a dict `e` of symbol values)."""
        raise NotImplementedError

    def _op(self, name: str, fn: Callable, other: Any, flip: bool = False) -> Expr:
        other = other if isinstance(other, Expr) else _Const(_int(other))
        return _Op(name, fn, other, self) if flip else _Op(name, fn, self, other)

    def __add__(self, o: Any) -> Expr:
        return self._op("+", operator.add, o)

    def __radd__(self, o: Any) -> Expr:
        return self._op("+", operator.add, o, True)

    def __sub__(self, o: Any) -> Expr:
        return self._op("-", operator.sub, o)

    def __rsub__(self, o: Any) -> Expr:
        return self._op("-", operator.sub, o, True)

    def __mul__(self, o: Any) -> Expr:
        return self._op("*", operator.mul, o)

    def __rmul__(self, o: Any) -> Expr:
        return self._op("*", operator.mul, o, True)

    def __floordiv__(self, o: Any) -> Expr:
        return self._op("//", operator.floordiv, o)

    def __rfloordiv__(self, o: Any) -> Expr:
        return self._op("//", operator.floordiv, o, True)

    def __mod__(self, o: Any) -> Expr:
        return self._op("%", operator.mod, o)


def _int(v: Any) -> int:
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError(f"symbol expressions take integers, got {v!r}")
    return operator.index(v)


@dataclass(frozen=True, eq=False)
class Sym(Expr):
    """A named symbol; its value comes from a Symbols table."""

    name: str

    def eval(self, env: Mapping[str, int]) -> int:
        return env[self.name]

    def symbols(self) -> frozenset[str]:
        return frozenset((self.name,))

    def render(self, ref: Callable[[str], str] | None = None) -> str:
        return ref(self.name) if ref else f"e[{self.name!r}]"

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True, eq=False)
class _Const(Expr):
    value: int

    def eval(self, env: Mapping[str, int]) -> int:
        return self.value

    def symbols(self) -> frozenset[str]:
        return frozenset()

    def render(self, ref: Callable[[str], str] | None = None) -> str:
        return repr(self.value)

    def __repr__(self) -> str:
        return str(self.value)


@dataclass(frozen=True, eq=False)
class _Op(Expr):
    name: str
    fn: Callable[[int, int], int]
    a: Expr
    b: Expr

    def eval(self, env: Mapping[str, int]) -> int:
        return self.fn(self.a.eval(env), self.b.eval(env))

    def symbols(self) -> frozenset[str]:
        return self.a.symbols() | self.b.symbols()

    def render(self, ref: Callable[[str], str] | None = None) -> str:
        a, b = self.a.render(ref), self.b.render(ref)
        if self.name == "cdiv":
            return f"(-(-{a} // {b}))"
        if self.name.isalpha():
            return f"{self.name}({a}, {b})"
        return f"({a} {self.name} {b})"

    def __repr__(self) -> str:
        if self.name.isalpha():
            return f"{self.name}({self.a!r}, {self.b!r})"
        return f"({self.a!r} {self.name} {self.b!r})"


@dataclass(frozen=True, eq=False)
class Case:
    """A condition over symbols: `expr` lies in one of `spans` (closed intervals, ascending).
    Launches made inside `rawgraph.cuda.launch.when(case)` are the variant an op takes while
    it holds: captured, their nodes run only then (a patch enables and disables them)."""

    expr: Expr
    spans: tuple[tuple[int, int], ...]

    def holds(self, env: Mapping[str, int]) -> bool:
        """Whether the condition holds under `env`."""
        v = self.expr.eval(env)
        return any(lo <= v <= hi for lo, hi in self.spans)

    def symbols(self) -> frozenset[str]:
        """Names of the symbols the condition reads."""
        return self.expr.symbols()

    def test(self, value: str) -> str:
        """Python source testing the variable `value` (the expression's value) against the
        spans."""
        return " or ".join(f"{lo} <= {value} <= {hi}" for lo, hi in self.spans) or "False"

    def __repr__(self) -> str:
        return f"{self.expr!r} in {' | '.join(f'[{lo}, {hi}]' for lo, hi in self.spans)}"


def _lift(x: Any) -> Expr:
    return x if isinstance(x, Expr) else _Const(_int(x))


def cdiv(a: Any, b: Any) -> Any:
    """Ceiling division; symbolic when either side is an expression."""
    if isinstance(a, Expr) or isinstance(b, Expr):
        return _Op("cdiv", lambda x, y: -(-x // y), _lift(a), _lift(b))
    return -(-a // b)


def smin(a: Any, b: Any) -> Any:
    """min() that stays symbolic when either side is an expression."""
    if isinstance(a, Expr) or isinstance(b, Expr):
        return _Op("min", min, _lift(a), _lift(b))
    return min(a, b)


def smax(a: Any, b: Any) -> Any:
    """max() that stays symbolic when either side is an expression."""
    if isinstance(a, Expr) or isinstance(b, Expr):
        return _Op("max", max, _lift(a), _lift(b))
    return max(a, b)


def resolve(x: Any, env: Mapping[str, int] | None) -> Any:
    """Evaluate `x` if it is an expression, else return it unchanged."""
    if isinstance(x, Expr):
        if env is None:
            raise ValueError(f"expression {x!r} needs symbol values: pass symbols=")
        try:
            return x.eval(env)
        except KeyError as e:
            raise KeyError(f"expression {x!r} reads symbol {e.args[0]!r}, "
                           f"which has no value") from None
    return x


@dataclass(frozen=True)
class Range:
    """An integer symbol allowed in [lo, hi]: the bounds the graph's buffers were sized for."""

    lo: int
    hi: int

    def check(self, name: str, v: Any) -> int:
        """The value as int, or ValueError/TypeError naming the symbol and its range."""
        if type(v) is not int:  # fast path for plain ints; numpy integers are fine too
            if isinstance(v, bool) or not hasattr(v, "__index__"):
                raise TypeError(f"symbol {name!r} needs an integer, got {type(v).__name__}")
            v = operator.index(v)
        if not self.lo <= v <= self.hi:
            raise ValueError(f"symbol {name!r} = {v} is outside [{self.lo}, {self.hi}], "
                             f"the range the graph's buffers were sized for")
        return v


@dataclass(frozen=True)
class Pointer:
    """A pointer symbol: a device array of at least `nbytes` bytes (and `dtype`, if given)."""

    nbytes: int = 0
    dtype: str | None = None

    def check(self, name: str, v: Any) -> int:
        """The array's device address, after checking its size and dtype."""
        data = getattr(v, "data", None)
        if data is None or not hasattr(data, "ptr"):
            raise TypeError(f"symbol {name!r} needs a device array, got {type(v).__name__}")
        if v.nbytes < self.nbytes:
            raise ValueError(f"symbol {name!r}: array of {v.nbytes} bytes is smaller than "
                             f"the {self.nbytes} bytes the graph was captured with")
        if self.dtype is not None and str(v.dtype) != self.dtype:
            raise TypeError(f"symbol {name!r} needs {self.dtype} data, got {v.dtype}")
        return int(data.ptr)


Spec = Range | Pointer


class Symbols:
    """A table of symbols: their specs (what values are valid) and current values.

    `S = Symbols(seq_len=Range(1, 4096)); S.seq_len` is the symbol; `S.set(seq_len=7)`
    validates and stores; `S.env` maps names to ints (addresses for pointers).
    """

    def __init__(self, **specs: Spec):
        for name, spec in specs.items():
            if not isinstance(spec, (Range, Pointer)):
                raise TypeError(f"symbol {name!r}: spec must be Range or Pointer, got {spec!r}")
        self.specs: dict[str, Spec] = specs
        self.env: dict[str, int] = {}

    def __getattr__(self, name: str) -> Sym:
        if name.startswith("_") or name not in self.__dict__.get("specs", {}):
            raise AttributeError(f"no symbol {name!r}")
        return Sym(name)

    def validate(self, values: Mapping[str, Any]) -> dict[str, int]:
        """Check values against the specs; return them as ints. Raises before changing anything."""
        specs = self.specs
        try:
            return {name: specs[name].check(name, v) for name, v in values.items()}
        except KeyError as e:
            if e.args and e.args[0] in values and e.args[0] not in specs:
                raise KeyError(f"unknown symbol {e.args[0]!r}; known: {sorted(specs)}") from None
            raise

    def set(self, **values: Any) -> None:
        """Validate and store new values."""
        self.env.update(self.validate(values))

    def __enter__(self) -> Symbols:
        """Make this table the current one on this thread (until the block ends)."""
        _stack().append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _stack().pop()


_local = threading.local()


def _stack() -> list[Symbols | None]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def current(symbols: Symbols | None = None) -> Symbols | None:
    """`symbols` if given, else the table a `with` block made current on this thread (None
    outside any, or inside `scope(None)`)."""
    if symbols is not None:
        return symbols
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def scope(symbols: Symbols | None) -> Iterator[None]:
    """`with scope(S):` is `with S:`; `with scope(None):` makes no table current inside
    (launches there take fixed arguments, as a conditional node's body must)."""
    _stack().append(symbols)
    try:
        yield
    finally:
        _stack().pop()
