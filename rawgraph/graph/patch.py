"""Patching an executable graph when symbols change: which kernel nodes read which symbols
(`PatchPlan`), and the one way they are patched, a program generated per set of symbol names.

`GraphExec.set(...)` for one set of names runs straight-line Python generated once and cached:
the symbols' checks, the nodes that read them, their grid and argument expressions inlined,
the argument slots to pack, the node's driver params and the cuGraphExecKernelNodeSetParams
call itself. It checks every value and every derived grid and argument first, then writes
and patches only the nodes whose values change; if the driver refuses a node midway, the
nodes already patched are put back. A failed check calls the node's `resolve`, which raises
the error naming the value; nothing has been written by then. A variant's node (launched
inside `when(case)`) is also enabled or disabled as its case starts or stops holding, after
its params are set. The driver calls and the params come in as arguments, so the planning
and the programs run without a GPU in tests.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from rawgraph.cuda.check import CudaError
from rawgraph.cuda.launch import Launch
from rawgraph.graph.node import GRID_MAX, KernelNode, render
from rawgraph.symbols import Range, Symbols

SetParams = Callable[[Any, Any, Any], tuple]  # (exec handle, node handle, params) -> (err,)
SetEnabled = Callable[[Any, Any, int], tuple]  # (exec handle, node handle, 0/1) -> (err,)
Program = Callable[[dict], int]               # symbol values -> nodes patched
_GRID_OK = " and ".join(f"0 < {{g}}[{i}] <= {hi}" for i, hi in enumerate(GRID_MAX))


class PatchPlan:
    """The patchable nodes of one executable graph, each with its own record
    (`KernelNode`), and the symbol values they compute with now (`env`)."""

    def __init__(self, records: list[tuple[Any, Launch]]):
        self.nodes = [KernelNode(node, L) for node, L in records if L.reads]
        self.at = {i: j for j, i in enumerate(i for i, (_, L) in enumerate(records) if L.reads)}
        tables = {id(n.launch.symbols): n.launch.symbols for n in self.nodes}
        if len(tables) > 1:
            raise ValueError("a graph's launches must share one Symbols table")
        self.symbols: Symbols | None = next(iter(tables.values()), None)
        self.env: dict[str, int] = {}
        self.by_symbol: dict[str, list[int]] = defaultdict(list)
        for j, n in enumerate(self.nodes):
            for name, v in n.launch.env.items():
                if self.env.setdefault(name, v) != v:
                    raise ValueError(f"symbol {name!r} changed during capture "
                                     f"({self.env[name]} then {v})")
                self.by_symbol[name].append(j)

    def launches(self, records: list[tuple[Any, Launch]]) -> list[Launch]:
        """The launches the graph runs now, in capture order, the patchable ones with this
        plan's values (a variant's node only while enabled)."""
        return [self.nodes[self.at[i]].as_launch() if i in self.at else L
                for i, (_, L) in enumerate(records)
                if i not in self.at or self.nodes[self.at[i]].enabled]

    def variants(self) -> list[KernelNode]:
        """The nodes of ops' variants (launched inside `when`): each enabled only while its
        case holds."""
        return [n for n in self.nodes if n.case is not None]

    def program(self, names: tuple[str, ...], handle: Any, set_params: SetParams,
                params_for: Callable[[KernelNode], Any] = KernelNode.driver_params,
                set_enabled: SetEnabled | None = None) -> Program:
        """The program setting `names` (in this order): patches through
        `set_params(handle, node, params_for(node))`, and switches variants' nodes through
        `set_enabled(handle, node, 0 or 1)`. KeyError for a name that is not a symbol of
        this graph."""
        if self.symbols is None:
            raise KeyError(f"this graph has no patchable nodes; cannot set {sorted(names)}")
        unknown = [n for n in names if n not in self.symbols.specs]
        if unknown:
            raise KeyError(f"unknown symbol {unknown[0]!r}; known: {sorted(self.symbols.specs)}")
        if set_enabled is None and self.variants():
            raise ValueError("this graph switches variants' nodes: pass set_enabled")
        return _compile(self, names, handle, set_params, params_for, set_enabled)


def _restore(done: list, handle: Any, set_params: SetParams, params_for: Callable,
             set_enabled: SetEnabled | None) -> None:
    """Put back the nodes a failed program patched or switched (newest first)."""
    for node, grid, args in reversed(done):
        if grid is None:  # a switch: args holds the state before it
            node.enabled = args
            set_enabled(handle, node.handle, int(args))
            continue
        node.write(grid, args)
        p = params_for(node)
        p.gridDimX, p.gridDimY, p.gridDimZ = node.params_grid = grid
        set_params(handle, node.handle, p)  # the node that failed never took its new values


def _fail(what: str, err: Any) -> None:
    raise CudaError(err, what)


def _compile(plan: PatchPlan, names: tuple[str, ...], handle: Any, set_params: SetParams,
             params_for: Callable[[KernelNode], Any],
             set_enabled: SetEnabled | None) -> Program:
    local = {n: f"v{k}" for k, n in enumerate(names)}
    ref = lambda n: local.get(n) or f"env[{n!r}]"  # noqa: E731
    assert plan.symbols is not None
    ns: dict[str, Any] = {"plan": plan, "restore": _restore, "fail": _fail, "SET": set_params,
                          "H": handle, "PF": params_for, "EN": set_enabled}
    src = ["def patch(values):"]
    for k, name in enumerate(names):
        spec = plan.symbols.specs[name]
        ns[f"chk{k}"] = spec.check
        src.append(f"    v{k} = values[{name!r}]")
        if isinstance(spec, Range):
            src.append(f"    if type(v{k}) is not int or not {spec.lo} <= v{k} <= {spec.hi}: "
                       f"v{k} = chk{k}({name!r}, v{k})")
        else:
            src.append(f"    v{k} = chk{k}({name!r}, v{k})")
    # c{k}: symbol k changes. Only the nodes reading a changed symbol are evaluated (a step
    # that moves one pointer leaves the nodes of an unchanged length alone).
    src += ["    env = plan.env"]
    src += [f"    c{k} = v{k} != env.get({n!r})" for k, n in enumerate(names)]
    src += [f"    if not ({' or '.join(f'c{k}' for k in range(len(names)))}):", "        return 0"]
    new_env = "{**env, " + ", ".join(f"{n!r}: v{k}" for k, n in enumerate(names)) + "}"
    reads = {n: set(plan.by_symbol.get(n, ())) for n in names}
    touched = sorted(set().union(*reads.values()))
    guard = {}
    for j in touched:  # resolve and check everything before writing anything
        node = plan.nodes[j]
        deps = [f"c{k}" for k, n in enumerate(names) if j in reads[n]]
        guard[j] = "True" if len(deps) == len(names) else " or ".join(deps)
        ns[f"N{j}"], ns[f"B{j}"], ns[f"K{j}"] = node, node.pack.buffer, node.handle
        src.append(f"    if {guard[j]}:")
        if node.case is not None:  # x{j}: the case's value, e{j}: whether the node runs
            src += [f"        x{j} = {node.case.expr.render(ref)}",
                    f"        e{j} = {node.case.test(f'x{j}')}"]
        if node.floats:  # rare: float arguments computed from symbols; let resolve convert
            src.append(f"        g{j}, d{j} = N{j}.resolve({new_env})")
            continue
        L = node.launch
        src.append(f"        g{j} = ({', '.join(render(g, ref) for g in L.grid_t)})")
        src.append(f"        d{j} = ({''.join(render(L.args_t[i], ref) + ', ' for i in node.dyn)})")
        bad = [f"not ({_GRID_OK.format(g=f'g{j}')})"] if node.grid_dyn else []
        bad += [f"not {b[0]} <= d{j}[{t}] <= {b[1]}" for t, b in enumerate(node.bounds)]
        if bad:
            src += [f"        if {' or '.join(bad)}:",
                    f"            N{j}.resolve({new_env})  # raises the error naming the value"]
    src += ["    done = []", "    try:"]
    for j in touched:
        node = plan.nodes[j]
        ns[f"Q{j}"] = params_for(node)
        ns[f"W{j}"] = f"patch {node.kernel.name}"
        src += [f"        if ({guard[j]}) and (g{j} != N{j}.grid or d{j} != N{j}.args):",
                f"            done.append((N{j}, N{j}.grid, N{j}.args))",
                f"            N{j}.grid, N{j}.args = g{j}, d{j}"]
        for t, i in enumerate(node.dyn):
            ns[f"P{j}_{t}"] = struct.Struct(node.pack.fmts[i]).pack_into
            src.append(f"            P{j}_{t}(B{j}, {node.pack.offset(i)}, d{j}[{t}])")
        src += [f"            if g{j} != N{j}.params_grid:",
                f"                Q{j}.gridDimX, Q{j}.gridDimY, Q{j}.gridDimZ = g{j}",
                f"                N{j}.params_grid = g{j}",
                f"            err, = SET(H, K{j}, Q{j})",
                "            if err:",
                f"                fail(W{j}, err)"]
        if node.case is not None:  # switched after its params are set
            ns[f"V{j}"] = f"switch {node.kernel.name} ({node.case!r})"
            src += [f"        if ({guard[j]}) and e{j} != N{j}.enabled:",
                    f"            done.append((N{j}, None, N{j}.enabled))",
                    f"            err, = EN(H, K{j}, int(e{j}))",
                    "            if err:",
                    f"                fail(V{j}, err)",
                    f"            N{j}.enabled = e{j}"]
    src += ["        pass", "    except BaseException:", "        restore(done, H, SET, PF, EN)",
            "        raise"]
    src += [f"    env[{n!r}] = v{k}" for k, n in enumerate(names)]
    src.append("    return len(done)")
    exec("\n".join(src), ns)  # our own generated source (see above)
    return ns["patch"]
