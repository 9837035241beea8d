"""rawgraph: CUDA graphs for LLM inference without PyTorch.

Capture kernels into a graph once, then patch kernel-node arguments and grids in place when
sequence lengths or batch sizes change, instead of capturing again.

    S = Symbols(seq_len=Range(1, 4096))
    S.set(seq_len=17)
    with capture(stream) as cap:
        ops.rmsnorm(x, w, y, rows=S.seq_len, stream=stream, symbols=S)
    ex = cap.graph.instantiate()
    ex.set(seq_len=300)    # patches the node's `rows` argument and grid, nothing else
    ex.launch(stream)
"""

from rawgraph import ops
from rawgraph.cuda.check import CompileError, CudaError, check
from rawgraph.cuda.device import available, info
from rawgraph.cuda.kernel import Kernel
from rawgraph.cuda.launch import Launch
from rawgraph.cuda.stream import new_stream
from rawgraph.cuda.timing import device_us, host_us, wall_ms
from rawgraph.engine.engine import Engine, EngineStats
from rawgraph.engine.request import Request
from rawgraph.engine.runner import Runner
from rawgraph.graph.capture import Capture, CaptureAllocationError, CaptureError, capture
from rawgraph.graph.draw import draw
from rawgraph.graph.graph import Graph, GraphExec, Node, UpdateResult
from rawgraph.graph.verify import VerifyError, verify
from rawgraph.model.checkpoint import Checkpoint
from rawgraph.model.checkpoint import load as load_checkpoint
from rawgraph.model.config import PRESETS, ModelConfig, preset
from rawgraph.model.decoder import Model
from rawgraph.model.inputs import DeviceStateError
from rawgraph.model.safetensors import CheckpointError
from rawgraph.model.step import PrefillPiece, Shape
from rawgraph.model.tokenizer import Tokenizer
from rawgraph.model.weights import random_weights
from rawgraph.ops.sampling import SamplingParams
from rawgraph.symbols import Pointer, Range, Sym, Symbols, cdiv, smax, smin

__all__ = [
    "PRESETS",
    "Capture",
    "CaptureAllocationError",
    "CaptureError",
    "Checkpoint",
    "CheckpointError",
    "CompileError",
    "CudaError",
    "DeviceStateError",
    "Engine",
    "EngineStats",
    "Graph",
    "GraphExec",
    "Kernel",
    "Launch",
    "Model",
    "ModelConfig",
    "Node",
    "Pointer",
    "PrefillPiece",
    "Range",
    "Request",
    "Runner",
    "SamplingParams",
    "Shape",
    "Sym",
    "Symbols",
    "Tokenizer",
    "UpdateResult",
    "VerifyError",
    "available",
    "capture",
    "cdiv",
    "check",
    "device_us",
    "draw",
    "host_us",
    "info",
    "load_checkpoint",
    "new_stream",
    "ops",
    "preset",
    "random_weights",
    "smax",
    "smin",
    "verify",
    "wall_ms",
]
