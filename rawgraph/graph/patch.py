"""Compiled patch programs: `GraphExec.set(...)` for one set of symbol names, as straight-line
Python generated once and cached.

The generic `PatchPlan.apply` walks dictionaries and calls methods per node; on the hot path
of a decode step that walk costs more than the driver call it feeds. A program does the same
work with everything known in advance baked in: the symbols' bounds, the touched nodes, their
grid and argument expressions (inlined), the argument slots to pack, and (for an executable
graph) the node's driver params and the cuGraphExecKernelNodeSetParams call itself. It checks
every value and every derived grid/argument first, then packs and patches only the nodes whose
values change. A failed check re-runs the generic `Launch.resolve`, which raises the error
naming the value; nothing has been written by then.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from rawgraph.cuda.check import CudaError
from rawgraph.graph.plan import PatchPlan, Setter
from rawgraph.symbols import Range

Program = Callable[[dict, Setter], int]
_GRID_OK = "0 < {g}[0] <= 2147483647 and 0 < {g}[1] <= 65535 and 0 < {g}[2] <= 65535"


def _rollback(done: list, setter: Setter) -> None:
    """Put back the nodes a failed program patched (newest first)."""
    for L, node, old in reversed(done):
        L.write(old)
        try:
            setter(node, L)
        except Exception:  # the node that failed: the executable never took its new values
            pass


def _fail(what: str, err: Any) -> None:
    raise CudaError(err, what)


def compile_program(plan: PatchPlan, names: tuple[str, ...],
                    driver: tuple[Any, Callable, Callable] | None = None) -> Program | None:
    """A program setting `names` (in this order) on `plan`; None if a name is unknown.

    `driver` = (exec handle, params_for(L) -> driver params, cuGraphExecKernelNodeSetParams):
    patch the executable inline. Without it, the program calls `setter(node, launch)`.
    """
    if plan.symbols is None or any(n not in plan.symbols.specs for n in names):
        return None  # the generic path raises the right error
    local = {n: f"v{k}" for k, n in enumerate(names)}
    ref = lambda n: local.get(n) or f"env[{n!r}]"  # noqa: E731
    ns: dict[str, Any] = {"plan": plan, "rollback": _rollback, "fail": _fail}
    src = ["def patch(values, setter):"]
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
    # that moves one pointer leaves the nodes of an unchanged length alone), as in plan().
    src += ["    env = plan.env"]
    src += [f"    c{k} = v{k} != env.get({n!r})" for k, n in enumerate(names)]
    src += [f"    if not ({' or '.join(f'c{k}' for k in range(len(names)))}):", "        return 0"]
    reads = {n: set(plan.by_symbol.get(n, ())) for n in names}
    touched = sorted(set().union(*reads.values()))
    recipes, guard = {}, {}
    for j in touched:  # resolve and check everything before writing anything
        _, node, L = plan.entries[j]
        r = recipes[j] = L.recipe(ref)
        deps = [f"c{k}" for k, n in enumerate(names) if j in reads[n]]
        guard[j] = "True" if len(deps) == len(names) else " or ".join(deps)
        ns[f"L{j}"], ns[f"N{j}"], ns[f"B{j}"] = L, node, r["buffer"]
        src.append(f"    if {guard[j]}:")
        if r["floats"]:  # rare: let the generic method convert
            e = "{**env, " + ", ".join(f"{n!r}: v{k}" for k, n in enumerate(names)) + "}"
            src.append(f"        g{j}, d{j} = L{j}.resolve({e})")
            continue
        src.append(f"        g{j} = ({', '.join(r['grid'])})")
        src.append(f"        d{j} = ({''.join(a + ', ' for a in r['args'])})")
        bad = [f"not ({_GRID_OK.format(g=f'g{j}')})"] if r["grid_dyn"] else []
        bad += [f"not {b[0]} <= d{j}[{t}] <= {b[1]}" for t, b in enumerate(r["bounds"])]
        if bad:
            e = "{**env, " + ", ".join(f"{n!r}: v{k}" for k, n in enumerate(names)) + "}"
            src += [f"        if {' or '.join(bad)}:",
                    f"            L{j}.resolve({e})  # raises the error naming the value"]
    src += ["    done = []", "    try:"]
    for j in touched:
        r = recipes[j]
        src += [f"        if ({guard[j]}) and (g{j} != L{j}.grid or d{j} != L{j}.cur[1]):",
                f"            done.append((L{j}, N{j}, L{j}.cur))",
                f"            L{j}.cur = (g{j}, d{j})",
                f"            L{j}.grid = g{j}",
                f"            L{j}._config = None"]
        for t, (fmt, off) in enumerate(r["slots"]):
            ns[f"P{j}_{t}"] = struct.Struct(fmt).pack_into
            src.append(f"            P{j}_{t}(B{j}, {off}, d{j}[{t}])")
        if driver is None:
            src.append(f"            setter(N{j}, L{j})")
            continue
        handle, params_for, set_params = driver
        ns["SET"], ns["H"], ns[f"Q{j}"] = set_params, handle, params_for(ns[f"L{j}"])
        ns[f"W{j}"] = f"patch {ns[f'L{j}'].kernel.name}"
        src += [f"            if g{j} != L{j}.node_grid:",
                f"                Q{j}.gridDimX, Q{j}.gridDimY, Q{j}.gridDimZ = g{j}",
                f"                L{j}.node_grid = g{j}",
                f"            err, = SET(H, N{j}, Q{j})",
                "            if err:",
                f"                fail(W{j}, err)"]
    src += ["        pass", "    except BaseException:", "        rollback(done, setter)",
            "        raise"]
    src += [f"    env[{n!r}] = v{k}" for k, n in enumerate(names)]
    src.append("    return len(done)")
    exec("\n".join(src), ns)  # our own generated source (see above)
    return ns["patch"]
