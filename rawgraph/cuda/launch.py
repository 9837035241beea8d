"""A kernel launch with its own argument storage; eager launch through cuLaunchKernelEx.

A `Launch` keeps the templates it was built from (values or symbol expressions), the values
they resolved to, and rawgraph-owned `void**` storage. Captures observe launches on their
streams and keep the `Launch` as the record of the graph node it became.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from cuda.bindings import driver

from rawgraph.cuda.check import check
from rawgraph.cuda.kernel import Kernel
from rawgraph.cuda.signature import ArgPack
from rawgraph.cuda.stream import stream_handle
from rawgraph.symbols import Expr, Symbols, resolve

Dims = tuple[int, int, int]
_GRID_MAX = (2**31 - 1, 65535, 65535)
_BLOCK_MAX = (1024, 1024, 64)
_PDL = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION

# Launch observers of this thread: captures subscribe here to learn which node each launch
# became. The CUDA layer knows nothing of graphs beyond this hook.
_local = threading.local()


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
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
            raise ValueError(f"{kernel}: {what} {d} must be integers in [1, {list(limits)}]")
    return d  # type: ignore[return-value]


class Launch:
    """One launch of one kernel: grid, block, shared memory, arguments, PDL flag."""

    def __init__(self, kernel: Kernel, grid: Any, block: Any, args: tuple, *, smem: int = 0,
                 pdl: bool = False, symbols: Symbols | None = None):
        self.kernel = kernel
        self.grid_t = _as_dims(grid, "grid")
        self.args_t = tuple(args)
        self.block = _check_dims(_as_dims(block, "block"), _BLOCK_MAX, "block", kernel.name)
        if self.block[0] * self.block[1] * self.block[2] > 1024:
            raise ValueError(f"{kernel.name}: block {self.block} has more than 1024 threads")
        if not isinstance(smem, int) or smem < 0:
            raise ValueError(f"{kernel.name}: shared memory {smem!r} must be an int >= 0")
        self.smem, self.pdl, self.symbols = smem, pdl, symbols
        # which symbols the launch reads: what makes it a patchable node
        self.reads = frozenset().union(*(t.symbols() for t in (*self.grid_t, *self.args_t)
                                         if isinstance(t, Expr)))
        if self.reads and symbols is None:
            raise ValueError(f"{kernel.name}: arguments use symbols {sorted(self.reads)}; "
                             f"pass symbols=")
        self.pack = ArgPack(kernel.sig)
        # the symbol values this launch was resolved with (only those it reads)
        self.env = {k: symbols.env[k] for k in self.reads if k in symbols.env} if symbols else {}
        self.grid, args_v = self.resolve(self.env)
        self.pack.write(args_v)
        self._config = driver.CUlaunchConfig()
        self._set_config()

    def resolve(self, env: dict[str, int] | None) -> tuple[Dims, tuple]:
        """(grid, converted args) under `env`, validated; changes nothing."""
        name = self.kernel.name
        grid = _check_dims(tuple(resolve(g, env) for g in self.grid_t), _GRID_MAX, "grid", name)
        args = self.kernel.sig.convert([resolve(a, env) for a in self.args_t], name)
        return grid, args

    def write(self, grid: Dims, args: tuple, env: dict[str, int] | None = None) -> None:
        """Store resolved values (from resolve) as this launch's current ones."""
        self.grid = grid
        self.pack.write(args)
        if env is not None:
            self.env = {k: env[k] for k in self.reads}
        self._set_config()

    def clone(self) -> Launch:
        """The same launch with its own argument storage (current values copied)."""
        new = object.__new__(Launch)
        new.__dict__.update(self.__dict__)
        new.pack = ArgPack(self.kernel.sig)
        new.pack.write(self.pack.values)
        new.env = dict(self.env)
        new._config = driver.CUlaunchConfig()
        new._set_config()
        return new

    @property
    def args(self) -> tuple:
        """The current argument values."""
        return self.pack.values

    def _set_config(self) -> None:
        c = self._config
        c.gridDimX, c.gridDimY, c.gridDimZ = self.grid
        c.blockDimX, c.blockDimY, c.blockDimZ = self.block
        c.sharedMemBytes = self.smem
        if self.pdl:
            attr = driver.CUlaunchAttribute()
            attr.id = _PDL
            attr.value.programmaticStreamSerializationAllowed = 1
            c.attrs, c.numAttrs = [attr], 1

    def launch(self, stream: Any = None) -> None:
        """Launch with the current values on `stream`."""
        fn = self.kernel.function  # compiles on first use
        if self.smem:
            self.kernel.allow_shared_memory(self.smem)
        h = stream_handle(stream)
        self._config.hStream = driver.CUstream(h)
        check(driver.cuLaunchKernelEx(self._config, fn, self.pack.address, 0),
              f"launch {self.kernel.name} grid={self.grid} block={self.block}")
        for fn_obs in observers():
            fn_obs(h, self)

    def __repr__(self) -> str:
        return (f"Launch({self.kernel.name}, grid={self.grid}, block={self.block}, "
                f"smem={self.smem}, args={self.args})")
