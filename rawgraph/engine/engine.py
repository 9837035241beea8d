"""The engine: requests in, tokens out, through continuous batching over bucketed decode
graphs and chunked prefill graphs (or the same launches run eagerly, `graphs=False`).

An iteration is all or nothing: an exception anywhere in `step` (a refused input, a CUDA
error, a KeyboardInterrupt while waiting for the GPU) rolls back what the iteration changed
(admissions, cache growth, tokens and prompt progress of every request) and leaves the
engine ready for the next `step`; no token is lost or emitted twice.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rawgraph.cuda.stream import cupy_stream
from rawgraph.engine.beam import Hypothesis, beam_search
from rawgraph.engine.request import Logprob, Request, token_ids
from rawgraph.engine.runner import IterStats, Pending, Runner
from rawgraph.engine.scheduler import Plan, Scheduler
from rawgraph.memory.prefix import PrefixCache
from rawgraph.model.decoder import Model, chunk_sizes
from rawgraph.model.step import PrefillPiece
from rawgraph.ops.sampling import SamplingParams

RECENT = 4096  # iterations kept for medians and timelines


@dataclass
class EngineStats:
    """Running totals, and the last RECENT iterations (for medians and timelines): a
    long-lived engine keeps a bounded record."""

    iterations: int = 0
    decode_steps: int = 0
    tokens: int = 0           # tokens emitted (first tokens and decode tokens)
    eager_iterations: int = 0
    rollbacks: int = 0        # iterations undone by an exception
    prompt_tokens: int = 0    # prompt tokens of the requests started
    cached_tokens: int = 0    # of those, the ones found in the prefix cache
    wall_s: float = 0.0
    iters: deque[IterStats] = field(default_factory=lambda: deque(maxlen=RECENT))
    capture: dict[str, Any] = field(default_factory=dict)

    def record(self, st: IterStats, tokens: int) -> None:
        """Count one committed iteration."""
        self.iterations += 1
        self.tokens += tokens
        self.eager_iterations += bool(st.eager)
        self.decode_steps += bool(st.decode_rows and not st.prefill_tokens)
        self.iters.append(st)

    def summary(self) -> dict[str, Any]:
        """Aggregates: tokens/s, ms per decode-only step, host and patch cost per step (the
        medians over the decode-only steps among the last RECENT iterations)."""
        dec = [i for i in self.iters if i.decode_rows and not i.prefill_tokens]
        med = lambda xs: statistics.median(xs) if xs else 0.0  # noqa: E731
        return {"iterations": self.iterations, "decode steps": self.decode_steps,
                "tokens out": self.tokens,
                "tokens/s": self.tokens / self.wall_s if self.wall_s else 0.0,
                "ms/step": med([i.wall_ms for i in dec]),
                "host us/step": med([i.host_us for i in dec]),
                "patch us/step": med([i.patch_us for i in dec]),
                "nodes patched/step": statistics.mean(i.patched for i in dec) if dec else 0.0,
                "eager iterations": self.eager_iterations,
                "cached prompt share": self.cached_tokens / max(self.prompt_tokens, 1),
                **self.capture}


def _logprob(lp: Any, ids: Any, k: int) -> Logprob:
    """A token's entries as ops.Logprobs lays them out (entry 0 the token, then the top k;
    an id -1: fewer numbers than k) as a Logprob."""
    top = tuple((int(t), float(v)) for t, v in zip(ids[1:k + 1], lp[1:k + 1]) if t >= 0)
    return Logprob(int(ids[0]), float(lp[0]), top)


@dataclass
class _Mark:
    """What an iteration may change, as it was before: enough to roll the iteration back."""

    requests: list[tuple[Request, int, int, int, str, int, int, int, int]]  # (r, len(output), ..)
    lens: Any                 # the cache's host lengths
    active: set[int]          # cache slots in use
    ahead: tuple[list[Request], list[tuple[Request, PrefillPiece]], Pending] | None
    runner: tuple[list[Pending], int, int]  # Runner.state()
    books: tuple[list[int], int]  # the scheduler's free slots and reserved blocks
    admitted: list[Request] = field(default_factory=list)


class Engine:
    """Generates tokens for requests that arrive and finish between iterations.

    `graphs=False` runs the same launches eagerly (the comparison baseline); `capture`
    ('upfront' or 'lazy') says when the graphs are made; `pdl`: decode kernels with programmatic
    dependent launch (see Runner). `overlap`: each step (with a prefill chunk beside it, or in
    a mixed iteration, or not) is launched before the previous step's tokens are read (they
    feed it on the device), so the host's work per step hides behind the GPU's; rows keep
    their places across steps (a finished request's row stays empty, a joining one takes an
    empty row, fed its first token on the device from the chunk that ended its prompt, or
    from the host once read) until a smaller bucket would do, when the rows are packed in a
    step fed from the host; and an iteration of prompt pieces alone that
    end no prompt is not waited for (the next chunk is prepared while it runs); a chunk's
    pieces count as in the cache from their launch, and a prompt's first token is emitted
    when its last piece's iteration is read. A request that stops at a stop id has one step
    computed past it, which is discarded. Tokens are the same either way. `mixed`: an
    iteration's prefill chunk and decode step run as one (Runner).
    `decode_chunk`: the most prompt tokens an iteration that also steps decoding sequences
    prefills (default: the largest chunk; a graph of that size is added to the chunks): the
    decoding users' next token waits for them, so a smaller one shortens the inter-token
    latency's tail and lengthens the time to first token. `prefix_cache`: a request whose
    prompt starts with full KV blocks another prompt left in the cache takes them and
    prefills only the rest (`memory.prefix`), and one whose prompt equals a running one's
    forks it (`_reuse`); not for requests that score their prompt or penalize repetition,
    whose prompt tokens must pass through their own chunks. Blocks no request holds stay
    cached until the allocator needs them, least recently used first.
    `batch_invariant` (None: the model's mode; True/False sets it on the model): each
    request's tokens and logits the same whatever else runs beside it
    (`Model.set_batch_invariant`; no mixed iterations).
    One thread drives an engine. `runner`:
    one to use instead of building a `Runner` for `model` (`engine.reference`: the NumPy decoder
    on the host).
    """

    def __init__(self, model: Model, *, graphs: bool = True, capture: str = "upfront",
                 buckets: Sequence[int] | None = None, chunks: Sequence[int] | None = None,
                 streams: int = 2, progress: bool = True, max_graphs: int = 64,
                 max_graph_bytes: int = 1 << 30, pdl: bool = True, overlap: bool = True,
                 mixed: bool = False, decode_chunk: int | None = None, runner: Any = None,
                 prefix_cache: bool = True, batch_invariant: bool | None = None):
        if capture not in ("upfront", "lazy"):
            raise ValueError(f"capture = {capture!r}: 'upfront' or 'lazy'")
        invariant = getattr(model, "batch_invariant", False) if batch_invariant is None \
            else batch_invariant
        if invariant and mixed:
            raise ValueError("mixed=True with batch_invariant: a mixed iteration's decode rows "
                             "round as its chunk's tokens do")
        if decode_chunk is not None and (type(decode_chunk) is not int
                                         or not 1 <= decode_chunk <= model.max_chunk):
            raise ValueError(f"decode_chunk = {decode_chunk!r}: an int in [1, max_chunk = "
                             f"{model.max_chunk}]")
        if decode_chunk is not None and chunks is None and runner is None:
            chunks = sorted({*chunk_sizes(model.max_chunk), decode_chunk})
        self.model = model
        if batch_invariant is not None and hasattr(model, "set_batch_invariant"):
            model.set_batch_invariant(batch_invariant)  # before any graph is captured
        self.runner = runner if runner is not None else Runner(
            model, graphs=graphs, buckets=buckets, chunks=chunks, streams=streams,
            max_graphs=max_graphs, max_graph_bytes=max_graph_bytes, pdl=pdl, mixed=mixed)
        kv = model.kv
        self.prefix = PrefixCache.of(kv.tables.alloc, kv.block_size) if prefix_cache else None
        self.scheduler = Scheduler(max_seqs=model.max_batch,
                                   chunk_tokens=self.runner.chunks[-1],
                                   chunk_seqs=model.max_chunk_seqs,
                                   num_blocks=kv.tables.alloc.num_blocks,
                                   block_size=kv.block_size, max_context=model.max_context,
                                   decode_chunk=decode_chunk,
                                   shared=self._shared if prefix_cache else None)
        self._grown: list[Request] = []  # requests whose prompts grew in this iteration
        self.stats = EngineStats()
        self.steps = 0
        self.overlap = overlap
        # launched, tokens unread: its decode rows, its prefill pieces, the launch
        self._ahead: tuple[list[Request | None], list[tuple[Request, PrefillPiece]],
                           Pending] | None = None
        self._chained = True  # False after a rollback: the device no longer holds the hand-off
        self._aborts: list[Request] = []
        if graphs and capture == "upfront":
            self.stats.capture = self.runner.capture_all(progress)

    # -- requests in -----------------------------------------------------------------------

    def check(self, request: Request) -> None:
        """Raise (TypeError / ValueError naming the problem) unless `request` could run on
        this engine: a fresh Request, token ids in the vocabulary, prompt + max_new_tokens
        within the context and the cache. Nothing changes."""
        if not isinstance(request, Request):
            raise TypeError(f"expected a Request, got {type(request).__name__}")
        if request.finish or request.output or request.prefilled or request.slot >= 0:
            raise ValueError(f"{request.name} has already run ({request.finish or 'running'}); "
                             f"make a new Request")
        if request in self.scheduler.waiting or request in self.scheduler.running:
            raise ValueError(f"{request.name} is already queued in this engine")
        vocab = self.model.cfg.vocab
        if max(request.prompt) >= vocab:
            raise ValueError(f"{request.name}: prompt token id {max(request.prompt)} outside "
                             f"[0, {vocab})")
        bias = request.sampling.logit_bias
        if bias and bias[-1][0] >= vocab:  # sorted by id
            raise ValueError(f"{request.name}: logit_bias token id {bias[-1][0]} outside "
                             f"[0, {vocab})")
        if request.sampling.min_tokens and request.stop and max(request.stop) >= vocab:
            raise ValueError(f"{request.name}: min_tokens bans stop id {max(request.stop)}, "
                             f"outside [0, {vocab})")
        self.scheduler.check(request)

    def add(self, request: Request) -> Request:
        """Queue a request (checked first, `check`)."""
        self.check(request)
        self.scheduler.add(request)
        return request

    def abort(self, request: Request) -> bool:
        """End a request early (finish "abort"): a waiting one leaves the queue now; a running
        one at the next step boundary, its slot and cache blocks freed then, also while a
        decode step it is part of is in flight. Other requests are untouched. False if the
        request is not in this engine (or has finished)."""
        if request.finish:
            return False
        if self.scheduler.drop(request):
            request.finish = "abort"
            return True
        if request in self.scheduler.running:
            if request not in self._aborts:  # ends at the next step boundary
                self._aborts.append(request)
            return True
        return False

    # -- one iteration -----------------------------------------------------------------------

    def step(self) -> list[Request]:
        """One iteration: admit, run a prefill chunk and a decode step, retire finished
        requests (returned). With `overlap`, a decode step continuing the last one (its rows
        in their places, rows left empty or taken: `_continued`) is launched first and the
        last one's tokens are read after it. An exception rolls the iteration back and
        propagates; the engine stays usable."""
        t0 = time.perf_counter()
        self._retire()  # what an interrupted earlier iteration left to free
        done: list[Request] = []
        mark = self._mark()
        try:
            for r in self._aborts:  # a decode step on its way with them is read, not followed
                r.finish = "abort"
                done.append(r)
            self.scheduler.admit(self.steps, mark.admitted)
            st, emitted = self._iterate(done)
        except BaseException:
            self._rollback(mark)
            raise
        self._aborts.clear()
        self._cache_prompts()
        wall = time.perf_counter() - t0
        if st is not None:  # an iteration was launched: it is timed by this call
            st.wall_ms = wall * 1e3
            self.stats.record(st, emitted)
        self.stats.wall_s += wall
        self.steps += 1
        self._retire()
        return done

    def _iterate(self, done: list[Request]) -> tuple[IterStats | None, int]:
        """Launch this iteration and read what it (or the step before it) produced; tokens
        are emitted into the requests, finished ones listed in `done` (retired later)."""
        sch, emitted = self.scheduler, 0
        plan: Plan | None = sch.plan(self._reuse())
        st = None
        if self._ahead is not None:
            rows, pieces, pending = self._ahead
            cont = self._continued(plan, rows, pieces) if self._chained else None
            if cont is not None:
                layout, tokens, fed = cont
                nxt = self.runner.launch([p for _, p in plan.prefill],
                                         [r.slot if r is not None else -1 for r in layout],
                                         tokens, follow=True, fed=fed)
                self._prefilled(plan.prefill)
                nxt.st.follow = True
                self._ahead, st, plan = (layout, plan.prefill, nxt), nxt.st, None  # launched
            else:
                self._ahead = None
            emitted += self._read(rows, pieces, pending, done)
            if plan is not None:  # the rows changed: plan again with the tokens read
                plan = sch.plan(self._reuse())
        if plan is not None and (plan.prefill or plan.decode):
            pending = self.runner.launch([p for _, p in plan.prefill],
                                         [r.slot for r in plan.decode],
                                         [r.output[-1] for r in plan.decode])
            st = pending.st
            self._chained = True
            self._prefilled(plan.prefill)
            if self.overlap and plan.decode:
                self._ahead = (plan.decode, plan.prefill, pending)
            elif not self.overlap or any(piece.final or piece.sampling.prompt_logprobs
                                         is not None for _, piece in plan.prefill):
                emitted += self._read(plan.decode, plan.prefill, pending, done)
            # else a chunk of prompts' inner pieces alone: it has no token to wait for, so
            # the host plans and queues the next chunk while this one runs (its half of the
            # first tokens is read when a later chunk reuses it)
        return st, emitted

    def _continued(self, plan: Plan, rows: list[Request | None],
                   pieces: list[tuple[Request, PrefillPiece]]
                   ) -> tuple[list[Request | None], list[int] | None, list[int] | None] | None:
        """The rows of a decode step continuing the one on its way (`rows`; None: an empty
        row; `pieces`: the chunk launched with it), the tokens of the rows joining it from
        the host (None if none does) and the chunk's pieces whose first tokens feed the
        rows joining on the device (None if none does), or None where it cannot. Each
        planned request of `rows` keeps its place; a row whose request is not planned (it
        finished or was aborted) or whose token on its way is its last is left empty (a
        padding row: the others keep their places, so the sampler's hand-off still feeds
        them); a planned request not in `rows` joins in a row empty there or after the
        last: fed from the host if its first token has been read, else (its prompt ended
        in that chunk, unread) with that token on the device, so it joins when a run
        without overlap would take it. It cannot when no row is left, or when the rows
        would take a smaller bucket than the empty rows hold on to (then the rows are
        packed, fed from the host). A prefill chunk may go beside it either way."""
        # sets of the requests themselves (they hash by identity): this runs every iteration
        planned = set(plan.decode)
        layout = [r if r in planned and len(r.output) + 2 <= r.max_new_tokens else None
                  for r in rows]
        held = set(rows)
        ended = {r: j for j, (r, p) in enumerate(pieces) if p.final}
        # a prompt that ended in the unread chunk joins if its first token is not its last
        joining = [r for r in plan.decode if r not in held
                   and (r.output or (r in ended and r.max_new_tokens >= 2))]
        if joining:
            free = [i for i, r in enumerate(rows) if r is None]  # empty there: nothing to read
            for r in joining:
                if free:
                    layout[free.pop(0)] = r
                else:
                    layout.append(r)
        live = len(layout) - layout.count(None)
        if not live or self.runner.bucket(live) != self.runner.bucket(len(layout)):
            return None
        host = {r for r in joining if r.output}
        dev = {r for r in joining if not r.output}
        tokens = [r.output[-1] if r in host else -1 for r in layout] if host else None
        fed = [ended[r] if r in dev else -1 for r in layout] if dev else None
        return layout, tokens, fed

    def _prefilled(self, pieces: list[tuple[Request, PrefillPiece]]) -> None:
        """Launched pieces are in the cache for what is planned next (their prompts' first
        tokens come when the iteration is read)."""
        for r, piece in pieces:
            r.prefilled += len(piece.tokens)
            self._grown.append(r)

    # -- the prefix cache ----------------------------------------------------------------------

    def _reuse(self) -> set[int]:
        """The first requests not yet started (as many as a chunk takes pieces) start on
        what other sequences computed: a prompt equal to a started one's (the n samples of a
        prompt) forks that sequence once it has prefilled all but the last token (sharing
        every block, the last partly filled one copied on write) and prefills that token
        alone; any other takes the longest run of cached blocks it starts with (all but its
        last token's block: that token's logits give the first output). Returns the ids of
        the requests held back from this iteration's chunk: one whose twin or next block
        another request is prefilling now (or starts to, ahead of it) waits for it instead of
        computing it again (samples of a prompt, a shared system prompt arriving in a
        burst), and those past the first few, not looked up yet."""
        held: set[int] = set()
        t, bs, left = self.model.kv.tables, self.model.kv.block_size, self.model.max_chunk_seqs
        if self.prefix is None or all(r.slot in t.active or r.finish
                                      for r in self.scheduler.running):
            return held  # nobody starts: the steady state of a full batch
        busy: set[int] = set()  # keys of blocks being prefilled
        fresh, started = [], []
        for r in self.scheduler.running:
            if r.slot in t.active:
                started.append(r)
                if r.prefilled < len(r.prompt) and not r.finish:
                    n = len(r.prompt) // bs
                    busy.update(self.prefix.keys(r.prompt, n, r.keys)[r.prefilled // bs:n])
            elif r.finish:
                continue
            elif len(fresh) < left:
                fresh.append(r)
            else:
                held.add(id(r))
        lengths = {len(r.prompt) for r in fresh}  # a twin has the same length: few to key
        twins = {self._whole(r): r for r in started if len(r.prompt) in lengths}
        for r in fresh:
            if r.sampling.prompt_logprobs is not None or r.sampling.repetition_penalty != 1:
                continue  # its prompt's tokens go through its own chunks
            twin = twins.get(self._whole(r)) if len(r.prompt) > 1 else None
            if twin is not None and twin.prompt == r.prompt:
                if twin.slot in t.active and twin.prefilled >= len(r.prompt) - 1:
                    t.fork(twin.slot, r.slot)
                    t.truncate(r.slot, len(r.prompt) - 1)
                    r.prefilled = r.cached = len(r.prompt) - 1
                    continue
                if not twin.finish:  # it starts now, or is on its way: wait for it
                    held.add(id(r))
                    continue
            most = (len(r.prompt) - 1) // bs
            blocks = self.prefix.match(r.prompt, most, r.keys)
            if len(blocks) < most and r.keys[len(blocks)] in busy:
                held.add(id(r))
                continue
            busy.update(r.keys[len(blocks):most])
            twins.setdefault(self._whole(r), r)
            if blocks:
                t.adopt(r.slot, blocks)
                r.prefilled = r.cached = len(blocks) * bs
        return held

    def _shared(self) -> int:
        """KV blocks the running requests' worst cases count more than once: the blocks each
        holds, less the distinct blocks held, less one for each shared, partly filled last
        block (copied on write when its sequence grows). What they may still allocate is at
        most their worst cases less this, so admission may promise it to others."""
        t = self.model.kv.tables
        if not t.active:
            return 0
        slots = np.fromiter(t.active, np.int64, len(t.active))
        lens, refs = t.lens[slots], t.alloc.refs
        n = -(-lens // t.block_size)
        last = refs[t.table[slots, np.maximum(n - 1, 0)].clip(0)]
        copies = int(((lens % t.block_size != 0) & (last > 1)).sum())
        return max(int(n.sum()) - int((refs > 0).sum()) - copies, 0)

    def _whole(self, r: Request) -> int:
        """A key of r's whole prompt: its full blocks' chain key and the tokens after."""
        assert self.prefix is not None
        bs = self.prefix.block_size
        full = len(r.prompt) // bs
        keys = self.prefix.keys(r.prompt, full, r.keys)
        return hash((keys[full - 1] if full else 0, tuple(r.prompt[full * bs:])))

    def _cache_prompts(self) -> None:
        """After an iteration commits: the full blocks its pieces completed join the cache
        (their keys and values are on their way on the stream every later chunk runs on);
        a prompt whose last piece it launched is counted."""
        grown, self._grown = dict.fromkeys(self._grown), []
        t, bs = self.model.kv.tables, self.model.kv.block_size
        for r in grown:
            if r.prefilled == len(r.prompt):
                self.stats.prompt_tokens += len(r.prompt)
                self.stats.cached_tokens += r.cached
            if self.prefix is not None and r.slot in t.active:
                self.prefix.insert(r.prompt, t.table[r.slot], r.prefilled // bs, r.keys)

    def _read(self, rows: list[Request | None], pieces: list[tuple[Request, PrefillPiece]],
              pending: Pending, done: list[Request]) -> int:
        """Tokens of a launched iteration: the first token of each prompt a piece ended (the
        prompt's last logits), then the decode rows'; requests that finished meanwhile drop
        theirs."""
        first, nxt, _ = self.runner.collect(pending)
        scored = pending.prompt_lp or [None] * len(pieces)
        for (r, piece), sc in zip(pieces, scored):
            if sc is not None and not r.finish:
                if piece.start == 0:  # the first prompt token has nothing before it
                    r.prompt_logprobs.append(None)
                k = r.sampling.prompt_logprobs or 0
                r.prompt_logprobs += [_logprob(lp, ids, k) for lp, ids in zip(*sc)]
        n = self._emit([r if piece.final else None for r, piece in pieces], first,
                       pending.first_lp, done)
        return n + self._emit(rows, nxt, pending.lp, done)

    def _emit(self, rows: Sequence[Request | None], tokens: Sequence[int],
              lp: tuple[Any, Any] | None, done: list[Request]) -> int:
        """Each row's token into its request (None or finished: nothing), with its
        log-probabilities (`lp`: the rows' arrays) where it asks; a request that stops or
        reaches its length is finished and listed in `done`. Returns the tokens emitted.
        One loop, no call per row: it runs over every row of every iteration."""
        n, step = 0, self.steps
        for i, (r, tok) in enumerate(zip(rows, tokens)):
            if r is None or r.finish:
                continue
            out = r.output
            out.append(tok)
            n += 1
            if lp is not None and r.sampling.logprobs is not None:
                r.logprobs.append(_logprob(lp[0][i], lp[1][i], r.sampling.logprobs))
            if r.first_step < 0:
                r.first_step = step
            r.last_step = step
            if tok in r.stop or len(out) >= r.max_new_tokens:
                # its slot and blocks go back once the iteration is committed
                r.finish = "stop" if tok in r.stop else "length"
                done.append(r)
        return n

    # -- all or nothing ------------------------------------------------------------------------

    def _mark(self) -> _Mark:
        t, run = self.model.kv.tables, self.runner
        return _Mark([(r, len(r.output), r.prefilled, r.cached, r.finish, r.first_step,
                       r.last_step, len(r.logprobs), len(r.prompt_logprobs))
                      for r in self.scheduler.running],
                     t.lens.copy(), set(t.active), self._ahead, run.state(),
                     self.scheduler.books())

    def _rollback(self, mark: _Mark) -> None:
        """Undo an iteration that raised: wait for what it queued on the GPU, give back the
        cache it grew and the admissions it made, and put every request's tokens and prompt
        progress back. The next decode step copies its inputs from the host again."""
        run, t = self.runner, self.model.kv.tables
        for s in {run.decode_stream, run.prefill_stream}:
            try:
                cupy_stream(s).synchronize()
            except Exception:  # a sticky CUDA error: the host state is put back regardless
                pass
        for r, n, prefilled, cached, finish, first, last, n_lp, n_prompt_lp in mark.requests:
            del r.output[n:], r.logprobs[n_lp:], r.prompt_logprobs[n_prompt_lp:]
            r.prefilled, r.cached, r.finish = prefilled, cached, finish
            r.first_step, r.last_step = first, last
        for s in sorted(t.active):
            if s not in mark.active:
                t.free(s)
            elif t.lens[s] > mark.lens[s]:
                t.truncate(s, int(mark.lens[s]))
        self.scheduler.unadmit(mark.admitted, mark.books)
        for r in mark.admitted:  # back to how they were queued
            r.output.clear()
            r.logprobs.clear()
            r.prompt_logprobs.clear()
            r.prefilled, r.cached, r.finish, r.first_step, r.last_step = 0, 0, "", -1, -1
        run.restore(mark.runner)  # and the next decode step copies its inputs again
        self._ahead, self._chained = mark.ahead, False
        self._grown.clear()
        self.stats.rollbacks += 1

    def _retire(self) -> None:
        """Give back the slot and cache blocks of requests that finished (idempotent: an
        interrupted call is completed by the next)."""
        t = self.model.kv.tables
        for r in [r for r in self.scheduler.running if r.finish]:
            if r.slot in t.active:
                self.model.free(r.slot)
            self.scheduler.finish(r, r.finish)

    # -- driving ---------------------------------------------------------------------------

    def drain(self) -> list[Request]:
        """Read the decode step still on its way, if any; requests it finishes."""
        done: list[Request] = []
        if self._ahead is not None:
            t0 = time.perf_counter()
            rows, pieces, pending = self._ahead
            self._ahead = None
            self.stats.tokens += self._read(rows, pieces, pending, done)
            self.stats.wall_s += time.perf_counter() - t0
            self._retire()
        return done

    def run(self, requests: Sequence[Request], max_steps: int = 1_000_000) -> list[Request]:
        """Run until every request has finished; returns them in the order given. Every
        request is checked before any is queued."""
        requests = list(requests)
        for i, r in enumerate(requests):
            self.check(r)
            if any(r is x for x in requests[:i]):
                raise ValueError(f"{r.name} appears twice")
        for r in requests:
            self.scheduler.add(r)
        while not self.scheduler.idle:
            if self.steps >= max_steps:
                raise RuntimeError(f"requests still running after {max_steps} steps")
            self.step()
        self.drain()  # a step launched past the last tokens: its rows have all finished
        return requests

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int = 32,
                 sampling: SamplingParams | None = None,
                 stop: Sequence[int] = ()) -> list[list[int]]:
        """Token ids generated for each prompt (all arriving at once). Every prompt is
        checked before any is queued."""
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise TypeError(f"prompts must be a list of token id lists, got "
                            f"{type(prompts).__name__}")
        reqs = [Request(token_ids(p, f"prompt {i}"), max_new_tokens,
                        SamplingParams() if sampling is None else sampling, stop)
                for i, p in enumerate(prompts)]
        return [r.output for r in self.run(reqs)]

    def beam_search(self, prompt: Sequence[int], beam_width: int, max_tokens: int,
                    length_penalty: float = 1.0, eos: Sequence[int] | None = None
                    ) -> list[Hypothesis]:
        """The best `beam_width` continuations of `prompt` by beam search (Hugging Face's
        `generate(num_beams=beam_width, do_sample=False)`; `engine.beam`), best first;
        `eos`: the ids that end a beam (default: the model's). The engine must be idle
        (ValueError otherwise); beams take cache slots of their own, forking and dropping
        blocks each step, their decode steps on the bucket graphs."""
        stop = self.model.cfg.eos if eos is None else eos
        return beam_search(self, prompt, beam_width, max_tokens, length_penalty, stop)

    def close(self) -> None:
        """Destroy the graphs and forget the cached prefixes no request holds (the model
        stays usable; an engine made on it later starts with a cold cache)."""
        self.drain()
        if self.prefix is not None:
            self.prefix.clear()
        self.runner.close()
