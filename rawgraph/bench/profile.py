"""Where a graph's time goes: each captured launch timed alone (a graph of `reps` copies of
it, CUDA events, median), summed per kernel. Repeated launches keep small operands in L2,
so per-kernel times are lower bounds for data that would otherwise come from HBM. Kernels
that set a conditional node's handle are left out: the handle means nothing outside its
graph (launched alone they fault), and they are a few microseconds."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rawgraph.cuda.timing import device_us
from rawgraph.graph.capture import capture
from rawgraph.graph.graph import GraphExec


def per_kernel(ex: GraphExec, stream: Any, reps: int = 10) -> list[dict[str, Any]]:
    """Rows {kernel, launches, us (sum over the graph's launches), us/launch}, slowest first."""
    total: dict[str, list[float]] = defaultdict(list)
    cache: dict[tuple, float] = {}
    for L in ex.launches():
        if any(p.name == "handle" for p in L.kernel.sig.params):
            continue  # sets an IF / WHILE node's condition: only valid inside its graph
        key = (L.kernel.name, L.grid, L.block, L.args)
        if key not in cache:
            one = L.clone()
            with capture(stream, name=f"profile {L.kernel.name}") as cap:
                for _ in range(reps):
                    one.launch(stream)
            with cap.graph as g, g.instantiate(upload_stream=stream) as rex:
                cache[key] = device_us(lambda rex=rex: rex.launch(stream), stream, reps=5) / reps
        total[L.kernel.name].append(cache[key])
    rows = [{"kernel": k, "launches": len(v), "us": sum(v), "us/launch": sum(v) / len(v)}
            for k, v in total.items()]
    return sorted(rows, key=lambda r: -r["us"])
