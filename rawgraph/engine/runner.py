"""Runs the model's prefill chunks and decode steps, as graphs or eagerly.

Decode: one graph per batch bucket, captured once for the longest context; per step the
sequences' ids, positions and sampling parameters go to the device in one copy and their
tables and lengths in another, and only the attention nodes whose split count changes are
patched (`max_len`). The sampler writes the tokens into mapped host memory (no copy back)
and hands them on as the next step's inputs, so a step that continues the last one
(`follow`) copies nothing unless a sequence needs a new cache block. Batches above the
largest bucket run eagerly, and the reason is logged.
Prefill: one graph per chunk size; a chunk of n tokens runs in the smallest graph that
holds it, with n, the sequence count and the longest piece (`max_q_len`) patched in, so the
last partial chunk of a prompt costs a patch, not a recapture or a pad to the full chunk.
With two streams, a prefill chunk and a decode step of the same iteration run concurrently,
ordered after one shared copy of the cache tables by an event; that copy waits for the last
chunk (which reads the tables). A chunk's first tokens are copied into mapped host memory
after it, a half per iteration in turn, so an iteration may be launched before the last
one's tokens are read, chunk or not.
The eager path issues exactly the same launches (same buckets, same kernels): its tokens
and logits are bit-identical to the graphs'. An iteration is prepared once
(`Inputs.prepare`: checks, metadata, the sizes its launches take), then each of its parts
(`_parts`: a `Shape` and its graph) is either patched to those sizes and replayed or
launched eagerly with them (`Model.launch`), in one place (`Runner.launch`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import cupy
import numpy as np

from rawgraph.cuda.stream import cupy_stream, new_stream
from rawgraph.engine.pool import GraphPool
from rawgraph.graph.capture import capture
from rawgraph.graph.graph import Graph
from rawgraph.memory.mapped import MappedArray
from rawgraph.model.decoder import PREFILL_CHUNKS, Model, Scores
from rawgraph.model.step import (
    LastStep,
    PrefillPiece,
    Shape,
    final_tokens,
    last_step,
    symbols,
)
from rawgraph.ops import LP_STRIDE
from rawgraph.ops.sampling import SamplingParams

log = logging.getLogger("rawgraph.engine")
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass
class IterStats:
    """What one iteration (a prefill chunk and/or a decode step) cost on the host."""

    decode_rows: int = 0      # rows with a sequence (a continued step may hold empty ones)
    prefill_tokens: int = 0
    host_us: float = 0.0      # prepare + patch + launch, before waiting for the GPU
    patch_us: float = 0.0     # ex.set calls alone
    patched: int = 0          # kernel nodes patched
    wall_ms: float = 0.0      # launch to tokens back on the host (Engine: its step's time)
    follow: bool = False      # its decode step continued the last one on the device (Engine)
    eager: list[str] = field(default_factory=list)  # why parts ran eagerly


@dataclass
class Pending:
    """A launched iteration whose tokens have not been read yet (`Runner.collect`)."""

    pieces: list[PrefillPiece]
    firsts: tuple[int, Any] | None  # the pieces' half of the first-token pairs, and its event
    rows: int                   # decode rows
    parity: Any                 # (rows,) each row's position % 2 (its token's half); -1: empty
    done: Any                   # event recorded after the decode step
    st: IterStats
    t0: float
    tokens: list[int] | None = None  # the decode tokens, once read
    first: list[int] | None = None   # the pieces' next tokens (-1: not final), once read
    want_lp: bool = False            # a decode row asked for log-probabilities
    lp: tuple[Any, Any] | None = None        # (rows, LP_STRIDE) lp and ids, once read
    first_lp: tuple[Any, Any] | None = None  # the pieces' likewise (firsts' half), once read
    scores: Scores | None = None     # prompt log-probabilities on their way (Model.score)
    prompt_lp: list[tuple[Any, Any] | None] | None = None  # per piece, once read


def _sizes(default: Sequence[int], limit: int, given: Sequence[int] | None) -> tuple[int, ...]:
    sizes = sorted(set(given if given is not None else [s for s in default if s < limit]))
    if given is None:
        sizes.append(limit)
    if not sizes or sizes[0] < 1 or sizes[-1] > limit:
        raise ValueError(f"sizes {sizes} must lie in [1, {limit}]")
    return tuple(dict.fromkeys(sizes))


def _replay(ex: Any, stream: Any, st: IterStats, **values: Any) -> None:
    """Patch executable `ex` to `values` (nodes patched and time into `st`), launch it on
    `stream`."""
    tp = time.perf_counter()
    st.patched += ex.set(**values)
    st.patch_us += (time.perf_counter() - tp) * 1e6
    ex.launch(stream)


def _split_scores(sc: Scores, pieces: int) -> list[tuple[Any, Any] | None]:
    """Each piece's rows of read prompt log-probabilities ((rows, LP_STRIDE) lp, ids), None
    for a piece that did not ask."""
    lp, ids = sc.lp.get(), sc.ids.get()
    out: list[tuple[Any, Any] | None] = [None] * pieces
    row = 0
    for i, n in sc.spans:
        out[i] = (lp[row:row + n], ids[row:row + n])
        row += n
    return out


class Launched:
    """What a runner has launched and not read yet (each with `tokens`, None until read),
    whose turn it is of the two alternating decode events (the state an engine's rollback
    puts back), and the last decode step, which a step may continue on the device
    (`follow`; a rollback drops it)."""

    buckets: tuple[int, ...]  # the decode batch sizes (set by the subclass)

    def __init__(self) -> None:
        self._unread: list = []  # decode launches whose tokens were not read yet
        self._turn = 0
        self._first_turn = 0  # whose turn it is of the two halves of a chunk's first tokens
        self._last_step: LastStep | None = None  # the last decode step, if it may be continued
        self._chunk: list[PrefillPiece] = []  # the last launch's pieces (their first tokens)

    def _check_launch(self, slots: Sequence[int], tokens: Sequence[int] | None,
                      sampling: Sequence[SamplingParams] | None, follow: bool,
                      fed: Sequence[int] | None) -> list[int] | None:
        """`launch`'s arguments that do not depend on the device, checked before anything
        changes (ValueError); returns `fed` checked (`_check_fed`)."""
        if follow:
            if sampling is not None or not slots:
                raise ValueError("follow: a decode step, its sampling parameters the slots' "
                                 "own")
            return self._check_fed(slots, fed)
        if slots and tokens is None:
            raise ValueError("tokens are needed unless the step follows the last one")
        if fed is not None:
            raise ValueError("fed: only a step that follows the last one")
        return None

    def _check_fed(self, slots: Sequence[int], fed: Sequence[int] | None) -> list[int] | None:
        """`fed` (per row: the index of the last launch's piece whose first token feeds the
        row, its sequence's prompt ended there; -1 elsewhere) checked against that launch;
        None for none. ValueError before anything changes."""
        if fed is None:
            return None
        fed = [int(j) for j in fed]
        if len(fed) != len(slots):
            raise ValueError(f"fed {fed}: one per row of {len(slots)}")
        for i, j in enumerate(fed):
            if j >= 0 and not (j < len(self._chunk) and self._chunk[j].final
                               and self._chunk[j].slot == slots[i]):
                raise ValueError(f"fed {fed}: row {i} (slot {slots[i]}) names no piece of the "
                                 f"last launch's chunk that ended its prompt")
        return fed

    def bucket(self, rows: int) -> int | None:
        """The smallest decode bucket holding `rows` (of the subclass's `buckets`), or None
        above the largest."""
        return next((b for b in self.buckets if b >= rows), None)

    def state(self) -> tuple[list, int, int]:
        """What an engine's rollback restores: the launched iterations not read yet, and
        whose turn it is (of the two alternating decode events, and of the two halves of
        the first tokens: a rolled-back chunk's half is the next chunk's, not an unread
        one's)."""
        return list(self._unread), self._turn, self._first_turn

    def restore(self, state: tuple[list, int, int]) -> None:
        """Back to `state` (iterations read since stay read: their tokens are on the host)."""
        unread, self._turn, self._first_turn = state
        self._unread = [p for p in unread if p.tokens is None]
        # the device's step inputs may be a rolled-back step's: the next decode step copies
        # them from the host
        self._last_step = None
        self._chunk = []


class Runner(Launched):
    """The model's iterations through bucket and chunk graphs (`graphs=True`) or eagerly.

    `pdl` (default on) launches decode and prefill kernels with programmatic dependent
    launch: each kernel starts while the previous one drains (the GEMV fetches its first
    weights then), which hides most of the gap between kernels. Results are bit-identical
    either way. `mixed`: an iteration with both a prefill chunk and a decode step runs them
    as one (a mixed `Shape`, a graph per bucket and chunk size: the weights read once)
    instead of two graphs side by side. `check_inputs` (default: the environment variable
    RAWGRAPH_CHECK_INPUTS set to 1): before each iteration's kernels, wait for both streams
    and check that the device holds what the host says they read (`Inputs.check`;
    DeviceStateError): a debug mode, slow, for tests and for hunting a wrong token.
    """

    def __init__(self, model: Model, *, graphs: bool = True, buckets: Sequence[int] | None = None,
                 chunks: Sequence[int] | None = None, streams: int = 2, max_graphs: int = 64,
                 max_graph_bytes: int = 1 << 30, pdl: bool = True, mixed: bool = False,
                 check_inputs: bool | None = None):
        if streams not in (1, 2):
            raise ValueError(f"streams = {streams}: one stream, or two (prefill beside decode)")
        if mixed and getattr(model, "batch_invariant", False):
            raise ValueError("mixed=True on a batch-invariant model: a mixed iteration's decode "
                             "rows round as its chunk's tokens do")
        self.model, self.graphs, self.pdl, self.mixed = model, graphs, pdl, mixed
        self.check_inputs = (os.environ.get("RAWGRAPH_CHECK_INPUTS") == "1"
                             if check_inputs is None else check_inputs)
        self.buckets = _sizes(BUCKETS, model.max_batch, buckets)
        self.chunks = _sizes(PREFILL_CHUNKS, model.max_chunk, chunks)
        # its streams are non-blocking: they do not wait for the legacy default stream, on
        # which CuPy queues a caller's fills and copies (a cache zeroed just before this);
        # what was queued before the runner lands before its first launch
        cupy.cuda.Device().synchronize()
        self.decode_stream = new_stream()
        self.prefill_stream = new_stream() if streams == 2 else self.decode_stream
        self._tables_copied = cupy.cuda.Event(block=False, disable_timing=True)
        self._prefill_done = cupy.cuda.Event(block=False, disable_timing=True)
        self.pool = GraphPool(self._build, self.decode_stream, max_graphs=max_graphs,
                              max_bytes=max_graph_bytes)
        self._warned: set[str] = set()
        # decode tokens come back through mapped host memory the sampler writes, a pair per
        # row, the half its position's parity picks: a step's tokens may be read while the
        # step continuing it (launched before they were read) writes the other half
        self._tokens = MappedArray(2 * model.max_batch)
        self._token_pairs = self._tokens.dev.reshape(model.max_batch, 2)
        # and the log-probabilities of the rows that ask, likewise (ops.Logprobs' halves)
        self._lp = (MappedArray(2 * LP_STRIDE * model.max_batch, np.float32),
                    MappedArray(2 * LP_STRIDE * model.max_batch, np.int32))
        self._lp_pairs = tuple(a.dev.reshape(model.max_batch, 2, LP_STRIDE) for a in self._lp)
        self._done = [cupy.cuda.Event(block=False, disable_timing=True) for _ in range(2)]
        # a chunk's first tokens likewise: the head's picks copied into mapped memory after
        # the chunk, the iterations taking the two halves in turn, so a chunk's may be read
        # while the next iteration (launched before they were) runs
        self._firsts = MappedArray(2 * model.max_chunk_seqs)
        self._first_halves = self._firsts.dev.reshape(2, model.max_chunk_seqs)
        s = model.max_chunk_seqs
        self._first_lp = (MappedArray(2 * s * LP_STRIDE, np.float32),
                          MappedArray(2 * s * LP_STRIDE, np.int32))
        self._first_done = [cupy.cuda.Event(block=False, disable_timing=True) for _ in range(2)]
        self._first_owner: list[Pending | None] = [None, None]  # whose tokens each half holds
        super().__init__()

    # -- graphs -------------------------------------------------------------------------------

    def _build(self, shape: Shape) -> Graph:
        """Capture the graph of iterations of `shape`, its sizes symbols (`step.symbols`)."""
        m, s, b = self.model, self.decode_stream, shape.batch
        if shape.batch and shape.chunk:
            m.mixed_buffers()  # allocated before the capture
        sym = symbols(shape, m.limits)
        with capture(s, name=str(shape)) as cap:
            m.launch(shape, {k: getattr(sym, k) for k in shape.sizes}, s, symbols=sym,
                     pdl=self.pdl, **self._outputs(b))
        return cap.graph

    def _outputs(self, rows: int) -> dict[str, Any]:
        """Where a launch of `rows` decode rows leaves its tokens and log-probabilities (the
        mapped pairs); nothing for a chunk alone."""
        return {"host_next": self._token_pairs[:rows], "host_lp": self._host_lp(rows)} \
            if rows else {}

    def _host_lp(self, rows: int) -> tuple[Any, Any]:
        """The first `rows` rows of the mapped log-probability pairs (lp, ids)."""
        return self._lp_pairs[0][:rows], self._lp_pairs[1][:rows]

    def keys(self) -> list[Shape]:
        """Every graph this runner uses: decode buckets, prefill chunk sizes, then (`mixed`)
        each bucket with each chunk size."""
        keys = [Shape(batch=b) for b in self.buckets] + [Shape(chunk=c) for c in self.chunks]
        if self.mixed:
            keys += [Shape(b, c) for b in self.buckets for c in self.chunks]
        return keys

    def capture_all(self, progress: bool = True) -> dict[str, Any]:
        """Capture and instantiate every graph now; a progress bar on stderr, a summary back."""
        t0 = time.perf_counter()
        keys = self.keys()
        for i, key in enumerate(keys):
            self.pool.acquire(key)
            if progress:
                bar = "#" * (20 * (i + 1) // len(keys))
                print(f"\rcapturing graphs [{bar:<20}] {i + 1}/{len(keys)} {key!s:<22}",
                      end="", file=sys.stderr, flush=True)
        ms = (time.perf_counter() - t0) * 1e3
        nodes = sum(len(e.graph.nodes) for e in self.pool.entries.values())
        summary = {"graphs": len(self.pool), "nodes": nodes, "capture ms": ms,
                   "graph MiB": self.pool.nbytes / 2**20}
        if progress:
            print(f"\rcaptured {summary['graphs']} graphs ({nodes} nodes) in {ms:.0f} ms, "
                  f"{summary['graph MiB']:.1f} MiB" + " " * 20, file=sys.stderr)
        return summary

    # -- one iteration -----------------------------------------------------------------------

    def chunk_size(self, tokens: int) -> int:
        """The smallest chunk size holding `tokens` (planners never exceed the largest)."""
        c = next((c for c in self.chunks if c >= tokens), None)
        if c is None:
            raise ValueError(f"a chunk of {tokens} tokens exceeds the largest chunk size "
                             f"{self.chunks[-1]}")
        return c

    def _eager(self, st: IterStats, why: str) -> None:
        st.eager.append(why)
        if why not in self._warned:
            self._warned.add(why)
            log.warning("running eagerly: %s", why)

    def run(self, pieces: Sequence[PrefillPiece], slots: Sequence[int],
            tokens: Sequence[int], sampling: Sequence[SamplingParams] | None = None
            ) -> tuple[list[int], list[int], IterStats]:
        """One iteration: a prefill chunk of `pieces` and a decode step of `slots` (either may
        be empty). Decode rows sample with their slots' stored parameters (set by their
        prefill pieces) unless `sampling` is given. Returns (next token per piece, -1 for
        pieces that are not final; next token per slot; stats)."""
        return self.collect(self.launch(pieces, slots, tokens, sampling))

    def launch(self, pieces: Sequence[PrefillPiece], slots: Sequence[int],
               tokens: Sequence[int] | None, sampling: Sequence[SamplingParams] | None = None,
               *, follow: bool = False, fed: Sequence[int] | None = None) -> Pending:
        """`run` without waiting: the iteration is queued on the GPU; `collect` returns its
        tokens. `follow`: a decode step continuing the last decode launch, its rows in
        their places, fed the tokens that step samples on the device
        (`Inputs.follow` checks it): each row the same slot as there, or -1 (a row
        whose sequence has left, kept as a padding row so the others keep their places; its
        token is -1), and a row that was empty there, or past its rows, may take a joining
        sequence fed from the host (`tokens`: its token there and -1 elsewhere; None when
        no row joins) or with the first token the last launch's chunk made for it, on the
        device (`fed`: the index of the piece that ended its prompt there, -1 elsewhere;
        that launch need not have been read). With a prefill chunk beside it (or in a mixed
        iteration) or not: the host can prepare and launch it before it has read the last
        step's tokens, so its work hides behind the GPU's. Tokens this launch could
        overwrite are read first (waiting for them): only the last step's may stay unread
        across a step that continues it."""
        fed = self._check_launch(slots, tokens, sampling, follow, fed)
        m, ds = self.model, self.decode_stream
        st = IterStats(decode_rows=sum(s >= 0 for s in slots),
                       prefill_tokens=sum(len(p.tokens) for p in pieces))
        parts = self._parts(pieces, slots, st)  # graphs first (a lazy capture runs before
        # this iteration's copies)
        if slots:  # tokens this step's sampler could overwrite are read first: a continuing
            # step writes the other half of the last step's pairs, anything else may not
            while len(self._unread) > (1 if follow else 0):
                self._settle(self._unread[0])
        t0 = time.perf_counter()
        mixed = next((shape for shape, _ in parts if shape.kind == "mixed"), None)
        ps = ds if mixed is not None else self.prefill_stream
        if self.prefill_stream is not ds:  # the tables' copy waits for a chunk reading them
            cupy_stream(ds).wait_event(self._prefill_done)
        sizes = m.inputs.prepare(pieces, slots, tokens, sampling, follow=follow,
                                 last=self._last_step, fed=fed, decode_stream=ds,
                                 prefill_stream=ps, mixed=mixed)
        if slots:  # every decode step launches with advance=1: the next may continue it
            self._last_step = last_step(slots, m.kv.tables, m.kv.syncs)
            sizes["advance"] = 1
        if pieces and ps is not ds:
            self._tables_copied.record(cupy_stream(ds))
            cupy_stream(ps).wait_event(self._tables_copied)
        if self.check_inputs:
            self._check_inputs(pieces, slots, tokens, fed)
        done = self._done[self._turn]
        for shape, ex in parts:  # decode first: it is what the waiting users feel
            stream = ds if shape.batch else ps
            values = {k: sizes[k] for k in shape.sizes}
            if ex is not None:
                _replay(ex, stream, st, **values)
            else:
                m.launch(shape, values, stream, pdl=self.pdl, **self._outputs(shape.batch))
            if shape.batch:
                done.record(cupy_stream(ds))
                self._turn ^= 1
        rows = m.mixed_buffers()["r"][mixed.batch:] if mixed is not None else m.pre["r"]
        scores = m.score(pieces, rows, ps) if pieces else None
        firsts = self._copy_firsts(pieces, ps) if pieces else None
        if pieces and ps is not ds:
            self._prefill_done.record(cupy_stream(ps))
        st.host_us = (time.perf_counter() - t0) * 1e6
        parity = self._parity() if slots else None
        return self._pending(pieces, firsts, slots, parity, done, st, t0, scores)

    def _parts(self, pieces: Sequence[PrefillPiece], slots: Sequence[int],
               st: IterStats) -> list[tuple[Shape, Any]]:
        """What an iteration launches, decode first: (shape, its graph or None to launch
        eagerly) for the decode step's bucket (above the largest: its rows, eagerly) and the
        chunk's size, or (`mixed`) one for both."""
        b = self.bucket(len(slots)) if slots else None
        c = self.chunk_size(st.prefill_tokens) if pieces else None
        if slots and b is None:
            self._eager(st, f"{len(slots)} rows exceed the largest bucket {self.buckets[-1]}")
        if self.mixed and b is not None and c is not None:
            shapes = [Shape(b, c)]
        else:
            shapes = ([Shape(batch=b or len(slots))] if slots else []) + (
                [Shape(chunk=c)] if c is not None else [])
        graphs = [self.pool.acquire(sh, keep=tuple(shapes[:i])) if self.graphs and (
            sh.batch in (0, b)) else None for i, sh in enumerate(shapes)]
        return list(zip(shapes, graphs))

    def _pending(self, pieces: Sequence[PrefillPiece], firsts: tuple[int, Any] | None,
                 slots: Sequence[int], parity: Any, done: Any, st: IterStats, t0: float,
                 scores: Scores | None) -> Pending:
        """A launch's Pending, recorded as the owner of what it left in the shared halves."""
        rows = len(slots)
        live = np.asarray(slots, np.int64)
        live = live[live >= 0]
        want = bool(live.size) and bool((self.model.inputs.sampling["top_n"][live] >= 0).any())
        p = Pending(list(pieces), firsts, rows, parity, done, st, t0, want_lp=want,
                    scores=scores)
        self._chunk = list(pieces)  # whose first tokens a following step may take
        if rows:
            self._unread.append(p)
        if firsts is not None:
            self._first_owner[firsts[0]] = p
        return p

    def _copy_firsts(self, pieces: Sequence[PrefillPiece], stream: Any) -> tuple[int, Any]:
        """After a chunk on `stream`: its pieces' next tokens (and log-probabilities, where a
        final piece asks) into this turn's half of the mapped first-token pairs (the chunk's
        before it there read first, if nobody has); (the half, the event after the copy)."""
        k, done, n = self._first_turn, self._first_done[self._first_turn], len(pieces)
        self._first_turn ^= 1
        if (owner := self._first_owner[k]) is not None:
            self._read_firsts(owner)
        pre = self.model.pre
        with cupy_stream(stream):
            self._first_halves[k, :n] = pre["next"][:n]
            if any(p.final and p.sampling.logprobs is not None for p in pieces):
                for mapped, src in zip(self._first_lp, (pre["lp"], pre["lp_ids"])):
                    mapped.dev.reshape(2, -1, LP_STRIDE)[k, :n] = src[:n]
        done.record(cupy_stream(stream))
        return k, done

    def _check_inputs(self, pieces: Sequence[PrefillPiece], slots: Sequence[int],
                      tokens: Sequence[int] | None, fed: Sequence[int] | None) -> None:
        """`check_inputs`' check, once this iteration's copies are queued: both streams
        waited for, then `Inputs.check` (tokens: the host's, -1 for a row it does not
        feed)."""
        for s in {self.decode_stream, self.prefill_stream}:
            cupy_stream(s).synchronize()
        self.model.inputs.check(pieces, slots, tokens, fed)

    def _parity(self) -> Any:
        """Each row of the last decode step's half of its token pair (the parity of its
        position, from the lengths the step's record took: nothing since has grown them);
        -1 for an empty row (no token to read)."""
        last = self._last_step
        assert last is not None
        return np.where(last.slots >= 0, (last.lens - 1) & 1, -1)

    def _settle(self, p: Pending) -> None:
        """Wait for a decode launch and read its tokens out of the shared pairs."""
        p.done.synchronize()
        at = (np.arange(p.rows), np.maximum(p.parity, 0))
        pairs = self._tokens.host.reshape(-1, 2)[at]
        p.tokens = np.where(p.parity >= 0, pairs, -1).tolist()
        if p.want_lp:
            lp, ids = (a.host.reshape(-1, 2, LP_STRIDE)[at] for a in self._lp)
            p.lp = (lp, ids)
        self._unread.remove(p)

    def _read_firsts(self, p: Pending) -> None:
        """Wait for a chunk's copy and read its pieces' next tokens out of its half."""
        assert p.firsts is not None
        k, done = p.firsts
        if p.first is None:
            done.synchronize()
            n = len(p.pieces)
            half = self._firsts.host.reshape(2, -1)[k, :n]
            p.first = final_tokens(half.tolist(), p.pieces)
            if any(q.final and q.sampling.logprobs is not None for q in p.pieces):
                lp, ids = (a.host.reshape(2, -1, LP_STRIDE)[k, :n].copy() for a in self._first_lp)
                p.first_lp = (lp, ids)
            if p.scores is not None:  # queued before the firsts' copy: done too
                p.prompt_lp = _split_scores(p.scores, n)
        if self._first_owner[k] is p:
            self._first_owner[k] = None

    def collect(self, p: Pending) -> tuple[list[int], list[int], IterStats]:
        """Wait for a launched iteration; (next token per piece, -1 for pieces that are not
        final; next token per decode row; stats)."""
        if p.firsts is not None:
            self._read_firsts(p)
        if p.rows and p.tokens is None:
            self._settle(p)
        p.st.wall_ms = (time.perf_counter() - p.t0) * 1e3
        return p.first or [], p.tokens or [], p.st

    def close(self) -> None:
        """Destroy the graphs and free the token buffers (after the decode stream's work)."""
        self.pool.close()
        for stream in {self.decode_stream, self.prefill_stream}:
            cupy_stream(stream).synchronize()
        for mapped in (self._tokens, self._firsts, *self._lp, *self._first_lp):
            mapped.close()
