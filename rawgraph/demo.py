"""`rawgraph demo`: a scripted stream of requests through the engine, eagerly and with graphs.

The script: requests with varied prompt and output lengths (some prompts longer than a
prefill chunk), greedy and sampled, arriving over the first iterations. Both runs must
produce the same tokens (the graphs replay exactly the eager launches); the summary compares
their step time, throughput, host cost, patching, and the graphs' capture time and memory.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from rawgraph.bench.results import table
from rawgraph.engine.engine import Engine
from rawgraph.engine.request import Request
from rawgraph.model import checkpoint
from rawgraph.model.config import PRESETS, ModelConfig, preset
from rawgraph.model.decoder import Model
from rawgraph.model.tokenizer import Tokenizer
from rawgraph.model.weights import random_weights
from rawgraph.ops.matmul import DECODE_ROWS
from rawgraph.ops.sampling import GREEDY_TEMPERATURE, SamplingParams
from rawgraph.options import add_quantize, at_least, check_model, check_quantize, positive

TEXT_PROMPTS = ["The capital of France is", "CUDA graphs make small kernels cheap because",
                "Write a haiku about memory bandwidth:", "1, 2, 3, 4, 5,",
                "In a paged KV cache, each sequence", "The quick brown fox"]


PROMPT_LENGTHS, NEW_TOKENS = (3, 17, 60, 130, 400), (4, 12, 24, 48)
LONGEST = max(PROMPT_LENGTHS) + max(NEW_TOKENS)


def script(vocab: int, n: int = 12, seed: int = 0, prompts: list[list[int]] | None = None,
           stop: tuple[int, ...] = ()) -> list[Request]:
    """`n` requests: prompt lengths 3..400 tokens, 4..48 new tokens, every third sampled,
    arriving at iterations 0, 0, 1, 3, 6, ... (or the given prompts)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        if prompts:
            prompt = prompts[i % len(prompts)]
        else:
            length = int(rng.choice(PROMPT_LENGTHS))
            prompt = [int(t) for t in rng.integers(0, vocab, length)]
        sampling = SamplingParams(0.8, 40, 0.9, seed=1000 + i) if i % 3 == 2 else \
            SamplingParams()
        out.append(Request(prompt, int(rng.choice(NEW_TOKENS)), sampling,
                           frozenset(stop), arrival=i * (i - 1) // 4, name=f"req{i:02d}"))
    return out


def check(args: Any) -> None:
    """ValueError naming the option unless the demo's options make sense (no GPU needed):
    a known preset, a checkpoint directory whose config.json rawgraph reads, sizes in range."""
    check_model(args)
    check_quantize(args)
    if not 1 <= args.max_batch <= DECODE_ROWS:
        raise ValueError(f"--max-batch {args.max_batch}: 1 to {DECODE_ROWS}")
    if args.chunk > args.max_context:
        raise ValueError(f"--chunk {args.chunk} exceeds --max-context {args.max_context}")
    if args.max_context < LONGEST:
        raise ValueError(f"--max-context {args.max_context}: the script's requests need up to "
                         f"{LONGEST} tokens (prompt and output)")


def setup(args: Any) -> tuple[Model, ModelConfig, Any]:
    """The demo's model (and tokenizer): ValueError (CheckpointError included) for a
    checkpoint or options the model refuses."""
    tok, files = None, None
    if args.model:
        ck = checkpoint.load(args.model)
        cfg, tensors, files = ck.config, ck.tensors, ck.files
        if ck.tokenizer is not None:
            tok = Tokenizer(ck.tokenizer)
    else:
        cfg = preset(args.preset)
        tensors = random_weights(cfg, args.seed) if args.preset == "tiny" else None
    model = Model(cfg, tensors, max_batch=args.max_batch, max_context=args.max_context,
                  max_chunk=args.chunk, max_chunk_seqs=min(8, args.max_batch), seed=args.seed,
                  files=files, quantize=args.quantize, keep_16bit=not args.quantized_only)
    return model, cfg, tok


def _show(r: Request, tok: Any) -> str:
    out = repr(tok.decode(r.output)) if tok else " ".join(map(str, r.output[:16])) + \
        (" ..." if len(r.output) > 16 else "")
    t = r.sampling.temperature
    how = "greedy" if t <= GREEDY_TEMPERATURE else f"t={t}"
    return (f"{r.name}  prompt {len(r.prompt):>4}  {how:<7} arrived {r.arrival:>3}  "
            f"steps {r.first_step:>3}-{r.last_step:<3} {r.finish:<6} -> {out}")


def main(args: Any, model: Model, cfg: ModelConfig, tok: Any) -> int:
    """Run the script eagerly and with graphs; print outputs and the comparison (exit
    status 1 if the two runs' tokens differ)."""
    prompts = [tok.encode(t) for t in TEXT_PROMPTS] if tok else None
    runs: dict[str, Any] = {}
    for mode in ("eager", "graph"):
        reqs = script(cfg.vocab, args.requests, args.seed, prompts, cfg.eos)
        engine = Engine(model, graphs=mode == "graph", streams=args.streams,
                        progress=mode == "graph")
        engine.run(reqs)
        runs[mode] = (reqs, engine.stats.summary())
        engine.close()
    reqs, _ = runs["graph"]
    print(f"\n{cfg.name} ({cfg.family}): {cfg.layers} layers, hidden {cfg.hidden}, "
          f"{cfg.dtype}; {len(reqs)} requests\n")
    for r in reqs:
        print(_show(r, tok))
    same = [a.output for a in runs["eager"][0]] == [b.output for b in reqs]
    print(f"\ngraph tokens identical to eager: {same}\n")
    rows = []
    for mode, (_, s) in runs.items():
        rows.append({"mode": mode, **{k: v for k, v in s.items() if k != "nodes"}})
    e, g = runs["eager"][1], runs["graph"][1]
    rows.append({"mode": "graph speedup", "ms/step": e["ms/step"] / max(g["ms/step"], 1e-9),
                 "tokens/s": g["tokens/s"] / max(e["tokens/s"], 1e-9)})
    print(table(rows, list(dict.fromkeys(k for r in rows for k in r))))
    model.close()
    return 0 if same else 1


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The `demo` subcommand's options (the caller sets what runs it)."""
    q = sub.add_parser("demo", help="scripted requests through the engine, eager vs graphs")
    q.add_argument("--preset", default="tiny", help=f"random weights of a named shape: "
                   f"{', '.join(PRESETS)}")
    q.add_argument("--model", type=Path, help="a checkpoint directory (config.json, "
                   "*.safetensors, optional tokenizer.json); overrides --preset")
    q.add_argument("--requests", type=positive, default=12, help="requests in the script")
    q.add_argument("--max-batch", type=positive, default=8,
                   help="sequences decoding at once (decode graph buckets up to it)")
    q.add_argument("--max-context", type=positive, default=1024,
                   help="tokens per sequence, prompt and output")
    q.add_argument("--chunk", type=positive, default=256, help="largest prefill chunk")
    q.add_argument("--streams", type=int, default=2, choices=(1, 2),
                   help="prefill beside decode on two streams, or one")
    q.add_argument("--seed", type=at_least(0), default=0, help="seed of the script and weights")
    add_quantize(q)
    return q
