"""A patchable kernel node of one executable graph: the node's handle, its driver parameters,
its own argument storage (what those parameters point at), and the rule that gives its grid
and symbolic arguments from symbol values.

Each executable of a graph has its own records (two executables patch independently). The
rule is the launch's expressions compiled into one small Python function; the patch program
(rawgraph.graph.patch) inlines the same expressions, and falls back to `resolve` only to
raise an error that names the bad value.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from cuda.bindings import driver

from rawgraph.cuda.launch import Launch
from rawgraph.cuda.signature import ArgPack, convert_value, int_bounds
from rawgraph.symbols import Expr

Dims = tuple[int, int, int]
GRID_MAX = (2**31 - 1, 65535, 65535)


@functools.lru_cache(maxsize=4096)
def _compile(src: str) -> Callable[[dict], tuple]:
    return eval(src, {"__builtins__": {}, "min": min, "max": max})  # our own rendered source


def render(t: Any, ref: Callable[[str], str] | None = None) -> str:
    """Python source of a template value (symbols read through `ref`)."""
    return t.render(ref) if isinstance(t, Expr) else repr(t)


class KernelNode:
    """The record of one patchable kernel node (a launch that reads symbols)."""

    # slots: the patch program reads and writes these on every patched node
    __slots__ = ("_rule", "args", "bounds", "case", "dyn", "enabled", "floats", "grid",
                 "grid_dyn", "handle", "kernel", "launch", "pack", "params", "params_grid")

    def __init__(self, handle: Any, launch: Launch):
        self.handle, self.launch, self.kernel = handle, launch, launch.kernel
        params = launch.kernel.sig.params
        self.dyn = tuple(i for i, t in enumerate(launch.args_t) if isinstance(t, Expr))
        self.grid_dyn = any(isinstance(g, Expr) for g in launch.grid_t)
        self.bounds = tuple(int_bounds(params[i]) if params[i].fmt not in "fd" else None
                            for i in self.dyn)
        self.floats = None in self.bounds
        grid_src = ", ".join(map(render, launch.grid_t))
        args_src = "".join(render(launch.args_t[i]) + ", " for i in self.dyn)
        self._rule = _compile(f"lambda e: (({grid_src}), ({args_src}))")
        self.pack = ArgPack(launch.kernel.sig)  # this node's storage: kernelParams point here
        values = launch.pack.values
        self.pack.write(values)
        self.grid: Dims = launch.grid
        self.args: tuple = tuple(values[i] for i in self.dyn)  # the symbolic arguments' values
        self.params: Any = None     # the driver's CUDA_KERNEL_NODE_PARAMS, made on first patch
        self.params_grid: Dims | None = None  # the grid `params` holds
        # a variant's node (launched inside `when`) runs only while its case holds
        self.case = launch.case
        self.enabled: bool = self.case is None or self.case.holds(launch.env)

    def resolve(self, env: dict[str, int]) -> tuple[Dims, tuple]:
        """(grid, symbolic argument values) under `env`, validated; changes nothing. Errors
        name the kernel and the value."""
        name = self.kernel.name
        try:
            grid, args = self._rule(env)
        except KeyError as e:
            raise KeyError(f"{name}: symbol {e.args[0]!r} has no value") from None
        if self.grid_dyn and not all(type(g) is int and 0 < g <= hi
                                     for g, hi in zip(grid, GRID_MAX)):
            raise ValueError(f"{name}: grid {grid} must be integers in [1, {list(GRID_MAX)}]")
        params = self.kernel.sig.params
        return grid, tuple(convert_value(params[i], v, name) for i, v in zip(self.dyn, args))

    def write(self, grid: Dims, args: tuple) -> None:
        """Make (grid, args) this node's values (its storage; the driver's copy is the
        program's to set)."""
        self.grid, self.args = grid, args
        self.pack.write_slots(self.dyn, args)

    def driver_params(self) -> driver.CUDA_KERNEL_NODE_PARAMS:
        """The node's driver parameters; kernelParams point at this record's storage."""
        if self.params is None:
            p = self.params = driver.CUDA_KERNEL_NODE_PARAMS()
            p.func = self.kernel.function
            p.kernelParams = self.pack.address
            p.extra = 0
            p.blockDimX, p.blockDimY, p.blockDimZ = self.launch.block
            p.sharedMemBytes = self.launch.smem
            self.params_grid = None
        return self.params

    def as_launch(self) -> Launch:
        """The captured launch with this node's current values (to launch it eagerly)."""
        return self.launch.clone(self.grid, self.pack.values)
