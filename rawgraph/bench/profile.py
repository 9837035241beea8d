"""Where a graph's time goes, two ways. Alone: each captured launch timed by itself (a graph
of `reps` copies of it, CUDA events, median), summed per kernel; repeated launches keep small
operands in L2, so these are lower bounds for data that would otherwise come from HBM. In
place: the graph's time less its time with that kernel's nodes disabled, which counts what
the kernel costs where it runs (its data from HBM, its share of the programmatic chain, the
waits it adds) but not what it overlaps with. Kernels that set a conditional node's handle
are left out: the handle means nothing outside its graph (launched alone they fault), and
they are a few microseconds. Per part (`per_label`): the same in place, over every kernel a
labelled part of the step launched (the decoder labels its parts as the read chain names its
links: "qkv", "attention", ..., "lm_head"). Launches inside a conditional node's body (a
prefill chunk's LM head, under its IF node) are not nodes of the graph profiled and do not
appear: their time is in "(gaps)"."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rawgraph.cuda.check import CudaError
from rawgraph.cuda.timing import device_us
from rawgraph.graph.capture import capture
from rawgraph.graph.graph import GraphExec


def per_kernel(ex: GraphExec, stream: Any, reps: int = 10) -> list[dict[str, Any]]:
    """Rows {kernel, launches, us (alone, summed over the graph's launches), us/launch,
    us in place}, slowest alone first."""
    total: dict[str, list[float]] = defaultdict(list)
    nodes: dict[str, list[Any]] = defaultdict(list)
    cache: dict[tuple, float] = {}
    for (node, _), L in zip(ex.graph.records, ex.launches()):
        if _sets_condition(L):
            continue
        key = (L.kernel.name, L.grid, L.block, L.args)
        if key not in cache:
            one = L.clone()
            with capture(stream, name=f"profile {L.kernel.name}") as cap:
                for _ in range(reps):
                    one.launch(stream)
            with cap.graph as g, g.instantiate(upload_stream=stream) as rex:
                cache[key] = device_us(lambda rex=rex: rex.launch(stream), stream, reps=5) / reps
        total[L.kernel.name].append(cache[key])
        nodes[L.kernel.name].append(node)
    rows = [{"kernel": k, "launches": len(v), "us": sum(v), "us/launch": sum(v) / len(v),
             "us in place": _in_place(ex, stream, nodes[k])} for k, v in total.items()]
    return sorted(rows, key=lambda r: -r["us"])


def per_label(ex: GraphExec, stream: Any) -> list[dict[str, Any]]:
    """Rows {part, launches, us in place} per label of the graph's launches
    (`rawgraph.cuda.launch.labelled`; "(unlabelled)" for the rest), in the order each first
    launches, then {part: "(gaps)", us in place: the graph less the parts' sum}: what no
    one part's removal takes away (the boundaries between kernels, and overlap counted on
    both sides). Kernels that set a conditional node's handle are left out, as above."""
    nodes: dict[str, list[Any]] = defaultdict(list)
    for (node, _), L in zip(ex.graph.records, ex.launches()):
        if not _sets_condition(L):
            nodes[L.label or "(unlabelled)"].append(node)
    rows = [{"part": part, "launches": len(ns), "us in place": _in_place(ex, stream, ns)}
            for part, ns in nodes.items()]
    known = [r["us in place"] for r in rows if isinstance(r["us in place"], float)]
    rows.append({"part": "(gaps)", "launches": 0,
                 "us in place": graph_us(ex, stream) - sum(known)})
    return rows


def part_rows(ex: GraphExec, stream: Any) -> list[dict[str, Any]]:
    """`per_label` as rows of a kernel table: {kernel: "part: X", launches, us in place}."""
    return [{"kernel": f"part: {r['part']}", "launches": r["launches"],
             "us in place": r["us in place"]} for r in per_label(ex, stream)]


def _sets_condition(launch: Any) -> bool:
    """Whether a launch sets an IF / WHILE node's condition (a `handle` argument): only
    valid inside its graph."""
    return any(p.name == "handle" for p in launch.kernel.sig.params)


# whole / disabled timings alternated per in-place figure, the median taken. What is left
# is about 1% of the graph (a 1B prefill chunk of 2,048 tokens, 8.9 ms: its embedding, 4 us
# alone, read 72 us in place as a kernel and -16 us as its part, two figures of the same
# node): in place resolves kernels that cost more than that, not the small ones of a long
# graph
ROUNDS = 3


def _in_place(ex: GraphExec, stream: Any, nodes: list[Any]) -> float | str:
    """The graph's us less its us with `nodes` disabled: the median over ROUNDS pairs of the
    two timed one after the other (the machine drifts by a few per cent over a profile); a
    string saying why where the driver will not disable them."""
    diffs = []
    for _ in range(ROUNDS):
        whole = graph_us(ex, stream)
        try:
            ex.enable(nodes, False)
        except CudaError as e:
            return f"n/a: {e}"
        try:
            diffs.append(whole - graph_us(ex, stream))
        finally:
            ex.enable(nodes)
    return sorted(diffs)[len(diffs) // 2]


def graph_us(ex: GraphExec, stream: Any) -> float:
    """Median device us of one replay of `ex` on `stream`."""
    return device_us(lambda: ex.launch(stream), stream, reps=10)
