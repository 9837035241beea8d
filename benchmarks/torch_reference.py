"""The PyTorch peer of rawgraph's benchmarks: the same shapes, measured where torch is importable.

rawgraph never imports torch; `rawgraph bench` runs this script in a subprocess (after its
own rows, so the two never share the GPU) and puts the numbers beside its own. Run alone:

    python3 benchmarks/torch_reference.py decode --preset llama-1b --cases 1:1024,64:2048
        [--compile]       # also torch.compile'd (inductor, default mode) at B=1, the
                          # shortest context
    python3 benchmarks/torch_reference.py attention --cases 4096:128,2048:64
    python3 benchmarks/torch_reference.py matmul --cases 512:6144:2048,4096:4096:4096
    python3 benchmarks/torch_reference.py prefill --preset llama-1b --cases 512,2048

Prints one JSON list of rows on stdout (progress on stderr). What each measures:

- decode: one decode step of the preset's decoder (LLaMA, or its family's: Qwen2's q, k, v
  biases in the projection, Qwen3's head norms after it, as transformers computes them) with
  random bf16 weights and a static KV cache of exactly `context` positions per row (SDPA
  reads all of it, as rawgraph's step at that context does): embedding, per layer RMSNorm,
  fused QKV projection (cuBLAS), RoPE, the new
  K/V written into the cache, SDPA (GQA), output projection, RMSNorm, fused gate/up, SiLU,
  down projection, then the final norm, LM head and greedy pick (RoPE without llama3's
  frequency scaling: the same work). Captured once per case in torch.cuda.CUDAGraph; the
  median of per-replay CUDA-event times.
- attention: causal SDPA, 32 query heads over 8 KV heads, batch 1, per backend (flash,
  cuDNN, memory-efficient); TFLOP/s counts the causal half (2 S^2 d heads).
- matmul: bf16 (M, K) x (N, K)^T through F.linear (cuBLAS).
- prefill: one forward of an S-token prompt (no cache, SDPA's default backend choice,
  cuBLAS), the LM head on the last position only: the time to first token.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from typing import Any

import torch
import torch.nn.functional as F

DT = torch.bfloat16
DEV = "cuda"


def _log(msg: str) -> None:
    print(f"torch_reference: {msg}", file=sys.stderr, flush=True)


def _median_ms(fn, reps: int = 20, warmup: int = 5) -> float:
    """Median of per-call CUDA-event times, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _shape(name: str) -> Any:
    """The family and dimensions of rawgraph's preset `name` (rawgraph imports no torch;
    this script may import rawgraph)."""
    from rawgraph.model.config import preset

    return preset(name)


