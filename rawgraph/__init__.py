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
from rawgraph.graph.capture import Capture, CaptureAllocationError, CaptureError, capture
from rawgraph.graph.exec import GraphExec, UpdateResult
from rawgraph.graph.graph import Graph, Node
from rawgraph.graph.verify import VerifyError
from rawgraph.symbols import Pointer, Range, Sym, Symbols, cdiv, smax, smin

__all__ = [
    "Capture", "CaptureAllocationError", "CaptureError", "CompileError", "CudaError", "Graph",
    "GraphExec", "Kernel", "Launch", "Node", "Pointer", "Range", "Sym", "Symbols",
    "UpdateResult", "VerifyError", "available", "capture", "cdiv", "check", "info",
    "new_stream", "ops", "smax", "smin",
]
