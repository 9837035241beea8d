"""compute-sanitizer racecheck and kernels in a conditional node's body (benchmarks/NOTES.md,
"Sanitizers"): two race-free kernels reported as racing each other, the case that crashed
the tool, and the same kernels without the IF node.

    compute-sanitizer --tool racecheck python3 -m tests.racecheck_if_body MODE

(as a module: run as a script, its folder would come first on the path and tests/cuda would
hide the `cuda` package that CuPy and cuda-bindings share.)

MODE: `toy` (two race-free kernels of a few lines, each through its own shared memory, in an
IF body), `shipped` (the prefill chunk graph as the engine captures it: the LM head in an IF
node), `inline` (the same head kernels captured without the IF node), `eager`, or
`body:SEQ[:host]`, the IF body cut to the kernels SEQ names in order (e: the gather of the
last rows as a separate kernel, r: rmsnorm of the gathered rows, g: rmsnorm gathering them
itself, l: the LM head's GEMV), `:host` with the condition fixed at 1 instead of set by a
kernel. Seen with compute-sanitizer 2025.3.1 (driver 580.159): `toy` reports a race
between its two kernels on every launch (and computes the right result); `body:er` (with or
without `:host`) crashes on the host in the first copy after the graph's launch; `shipped`
and `body:gl` reported a race between the GEMV and rmsnorm in one run and none in the next;
`inline`, `eager`, `body:e`, `body:r`, `body:rr`, `body:ee`, `body:l`, `body:g`: 0 hazards.
The shipped body is `g`, the LM head and sampling. Prints the first tokens of three replays
(`toy`: whether each is right); a tiny fp16 model, one layer, runs in seconds.
"""

import contextlib
import sys

import numpy as np

import rawgraph.model.decoder as decoder
from rawgraph import ops
from rawgraph.engine.runner import Runner
from rawgraph.model.config import ModelConfig
from rawgraph.model.decoder import Model
from rawgraph.model.step import PrefillPiece
from rawgraph.model.weights import shapes


def _cut_body(seq: str) -> None:
    def head(self, stream):
        a, m, s, w = self.pre, self.inputs.pre_meta.dev, self.max_chunk_seqs, self.w
        kw = {"stream": stream, "symbols": None}
        for c in seq:
            if c == "e":
                ops.embedding(m["last"], a["r"], a["h"][:s], s, **kw)
            elif c == "g":
                ops.rmsnorm(a["r"], w["norm"], a["last"], rows=s, eps=self.cfg.rms_eps,
                            gather=m["last"], **kw)
            elif c == "r":
                ops.rmsnorm(a["h"][:s], w["norm"], a["last"], rows=s, eps=self.cfg.rms_eps,
                            **kw)
            elif c == "l":
                ops.linear(a["last"], w["lm_head"], a["logits"], m=s,
                           m_max=a["last"].shape[0], **kw)
    Model._prefill_head = head


def _inline() -> None:
    decoder.condition_handle = lambda stream: 0
    decoder.set_condition_any = lambda *a, **k: None
    decoder.if_node = lambda *a, **k: contextlib.nullcontext()
    launch = Model.launch

    def on_one_stream(self, shape, sizes, stream, symbols=None, **kw):
        self._body_stream = stream  # the "body" is captured on the main stream
        return launch(self, shape, sizes, stream, symbols, **kw)
    Model.launch = on_one_stream


_TOY = r"""
extern "C" __global__ void reverse(const float* x, float* y) {
    __shared__ float s[256];
    s[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = s[255 - threadIdx.x];
}
extern "C" __global__ void rotate(const float* y, float* z) {
    __shared__ float s[512];
    s[2 * threadIdx.x] = 2.0f * y[threadIdx.x];
    __syncthreads();
    z[threadIdx.x] = s[2 * ((threadIdx.x + 1) % 256)];
}
"""


def toy() -> None:
    """Two kernels that cannot race, one after the other in an IF body whose condition is 1."""
    import cupy

    from rawgraph.cuda.stream import new_stream
    from rawgraph.graph.capture import capture
    from rawgraph.graph.conditional import condition_handle, if_node

    mod = cupy.RawModule(code=_TOY)
    reverse, rotate = mod.get_function("reverse"), mod.get_function("rotate")
    x = cupy.arange(256, dtype=cupy.float32)
    y, z = cupy.zeros_like(x), cupy.zeros_like(x)
    stream, body = new_stream(), new_stream()
    with stream:
        reverse((1,), (256,), (x, y))                  # load both modules before the capture
        rotate((1,), (256,), (y, z))
    stream.synchronize()
    with capture(stream, name="toy") as cap:
        with if_node(stream, condition_handle(stream, default=1), body, name="toy IF"), body:
            reverse((1,), (256,), (x, y))
            rotate((1,), (256,), (y, z))
    ex = cap.graph.instantiate(upload_stream=stream)
    want = 2 * np.roll(np.arange(256, dtype=np.float32)[::-1], -1)
    for i in range(3):
        with stream:
            z.fill(0)
        ex.launch(stream)
        stream.synchronize()
        print("toy", i, "ok" if (z.get() == want).all() else "WRONG", flush=True)
    ex.close()
    cap.graph.close()


def main(mode: str) -> None:
    if mode == "toy":
        return toy()
    if mode.startswith("body:"):
        _, seq, *host = mode.split(":")
        _cut_body(seq)
        if host == ["host"]:
            handle = decoder.condition_handle
            decoder.condition_handle = lambda stream: handle(stream, default=1)
            decoder.set_condition_any = lambda *a, **k: None
    elif mode == "inline":
        _inline()
    elif mode not in ("shipped", "eager"):
        raise SystemExit(__doc__)
    cfg = ModelConfig(vocab=512, hidden=256, layers=1, heads=4, kv_heads=2, head_dim=64,
                      intermediate=512, rope_theta=1e4, dtype="float16")
    rng = np.random.default_rng(0)
    tensors = {k: (rng.standard_normal(s) * 0.05).astype(np.float16)
               for k, s in shapes(cfg).items()}
    model = Model(cfg, tensors, max_batch=2, max_context=256, max_chunk=64, max_chunk_seqs=2)
    runner = Runner(model, graphs=mode != "eager", buckets=[1], chunks=[64])
    prompt = [int(x) for x in rng.integers(0, 512, 50)]
    for i in range(3):
        first, _, _ = runner.run([PrefillPiece(0, prompt, 0)], [], [])
        print(mode, i, first, flush=True)
        model.free(0)
    runner.close()
    model.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
