"""Compiled patch programs: `ExecGraph.set(...)` for one set of symbol names, as straight-line
Python generated once and cached.

The generic `PatchPlan.apply` walks dictionaries and calls a method per node; on the hot
path of a decode step that walk costs more than the driver call it feeds. A program does the
same work with the symbols' bounds, the touched nodes and their argument slots baked in:
validate every value and every derived grid/argument first, then pack and patch only the
nodes whose values change. Any check that fails re-runs the generic method, which raises the
named error; nothing has been written by then.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

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


def compile_program(plan: PatchPlan, names: tuple[str, ...]) -> Program | None:
    """A program setting `names` (in this order) on `plan`; None if a name is unknown."""
    if plan.symbols is None or any(n not in plan.symbols.specs for n in names):
        return None  # the generic path raises the right error
    ns: dict[str, Any] = {"plan": plan, "rollback": _rollback}
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
    same = " and ".join(f"v{k} == env.get({n!r})" for k, n in enumerate(names))
    src += ["    env = plan.env", f"    if {same}:", "        return 0",
            "    e = {**env, " + ", ".join(f"{n!r}: v{k}" for k, n in enumerate(names)) + "}"]
    touched = sorted({j for n in names for j in plan.by_symbol.get(n, ())})
    for j in touched:  # resolve and check everything before writing anything
        _, node, L = plan.entries[j]
        r = L.recipe()
        ns[f"L{j}"], ns[f"N{j}"], ns[f"R{j}"], ns[f"B{j}"] = L, node, r["rule"], r["buffer"]
        if r["floats"]:
            src.append(f"    g{j}, d{j} = L{j}.resolve(e)")
            continue
        src.append(f"    g{j}, d{j} = R{j}(e)")
        bad = [f"not ({_GRID_OK.format(g=f'g{j}')})"] if r["grid_dyn"] else []
        bad += [f"not {b[0]} <= d{j}[{t}] <= {b[1]}" for t, b in enumerate(r["bounds"])]
        if bad:
            src.append(f"    if {' or '.join(bad)}:")
            src.append(f"        L{j}.resolve(e)  # raises the error naming the value")
        for t, (_, fmt, _) in enumerate(r["slots"]):
            ns[f"P{j}_{t}"] = struct.Struct(fmt).pack_into
    src += ["    done = []", "    try:"]
    for j in touched:
        _, _, L = plan.entries[j]
        src += [f"        if g{j} != L{j}.grid or d{j} != L{j}.cur[1]:",
                f"            done.append((L{j}, N{j}, L{j}.cur))",
                f"            L{j}.cur = (g{j}, d{j})",
                f"            L{j}.grid = g{j}",
                f"            L{j}._config = None"]
        src += [f"            P{j}_{t}(B{j}, {off}, d{j}[{t}])"
                for t, (_, _, off) in enumerate(L.recipe()["slots"])]
        src.append(f"            setter(N{j}, L{j})")
    src += ["        pass", "    except BaseException:", "        rollback(done, setter)",
            "        raise", "    plan.env = e", "    return len(done)"]
    exec("\n".join(src), ns)  # our own generated source (see above)
    return ns["patch"]
