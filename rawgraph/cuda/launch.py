"""A kernel launch with its own argument storage; eager launch through cuLaunchKernelEx.

A `Launch` keeps the templates it was built from (values or symbol expressions), the values
they resolved to, and rawgraph-owned `void**` storage. Captures observe launches on their
streams and keep the `Launch` as the record of the graph node it became; patching that node
later is the graph layer's business (rawgraph.graph.node), not this one's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from cuda.bindings import driver

from rawgraph.cuda.check import CudaError
from rawgraph.cuda.signature import ArgPack, Signature
from rawgraph.cuda.stream import stream_handle
from rawgraph.symbols import Case, Expr, Symbols, resolve


class Launchable(Protocol):
    """What a launch needs of a kernel (`rawgraph.cuda.kernel.Kernel` is the one there is):
    launches sit below kernels, which launch through them."""

    name: str
    sig: Signature

    @property
    def function(self) -> driver.CUfunction:
        """The driver's function handle (compiled on first use)."""

    def allow_shared_memory(self, nbytes: int) -> None:
        """Opt in to `nbytes` of dynamic shared memory."""

Dims = tuple[int, int, int]
_GRID_MAX = (2**31 - 1, 65535, 65535)
_BLOCK_MAX = (1024, 1024, 64)
_PDL = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION

# Launch observers of this thread: captures subscribe here to learn which node each launch
# became. The CUDA layer knows nothing of graphs beyond this hook.
_local = threading.local()


@contextlib.contextmanager
def programmatic(enabled: bool = True) -> Iterator[None]:
    """Launches in the block (this thread) use programmatic dependent launch: each kernel
    may start while the previous one finishes, running its independent prologue (kernels_cu
    call rg::pdl_start / pdl_wait before reading what came before)."""
    old = getattr(_local, "pdl", False)
    _local.pdl = enabled
    try:
        yield
    finally:
        _local.pdl = old


class labelled:
    """`with labelled("qkv"):` launches recorded in the block (this thread) carry the name
    as their `label`: the part of a step they belong to (the decoder's "qkv", "attention",
    ...), which a profile sums by (`rawgraph.bench.profile.per_label`). The innermost
    block's name wins. A class, not a generator: an eager decode step enters five a layer."""

    __slots__ = ("name", "outer")

    def __init__(self, name: str):
        self.name, self.outer = name, None

    def __enter__(self) -> None:
        self.outer = getattr(_local, "label", None)
        _local.label = self.name

    def __exit__(self, *exc: object) -> None:
        _local.label = self.outer


class when:
    """`with when(case):` launches made in the block (this thread) are one variant of an op,
    taken while `case` (a `rawgraph.symbols.Case`) holds: a capture records them with the
    case, and the executable graph runs their nodes only while it holds (patching enables
    and disables them). Ops enter it (`rawgraph.ops.variant`), only while capturing: an
    eager launch inside runs whatever the case says."""

    __slots__ = ("case", "outer")

    def __init__(self, case: Case):
        self.case, self.outer = case, None

    def __enter__(self) -> None:
        self.outer = getattr(_local, "case", None)
        if self.outer is not None:
            raise ValueError(f"variants do not nest: {self.case!r} inside {self.outer!r}")
        _local.case = self.case

    def __exit__(self, *exc: object) -> None:
        _local.case = self.outer


def pdl_default() -> bool:
    """Whether launches on this thread use programmatic dependent launch by default."""
    return getattr(_local, "pdl", False)


def observers() -> list[Callable[[int, Launch], None]]:
    """This thread's launch observers, each called as fn(stream_handle, launch)."""
    if not hasattr(_local, "observers"):
        _local.observers = []
    return _local.observers


def _as_dims(x: Any, what: str) -> tuple:
    t = tuple(x) if isinstance(x, (tuple, list)) else (x,)
    if not 1 <= len(t) <= 3:
        raise ValueError(f"{what} needs 1 to 3 dimensions, got {x!r}")
    return t + (1,) * (3 - len(t))


def _check_dims(d: tuple, limits: Dims, what: str, kernel: str) -> Dims:
    for v, hi in zip(d, limits):
        if type(v) is not int or not 1 <= v <= hi:
            raise ValueError(f"{kernel}: {what} {d} must be integers in [1, {list(limits)}]")
    return d  # type: ignore[return-value]


def _geometry(kernel: Launchable, grid: Any, block: Any, smem: Any) -> tuple[Dims, Dims]:
    name = kernel.name
    block = _check_dims(_as_dims(block, "block"), _BLOCK_MAX, "block", name)
    if block[0] * block[1] * block[2] > 1024:
        raise ValueError(f"{name}: block {block} has more than 1024 threads")
    if type(smem) is not int or smem < 0:
        raise ValueError(f"{name}: shared memory {smem!r} must be an int >= 0")
    return _as_dims(grid, "grid"), block


def _pdl_attrs() -> list:
    attr = driver.CUlaunchAttribute()
    attr.id = _PDL
    attr.value.programmaticStreamSerializationAllowed = 1
    return [attr]


