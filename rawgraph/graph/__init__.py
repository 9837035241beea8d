"""Graphs: capture, inspect, instantiate, patch in place, update, verify; conditional nodes;
a ledger of the memory each executable graph costs and pins."""

from rawgraph.graph.capture import Capture, CaptureAllocationError, CaptureError, capture
from rawgraph.graph.conditional import WhileGraph, condition_handle, if_node, set_condition_any
from rawgraph.graph.draw import draw
from rawgraph.graph.graph import Graph, GraphExec, Node, UpdateResult
from rawgraph.graph.ledger import GraphMemory, Ledger, free_bytes, graph_pool, trim_graph_pool
from rawgraph.graph.verify import VerifyError, verify

__all__ = ["Capture", "CaptureAllocationError", "CaptureError", "Graph", "GraphExec",
           "GraphMemory", "Ledger", "Node", "UpdateResult", "VerifyError", "WhileGraph",
           "capture", "condition_handle", "draw", "free_bytes", "graph_pool", "if_node",
           "set_condition_any", "trim_graph_pool", "verify"]
