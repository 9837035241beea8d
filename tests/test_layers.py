"""The package's layers only point down, and no two modules import each other (CPU).

Every import counts: at the top of a file, inside a function, or for type checking only."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "rawgraph"
# lowest first: a module imports only from its own package (file) and lower layers
LAYERS = [("symbols", "dtypes"), ("cuda",), ("memory",), ("graph",), ("ops",), ("model",),
          ("options",), ("engine",), ("serve",), ("bench",), ("demo",), ("cli",)]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _modules() -> dict[str, Path]:
    out = {}
    for f in ROOT.rglob("*.py"):
        parts = f.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def imports() -> dict[str, set[str]]:
    """module -> the rawgraph modules it imports."""
    mods = _modules()
    out: dict[str, set[str]] = {}
    for name, f in mods.items():
        found = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:  # `from pkg import module` imports the module
                    sub = f"{node.module}.{a.name}"
                    found.add(sub if sub in mods else node.module)
        out[name] = {m for m in found if m in mods and m != name}
    return out


def _layer(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def test_layers_only_point_down():
    bad = []
    for mod, deps in imports().items():
        if mod == "rawgraph":  # the public face gathers from every layer
            continue
        for dep in deps:
            a, b = _layer(mod), _layer(dep)
            if b == "" or (a != b and RANK[b] >= RANK[a]):
                bad.append(f"{mod} -> {dep}")
    assert not bad, "imports that do not point down: " + ", ".join(sorted(bad))


def test_every_package_has_a_layer():
    assert {_layer(m) for m in _modules()} - {""} <= set(RANK)


def test_no_import_cycles():
    graph, state, cycles = imports(), {}, []

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                cycles.append(" -> ".join([*path[path.index(d):], d]))
            elif d not in state:
                visit(d, [*path, d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles: " + "; ".join(cycles)
