"""The engine: continuous batching over bucketed decode graphs and chunked prefill graphs."""

from rawgraph.engine.engine import Engine, EngineStats
from rawgraph.engine.pool import GraphPool
from rawgraph.engine.request import Request
from rawgraph.engine.runner import Runner
from rawgraph.engine.scheduler import Scheduler

__all__ = ["Engine", "EngineStats", "GraphPool", "Request", "Runner", "Scheduler"]
