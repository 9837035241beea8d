"""The host side of an iteration: check it, grow the cache, write what its launches read.

`Inputs` owns what an iteration's launches read besides weights and activations: the step's
metadata (token ids, positions, cache slots, sampling parameters; a chunk's offsets, pieces
and rule entries) in pinned staging, copied to the device in one transfer, and each slot's
sampling parameters on the host. `prepare` is the one entry for an iteration: it checks
it (`rawgraph.model.step`), grows the sequences' tables, writes and copies the metadata, and
returns the sizes its launches take (`step.SIZES`), the same values an eager launch is given
and a graph is patched to. `decode`, `follow`, `prefill` and `mixed` are its parts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rawgraph import ops
from rawgraph.cuda.stream import cupy_stream
from rawgraph.memory.blocks import OutOfBlocks
from rawgraph.memory.paged import PagedKVCache
from rawgraph.memory.staging import Staging
from rawgraph.model import step
from rawgraph.model.step import Limits, PrefillPiece, Shape
from rawgraph.ops.sampling import SamplingParams


def sampling_fields(n: int) -> dict[str, tuple[Any, int]]:
    """Per-row fields a head reads (set per slot: `Inputs.set_sampling`)."""
    return {"seeds": (np.uint64, n), "temperature": (np.float32, n), "top_k": (np.int32, n),
            "top_p": (np.float32, n), "presence": (np.float32, n),
            "frequency": (np.float32, n), "repetition": (np.float32, n),
            "rules": (np.int32, n), "top_n": (np.int32, n)}


# what a slot's sampling fields hold before set_sampling: greedy, no rules, no logprobs
NEUTRAL = {"top_p": 1.0, "repetition": 1.0, "top_n": -1}


class DeviceStateError(RuntimeError):
    """The device's copy of an iteration's inputs differs from the host's (`Inputs.check`,
    a debug check)."""


class Inputs:
    """The metadata staging of a decoder's decode steps (`dec_meta`: max_batch rows),
    prefill chunks (`pre_meta`, `rule_meta`) and mixed iterations (`mix_meta`, made on
    first use), and each slot's sampling parameters (`sampling`). `kv`: the decoder's
    cache, whose tables each iteration grows; `pre_next`: the device array a chunk's head
    writes its pieces' next tokens to (a joining decode row may be fed from it).
    `staging`: what makes a staging buffer of fields (`memory.Staging`; the CPU tests pass
    one on host memory)."""

    def __init__(self, limits: Limits, kv: PagedKVCache, pre_next: Any,
                 staging: Callable[[dict], Staging] = Staging):
        self.limits, self.kv, self.pre_next = limits, kv, pre_next
        self._staging = staging
        b, c, s = limits.max_batch, limits.max_chunk, limits.max_chunk_seqs
        self.dec_meta = staging({**sampling_fields(b), "ids": (np.int32, b),
                                 "pos": (np.int32, b), "slots": (np.int32, b)})
        self.pre_meta = staging({**sampling_fields(s), "ids": (np.int32, c),
                                 "pos": (np.int32, c), "slots": (np.int32, c),
                                 "cu": (np.int32, s + 1), "seqs": (np.int32, s),
                                 "last": (np.int32, s), "last_pos": (np.int32, s),
                                 "final": (np.int32, s), "install": (np.int32, s)})
        # rules: what a sequence's first chunk installs (pushed only for chunks that install)
        cap = ops.logits.BIAS_CAP
        self.rule_meta = staging({"nb": (np.int32, s), "ids": (np.int32, s * cap),
                                  "vals": (np.float32, s * cap), "until": (np.int32, s * cap)})
        self.mix_meta: Staging | None = None  # a mixed iteration's rows: `mix_staging`
        # per-slot sampling parameters, gathered into each step's metadata
        self.sampling = {name: np.zeros(b, dt) for name, (dt, _) in sampling_fields(b).items()}
        for name, v in NEUTRAL.items():  # greedy until set_sampling says otherwise
            self.sampling[name][:] = v
        self._sampling_pushed = False

    def mix_staging(self) -> Staging:
        """The rows of a mixed iteration: max_batch decode rows, then max_chunk chunk tokens
        (made on the first call: call it outside a capture)."""
        if self.mix_meta is None:
            rows = self.limits.max_batch + self.limits.max_chunk
            self.mix_meta = self._staging({"ids": (np.int32, rows),
                                           "pos": (np.int32, rows),
                                           "slots": (np.int32, rows)})
        return self.mix_meta

    def prepare(self, pieces: Sequence[PrefillPiece], slots: Sequence[int],
                tokens: Sequence[int] | None, sampling: Sequence[SamplingParams] | None = None,
                *, follow: bool = False, last: step.LastStep | None = None,
                fed: Sequence[int] | None = None, decode_stream: Any = None,
                prefill_stream: Any = None, mixed: Shape | None = None) -> dict[str, int]:
        """The host side of an iteration: a chunk of `pieces` (on `prefill_stream`) and a
        decode step of `slots` (`decode`; with `follow`, continuing `last`: `follow`, with
        `tokens` and `fed` as its), their tables in one copy on `decode_stream`; `mixed`:
        the shape of the one mixed launch both parts make (everything on the decode
        stream). Returns the sizes the iteration's launches take (`step.SIZES`; `advance`
        is the caller's). All or nothing: ValueError or OutOfBlocks before anything
        changes."""
        if slots and tokens is None and not follow:
            raise ValueError("tokens are needed unless the step follows the last one")
        # with both parts, the decode rows are checked before the chunk changes the cache,
        # and not again (the chunk's slots are others)
        checked = self._check_both(pieces, slots, tokens, follow, last, fed) \
            if pieces and slots else None
        ds = decode_stream
        ps = ds if mixed is not None else prefill_stream
        sizes = self.prefill(pieces, ps, sync=False) if pieces else {}
        if follow:  # its copy of the tables carries the chunk's
            sizes["max_len"] = self.follow(slots, last, ds, tokens, fed, checked=checked)
        elif slots:
            assert tokens is not None  # checked above
            sizes["max_len"] = self.decode(slots, tokens, ds, sampling, checked=checked)
        else:
            self.kv.sync(ds)
        if mixed is not None:
            self.mixed(mixed.batch, mixed.chunk, sizes["n"], ds)
        return sizes

    def _check_both(self, pieces: Sequence[PrefillPiece], slots: Sequence[int],
                    tokens: Sequence[int] | None, follow: bool, last: step.LastStep | None,
                    fed: Sequence[int] | None) -> Any:
        """What could make the decode part fail once the chunk has changed the cache,
        checked first: the decode rows, slots in both parts, and the blocks both take.
        Returns the rows' check (`check_decode`'s, or `step.check_follow`'s joins) for
        `decode` or `follow` to take instead of checking again."""
        if follow:
            src = self._fed(fed, len(slots))
            checked = step.check_follow(last, slots, self.kv.tables, self.limits, tokens,
                                        src >= 0)
        else:
            assert tokens is not None
            checked = self.check_decode(slots, tokens)
        both = {p.slot for p in pieces} & set(slots)
        if both:
            raise ValueError(f"slots {sorted(both)} both prefill and decode in one iteration")
        need = self.blocks_needed({**{p.slot: len(p.tokens) for p in pieces},
                                   **dict.fromkeys((s for s in slots if s >= 0), 1)})
        free = self.kv.tables.alloc.num_free
        if need > free:
            raise OutOfBlocks(f"this iteration needs {need} new KV blocks, {free} free")
        return checked

    def blocks_needed(self, need: dict[int, int]) -> int:
        """New KV blocks that need[slot] more tokens per sequence take (ValueError past
        max_context); nothing changes."""
        return step.blocks_needed(need, self.kv.tables, self.limits)

    def grow(self, need: dict[int, int]) -> None:
        """Make room for need[slot] more tokens in each sequence, all or nothing."""
        t = self.kv.tables
        fresh = self.blocks_needed(need)
        if fresh > t.alloc.num_free:  # checked before any sequence changes
            raise OutOfBlocks(f"this step needs {fresh} new KV blocks, {t.alloc.num_free} free")
        for slot, n in need.items():
            if slot not in t.active:
                t.add(slot)
            t.append(slot, n)

    def set_sampling(self, slot: int, params: SamplingParams, bans: bool = False) -> None:
        """How the sequence in `slot` samples from now on (kept per slot, like its table);
        `bans`: it has stop ids for min_tokens to ban (installed by its first chunk)."""
        step.check_slots([slot], self.limits)
        p = self.sampling
        p["seeds"][slot], p["temperature"][slot] = params.seed, params.temperature
        p["top_k"][slot], p["top_p"][slot] = params.top_k, params.top_p
        p["presence"][slot] = params.presence_penalty
        p["frequency"][slot] = params.frequency_penalty
        p["repetition"][slot] = params.repetition_penalty
        p["rules"][slot] = params.rules(bans)
        p["top_n"][slot] = -1 if params.logprobs is None else params.logprobs
        self._sampling_pushed = False  # a continuing step copies them again

    def check_decode(self, slots: Sequence[int], tokens: Sequence[int]
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Validate a decode step's rows (ValueError naming the problem); nothing changes.
        Returns slots and tokens as arrays."""
        rows = step.decode_rows(slots, tokens, self.kv.tables, self.limits)
        return rows.slots, rows.tokens

    def decode(self, slots: Sequence[int], tokens: Sequence[int], stream: Any,
               sampling: Sequence[SamplingParams] | None = None, *, sync: bool = True,
               checked: tuple[np.ndarray, np.ndarray] | None = None) -> int:
        """Host side of one decode step: grow each sequence by its token, then copy ids,
        positions, slots, sampling parameters (and with `sync`, tables and lengths) to the
        device. Returns the step's longest context (its size `max_len`).

        `sampling` (one per row) replaces the slots' stored parameters (`set_sampling`);
        without it the stored ones apply. Launched with `advance=1`, the step may be continued
        on the device (`follow`). Vectorized: this runs before every step. `checked`:
        `check_decode`'s result for these rows, already taken.
        """
        n = len(slots)
        sl, tok = self.check_decode(slots, tokens) if checked is None else checked
        t = self.kv.tables
        new = [s for s in slots if s not in t.active]
        for s in new:
            t.add(s)
        try:
            t.append_one(sl)
        except (ValueError, OutOfBlocks):
            for s in new:  # all or nothing
                t.free(s)
            raise
        if sampling is not None:
            for s, p in zip(slots, sampling):
                self.set_sampling(s, p)
        h = self.dec_meta.begin()
        h["ids"][:n], h["ids"][n:] = tok, 0
        h["slots"][:n], h["slots"][n:] = sl, -1  # padding rows: no cache slot, nothing written
        lens = t.lens[sl]
        h["pos"][:n], h["pos"][n:] = lens - 1, 0
        for name, arr in self.sampling.items():
            h[name][:n] = arr[sl]
        self.dec_meta.push(stream)
        self._sampling_pushed = True
        if sync:
            self.kv.sync(stream)
        return int(lens.max())

    def follow(self, slots: Sequence[int], last: step.LastStep | None, stream: Any,
               tokens: Sequence[int] | None = None, fed: Sequence[int] | None = None, *,
               checked: np.ndarray | None = None) -> int:
        """Host side of a decode step that continues `last` (`step.last_step` of the decode
        step before, launched with `advance=1`), its rows in their places: that step's
        sampler already made its tokens these rows' inputs and moved their positions and
        cache lengths on, on the device. Here each sequence grows by the token on its way;
        a copy runs only for what changed: a new cache block or copy-on-write (tables),
        lengths moved on the host (a prefill chunk prepared beside it) or synced since that
        step, sampling parameters set since, rows left empty or taken. A row whose sequence
        has left (finished, aborted) may be left empty (slot -1): it becomes a padding row
        in its place, so the others keep theirs and their hand-off (a padding row's position
        is not moved on, so it writes the other half of its token pair: the half holding the
        left sequence's last token stays until read).
        A row empty in `last`, or past its rows, may take a joining sequence, fed from the
        host (`tokens`: its token there, -1 in every other row) or on the device (`fed`: in
        that row the index j of its piece in the last prefill chunk, which ended its
        prompt: pre["next"][j], copied after that chunk; -1 in every other row); its
        position, slot and sampling fields are copied, its cache length synced. Returns the
        step's longest context (`max_len`). ValueError (`step.check_follow`) if the slots,
        tokens or their sequences on the host are not ones that may continue that step;
        `checked`: that check's result (the joining rows), already taken."""
        t = self.kv.tables
        src = self._fed(fed, len(slots))
        joins = step.check_follow(last, slots, t, self.limits, tokens, src >= 0) \
            if checked is None else checked
        assert last is not None
        got = np.asarray(list(slots), np.int64)
        sl = got[got >= 0]
        t.append_one(sl)  # all or nothing
        was = np.full(len(got), -1, np.int64)
        was[:len(last.slots)] = last.slots
        moved = ((got < 0) & (was >= 0)) | joins  # rows left empty or taken now
        if not self._sampling_pushed or moved.any():  # continued ids and positions: kept
            h = self.dec_meta.begin()
            for name, arr in self.sampling.items():
                h[name][:len(got)] = arr[np.maximum(got, 0)]
            h["slots"][:len(got)] = got
            self.dec_meta.push(stream, self.dec_meta.offset("ids"))  # sampling, then slots
            self.dec_meta.push(stream, start=self.dec_meta.offset("slots"))
            for i in np.flatnonzero(joins):  # a joining row's id and position, alone
                h["pos"][i] = t.lens[got[i]] - 1
                names = ("pos",) if src[i] >= 0 else ("ids", "pos")
                if src[i] < 0:
                    assert tokens is not None
                    h["ids"][i] = tokens[i]
                for name in names:
                    at = self.dec_meta.offset(name) + 4 * int(i)
                    self.dec_meta.push(stream, at + 4, start=at)
            ids = self.dec_meta.dev["ids"]
            for i in np.flatnonzero(src >= 0):  # its first token, where the chunk left it
                j = int(src[i])
                ids[i:i + 1].data.copy_from_device_async(self.pre_next[j:j + 1].data, 4,
                                                         cupy_stream(stream))
            self._sampling_pushed = True
        if (joins.any() or t.changed or t.pending_copies or t.lens_moved
                or self.kv.syncs != last.syncs):
            self.kv.sync(stream)  # host lengths now equal what the device moved on to
        return int(t.lens[sl].max())

    def _fed(self, fed: Sequence[int] | None, rows: int) -> np.ndarray:
        """A following step's `fed` as an array (all -1 when None); ValueError unless one
        per row, each a chunk's piece index or -1."""
        src = np.full(rows, -1, np.int64) if fed is None else np.asarray(fed, np.int64)
        if src.shape != (rows,) or src.max(initial=-1) >= self.limits.max_chunk_seqs \
                or src.min(initial=-1) < -1:
            raise ValueError(f"fed {src.tolist()}: one per row, a chunk's piece index in "
                             f"[0, {self.limits.max_chunk_seqs}) or -1")
        return src

    def prefill(self, pieces: Sequence[PrefillPiece], stream: Any, *,
                sync: bool = True) -> dict[str, int]:
        """Host side of one prefill chunk: grow each sequence by its piece, copy metadata
        (and with `sync`, the cache tables). Returns its sizes (`step.SIZES`: n, seqs,
        max_q_len, pre_len). Without `sync`, call `kv.sync` before launching: a prefill and a
        decode step prepared together share one copy of the tables."""
        chunk = step.chunk(pieces, self.kv.tables, self.limits)
        installs = [(i, p) for i, p in enumerate(pieces)
                    if p.first and p.sampling.rules(bool(p.bans))]
        for _, p in installs:  # before anything changes
            step.check_rules(p, self.limits)
        self.grow(chunk.need)
        h = self.pre_meta.begin()
        row = 0
        h["cu"][:] = 0
        for name in ("last", "last_pos", "final"):  # rows past the pieces: valid, unused
            h[name][:] = 0
        for i, p in enumerate(pieces):
            m = len(p.tokens)
            h["ids"][row:row + m] = p.tokens
            h["pos"][row:row + m] = np.arange(p.start, p.start + m)
            h["slots"][row:row + m] = p.slot
            h["seqs"][i], h["last"][i], h["last_pos"][i] = p.slot, row + m - 1, p.start + m - 1
            h["final"][i] = p.final
            row += m
            h["cu"][i + 1] = row
        for i, p in enumerate(pieces):  # stored per slot: later decode steps use them too
            self.set_sampling(p.slot, p.sampling, bool(p.bans))
            for name, arr in self.sampling.items():
                h[name][i] = arr[p.slot]
        for name in self.sampling:  # the head's rows past the pieces: nothing to do
            h[name][len(pieces):] = NEUTRAL.get(name, 0)
        h["install"][:] = 0
        for i, p in installs:
            h["install"][i] = 1 | (p.sampling.repetition_penalty != 1) << 1
        if installs:
            self._stage_rules(installs, stream)
        self.pre_meta.push(stream)
        if sync:
            self.kv.sync(stream)
        pre_len = int(self.kv.tables.lens[[p.slot for p in pieces]].max())
        return {"n": chunk.tokens, "seqs": chunk.seqs, "max_q_len": chunk.max_q_len,
                "pre_len": pre_len}

    def _stage_rules(self, installs: list[tuple[int, PrefillPiece]], stream: Any) -> None:
        """Stage the bias entries of the pieces that start their sequences' rules: each
        logit_bias entry, and each stop id min_tokens bans (-inf below ban_until; a banned id
        with a bias keeps it after)."""
        cap, h = ops.logits.BIAS_CAP, self.rule_meta.begin()
        for i, p in installs:
            bias = dict(p.sampling.logit_bias)
            until = dict.fromkeys(p.bans, p.ban_until) if p.sampling.min_tokens else {}
            ids = sorted(set(bias) | set(until))  # step.check_rules: at most cap, in vocab
            row = slice(i * cap, i * cap + len(ids))
            h["nb"][i] = len(ids)
            h["ids"][row] = ids
            h["vals"][row] = [bias.get(t, 0.0) for t in ids]
            h["until"][row] = [until.get(t, 0) for t in ids]
        self.rule_meta.push(stream)

    def mixed(self, batch: int, chunk: int, n: int, stream: Any) -> None:
        """Host side of a mixed iteration, after `prefill` and `decode` (or `follow`) of
        its parts: the rows' ids, positions and cache slots in one array, the decode
        bucket's `batch` rows (padding included; the launch copies them from the step's
        metadata on the device over these) then the chunk's `n` tokens (the rest of the
        `chunk` rows: padding, no cache slot)."""
        mix = self.mix_staging()
        h, d, p = mix.begin(), self.dec_meta.host, self.pre_meta.host
        for name in ("ids", "pos", "slots"):
            h[name][:batch] = d[name][:batch]
            h[name][batch:batch + n] = p[name][:n]
            h[name][batch + n:] = -1 if name == "slots" else 0
        mix.push(stream)

    def check(self, pieces: Sequence[PrefillPiece], slots: Sequence[int],
              tokens: Sequence[int] | None = None, fed: Sequence[int] | None = None) -> None:
        """Debug: the device holds what the host says an iteration about to launch reads
        (after `prepare`, with every stream that copies synchronized): each touched
        sequence's length and table row, and the decode rows' slots, positions and ids (a
        row fed from the host: `tokens[i]`; on the device: `fed[i]`, the last chunk's
        pre["next"] entry). A step continuing the last one finds most of it where that
        step's sampler left it, the rest copied only when something changed: this is the
        check that such a copy was not skipped. DeviceStateError naming the first
        difference; nothing changes."""
        t = self.kv.tables
        lens, tab = self.kv.seq_lens.get(), self.kv.block_tables.get()
        rows = np.asarray(list(slots), np.int64)
        for s in sorted({p.slot for p in pieces} | {int(s) for s in rows if s >= 0}):
            n = -(-int(t.lens[s]) // t.block_size)
            if lens[s] != t.lens[s] or not np.array_equal(tab[s, :n], t.table[s, :n]):
                raise DeviceStateError(
                    f"slot {s}: the device has length {lens[s]}, blocks {tab[s, :n].tolist()};"
                    f" the host {t.lens[s]}, {t.table[s, :n].tolist()}")
        if not len(rows):
            return
        d = {k: self.dec_meta.dev[k][:len(rows)].get() for k in ("slots", "pos", "ids")}
        live = rows >= 0
        want = {"slots": rows, "pos": np.where(live, t.lens[np.maximum(rows, 0)] - 1, d["pos"])}
        src = np.full(len(rows), -1) if fed is None else np.asarray(list(fed))
        nxt = self.pre_next.get()
        ids = np.where(src >= 0, nxt[np.maximum(src, 0)], d["ids"])
        if tokens is not None:
            tok = np.asarray(list(tokens))
            ids = np.where(tok >= 0, tok, ids)
        want["ids"] = ids
        for k, v in want.items():
            bad = np.flatnonzero(d[k] != v)
            if len(bad):
                i = int(bad[0])
                raise DeviceStateError(f"decode row {i} (slot {rows[i]}): the device's {k} is "
                                       f"{d[k][i]}, the host's {v[i]}")
