"""The batch-invariant mode (#72): a request's logits, bit for bit, do not depend on what
else its iteration holds. One request alone against the same request at each end and the
middle of decode batches of 7, 64 and 256, and with its prompt prefilled in chunks of 64, 256
and 2,048 tokens beside other prompts; then through the engine (graphs, buckets, overlap,
the prefix cache) alone and among 63 others. The same comparison in the default mode finds
differences (the check has teeth)."""

import dataclasses

import numpy as np
import pytest

from rawgraph.engine import Engine, Request
from rawgraph.model.config import preset
from rawgraph.model.decoder import Model
from rawgraph.model.step import PrefillPiece
from rawgraph.ops import SamplingParams

pytestmark = pytest.mark.gpu
STEPS = 4  # decode steps compared after the prompt
PROMPT = 100  # the request's prompt tokens


def _model(dtype: str, invariant: bool) -> Model:
    # llama-1b's widths (its GEMM plans and attention heads), two layers
    cfg = dataclasses.replace(preset("llama-1b"), layers=2, dtype=dtype)
    return Model(cfg, None, max_batch=256, max_context=2048, max_chunk=2048, max_chunk_seqs=8,
                 seed=5, batch_invariant=invariant)


def _prompts(rng, n: int, vocab: int) -> list[list[int]]:
    return [[int(t) for t in rng.integers(0, vocab, int(rng.integers(20, 300)))]
            for _ in range(n)]


def _bits(a) -> np.ndarray:
    return a.get().view(np.uint16).copy()


def _prefill(model: Model, prompts: dict[int, list[int]], chunk: int) -> dict[int, np.ndarray]:
    """Prefill each slot's prompt in chunks of `chunk` tokens (up to max_chunk_seqs pieces a
    chunk, sequences in slot order); each slot's first-token logits bits and token."""
    queue = [(s, p, 0) for s, p in sorted(prompts.items())]
    first: dict[int, np.ndarray] = {}
    while queue:
        pieces, room = [], chunk
        while queue and room and len(pieces) < model.max_chunk_seqs:
            s, p, at = queue.pop(0)
            n = min(room, len(p) - at)
            pieces.append(PrefillPiece(s, p[at:at + n], at, final=at + n == len(p)))
            room -= n
            if at + n < len(p):
                queue.insert(0, (s, p, at + n))
        nxt = model.prefill(pieces, chunk=chunk)
        for j, (piece, tok) in enumerate(zip(pieces, nxt)):
            if piece.final:
                first[piece.slot] = (_bits(model.pre["logits"][j]), tok)
    return first


def _run(model: Model, target: list[int], others: list[list[int]], at: int, chunk: int
         ) -> list[np.ndarray]:
    """The target's logits bits (its first token's, then STEPS decode steps') with `others`
    in the same chunks and decode steps, the target in row `at`."""
    rows = [*others[:at], target, *others[at:]]
    first = _prefill(model, dict(enumerate(rows)), chunk)
    got = [first[at][0]]
    tokens = [first[s][1] for s in range(len(rows))]
    for _ in range(STEPS):
        tokens = model.decode(list(range(len(rows))), tokens)
        got.append(_bits(model.dec["logits"][at]))
    for s in range(len(rows)):
        model.free(s)
    return got


def _unlike(a: list[np.ndarray], b: list[np.ndarray]) -> int:
    return sum(int((x != y).any()) for x, y in zip(a, b))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_requests_logits_do_not_depend_on_its_batch_or_chunks(dtype):
    rng = np.random.default_rng(11)
    model = _model(dtype, True)
    target = [int(t) for t in rng.integers(0, model.cfg.vocab, PROMPT)]
    others = _prompts(rng, 255, model.cfg.vocab)
    try:
        alone = _run(model, target, [], 0, 256)
        for batch in (7, 64, 256):
            for at in sorted({0, batch // 2, batch - 1}):
                got = _run(model, target, others[:batch - 1], at, 256)
                assert _unlike(got, alone) == 0, (batch, at)
        for chunk in (64, 2048):  # the prompt cut at 64 tokens, or beside 2,048 others'
            got = _run(model, target, others[:20], 3, chunk)
            assert _unlike(got, alone) == 0, chunk
    finally:
        model.close()


def test_the_default_mode_is_not_batch_invariant():
    # the comparison above finds what it looks for: in the default mode a batch of 64 (the
    # skinny GEMM for the GEMV, other attention splits) changes the bits
    rng = np.random.default_rng(11)
    model = _model("bfloat16", False)
    target = [int(t) for t in rng.integers(0, model.cfg.vocab, PROMPT)]
    others = _prompts(rng, 63, model.cfg.vocab)
    try:
        alone = _run(model, target, [], 0, 256)
        assert _unlike(_run(model, target, others, 31, 256), alone) > 0
    finally:
        model.close()


def test_the_engine_serves_a_request_alike_alone_and_among_others():
    # graphs per bucket, overlapped steps, the prefix cache (the others share the target's
    # first 64 tokens): tokens and log-probabilities (float32 bits) as alone
    rng = np.random.default_rng(3)
    cfg = dataclasses.replace(preset("llama-1b"), layers=2)
    model = Model(cfg, None, max_batch=64, max_context=1024, max_chunk=256, max_chunk_seqs=8,
                  seed=5)
    target = [int(t) for t in rng.integers(0, cfg.vocab, 150)]
    sp = SamplingParams(logprobs=3)

    def serve(n_others: int) -> Request:
        req = Request(list(target), 24, sp, name="target")
        others = [Request(target[:64] + p, 24, SamplingParams(logprobs=3))
                  for p in _prompts(rng, n_others, cfg.vocab)]
        engine = Engine(model, progress=False, batch_invariant=True, capture="lazy")
        try:
            engine.run([*others[:n_others // 2], req, *others[n_others // 2:]])
        finally:
            engine.close()
        return req

    try:
        alone, among = serve(0), serve(63)
        assert among.output == alone.output
        assert [lp.logprob for lp in among.logprobs] == [lp.logprob for lp in alone.logprobs]
        assert [lp.top for lp in among.logprobs] == [lp.top for lp in alone.logprobs]
        with pytest.raises(ValueError, match="mixed"):
            Engine(model, progress=False, mixed=True)
    finally:
        model.close()
