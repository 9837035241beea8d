"""The engine's bookkeeping without a GPU: continuous batching, overlapped steps, the rollback
of an iteration that raises anywhere, and aborts, driven through a stand-in for the runner
whose next token is a hash of everything in the sequence's cache (so a token lost, repeated
or computed on a cache left half-grown changes every later one). The GPU twins of these tests
(test_engine_faults_gpu.py) run the real runner and model."""

import hashlib
from types import SimpleNamespace

import pytest

from rawgraph.engine import engine as engine_module
from rawgraph.engine.engine import Engine
from rawgraph.engine.request import Request
from rawgraph.engine.runner import IterStats, Launched
from rawgraph.memory.blocks import BlockAllocator, BlockTables
from rawgraph.model.step import Limits, check_follow, last_step
from rawgraph.ops.sampling import SamplingParams
from tests.helpers import drive, inject

VOCAB = 97


def _next(tokens: list[int]) -> int:
    return int.from_bytes(hashlib.sha256(bytes(str(tokens), "ascii")).digest()[:4], "little") \
        % VOCAB


class FakeModel:
    """What the engine uses of a Model: sizes, the host block tables, free."""

    def __init__(self, max_batch=4, max_context=256, max_chunk_seqs=4, num_blocks=64):
        self.cfg = SimpleNamespace(vocab=VOCAB)
        self.max_batch, self.max_context, self.max_chunk_seqs = max_batch, max_context, \
            max_chunk_seqs
        self.max_chunk = 32
        tables = BlockTables(BlockAllocator(num_blocks), 16, max_batch, max_context // 16)
        self.kv = SimpleNamespace(tables=tables, block_size=16, syncs=0)
        self.limits = Limits(max_batch, 32, max_chunk_seqs, max_context, VOCAB)

    def free(self, slot):
        self.kv.tables.free(slot)


class FakeRunner(Launched):
    """The runner's interface over a host-side cache of token lists (mirroring the tables'
    lengths, so a rollback's truncation shows): launch grows the tables as the real one
    does, a following step takes the last step's tokens "on the device", collect reads."""

    def __init__(self, model, **kw):
        self.model, self.chunks, self.buckets = model, (32,), (1, 2, 4)
        self.decode_stream = self.prefill_stream = None
        super().__init__()
        self.cache: dict[int, list[int]] = {}
        self.last: dict[int, int] = {}
        self.first: list[int] = []  # the last launch's pieces' first tokens

    def capture_all(self, progress=True):
        return {}

    def launch(self, pieces, slots, tokens, sampling=None, *, follow=False, fed=None):
        t, m = self.model.kv.tables, self.model
        while len(self._unread) > (1 if follow else 0):  # as the real one: read, then reuse
            self.collect(self._unread[0])
        if follow:  # as Inputs.follow: continued rows, empty (-1) and joining ones
            src = self._check_fed(slots, fed) or [-1] * len(slots)
            joins = check_follow(self._last_step, slots, t, m.limits, tokens,
                                 [j >= 0 for j in src])
            tokens = [self.first[j] if j >= 0 else tokens[i] if k else
                      self.last[s] if s >= 0 else -1
                      for i, (s, k, j) in enumerate(zip(slots, joins, src))]
        for s in list(self.cache):  # the cache holds what the tables say
            self.cache[s] = self.cache[s][:int(t.lens[s])] if s in t.active else []
        first = []
        for p in pieces:
            assert p.start == (int(t.lens[p.slot]) if p.slot in t.active else 0)
            if p.slot not in t.active:
                t.add(p.slot)
            t.append(p.slot, len(p.tokens))
            self.cache.setdefault(p.slot, []).extend(p.tokens)
            first.append(_next(self.cache[p.slot]) if p.final else -1)
        out = []
        for s, tok in zip(slots, tokens):
            if s < 0:
                out.append(-1)
                continue
            t.append(s, 1)
            self.cache[s].append(tok)
            out.append(_next(self.cache[s]))
        self.last.update((s, o) for s, o in zip(slots, out) if s >= 0)
        self._chunk, self.first = list(pieces), first
        if slots:
            self._last_step = last_step(slots, t, 0)
        st = IterStats(decode_rows=sum(s >= 0 for s in slots),
                       prefill_tokens=sum(len(p.tokens) for p in pieces))
        p = SimpleNamespace(rows=len(slots), st=st, first=first, out=out, tokens=None, lp=None,
                            first_lp=None, prompt_lp=None)
        if slots:
            self._unread.append(p)
        return p

    def collect(self, p):
        if p.rows and p.tokens is None:
            p.tokens = p.out
            self._unread.remove(p)
        return p.first, p.tokens or [], p.st

    def close(self):
        pass


@pytest.fixture
def make(monkeypatch):
    monkeypatch.setattr(engine_module, "Runner", FakeRunner)
    return lambda **kw: Engine(FakeModel(**kw), progress=False)


def _requests():
    specs = [(5, 12, 0), (70, 9, 0), (40, 20, 1), (1, 7, 3), (33, 14, 4), (9, 25, 6)]
    return [Request([(7 * i + j) % VOCAB for j in range(n)], k,
                    SamplingParams(0.5, seed=i) if i % 2 else SamplingParams(), arrival=a,
                    name=f"r{i}")
            for i, (n, k, a) in enumerate(specs)]


def _idle(e):
    t = e.model.kv.tables
    return (e.scheduler.idle and not t.active and t.alloc.num_free == t.alloc.num_blocks
            and sorted(e.scheduler._free_slots) == list(range(e.model.max_batch))
            and e.scheduler._reserved == 0)




def _want(make):
    e = make()
    reqs = _requests()
    assert drive(e, reqs) == 0 and _idle(e)
    return [(r.output, r.finish) for r in reqs]




POINTS = [("runner.launch", "runner", "launch", False),
          ("runner.launch done", "runner", "launch", True),
          ("runner.collect", "runner", "collect", False),
          ("runner.collect done", "runner", "collect", True),
          ("tables.append done", "tables", "append", True),
          ("scheduler.admit done", "scheduler", "admit", True),
          ("engine._emit done", "engine", "_emit", True)]


@pytest.mark.parametrize("at", [1, 2, 3, 7, 15])
@pytest.mark.parametrize(("what", "owner", "name", "after"), POINTS, ids=[p[0] for p in POINTS])
def test_an_iteration_that_raises_is_rolled_back(make, monkeypatch, what, owner, name, after,
                                                 at):
    want = _want(make)
    e = make()
    target = {"runner": e.runner, "tables": e.model.kv.tables, "scheduler": e.scheduler,
              "engine": e}[owner]
    error = KeyboardInterrupt() if at % 2 == 0 else RuntimeError(what)
    calls = inject(monkeypatch, target, name, at, after, error)
    reqs = _requests()
    faults = drive(e, reqs)
    assert calls["n"] >= at and faults == 1 and e.stats.rollbacks == 1
    assert [(r.output, r.finish) for r in reqs] == want
    assert _idle(e)


def test_every_other_launch_failing_loses_nothing(make, monkeypatch):
    want = _want(make)
    e = make()
    original, n = e.runner.launch, {"i": 0}

    def flaky(*args, **kw):
        n["i"] += 1
        out = original(*args, **kw)
        if n["i"] % 2:
            raise RuntimeError("flaky")
        return out

    monkeypatch.setattr(e.runner, "launch", flaky)
    reqs = _requests()
    assert drive(e, reqs) > 10
    assert [(r.output, r.finish) for r in reqs] == want and _idle(e)


def test_aborts_end_requests_at_the_next_step(make):
    want = _want(make)
    e = make()
    reqs = _requests()
    for r in reqs:
        e.add(r)
    victim, waiting = reqs[2], reqs[5]
    assert e.abort(waiting) and waiting.finish == "abort" and waiting not in e.scheduler.waiting
    while not (victim.decoding and len(victim.output) >= 3 and e._ahead is not None
               and victim in e._ahead[0]):
        e.step()
    kept = len(victim.output)
    assert e.abort(victim) and e.abort(victim) and not e.abort(Request([1], 1))
    done = e.step()
    assert victim in done and victim.finish == "abort" and victim not in e.scheduler.running
    while not e.scheduler.idle:
        e.step()
    e.drain()
    assert victim.output == want[2][0][:kept] and not e.abort(victim)
    assert all((r.output, r.finish) == want[i] for i, r in enumerate(reqs)
               if r not in (victim, waiting))
    assert _idle(e)


def test_an_abort_survives_a_rolled_back_step(make, monkeypatch):
    want = _want(make)
    e = make()
    reqs = _requests()
    for r in reqs:
        e.add(r)
    while not (reqs[0].decoding and len(reqs[0].output) >= 2):
        e.step()
    e.abort(reqs[0])
    inject(monkeypatch, e.runner, "collect", 1, False, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        e.step()
    assert reqs[0].finish == "" and reqs[0] in e.scheduler.running  # not yet: rolled back
    monkeypatch.undo()
    done = e.step()
    assert reqs[0] in done and reqs[0].finish == "abort"
    while not e.scheduler.idle:
        e.step()
    e.drain()
    assert all((r.output, r.finish) == want[i] for i, r in enumerate(reqs) if i)
    assert _idle(e)