class Decoder:
    """Random bf16 weights (scaled so activations stay finite) and the forward passes."""

    def __init__(self, s: Any, seed: int = 0):
        self.s = s
        g = torch.Generator(device=DEV).manual_seed(seed)

        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, device=DEV, dtype=DT, generator=g) / math.sqrt(shape[-1])

        qkv = (s.heads + 2 * s.kv_heads) * s.head_dim
        fam = s.fam  # the family's extras: Qwen2's q, k, v biases, Qwen3's head norms
        self.embed = w(s.vocab, s.hidden)
        self.layers = [dict(n1=torch.ones(s.hidden, device=DEV, dtype=DT),
                            qkv=w(qkv, s.hidden), o=w(s.hidden, s.heads * s.head_dim),
                            bias=w(qkv) if fam.qkv_bias else None,
                            qn=torch.ones(s.head_dim, device=DEV, dtype=DT) if fam.qk_norm
                            else None,
                            kn=torch.ones(s.head_dim, device=DEV, dtype=DT) if fam.qk_norm
                            else None,
                            n2=torch.ones(s.hidden, device=DEV, dtype=DT),
                            gu=w(2 * s.intermediate, s.hidden), down=w(s.hidden, s.intermediate))
                       for _ in range(s.layers)]
        self.norm = torch.ones(s.hidden, device=DEV, dtype=DT)
        self.head = w(s.vocab, s.hidden)
        half = s.head_dim // 2
        self.inv_freq = 1.0 / (s.rope_theta ** (torch.arange(half, device=DEV) / half))

    def rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (len(pos), head_dim) for positions `pos` (rotate-half layout)."""
        f = pos.float()[:, None] * self.inv_freq[None]
        f = torch.cat([f, f], -1)
        return f.cos().to(DT), f.sin().to(DT)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, -1)
        return x * cos + torch.cat([-b, a], -1) * sin

    def _qkv(self, h: torch.Tensor, L: dict, rows: int) -> tuple[torch.Tensor, ...]:
        """q (rows, heads, d), k (rows, kv_heads, d), v (rows, kv_heads * d) before RoPE: the
        input norm, the projection (with its bias), the head norms where the family has
        them (as transformers' Qwen2 and Qwen3 do)."""
        s = self.s
        a = F.rms_norm(h, (s.hidden,), L["n1"], s.rms_eps)
        q, k, v = F.linear(a, L["qkv"], L["bias"]).split(
            [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], -1)
        q, k = q.view(rows, s.heads, s.head_dim), k.view(rows, s.kv_heads, s.head_dim)
        if L["qn"] is not None:
            q = F.rms_norm(q, (s.head_dim,), L["qn"], s.rms_eps)
            k = F.rms_norm(k, (s.head_dim,), L["kn"], s.rms_eps)
        return q, k, v

    def _mlp(self, h: torch.Tensor, L: dict) -> torch.Tensor:
        a = F.rms_norm(h, (self.s.hidden,), L["n2"], self.s.rms_eps)
        g, u = F.linear(a, L["gu"]).chunk(2, -1)
        return h + F.linear(F.silu(g) * u, L["down"])

    def decode(self, ids: torch.Tensor, pos: torch.Tensor, caches: list) -> torch.Tensor:
        """One step: ids (B,), pos (1,) the position every row writes (context - 1);
        caches[l] = (k, v), each (B, kv_heads, context, head_dim). The next ids (B,)."""
        s, B = self.s, ids.shape[0]
        cos, sin = self.rope(pos)  # (1, d): broadcast over rows and heads
        h = self.embed[ids]
        for L, (kc, vc) in zip(self.layers, caches):
            q, k, v = self._qkv(h, L, B)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            kc.index_copy_(2, pos, k[:, :, None])
            vc.index_copy_(2, pos, v.view(B, s.kv_heads, 1, s.head_dim))
            o = F.scaled_dot_product_attention(q[:, :, None], kc, vc, enable_gqa=True)
            h = h + F.linear(o.reshape(B, s.heads * s.head_dim), L["o"])
            h = self._mlp(h, L)
        logits = F.linear(F.rms_norm(h, (s.hidden,), self.norm, s.rms_eps), self.head)
        return logits.argmax(-1)

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """A prompt's forward, ids (S,); the next id (1,) from the last position."""
        s, S = self.s, ids.shape[0]
        cos, sin = self.rope(torch.arange(S, device=DEV))
        cos, sin = cos[:, None], sin[:, None]  # (S, 1, d)
        h = self.embed[ids]
        for L in self.layers:
            q, k, v = self._qkv(h, L, S)
            q = self._rotate(q, cos, sin).transpose(0, 1)
            k = self._rotate(k, cos, sin).transpose(0, 1)
            v = v.view(S, s.kv_heads, s.head_dim).transpose(0, 1)
            o = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True,
                                               enable_gqa=True)
            h = h + F.linear(o[0].transpose(0, 1).reshape(S, s.heads * s.head_dim), L["o"])
            h = self._mlp(h, L)
        last = F.rms_norm(h[-1:], (s.hidden,), self.norm, s.rms_eps)
        return F.linear(last, self.head).argmax(-1)


def _graphed(fn, *args):
    """fn(*args) captured in a CUDA graph (after warm-up on a side stream): replay()."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*args)
    return graph.replay


def decode(preset: str, cases: list[tuple[int, int]], compile_b1: bool) -> list[dict]:
    """Per (B, context): ms of one graph-replayed decode step (and torch.compile'd at B=1)."""
    s = _shape(preset)
    model = Decoder(s)
    compiled = torch.compile(model.decode) if compile_b1 else None
    rows = []
    for B, ctx in cases:
        kv = 2 * s.layers * B * s.kv_heads * ctx * s.head_dim * 2
        free, _ = torch.cuda.mem_get_info()
        row = {"bench": "decode", "preset": preset, "B": B, "context": ctx}
        if kv > free - (2 << 30):
            rows.append({**row, "skipped": f"KV cache {kv / 2**30:.1f} GiB > free memory"})
            continue
        caches = [(torch.zeros(B, s.kv_heads, ctx, s.head_dim, device=DEV, dtype=DT),
                   torch.zeros(B, s.kv_heads, ctx, s.head_dim, device=DEV, dtype=DT))
                  for _ in range(s.layers)]
        ids = torch.ones(B, device=DEV, dtype=torch.long)
        pos = torch.tensor([ctx - 1], device=DEV)
        with torch.inference_mode():
            row["ms"] = _median_ms(_graphed(model.decode, ids, pos, caches))
            if compiled is not None and B == 1 and ctx == min(c for _, c in cases):
                _log(f"{preset} B=1 ctx {ctx}: compiling")  # once: a new shape recompiles
                row["compiled ms"] = _median_ms(_graphed(compiled, ids, pos, caches))
        _log(f"{preset} B={B} ctx {ctx}: {row['ms']:.3f} ms")
        rows.append(row)
        del caches
        torch.cuda.empty_cache()
    return rows


BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
            "efficient": "EFFICIENT_ATTENTION"}


