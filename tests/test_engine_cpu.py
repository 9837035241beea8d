"""Engine logic without a GPU: scheduling (admission by KV blocks, chunk planning, retiring),
request checks, the demo script, bucket and chunk sizes, the tokenizer wrapper, eos ids."""

import numpy as np
import pytest

from rawgraph.demo import script
from rawgraph.engine.request import Request
from rawgraph.engine.runner import _sizes
from rawgraph.engine.scheduler import Scheduler
from rawgraph.model.config import LlamaConfig, preset
from rawgraph.model.safetensors import CheckpointError
from rawgraph.ops.sampling import SamplingParams


def _sched(**kw):
    args = {"max_seqs": 3, "chunk_tokens": 16, "chunk_seqs": 2, "num_blocks": 10,
            "block_size": 16, "max_context": 128} | kw
    return Scheduler(**args)


def test_admission_reserves_the_worst_case_in_blocks():
    s = _sched()
    a, b, c = Request([1] * 60, 40), Request([1] * 30, 2), Request([1], 1, arrival=3)
    for r in (a, b, c):
        s.add(r)
    s.admit(0)  # a: 7 blocks; b: 2 blocks; c has not arrived
    assert [r.slot for r in s.running] == [0, 1] and list(s.waiting) == [c]
    s.admit(3)  # c needs 1 block: 10 reserved now
    assert len(s.running) == 3
    d = Request([1] * 10, 10)
    s.add(d)
    s.admit(4)
    assert list(s.waiting) == [d]  # no slot left
    s.finish(a, "length")
    s.admit(5)
    assert d.slot == 0 and a.finish == "length"


def test_plan_fills_chunks_in_arrival_order_and_steps_every_decoder():
    s = _sched()
    a, b, c = Request([1] * 20, 4), Request([2] * 5, 4), Request([3] * 3, 4)
    for r in (a, b, c):
        s.add(r)
    s.admit(0)
    p = s.plan()
    assert [(r.name, len(x.tokens), x.start) for r, x in p.prefill] == [(a.name, 16, 0)]
    a.prefilled = 16
    p = s.plan()  # a's last 4 tokens, then b's 5; c waits (two sequences per chunk)
    assert [(len(x.tokens), x.start) for _, x in p.prefill] == [(4, 16), (5, 0)]
    a.prefilled, b.prefilled = 20, 5
    a.output, b.output = [7], [8]
    p = s.plan()
    assert p.decode == [a, b] and [r for r, _ in p.prefill] == [c]


