"""Patch plan: which nodes read which symbols, and what a change of symbols patches.

Pure bookkeeping over `Launch` records; the driver call that applies a patch is passed in,
so the planning logic is testable without a GPU.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from rawgraph.cuda.launch import Launch
from rawgraph.symbols import Symbols

Setter = Callable[[Any, Launch], None]  # (node handle, launch with new values) -> None


class PatchPlan:
    """The patchable nodes of one executable graph, each with its own argument storage."""

    def __init__(self, records: list[tuple[Any, Launch]]):
        # (record index, node, private copy of the launch): the copy's storage is what the
        # executable graph is patched from, independent of other executables of the graph.
        self.entries = [(i, node, launch.clone()) for i, (node, launch) in enumerate(records)
                        if launch.reads]
        tables = {id(L.symbols): L.symbols for _, _, L in self.entries}
        if len(tables) > 1:
            raise ValueError("a graph's launches must share one Symbols table")
        self.symbols: Symbols | None = next(iter(tables.values()), None)
        self.env: dict[str, int] = {}
        self.by_symbol: dict[str, list[int]] = defaultdict(list)
        for j, (_, _, L) in enumerate(self.entries):
            for name, v in L.env.items():
                if self.env.setdefault(name, v) != v:
                    raise ValueError(f"symbol {name!r} changed during capture "
                                     f"({self.env[name]} then {v})")
                self.by_symbol[name].append(j)

    def plan(self, values: dict[str, Any]) -> tuple[dict[str, int], list[tuple[int, tuple]]]:
        """Validate new symbol values; return (new env, [(entry, (grid, dyn args))] that change).

        Raises (KeyError, TypeError, ValueError) before anything is written.
        """
        if self.symbols is None:
            raise KeyError(f"this graph has no patchable nodes; cannot set {sorted(values)}")
        new = self.symbols.validate(values)
        old = self.env
        changed = [k for k, v in new.items() if old.get(k) != v]
        env = {**old, **new}
        if not changed:
            return env, []
        by = self.by_symbol
        touched = by.get(changed[0], ()) if len(changed) == 1 else sorted(
            {j for k in changed for j in by.get(k, ())})
        todo = []
        entries = self.entries
        for j in touched:
            L = entries[j][2]
            cur = L.resolve(env)
            if cur != L.cur:
                todo.append((j, cur))
        return env, todo

    def apply(self, values: dict[str, Any], setter: Setter) -> int:
        """Patch the nodes whose grid or arguments change; returns how many were patched.

        All values are validated first; if the driver refuses a node midway, the nodes already
        patched are put back and the error re-raised.
        """
        env, todo = self.plan(values)
        entries = self.entries
        done: list[tuple[int, tuple]] = []
        try:
            for j, cur in todo:
                _, node, L = entries[j]
                old = L.cur
                L.write(cur)
                try:
                    setter(node, L)
                except BaseException:
                    L.write(old)
                    raise
                done.append((j, old))
        except BaseException:
            for j, old in reversed(done):
                _, node, L = entries[j]
                L.write(old)
                setter(node, L)
            raise
        self.env = env
        return len(todo)

    def launches(self, records: list[tuple[Any, Launch]]) -> list[Launch]:
        """All launches in capture order, the patchable ones with this plan's current values."""
        mine = {i: L for i, _, L in self.entries}
        return [mine.get(i, L) for i, (_, L) in enumerate(records)]
