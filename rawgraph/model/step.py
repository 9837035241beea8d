"""A step's sizes, derived and checked once on the host before anything changes.

A prefill chunk is made of pieces (`PrefillPiece`), one per sequence. The decoder's limits
(`Limits`) and the cache's block tables are all a check needs: a decode
step's rows (`decode_rows`), a prefill chunk's pieces (`chunk`), the KV blocks a growth takes
(`blocks_needed`), the one check of a context against `max_context` (`check_context`), and
whether a decode step may continue the last one on the device (`LastStep`, `check_follow`).
Each raises ValueError naming the problem and changes nothing, so `Model` and the runner call
them before touching the tables or the device; none needs a GPU.

An iteration's launches depend on its `Shape` (a decode bucket, a chunk size, or both) and on
a few sizes (`SIZES`): ints when it runs eagerly, the symbols of `symbols(shape, limits)`
when it is captured, the same names patched in a graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rawgraph.memory.blocks import BlockTables
from rawgraph.ops.logits import BIAS_CAP
from rawgraph.ops.sampling import SamplingParams
from rawgraph.symbols import Range, Symbols

GREEDY = SamplingParams()


@dataclass(frozen=True)
class PrefillPiece:
    """One sequence's share of a prefill chunk: `tokens` at positions start, start + 1, ...
    `final`: the piece ends its prompt, so its last position's next token is sampled (a chunk
    of non-final pieces skips the LM head: an IF node in a graph). `bans`: the ids
    sampling.min_tokens bans (the request's stop ids) while the position is below
    `ban_until` (read from the sequence's first piece). `next_token`: the prompt token after
    the piece (-1 for a final piece): what its last row scores with prompt_logprobs.
    `cached`: the prompt tokens a prefix cache held for the sequence: its first piece
    (`first`) starts there."""

    slot: int
    tokens: Sequence[int]
    start: int
    sampling: SamplingParams = GREEDY
    final: bool = True
    bans: tuple[int, ...] = ()
    ban_until: int = 0
    next_token: int = -1
    cached: int = 0

    @property
    def first(self) -> bool:
        """The sequence's first piece: it installs the sequence's sampling rules."""
        return self.start == self.cached


def check_rules(piece: PrefillPiece, limits: Limits) -> None:
    """ValueError unless a sequence's rules fit: its logit_bias ids and banned ids in the
    vocabulary, and few enough for its bias entries."""
    ids = {t for t, _ in piece.sampling.logit_bias} | set(piece.bans)
    bad = [t for t in ids if not 0 <= t < limits.vocab]
    if bad:
        raise ValueError(f"slot {piece.slot}: token id {min(bad)} of logit_bias or the banned "
                         f"stop ids outside [0, {limits.vocab})")
    if len(ids) > BIAS_CAP:
        raise ValueError(f"slot {piece.slot}: {len(ids)} biased and banned ids, at most "
                         f"{BIAS_CAP}")


def final_tokens(tokens: Sequence[int], pieces: Sequence[PrefillPiece]) -> list[int]:
    """Each piece's sampled token, -1 where the piece is not final (nothing was sampled)."""
    return [t if p.final else -1 for t, p in zip(tokens, pieces)]


@dataclass(frozen=True)
class Limits:
    """What the decoder was sized for."""

    max_batch: int       # decode rows, and cache slots 0 .. max_batch - 1
    max_chunk: int       # tokens in a prefill chunk
    max_chunk_seqs: int  # sequences in a prefill chunk
    max_context: int     # tokens a sequence may reach
    vocab: int


@dataclass(frozen=True)
class Shape:
    """What an iteration launches, and what a graph is captured for: a decode step over a
    bucket of `batch` rows (0: none; rows past its sequences are padding) and/or a prefill
    chunk whose kernels are chosen for `chunk` tokens (0: none). Both: a mixed iteration
    (the decode rows and the chunk's tokens through each projection together)."""

    batch: int = 0
    chunk: int = 0

    @property
    def sizes(self) -> tuple[str, ...]:
        """The names of the sizes its launches take (`SIZES`)."""
        return (("max_len", "advance") if self.batch else ()) + (
            ("n", "seqs", "max_q_len", "pre_len") if self.chunk else ())

    @property
    def kind(self) -> str:
        """"decode", "prefill" or "mixed"."""
        return "mixed" if self.batch and self.chunk else "decode" if self.batch else "prefill"

    def __str__(self) -> str:
        return " ".join([self.kind] + ([f"B={self.batch}"] if self.batch else [])
                        + ([f"C={self.chunk}"] if self.chunk else []))


# the sizes an iteration's launches take: ints eagerly, symbols when captured (patched)
SIZES = {
    "max_len": "the decode rows' longest context, their own token included",
    "advance": "1: the sampler hands each token on to a step that continues this one",
    "n": "the chunk's tokens",
    "seqs": "the chunk's pieces (one sequence each)",
    "max_q_len": "the chunk's longest piece",
    "pre_len": "the longest context of the chunk's sequences, the chunk included",
}


def symbols(shape: Shape, limits: Limits) -> Symbols:
    """The symbols a graph of `shape` is captured with: each size's range, set to the value
    it is captured at (the largest: every split and run block a later value needs)."""
    ctx, c = Range(1, limits.max_context), shape.chunk
    ranges = {"max_len": ctx, "advance": Range(0, 1), "n": Range(1, max(c, 1)),
              "seqs": Range(1, limits.max_chunk_seqs), "max_q_len": Range(1, max(c, 1)),
              "pre_len": ctx}
    at = {"max_len": limits.max_context, "advance": 1, "n": c, "seqs": 1, "max_q_len": c,
          "pre_len": limits.max_context}
    sym = Symbols(**{k: ranges[k] for k in shape.sizes})
    sym.set(**{k: at[k] for k in shape.sizes})
    return sym


def check_shape(shape: Shape, sizes: dict, limits: Limits) -> None:
    """ValueError unless `shape` fits the decoder and `sizes` name exactly its sizes."""
    if not (shape.batch or shape.chunk) or not 0 <= shape.batch <= limits.max_batch \
            or not 0 <= shape.chunk <= limits.max_chunk:
        raise ValueError(f"shape {shape!r}: a batch in [1, {limits.max_batch}] and/or a "
                         f"chunk in [1, {limits.max_chunk}]")
    if set(sizes) - set(shape.sizes) or set(shape.sizes) - set(sizes) - {"advance"}:
        raise ValueError(f"sizes {sorted(sizes)}: shape {shape} takes {list(shape.sizes)}")


@dataclass(frozen=True)
class DecodeRows:
    """A decode step's rows, checked: their slots and input tokens as arrays."""

    slots: np.ndarray   # (rows,) int64
    tokens: np.ndarray  # (rows,) int64


@dataclass(frozen=True)
class Chunk:
    """A prefill chunk, checked: its sizes and how much each sequence grows."""

    tokens: int                  # all pieces' tokens
    seqs: int                    # pieces (one sequence each)
    max_q_len: int               # the longest piece (its query rows)
    need: dict[int, int]         # slot -> tokens it grows by


@dataclass(frozen=True)
class LastStep:
    """A decode step launched with `advance=1`: its sampler made its tokens the rows' next
    inputs and moved their positions and cache lengths on, on the device. A step continuing
    it (`Inputs.follow`) takes the same rows in the same places, of the same
    sequences, at the lengths that step left, or leaves a row's place empty (slot -1: a
    padding row) (`check_follow`)."""

    slots: np.ndarray    # (rows,) int64; -1: an empty row
    lens: np.ndarray     # (rows,) their lengths after that step (0 for empty rows)
    started: np.ndarray  # (rows,) tables.started[slots]: the sequences the slots held
    syncs: int           # the cache's table copies by then (a later one rewrote the lengths)


def last_step(slots: Sequence[int], tables: BlockTables, syncs: int) -> LastStep:
    """The record of a decode step of `slots` (-1: an empty row) just prepared (`syncs`: the
    cache's copies)."""
    sl = np.asarray(slots, np.int64)
    live = sl >= 0
    lens, started = np.zeros(len(sl), tables.lens.dtype), np.full(len(sl), -1,
                                                                  tables.started.dtype)
    lens[live], started[live] = tables.lens[sl[live]], tables.started[sl[live]]
    return LastStep(sl, lens, started, syncs)


def check_follow(last: LastStep | None, slots: Sequence[int], tables: BlockTables,
                 limits: Limits, tokens: Sequence[int] | None = None,
                 fed: Sequence[bool] | None = None) -> np.ndarray:
    """ValueError unless a decode step of `slots` may continue `last` (None: no step to
    continue); nothing changes. Each of last's rows keeps its slot, or is left empty (-1);
    a row that was empty there, or past its rows, may stay empty or take a sequence that
    joins, fed its token from the host (`tokens`: that row's token, -1 in every other row)
    or on the device (`fed`: True in that row: the first token its prompt's last chunk
    left there; its entry in `tokens` is -1). At least one row has a sequence. Returns the
    joining rows' mask."""
    if last is None:
        raise ValueError("no decode step to continue: the last one was not a decode step "
                         "launched with advance=1, or it was rolled back")
    sl, got = last.slots, np.asarray(list(slots), np.int64)
    was = np.full(len(got), -1, np.int64)
    was[:min(len(sl), len(got))] = sl[:len(got)]
    joins = (got >= 0) & (was < 0)
    if (len(got) < len(sl) or len(got) > limits.max_batch
            or ((got != was) & (got >= 0) & (was >= 0)).any() or not (got >= 0).any()):
        raise ValueError(f"slots {got.tolist()} are not the continued step's {sl.tolist()} "
                         f"(or some of its rows left empty, -1, or empty rows taking a new "
                         f"sequence)")
    live = got[got >= 0]
    if len(set(live.tolist())) < len(live) or live.max() >= limits.max_batch:
        raise ValueError(f"slots {got.tolist()} must be distinct, in [0, {limits.max_batch})")
    if joins.any() and np.isin(got[joins], sl[sl >= 0]).any():  # its token is on its way
        raise ValueError(f"slots {got.tolist()}: a sequence of the continued step may not "
                         f"move to another row")
    dev = np.zeros(len(got), bool) if fed is None else np.asarray(list(fed), bool)
    if len(dev) != len(got) or (dev & ~joins).any():
        raise ValueError(f"fed {dev.tolist()}: one per row, True only in rows taking a new "
                         f"sequence ({np.flatnonzero(joins).tolist()})")
    host = joins & ~dev
    if tokens is None:
        if host.any():
            raise ValueError(f"rows {np.flatnonzero(host).tolist()} take a new sequence: "
                             f"their tokens are needed")
    else:
        tok = np.asarray(list(tokens), np.int64)
        if len(tok) != len(got) or (tok[~host] != -1).any():
            raise ValueError(f"tokens {tok.tolist()}: one per row, -1 but in the rows taking "
                             f"a new sequence from the host ({np.flatnonzero(host).tolist()})")
        if host.any() and (tok[host].min() < 0 or tok[host].max() >= limits.vocab):
            raise ValueError(f"token ids {tok[host].tolist()} outside [0, {limits.vocab})")
    kept = (got >= 0) & ~joins
    cont = got[kept]
    if (not tables.active.issuperset(live.tolist())
            or (tables.lens[cont] != last.lens[kept[:len(sl)]]).any()
            or (tables.started[cont] != last.started[kept[:len(sl)]]).any()):
        raise ValueError(f"slots {got.tolist()}: their sequences changed since the step this "
                         f"one continues")
    top = max(int(last.lens.max()), int(tables.lens[got[joins]].max()) if joins.any() else 0)
    check_context(top + 1, limits)
    return joins


def check_context(context: int, limits: Limits, where: str = "") -> None:
    """ValueError unless a sequence of `context` tokens fits: the one check of a context
    against max_context."""
    if context > limits.max_context:
        raise ValueError(f"{where}context {context} exceeds max_context = "
                         f"{limits.max_context}")


def check_slots(slots: Sequence[int], limits: Limits) -> None:
    """ValueError unless `slots` are distinct cache slots."""
    if len(set(slots)) < len(slots) or not all(0 <= s < limits.max_batch for s in slots):
        raise ValueError(f"slots {list(slots)} must be distinct, in [0, {limits.max_batch})")


def decode_rows(slots: Sequence[int], tokens: Sequence[int], tables: BlockTables,
                limits: Limits) -> DecodeRows:
    """A decode step's rows (one token each into sequences `slots`), checked."""
    n = len(slots)  # Python's min/max/set: faster than NumPy's for a step's few rows
    if not 0 < n == len(tokens) <= limits.max_batch:
        raise ValueError(f"{n} slots, {len(tokens)} tokens: need 1 to {limits.max_batch} "
                         f"rows, one token each")
    if min(slots) < 0 or max(slots) >= limits.max_batch or len(set(slots)) < n:
        raise ValueError(f"slots {list(slots)} must be distinct, in [0, {limits.max_batch})")
    if min(tokens) < 0 or max(tokens) >= limits.vocab:
        raise ValueError(f"token ids {list(tokens)} outside [0, {limits.vocab})")
    sl, tok = np.asarray(slots, np.int64), np.asarray(tokens, np.int64)
    check_context(int(tables.lens[sl].max()) + 1, limits)
    return DecodeRows(sl, tok)


def blocks_needed(need: dict[int, int], tables: BlockTables, limits: Limits) -> int:
    """New KV blocks that need[slot] more tokens per sequence take; ValueError past
    max_context."""
    bs, fresh = tables.block_size, 0
    for slot, n in need.items():
        have = int(tables.lens[slot]) if slot in tables.active else 0
        check_context(have + n, limits, f"slot {slot}: ")
        fresh += -(-(have + n) // bs) - -(-have // bs)
    return fresh


def chunk(pieces: Sequence[PrefillPiece], tables: BlockTables, limits: Limits) -> Chunk:
    """A prefill chunk of `pieces`, checked: each continues its sequence, with ids in the
    vocabulary, within the chunk's and the context's limits."""
    n = sum(len(p.tokens) for p in pieces)
    if not 0 < len(pieces) <= limits.max_chunk_seqs or not 0 < n <= limits.max_chunk:
        raise ValueError(f"{len(pieces)} pieces of {n} tokens: a chunk takes 1 to "
                         f"{limits.max_chunk_seqs} sequences and 1 to {limits.max_chunk} "
                         f"tokens")
    check_slots([p.slot for p in pieces], limits)
    for p in pieces:
        have = int(tables.lens[p.slot]) if p.slot in tables.active else 0
        if not p.tokens or p.start != have:
            raise ValueError(f"slot {p.slot}: a piece must continue its sequence at "
                             f"position {have} with at least one token (got start "
                             f"{p.start}, {len(p.tokens)} tokens)")
        if not 0 <= min(p.tokens) <= max(p.tokens) < limits.vocab:
            raise ValueError(f"slot {p.slot}: token ids outside [0, {limits.vocab})")
    need = {p.slot: len(p.tokens) for p in pieces}
    for slot, k in need.items():
        have = int(tables.lens[slot]) if slot in tables.active else 0
        check_context(have + k, limits, f"slot {slot}: ")
    return Chunk(n, len(pieces), max(len(p.tokens) for p in pieces), need)

