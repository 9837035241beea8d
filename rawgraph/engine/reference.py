"""The engine on the host: the NumPy reference decoder behind the runner's interface.

`ReferenceModel` and `ReferenceRunner` stand where `Model` and `Runner` stand, so an
`Engine` (scheduling, overlapped steps, rollback, aborts) runs without a GPU on a real
decoder: `model.reference.forward` in float32, one cache of keys and values per slot that
follows the block tables (a rollback's truncation included), and a copy of each block's
keys, values and tokens as last written (copied on write as the GPU's are), from which a
sequence that starts on another's blocks (a cached prefix, a fork) begins. Greedy rows take
the argmax; sampled rows draw from `ops.reference.sample_probs` seeded by (seed, position),
so draws are reproducible (not the GPU sampler's bits). What it is for: servers and tools
tested on a machine without a GPU, and tiny models served on the CPU.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rawgraph.engine.engine import Engine
from rawgraph.engine.runner import IterStats, Launched
from rawgraph.memory.blocks import BlockAllocator, BlockTables
from rawgraph.memory.paged import BLOCK_SIZE
from rawgraph.model.config import ModelConfig
from rawgraph.model.reference import KVState, float_weights, forward
from rawgraph.model.step import Limits, PrefillPiece, check_follow, final_tokens, last_step
from rawgraph.ops.logits import LP_STRIDE
from rawgraph.ops.reference import apply_rules, sample_probs
from rawgraph.ops.reference import logprobs as ref_logprobs
from rawgraph.ops.sampling import GREEDY_TEMPERATURE, SamplingParams


@dataclass
class HostCache:
    """The block tables of a host-side cache (what the engine reads of `Model.kv`)."""

    tables: BlockTables
    block_size: int


class ReferenceModel:
    """What the engine uses of a `Model`, on the host: sizes, block tables, `free`, and the
    float32 weights and per-slot keys and values the runner computes with."""

    def __init__(self, cfg: ModelConfig, tensors: dict[str, np.ndarray], *, max_batch: int = 8,
                 max_context: int = 1024, max_chunk: int = 256, max_chunk_seqs: int = 8,
                 block_size: int = BLOCK_SIZE):
        for name, v in (("max_batch", max_batch), ("max_context", max_context),
                        ("max_chunk", max_chunk), ("max_chunk_seqs", max_chunk_seqs)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} = {v!r} must be a positive integer")
        self.cfg = cfg
        self.max_batch, self.max_context = max_batch, max_context
        self.max_chunk, self.max_chunk_seqs = max_chunk, min(max_chunk_seqs, max_batch)
        self.limits = Limits(max_batch, max_chunk, self.max_chunk_seqs, max_context, cfg.vocab)
        self.w = float_weights(cfg, tensors)
        per_seq = math.ceil(max_context / block_size)
        self.kv = HostCache(BlockTables(BlockAllocator(max_batch * per_seq), block_size,
                                        max_batch, per_seq), block_size)
        self.states: dict[int, KVState] = {}
        self.sampling: dict[int, SamplingParams] = {}
        self.history: dict[int, list[int]] = {}  # each slot's tokens by position
        self.rules: dict[int, tuple[int, dict[int, int]]] = {}  # prompt length, bans' until
        # each block's content as last written: keys, values (per layer), tokens
        self.blocks: dict[int, tuple[list[np.ndarray], list[np.ndarray], list[int]]] = {}

    def free(self, slot: int) -> None:
        """Release a finished sequence's slot and blocks."""
        self.kv.tables.free(slot)
        self.states.pop(slot, None)
        self.sampling.pop(slot, None)
        self.history.pop(slot, None)
        self.rules.pop(slot, None)

    def logits(self, slot: int, tokens: Sequence[int], every: bool = False) -> np.ndarray:
        """The next-token logits after feeding `tokens` to `slot`'s sequence (its cache
        trimmed to the tables' length first, so a rolled-back step leaves no trace); `every`:
        each fed token's, (len(tokens), vocab)."""
        t, bs = self.kv.tables, self.kv.block_size
        for src, dst, rows in t.pending_copies:  # copy-on-write, as kv.sync runs it
            k, v, toks = self.blocks[src]
            self.blocks[dst] = [x[:rows] for x in k], [x[:rows] for x in v], toks[:rows]
        t.pending_copies.clear()
        st = self.states.setdefault(slot, KVState())
        keep = int(t.lens[slot]) - len(tokens)  # the tables already count the new tokens
        hist = self.history.setdefault(slot, [])
        if st.length < keep:  # a sequence started on others' blocks: their content
            assert st.length == 0, (slot, keep, st.length)
            held = [self.blocks[int(b)] for b in t.table[slot, :-(-keep // bs)]]
            st.k = [np.concatenate([h[0][i] for h in held]) for i in range(self.cfg.layers)]
            st.v = [np.concatenate([h[1][i] for h in held]) for i in range(self.cfg.layers)]
            hist[:] = [x for h in held for x in h[2]]
        if st.length > keep:
            st.k = [k[:keep] for k in st.k]
            st.v = [v[:keep] for v in st.v]
        del hist[keep:]
        hist += [int(t) for t in tokens]
        out = forward(self.cfg, self.w, np.asarray(tokens), st)
        for j in range(keep // bs, -(-st.length // bs)):  # blocks this call wrote into
            part = slice(j * bs, min((j + 1) * bs, st.length))
            self.blocks[int(t.table[slot, j])] = ([k[part] for k in st.k],
                                                  [v[part] for v in st.v], hist[part])
        return out if every else out[-1]

    def ruled(self, slot: int, logits: np.ndarray, s: SamplingParams) -> np.ndarray:
        """`logits` of the sequence in `slot` after its rules (ops.reference.apply_rules over
        its history: the prompt, then the output so far)."""
        prompt_len, until = self.rules.get(slot, (0, {}))
        hist = self.history.get(slot, [])
        if not (s.rules(bool(until)) and prompt_len):
            return logits
        vocab = logits.shape[0]
        counts = np.bincount(hist[prompt_len:], minlength=vocab)[:vocab]
        in_prompt = np.zeros(vocab, bool)
        in_prompt[hist[:prompt_len]] = True
        return apply_rules(logits, None, counts=counts, in_prompt=in_prompt,
                           presence=s.presence_penalty, frequency=s.frequency_penalty,
                           repetition=s.repetition_penalty, bias=dict(s.logit_bias),
                           until=until, position=len(hist) - 1)

    def close(self) -> None:
        """Nothing to free on the host."""


def entries(logits: np.ndarray, token: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A row's log-probability entries as ops.Logprobs lays them out: (lp, ids) of
    LP_STRIDE, entry 0 `token`'s, then the top k."""
    lse, top, lps = ref_logprobs(logits, k)
    lp, ids = np.full(LP_STRIDE, -np.inf, np.float32), np.full(LP_STRIDE, -1, np.int32)
    lp[0], ids[0] = float(logits[token]) - lse, token
    lp[1:1 + len(top)], ids[1:1 + len(top)] = lps, top
    return lp, ids


def pick(logits: np.ndarray, s: SamplingParams, position: int) -> int:
    """The token a row takes: argmax when greedy, else a draw seeded by (seed, position)."""
    if s.temperature <= GREEDY_TEMPERATURE:
        return int(np.argmax(np.where(np.isnan(logits), -np.inf, logits)))
    p = sample_probs(logits, s.temperature, s.top_k, s.top_p)
    return int(np.random.default_rng([s.seed, position]).choice(p.size, p=p / p.sum()))


@dataclass
class HostPending:
    """A launched iteration: its tokens are computed already, read by `collect`."""

    pieces: list[PrefillPiece]
    rows: int
    st: IterStats
    first: list[int]
    out: list[int]
    tokens: list[int] | None = field(default=None)
    lp: tuple[Any, Any] | None = None        # as the GPU runner's Pending
    first_lp: tuple[Any, Any] | None = None
    prompt_lp: list[tuple[Any, Any] | None] | None = None


class ReferenceRunner(Launched):
    """The runner's interface (`launch`, `collect`, the two streams, buckets and chunks) over
    a `ReferenceModel`: each launch grows the block tables as the GPU runner does and computes
    its tokens at once."""

    def __init__(self, model: ReferenceModel):
        self.model = model
        self.chunks = (model.max_chunk,)
        self.buckets = (model.max_batch,)
        self.decode_stream = self.prefill_stream = None
        super().__init__()
        self._last: dict[int, int] = {}  # each slot's token from its last decode step
        self._chunk_first: list[int] = []  # the last launch's pieces' first tokens

    def capture_all(self, progress: bool = True) -> dict[str, Any]:
        """No graphs on the host."""
        return {}

    def launch(self, pieces: Sequence[PrefillPiece], slots: Sequence[int],
               tokens: Sequence[int] | None, sampling: Sequence[SamplingParams] | None = None,
               *, follow: bool = False, fed: Sequence[int] | None = None) -> HostPending:
        """One iteration: a prefill chunk of `pieces` and a decode step of `slots` (`follow`:
        fed the tokens the last decode step of the same slots produced, some rows maybe left
        empty, -1, or taking a joining sequence, as the GPU runner's). Its host time is the
        whole computation (the reference has no device to hand it to)."""
        t0 = time.perf_counter()
        m, t = self.model, self.model.kv.tables
        fed = self._check_launch(slots, tokens, sampling, follow, fed)
        while len(self._unread) > (1 if follow else 0):
            self.collect(self._unread[0])
        if follow:  # as Inputs.follow: continued rows, empty ones, joining ones
            src = [-1] * len(slots) if fed is None else fed
            joins = check_follow(self._last_step, slots, t, m.limits, tokens,
                                 [j >= 0 for j in src])
            given, tokens = tokens, []
            for i, (s, joins_here, j) in enumerate(zip(slots, joins, src)):
                if j >= 0:  # joining with the first token of the chunk that ended its prompt
                    tokens.append(self._chunk_first[j])
                elif joins_here:  # joining, fed from the host
                    tokens.append(int(given[i]))  # type: ignore[index]
                else:  # continued with its last token, or an empty row
                    tokens.append(self._last[s] if s >= 0 else -1)
        first, first_lp, prompt_lp = [], [], []
        for p in pieces:
            if p.slot not in t.active:
                t.add(p.slot)
            t.append(p.slot, len(p.tokens))
            m.sampling[p.slot] = p.sampling
            if p.first:
                m.rules[p.slot] = (0, dict.fromkeys(p.bans, p.ban_until)
                                   if p.sampling.min_tokens else {})
            every = m.logits(p.slot, p.tokens, every=True)
            prompt_lp.append(self._score(p, every))
            if p.final:
                m.rules[p.slot] = (p.start + len(p.tokens), m.rules[p.slot][1])
            logits = m.ruled(p.slot, every[-1], p.sampling)
            tok = pick(logits, p.sampling, p.start + len(p.tokens)) if p.final else -1
            first.append(tok)
            first_lp.append(entries(every[-1], max(tok, 0), p.sampling.logprobs or 0))
        out, out_lp = [], []
        for i, (s, tok) in enumerate(zip(slots, tokens or [])):
            if s < 0:  # an empty row: a padding row, no token
                out.append(-1)
                out_lp.append(entries(np.zeros(1, np.float32), 0, 0))
                continue
            t.append(s, 1)
            params = sampling[i] if sampling is not None else m.sampling[s]
            raw = m.logits(s, [tok])
            out.append(pick(m.ruled(s, raw, params), params, int(t.lens[s])))
            out_lp.append(entries(raw, out[-1], params.logprobs or 0))
        self._last.update((s, tok) for s, tok in zip(slots, out) if s >= 0)
        self._chunk, self._chunk_first = list(pieces), first  # a following step's joins
        if slots:
            self._last_step = last_step(slots, t, 0)
        st = IterStats(decode_rows=sum(s >= 0 for s in slots),
                       prefill_tokens=sum(len(p.tokens) for p in pieces),
                       host_us=(time.perf_counter() - t0) * 1e6,
                       eager=["the reference decoder on the host"])
        pending = HostPending(list(pieces), len(slots), st, final_tokens(first, pieces), out,
                              lp=_stack(out_lp), first_lp=_stack(first_lp),
                              prompt_lp=prompt_lp)
        if slots:
            self._unread.append(pending)
        return pending

    @staticmethod
    def _score(p: PrefillPiece, every: np.ndarray) -> tuple[Any, Any] | None:
        """A piece's prompt log-probability entries (Model.score's rows), or None."""
        k = p.sampling.prompt_logprobs
        if k is None:
            return None
        targets = [*p.tokens[1:], p.next_token] if not p.final else list(p.tokens[1:])
        rows = [entries(every[i], t, k) for i, t in enumerate(targets)]
        return _stack(rows) or (np.zeros((0, LP_STRIDE), np.float32),
                                np.zeros((0, LP_STRIDE), np.int32))

    def collect(self, p: HostPending) -> tuple[list[int], list[int], IterStats]:
        """(next token per piece, -1 for pieces that are not final; next token per decode
        row; stats)."""
        if p.rows and p.tokens is None:
            p.tokens = p.out
            self._unread.remove(p)
        return p.first, p.tokens or [], p.st

    def close(self) -> None:
        """Nothing to release."""


def _stack(rows: list[tuple[Any, Any]]) -> tuple[Any, Any] | None:
    """Rows of (lp, ids) entries as two arrays, or None for none."""
    if not rows:
        return None
    return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])


def reference_engine(cfg: ModelConfig, tensors: dict[str, np.ndarray], *, max_batch: int = 8,
                     max_context: int = 1024, max_chunk: int = 256, max_chunk_seqs: int = 8,
                     overlap: bool = True, decode_chunk: int | None = None,
                     prefix_cache: bool = True) -> Engine:
    """An `Engine` over the reference decoder on the host (no GPU); `decode_chunk` and
    `prefix_cache` as `Engine`'s."""
    model = ReferenceModel(cfg, tensors, max_batch=max_batch, max_context=max_context,
                           max_chunk=max_chunk, max_chunk_seqs=max_chunk_seqs)
    return Engine(model, graphs=False, progress=False, overlap=overlap,
                  decode_chunk=decode_chunk, runner=ReferenceRunner(model),
                  prefix_cache=prefix_cache)
