"""Continuous batching: which requests enter, which prompt tokens go into the next prefill
chunk, which sequences take a decode step. Requests join and leave between iterations.

Admission reserves a request's worst case (prompt + max_new_tokens) in KV blocks, so a
running request never runs out of cache and nothing has to be preempted. Where running
requests share blocks (a cached prefix, a fork), `shared()` says how many blocks their worst
cases count more than once, and admission takes that many more.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass

from rawgraph.engine.request import Request
from rawgraph.model.step import PrefillPiece


@dataclass
class Plan:
    """One iteration's work."""

    prefill: list[tuple[Request, PrefillPiece]]
    decode: list[Request]


class Scheduler:
    """FIFO admission into `max_seqs` cache slots; prefill chunks of up to `chunk_tokens`
    tokens from up to `chunk_seqs` sequences, and of up to `decode_chunk` tokens in an
    iteration that also steps decoding sequences (their next token waits for the chunk);
    every decoding sequence steps each iteration."""

    def __init__(self, *, max_seqs: int, chunk_tokens: int, chunk_seqs: int, num_blocks: int,
                 block_size: int, max_context: int, decode_chunk: int | None = None,
                 shared: Callable[[], int] | None = None):
        self.max_seqs, self.chunk_tokens, self.chunk_seqs = max_seqs, chunk_tokens, chunk_seqs
        self.decode_chunk = min(decode_chunk or chunk_tokens, chunk_tokens)
        self.num_blocks, self.block_size, self.max_context = num_blocks, block_size, max_context
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._free_slots = list(range(max_seqs))[::-1]
        self._reserved = 0  # KV blocks promised to running requests (their worst cases)
        self.shared = shared  # of those, the ones counted more than once (shared blocks)

    def _blocks(self, r: Request) -> int:
        return -(-(len(r.prompt) + r.max_new_tokens) // self.block_size)

    def check(self, r: Request) -> None:
        """ValueError for a request that could never run."""
        need = len(r.prompt) + r.max_new_tokens
        if need > self.max_context:
            raise ValueError(f"{r.name}: prompt of {len(r.prompt)} + {r.max_new_tokens} new "
                             f"tokens exceeds max_context = {self.max_context}")
        if self._blocks(r) > self.num_blocks:
            raise ValueError(f"{r.name}: needs {self._blocks(r)} KV blocks, the cache has "
                             f"{self.num_blocks}")

    def add(self, r: Request) -> None:
        """Queue a request (checked first)."""
        self.check(r)
        self.waiting.append(r)

    def admit(self, step: int, admitted: list[Request] | None = None) -> list[Request]:
        """Move arrived requests into free slots while their worst case fits the cache;
        returns them, appended to `admitted` as each enters (`unadmit` takes them back, also
        after an interruption part way)."""
        admitted = [] if admitted is None else admitted
        saved = None
        while self.waiting and self._free_slots and self.waiting[0].arrival <= step:
            r = self.waiting[0]
            if saved is None:  # once a call: what the tables share now
                saved = self.shared() if self.shared is not None else 0
            if self._reserved - saved + self._blocks(r) > self.num_blocks:
                break  # FIFO: later requests wait behind it
            admitted.append(r)
            r.slot = self._free_slots[-1]
            self.running.append(r)
            self._reserved += self._blocks(r)
            self._free_slots.pop()
            self.waiting.popleft()
        return admitted

    def books(self) -> tuple[list[int], int]:
        """The free slots and reserved blocks, for `unadmit` to put back."""
        return list(self._free_slots), self._reserved

    def unadmit(self, admitted: list[Request], books: tuple[list[int], int]) -> None:
        """Undo `admit` (a failed iteration, possibly interrupted inside `admit`): the
        requests wait at the front again, in order, and the free slots and reserved blocks
        are what `books()` said before."""
        for r in reversed(admitted):
            if r in self.running:
                self.running.remove(r)
            if r not in self.waiting:
                self.waiting.appendleft(r)
            r.slot = -1
        self._free_slots, self._reserved = list(books[0]), books[1]

    def drop(self, r: Request) -> bool:
        """Take a waiting request out of the queue; False if it is not waiting."""
        if r not in self.waiting:
            return False
        self.waiting.remove(r)
        return True

    def plan(self, held: Collection[int] = ()) -> Plan:
        """This iteration's prefill pieces (in arrival order; none for the requests whose
        ids are `held`) and decode rows."""
        decode, starting = [], []  # one pass: this runs every iteration over every request
        for r in self.running:
            if r.finish:
                continue
            if r.prefilled == len(r.prompt):  # r.decoding
                decode.append(r)
            elif id(r) not in held:
                starting.append(r)
        pieces, budget = [], self.decode_chunk if decode else self.chunk_tokens
        for r in starting:
            if budget == 0 or len(pieces) == self.chunk_seqs:
                break
            take = min(len(r.prompt) - r.prefilled, budget)
            end = r.prefilled + take
            bans = tuple(sorted(r.stop)) if r.sampling.min_tokens else ()
            piece = PrefillPiece(r.slot, r.prompt[r.prefilled:end], r.prefilled, r.sampling,
                                 final=end == len(r.prompt), bans=bans,
                                 ban_until=len(r.prompt) + r.sampling.min_tokens - 1,
                                 next_token=r.prompt[end] if end < len(r.prompt) else -1,
                                 cached=r.cached)
            pieces.append((r, piece))
            budget -= take
        return Plan(pieces, decode)

    def finish(self, r: Request, why: str) -> None:
        """Retire a running request: its slot and reserved blocks come back (once)."""
        r.finish = r.finish or why
        if r in self.running:
            self.running.remove(r)
            self._free_slots.append(r.slot)
            self._reserved -= self._blocks(r)

    @property
    def idle(self) -> bool:
        """Nothing waiting, nothing running."""
        return not self.waiting and not self.running