def test_requests_that_can_never_run_are_refused():
    s = _sched()
    with pytest.raises(ValueError, match="exceeds max_context = 128"):
        s.add(Request([1] * 100, 29))
    with pytest.raises(ValueError, match="KV blocks"):
        _sched(num_blocks=2).add(Request([1] * 40, 1))
    with pytest.raises(ValueError, match="at least one prompt token"):
        Request([], 1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        Request([1], 0)


def test_bucket_and_chunk_sizes():
    assert _sizes((1, 2, 4, 8, 16), 12, None) == (1, 2, 4, 8, 12)
    assert _sizes((1, 2, 4), 8, [4, 2, 2]) == (2, 4)
    with pytest.raises(ValueError, match="must lie in"):
        _sizes((1,), 8, [16])


def test_demo_script_is_varied_and_valid():
    reqs = script(512, 12)
    assert len({len(r.prompt) for r in reqs}) >= 3 and len({r.max_new_tokens for r in reqs}) >= 3
    assert any(r.sampling.temperature > 0 for r in reqs)
    assert any(r.arrival > 0 for r in reqs) and all(max(r.prompt) < 512 for r in reqs)
    assert [r.output for r in script(512, 12)] == [r.output for r in reqs]


def test_eos_ids_from_config_json():
    hf = preset("tiny").to_hf()
    assert LlamaConfig.from_hf(hf).eos == ()
    assert LlamaConfig.from_hf({**hf, "eos_token_id": 7}).eos == (7,)
    cfg = LlamaConfig.from_hf({**hf, "eos_token_id": [1, 2]})
    assert cfg.eos == (1, 2) and LlamaConfig.from_hf(cfg.to_hf()).eos == (1, 2)


def test_tokenizer_round_trip(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    tok = tokenizers.Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "graphs": 2},
                                                unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    from rawgraph.model.tokenizer import Tokenizer

    t = Tokenizer(tmp_path / "tokenizer.json")
    assert t.encode("hello graphs") == [1, 2] and t.decode([1, 2]) == "hello graphs"
    with pytest.raises(CheckpointError, match=r"missing\.json: no tokenizer file"):
        Tokenizer(tmp_path / "missing.json")
    (tmp_path / "garbage.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"garbage\.json: not a tokenizer\.json"):
        Tokenizer(tmp_path / "garbage.json")
    with pytest.raises(CheckpointError, match="not a file"):
        Tokenizer(tmp_path)


def test_bad_requests_and_sampling_parameters_are_refused():
    ok = [1, 2, 3]
    bad = [
        (lambda: Request([1.5, 2.5], 4), TypeError, "token ids must be integers"),
        (lambda: Request(["1", "2"], 4), TypeError, "token ids must be integers"),
        (lambda: Request("hello", 4), TypeError, "list of token ids"),
        (lambda: Request([True, 2], 4), TypeError, "bool"),
        (lambda: Request([-1], 4), ValueError, ">= 0"),
        (lambda: Request(ok, 2.5), TypeError, "max_new_tokens must be an integer"),
        (lambda: Request(ok, 4, None), TypeError, "sampling must be a SamplingParams"),
        (lambda: Request(ok, 4, stop=5), TypeError, "stop must be a collection"),
        (lambda: Request(ok, 4, stop=[1.0]), TypeError, "stop: token ids must be integers"),
        (lambda: SamplingParams(seed=1.5), TypeError, "seed must be an integer"),
        (lambda: SamplingParams(seed="7"), TypeError, "seed must be an integer"),
        (lambda: SamplingParams(temperature=float("inf")), ValueError, "temperature must be"),
        (lambda: SamplingParams(temperature=float("nan")), ValueError, "temperature must be"),
        (lambda: SamplingParams(top_p=0), ValueError, "top_p"),
    ]
    for make, kind, match in bad:
        with pytest.raises(kind, match=match):
            make()
    r = Request(np.asarray([3, 4], np.int64), np.int64(3), SamplingParams(0.5, np.int32(4)),
                stop=np.array([9]))
    assert r.prompt == [3, 4] and type(r.prompt[0]) is int and r.max_new_tokens == 3
    assert r.stop == frozenset([9]) and type(r.sampling.top_k) is int


def test_engine_stats_stay_bounded():
    from rawgraph.engine.engine import RECENT, EngineStats
    from rawgraph.engine.runner import IterStats

    st = EngineStats()
    for i in range(RECENT + 100):
        st.record(IterStats(decode_rows=1, wall_ms=float(i)), 1)
    st.record(IterStats(decode_rows=1, prefill_tokens=5), 2)
    assert len(st.iters) == RECENT and st.decode_steps == RECENT + 100
    assert st.tokens == RECENT + 102 and st.summary()["ms/step"] == 101 + (RECENT - 2) / 2


def test_admissions_are_undone_exactly():
    s = _sched(max_seqs=4, num_blocks=12)
    a, b, c = Request([1] * 60, 40), Request([1] * 30, 2), Request([1], 1, arrival=3)
    for r in (a, b, c):
        s.add(r)
    s.admit(0)
    d = Request([1] * 5, 5)
    s.add(d)
    before = (list(s.waiting), list(s.running), *s.books())
    books, admitted = s.books(), []
    assert s.admit(3, admitted) == [c, d] == admitted and c.slot >= 0 and d.slot >= 0
    s.unadmit(admitted, books)
    assert (list(s.waiting), list(s.running), *s.books()) == before
    assert c.slot == d.slot == -1
    s.admit(3)
    assert [r.slot for r in s.running] == [0, 1, 2, 3]  # the same slots as before the undo
    assert s.drop(d) is False and s.drop(Request([2], 1)) is False
