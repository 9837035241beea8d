"""A kernel launch with its own argument storage; eager launch through cuLaunchKernelEx.

A `Launch` keeps the templates it was built from (values or symbol expressions), the values
they resolved to, and rawgraph-owned `void**` storage. Captures observe launches on their
streams and keep the `Launch` as the record of the graph node it became. The expressions of
a launch are compiled into one small Python function, so re-resolving them when a symbol
changes (the patch hot path) costs a call, not a tree walk.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from cuda.bindings import driver

from rawgraph.cuda.check import CudaError
from rawgraph.cuda.signature import ArgPack, Signature, convert_value, int_bounds
from rawgraph.cuda.stream import stream_handle
from rawgraph.symbols import Expr, Symbols


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


@functools.lru_cache(maxsize=4096)
def _compile(src: str) -> Callable[[dict], tuple]:
    return eval(src, {"__builtins__": {}, "min": min, "max": max})  # our own rendered source


def _render(t: Any, ref: Callable[[str], str] | None = None) -> str:
    return t.render(ref) if isinstance(t, Expr) else repr(t)


class Launch:
    """One launch of one kernel: grid, block, shared memory, arguments, PDL flag."""

    def __init__(self, kernel: Launchable, grid: Any, block: Any, args: tuple, *, smem: int = 0,
                 pdl: bool = False, symbols: Symbols | None = None):
        name = kernel.name
        self.kernel = kernel
        self.grid_t, self.block = _geometry(kernel, grid, block, smem)
        self.args_t = tuple(args)
        self.smem, self.pdl, self.symbols = smem, pdl, symbols
        params = kernel.sig.params
        if len(self.args_t) != len(params):
            raise TypeError(f"{name}: expected {len(params)} arguments ({kernel.sig}), "
                            f"got {len(self.args_t)}")
        # which symbols the launch reads: what makes it a patchable node
        exprs = [t for t in (*self.grid_t, *self.args_t) if isinstance(t, Expr)]
        self.reads = frozenset().union(*(t.symbols() for t in exprs))
        self._dyn = tuple(i for i, t in enumerate(self.args_t) if isinstance(t, Expr))
        for i in self._dyn:
            if params[i].is_blob:
                raise ValueError(f"{name}: argument {params[i].name!r} ({params[i].ctype}) is "
                                 f"bytes fixed at launch; it cannot follow a symbol")
        if self._dyn:
            base = tuple(0 if isinstance(t, Expr) else convert_value(p, t, name)
                         for p, t in zip(params, self.args_t))
        else:
            base = kernel.sig.convert(self.args_t, name)
        self.pack = ArgPack(kernel.sig)
        self.pack.write(base)
        self._config: driver.CUlaunchConfig | None = None
        self.node_params: Any = None  # driver params of the graph node this launch patches
        self.node_grid: Dims | None = None  # the grid those params hold
        if not self.reads:
            self.env: dict[str, int] = {}
            self.grid = _check_dims(self.grid_t, _GRID_MAX, "grid", name)
            self.cur = (self.grid, ())  # (grid, values of the symbolic arguments)
            return
        if symbols is None:
            raise ValueError(f"{name}: arguments use symbols {sorted(self.reads)}; pass symbols=")
        self._grid_dyn = any(isinstance(g, Expr) for g in self.grid_t)
        self._bounds = tuple(int_bounds(params[i]) if params[i].fmt not in "fd" else None
                             for i in self._dyn)
        self._floats = None in self._bounds
        grid_src = ", ".join(map(_render, self.grid_t))
        args_src = "".join(_render(self.args_t[i]) + ", " for i in self._dyn)
        self._rule = _compile(f"lambda e: (({grid_src}), ({args_src}))")
        # the symbol values this launch was resolved with (only those it reads)
        self.env = {k: symbols.env[k] for k in self.reads if k in symbols.env}
        self.write(self.resolve(self.env))

    def resolve(self, env: dict[str, int]) -> tuple[Dims, tuple]:
        """(grid, values of the symbolic arguments) under `env`, validated; changes nothing.

        This is the patch hot path: one call of the compiled rule, then bounds checks.
        """
        if not self.reads:
            return self.cur
        try:
            new = self._rule(env)
        except KeyError as e:
            raise KeyError(f"{self.kernel.name}: symbol {e.args[0]!r} has no value") from None
        grid, dyn = new
        if self._grid_dyn and not (0 < grid[0] <= _GRID_MAX[0] and 0 < grid[1] <= _GRID_MAX[1]
                                   and 0 < grid[2] <= _GRID_MAX[2]):
            _check_dims(grid, _GRID_MAX, "grid", self.kernel.name)  # raises, naming the dims
        for i, v, b in zip(self._dyn, dyn, self._bounds):
            if b is not None and not b[0] <= v <= b[1]:
                convert_value(self.kernel.sig.params[i], v, self.kernel.name)  # raises
        if self._floats:  # float parameters computed from integer symbols
            new = grid, tuple(float(x) if b is None else x for x, b in zip(dyn, self._bounds))
        return new

    def write(self, new: tuple[Dims, tuple]) -> None:
        """Make `new` = (grid, symbolic argument values), from resolve, the current values."""
        self.cur = new
        self.grid = new[0]
        self.pack.write_slots(self._dyn, new[1])
        self._config = None

    def recipe(self, ref: Callable[[str], str]) -> dict[str, Any]:
        """What a compiled patch program needs to re-resolve this launch inline: the source of
        its grid and symbolic arguments (symbols read through `ref`), the checks that apply,
        and where each symbolic argument is stored."""
        return {"grid": [_render(g, ref) for g in self.grid_t], "grid_dyn": self._grid_dyn,
                "args": [_render(self.args_t[i], ref) for i in self._dyn],
                "bounds": self._bounds, "floats": self._floats,
                "slots": [(self.pack.fmts[i], self.pack.offset(i)) for i in self._dyn],
                "buffer": self.pack.buffer}

    def clone(self) -> Launch:
        """The same launch with its own argument storage (current values copied)."""
        new = object.__new__(Launch)
        new.__dict__.update(self.__dict__)
        new.pack = ArgPack(self.kernel.sig)
        new.pack.write(self.pack.values)  # (cur, a tuple, is shared safely)
        new.env = dict(self.env)
        new._config = None
        new.node_params = None
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
