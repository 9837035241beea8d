"""Verification mode: a graph replay must equal eager launches of the same kernels, bit for bit."""

from __future__ import annotations

from typing import Any

import cupy

from rawgraph.cuda.stream import cupy_stream
from rawgraph.graph.graph import GraphExec


class VerifyError(AssertionError):
    """Graph replay and eager launches disagreed."""


def _snapshot(buffers: list) -> list:
    return [b.copy() for b in buffers]


def _restore(buffers: list, saved: list) -> None:
    for b, s in zip(buffers, saved):
        b[...] = s


def verify(ex: GraphExec, buffers: list, stream: Any = None) -> None:
    """Run `ex` once, then (from the same starting contents of `buffers`) its launches eagerly
    with the parameters `ex` currently holds; compare every buffer byte for byte.

    `buffers` are the CuPy arrays the graph reads and writes. They are left as the eager run
    wrote them. Raises VerifyError naming each buffer that differs and its first differing
    byte; ValueError if the graph has nodes that were not launched through rawgraph.
    """
    kernels = sum(1 for n in ex.graph.nodes if n.type == "kernel")
    others = [n for n in ex.graph.nodes if n.type not in ("kernel", "empty")]
    if others or kernels != len(ex.graph.records):
        raise ValueError(f"verify needs every node to be a rawgraph launch; graph "
                         f"{ex.graph.name!r} has {len(others)} other nodes and "
                         f"{kernels - len(ex.graph.records)} kernels not launched by rawgraph")
    s = cupy_stream(stream)
    with s:
        start = _snapshot(buffers)
        ex.launch(s)
        s.synchronize()
        replay = _snapshot(buffers)
        _restore(buffers, start)
        for launch in ex.launches():
            launch.launch(s)
        s.synchronize()
    bad = []
    for i, (b, r) in enumerate(zip(buffers, replay)):
        diff = cupy.flatnonzero(b.view(cupy.uint8).ravel() != r.view(cupy.uint8).ravel())
        if diff.size:
            bad.append(f"buffer {i} {b.shape} {b.dtype}: {int(diff.size)} bytes differ, "
                       f"first at byte {int(diff[0])}")
    if bad:
        raise VerifyError(f"graph {ex.graph.name!r} replay != eager launches: " + "; ".join(bad))