def launch_now(kernel: Launchable, grid: Any, block: Any, args: tuple, stream: Any = None, *,
               smem: int = 0, pdl: bool = False) -> None:
    """Launch with concrete values and keep no record (the eager fast path).

    Arguments go through per-thread scratch storage of the kernel: the driver copies them
    at launch, so the storage is free again when cuLaunchKernelEx returns.
    """
    grid, block = _geometry(kernel, grid, block, smem)
    grid = _check_dims(grid, _GRID_MAX, "grid", kernel.name)
    values = kernel.sig.convert(args, kernel.name)
    fn = kernel.function
    if smem:
        kernel.allow_shared_memory(smem)
    scratch = getattr(_local, "scratch", None)
    if scratch is None:
        scratch = _local.scratch = {}
    pack, c = scratch.get(kernel) or scratch.setdefault(
        kernel, (ArgPack(kernel.sig), driver.CUlaunchConfig()))
    pack.write(values)
    c.gridDimX, c.gridDimY, c.gridDimZ = grid
    c.blockDimX, c.blockDimY, c.blockDimZ = block
    c.sharedMemBytes = smem
    c.attrs, c.numAttrs = (_pdl_attrs(), 1) if pdl else ([], 0)
    c.hStream = driver.CUstream(stream_handle(stream))
    err, = driver.cuLaunchKernelEx(c, fn, pack.address, 0)
    if err:
        raise CudaError(err, f"launch {kernel.name} grid={grid} block={block}")


class Launch:
    """One launch of one kernel: grid, block, shared memory, arguments, PDL flag.

    `grid` and `args` may hold symbol expressions, evaluated with `symbols`' values now: the
    launch keeps both the templates (`grid_t`, `args_t`, the symbols they `reads`, the values
    `env` they read) and what they came to (`grid`, the stored arguments). `label`: the
    innermost `labelled` name around its making, or None; `case`: the `when` condition
    around it (its node runs only while that holds), or None."""

    def __init__(self, kernel: Launchable, grid: Any, block: Any, args: tuple, *, smem: int = 0,
                 pdl: bool = False, symbols: Symbols | None = None):
        name = kernel.name
        self.kernel = kernel
        self.grid_t, self.block = _geometry(kernel, grid, block, smem)
        self.args_t = tuple(args)
        self.smem, self.pdl, self.symbols = smem, pdl, symbols
        self.label: str | None = getattr(_local, "label", None)
        self.case: Case | None = getattr(_local, "case", None)
        params = kernel.sig.params
        if len(self.args_t) != len(params):
            raise TypeError(f"{name}: expected {len(params)} arguments ({kernel.sig}), "
                            f"got {len(self.args_t)}")
        exprs = [t for t in (*self.grid_t, *self.args_t, self.case)
                 if isinstance(t, (Expr, Case))]
        self.reads = frozenset().union(*(t.symbols() for t in exprs))
        self.env: dict[str, int] = {}
        if self.reads:
            if symbols is None:
                raise ValueError(f"{name}: arguments use symbols {sorted(self.reads)}; "
                                 f"pass symbols=")
            for p, t in zip(params, self.args_t):
                if isinstance(t, Expr) and p.is_blob:
                    raise ValueError(f"{name}: argument {p.name!r} ({p.ctype}) is bytes fixed "
                                     f"at launch; it cannot follow a symbol")
            unset = sorted(self.reads - symbols.env.keys())
            if unset:
                raise KeyError(f"{name}: symbol {unset[0]!r} has no value")
            self.env = {k: symbols.env[k] for k in self.reads}
        self.grid = _check_dims(tuple(resolve(g, self.env) for g in self.grid_t), _GRID_MAX,
                                "grid", name)
        self.pack = ArgPack(kernel.sig)
        self.pack.write(kernel.sig.convert(tuple(resolve(t, self.env) for t in self.args_t),
                                           name))
        self._config: driver.CUlaunchConfig | None = None

    def clone(self, grid: Dims | None = None, args: tuple | None = None) -> Launch:
        """The same launch with its own argument storage: the current values, or `grid` and
        `args` (converted values) instead."""
        new = object.__new__(Launch)
        new.__dict__.update(self.__dict__)
        new.grid = self.grid if grid is None else grid
        new.pack = ArgPack(self.kernel.sig)
        new.pack.write(self.pack.values if args is None else args)
        new._config = None
        return new

    @property
    def args(self) -> tuple:
        """The current argument values."""
        return self.pack.values

    def _make_config(self) -> driver.CUlaunchConfig:
        c = driver.CUlaunchConfig()
        c.gridDimX, c.gridDimY, c.gridDimZ = self.grid
        c.blockDimX, c.blockDimY, c.blockDimZ = self.block
        c.sharedMemBytes = self.smem
        if self.pdl:
            c.attrs, c.numAttrs = _pdl_attrs(), 1
        return c

    def launch(self, stream: Any = None) -> None:
        """Launch with the current values on `stream`."""
        fn = self.kernel.function  # compiles on first use
        if self.smem:
            self.kernel.allow_shared_memory(self.smem)
        if self._config is None:
            self._config = self._make_config()
        h = stream_handle(stream)
        self._config.hStream = driver.CUstream(h)
        err, = driver.cuLaunchKernelEx(self._config, fn, self.pack.address, 0)
        if err:  # (the message is built only on failure: this is the hot path)
            raise CudaError(err, f"launch {self.kernel.name} grid={self.grid} block={self.block}")
        for fn_obs in observers():
            fn_obs(h, self)

    def __repr__(self) -> str:
        return (f"Launch({self.kernel.name}, grid={self.grid}, block={self.block}, "
                f"smem={self.smem}, args={self.args})")
