"""A picture of a graph with matplotlib alone (no graphviz needed): nodes in rows by their
dependency depth, patchable nodes highlighted."""

from __future__ import annotations

from typing import Any

from rawgraph.graph.graph import Graph


def depths(graph: Graph) -> dict[int, int]:
    """Node index -> length of the longest dependency chain leading to it."""
    d = {n.index: 0 for n in graph.nodes}
    edges = graph.edges
    for _ in range(len(d)):  # longest-path relaxation; graphs drawn here are small
        changed = False
        for a, b in edges:
            if d[b] < d[a] + 1:
                d[b], changed = d[a] + 1, True
        if not changed:
            break
    return d


def draw(graph: Graph, ax: Any = None) -> Any:
    """Draw `graph` on a matplotlib Axes (made if not given); returns the Axes."""
    import matplotlib.pyplot as plt

    d = depths(graph)
    rows: dict[int, list[int]] = {}
    for i, k in sorted(d.items()):
        rows.setdefault(k, []).append(i)
    pos = {i: (col - (len(r) - 1) / 2, -k) for k, r in rows.items() for col, i in enumerate(r)}
    if ax is None:
        _, ax = plt.subplots(figsize=(2.6 * max(map(len, rows.values())) + 2,
                                      1.1 * len(rows) + 0.6))
    for a, b in graph.edges:
        ax.annotate("", xy=pos[b], xytext=pos[a],
                    arrowprops={"arrowstyle": "->", "color": "0.4", "shrinkA": 14,
                                "shrinkB": 14})
    for n in graph.nodes:
        label = n.type if n.type != "kernel" else f"{n.kernel}\ngrid {n.grid[:2]}"
        if n.reads:
            label += f"\npatched by {', '.join(sorted(n.reads))}"
        ax.text(*pos[n.index], label, ha="center", va="center", fontsize=8, family="monospace",
                bbox={"boxstyle": "round", "fc": "#ffe9a8" if n.reads else "#e8eef7",
                      "ec": "0.5"})
    xs = [p[0] for p in pos.values()] or [0]
    ax.set_xlim(min(xs) - 1.2, max(xs) + 1.2)
    ax.set_ylim(-len(rows) + 0.4, 0.6)
    ax.set_title(f"graph {graph.name!r}: {len(graph.nodes)} nodes")
    ax.axis("off")
    return ax