def attention(cases: list[tuple[int, int]], heads: int = 32, kv_heads: int = 8) -> list[dict]:
    """Per (S, head_dim) and backend: µs and TFLOP/s of causal SDPA (batch 1)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for S, d in cases:
        g = torch.Generator(device=DEV).manual_seed(0)
        q = torch.randn(1, heads, S, d, device=DEV, dtype=DT, generator=g)
        k = torch.randn(1, kv_heads, S, d, device=DEV, dtype=DT, generator=g)
        v = torch.randn(1, kv_heads, S, d, device=DEV, dtype=DT, generator=g)
        # backends without GQA get the KV heads repeated (compute-bound: the same FLOPs)
        kx, vx = (t.repeat_interleave(heads // kv_heads, 1) for t in (k, v))
        flops = 2 * S * S * d * heads
        for name, backend in BACKENDS.items():
            row = {"bench": "attention", "S": S, "head_dim": d, "backend": name}
            try:
                with sdpa_kernel(getattr(SDPBackend, backend)), torch.inference_mode():
                    try:
                        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                        args, row["gqa"] = (q, k, v), True
                    except RuntimeError:
                        args, row["gqa"] = (q, kx, vx), False
                    gqa = row["gqa"]
                    ms = _median_ms(lambda a=args, g=gqa: F.scaled_dot_product_attention(
                        *a, is_causal=True, enable_gqa=g))
                row.update({"us": ms * 1e3, "TFLOP/s": flops / ms / 1e9})
            except RuntimeError as e:
                row["skipped"] = str(e).splitlines()[0][:200]
            rows.append(row)
            _log(f"attention S={S} d={d} {name}: {row.get('us', row.get('skipped'))}")
    return rows


def matmul(cases: list[tuple[int, int, int]]) -> list[dict]:
    """Per (M, N, K): µs and TFLOP/s of x (M, K) times W (N, K) transposed."""
    rows = []
    for M, N, K in cases:
        x = torch.randn(M, K, device=DEV, dtype=DT)
        w = torch.randn(N, K, device=DEV, dtype=DT)
        with torch.inference_mode():
            ms = _median_ms(lambda x=x, w=w: F.linear(x, w))
        rows.append({"bench": "matmul", "M": M, "N": N, "K": K, "us": ms * 1e3,
                     "TFLOP/s": 2 * M * N * K / ms / 1e9})
    return rows


def prefill(preset: str, lengths: list[int]) -> list[dict]:
    """Per prompt length: ms of the forward that gives the first token."""
    from rawgraph.bench.shapes import prompt  # rawgraph's prompts, id for id

    model = Decoder(_shape(preset))
    rows = []
    for S in lengths:
        ids = torch.tensor(prompt(S, model.s.vocab), device=DEV, dtype=torch.long)
        long = S > 16384  # seconds a forward: fewer of them
        with torch.inference_mode():
            ms = _median_ms(lambda ids=ids: model.prefill(ids), reps=2 if long else 5,
                            warmup=1 if long else 2)
        rows.append({"bench": "prefill", "preset": preset, "tokens": S, "ms": ms})
        _log(f"prefill {preset} S={S}: {ms:.2f} ms")
    return rows


def _ints(text: str, n: int) -> list[tuple[int, ...]]:
    out = []
    for case in filter(None, text.split(",")):
        parts = tuple(int(x) for x in case.split(":"))
        if len(parts) != n:
            raise SystemExit(f"torch_reference: case {case!r} needs {n} numbers joined by ':'")
        out.append(parts)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("decode", "attention", "matmul", "prefill"))
    p.add_argument("--preset", default="llama-1b")
    p.add_argument("--cases", required=True, help="comma-separated cases (see the docstring)")
    p.add_argument("--compile", action="store_true", help="decode: torch.compile at B=1 too")
    a = p.parse_args(argv)
    if a.what == "decode":
        rows = decode(a.preset, _ints(a.cases, 2), a.compile)
    elif a.what == "attention":
        rows = attention(_ints(a.cases, 2))
    elif a.what == "matmul":
        rows = matmul(_ints(a.cases, 3))
    else:
        rows = prefill(a.preset, [c[0] for c in _ints(a.cases, 1)])
    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "device": torch.cuda.get_device_name()}
    print(json.dumps([{**r, **env} for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
