"""ops.process on the device against its NumPy reference: log-sum-exp and the top n of raw
logits (ties to the smaller index, NaN skipped, vocabularies that end inside a piece), the
target's log-probability, the rules' processed row bit for bit (ops.reference.apply_rules
rounded to the dtype), counting a fed token once per position, installing a sequence's
rules, and the sampler reading the processed row and writing the chosen token's entry."""

import cupy
import numpy as np
import pytest

from rawgraph import ops
from rawgraph.dtypes import to_float32, to_storage
from rawgraph.ops import reference as ref
from rawgraph.ops.logits import BIAS_BIT, BIAS_CAP, LP_STRIDE, PROMPT_BIT
from tests.helpers import DTYPES

pytestmark = pytest.mark.gpu


def _dev(a, t):
    return cupy.asarray(np.ascontiguousarray(a, t))


def _out(rows, halves=1):
    shape = (rows, LP_STRIDE) if halves == 1 else (rows, 2, LP_STRIDE)
    return ops.Logprobs(cupy.zeros(rows, np.int32), cupy.zeros(rows, np.float32),
                        cupy.full(shape, 7.0, np.float32), cupy.full(shape, -7, np.int32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [128256, 1001, 40])
def test_logprobs_and_the_top_n_match_the_reference(stream, rng, dtype, vocab):
    rows = 6
    x = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
    x[1, 5] = x[1, 9] = x[1, 30] = x[1].max() + 4  # ties: smaller index first
    x[2, ::3] = np.nan  # NaN never counted
    x[3, :] = -np.inf
    x[3, 7] = 0.0  # one finite token: the rest have no chance
    x[4, :] = x[4, 0]  # all tied
    stored = to_storage(x, dtype)
    xs = to_float32(stored, dtype)
    logits = cupy.asarray(stored)
    top_n = [20, 3, 5, 2, 20, -1]
    targets = [0, 9, 3, 7, vocab - 1, 0]
    out = _out(rows)
    out.top_n.set(np.asarray(top_n, np.int32))
    ops.process(logits, logits, cupy.zeros(rows, np.int32), out, targets=_dev(targets, np.int32),
                stream=stream)
    stream.synchronize()
    lse, lp, ids = out.lse.get(), out.lp.get(), out.ids.get()
    for r, n in enumerate(top_n):
        if n < 0:
            assert (ids[r] == -7).all() and (lp[r] == 7.0).all()  # untouched
            continue
        want_lse, want_top, want_lp = ref.logprobs(xs[r], n)
        assert np.isclose(lse[r], want_lse, rtol=1e-6, atol=1e-5)
        k = len(want_top)
        assert ids[r, 1:1 + k].tolist() == want_top
        np.testing.assert_allclose(lp[r, 1:1 + k], want_lp, rtol=1e-5, atol=1e-5)
        assert (ids[r, 1 + k:1 + n] == -1).all() and np.isneginf(lp[r, 1 + k:1 + n]).all()
        assert ids[r, 0] == targets[r]
        assert np.isclose(lp[r, 0], xs[r, targets[r]] - want_lse, rtol=1e-5, atol=1e-5) or \
            (np.isnan(xs[r, targets[r]]) and np.isnan(lp[r, 0])) or \
            (np.isneginf(xs[r, targets[r]]) and np.isneginf(lp[r, 0]))
    assert ids[1, 1:4].tolist() == [5, 9, 30]
    assert ids[4, 1:21].tolist() == list(range(20))


def _state(rng, slots, vocab):
    st = ops.RuleState(slots, vocab)
    return st


@pytest.mark.parametrize("dtype", DTYPES)
def test_rules_give_the_references_row_bit_for_bit(stream, rng, dtype):
    rows, vocab, slots = 4, 5003, 6
    x = (rng.standard_normal((rows, vocab)) * 4).astype(np.float32)
    stored = to_storage(x, dtype)
    xs = to_float32(stored, dtype)
    st = ops.RuleState(slots, vocab)
    counts = rng.integers(0, 3, (slots, vocab)).astype(np.int64)
    counts[rng.random((slots, vocab)) < 0.9] = 0
    in_prompt = rng.random((slots, vocab)) < 0.05
    bias = {s: {int(t): float(rng.uniform(-100, 100)) for t in rng.choice(vocab, 12, False)}
            for s in range(slots)}
    until = {s: {int(t): int(rng.integers(0, 20)) for t in rng.choice(vocab, 5, False)}
             for s in range(slots)}
    word = counts.astype(np.uint32) | np.where(in_prompt, PROMPT_BIT, 0).astype(np.uint32)
    nb = np.zeros(slots, np.int32)
    b_ids = np.zeros((slots, BIAS_CAP), np.int32)
    b_val = np.zeros((slots, BIAS_CAP), np.float32)
    b_until = np.zeros((slots, BIAS_CAP), np.int32)
    for s in range(slots):
        keys = sorted(set(bias[s]) | set(until[s]))
        nb[s] = len(keys)
        b_ids[s, :len(keys)] = keys
        b_val[s, :len(keys)] = [bias[s].get(t, 0.0) for t in keys]
        b_until[s, :len(keys)] = [until[s].get(t, 0) for t in keys]
        word[s, keys] |= BIAS_BIT
    st.counts.set(word.view(np.int32))
    st.bias_n.set(nb)
    st.bias_ids.set(b_ids)
    st.bias_val.set(b_val)
    st.bias_until.set(b_until)
    slot_of = np.array([3, 0, 5, 1], np.int32)
    pos = np.array([4, 10, 0, 30], np.int32)
    pres = np.array([0.5, -2, 0, 1.25], np.float32)
    freq = np.array([0.3, 1.1, 2, 0], np.float32)
    rep = np.array([1.3, 1.0, 0.7, 2.0], np.float32)
    rules = np.array([1, 1, 0, 1], np.int32)
    logits = cupy.asarray(stored)
    proc = cupy.zeros_like(logits)
    rr = ops.RowRules(_dev(rules, np.int32), _dev(slot_of, np.int32), _dev(pres, np.float32),
                      _dev(freq, np.float32), _dev(rep, np.float32))
    ops.process(logits, proc, _dev(pos, np.int32), _out(rows), row_rules=rr, state=st,
                stream=stream)
    stream.synchronize()
    got = to_float32(proc.get(), dtype)
    for r in range(rows):
        if not rules[r]:
            assert (got[r] == 0).all()  # a row without rules: proc untouched
            continue
        s = slot_of[r]
        want = ref.apply_rules(xs[r], dtype, counts=counts[s], in_prompt=in_prompt[s],
                               presence=pres[r], frequency=freq[r], repetition=rep[r],
                               bias=bias[s], until=until[s], position=int(pos[r]))
        np.testing.assert_array_equal(got[r], want)
    assert (logits.get() == stored).all()  # the raw logits stay


def test_a_fed_token_is_counted_once_per_position(stream):
    vocab = 64
    st = ops.RuleState(2, vocab)
    logits = cupy.zeros((1, vocab), np.float16)
    rr = ops.RowRules(_dev([1], np.int32), _dev([1], np.int32), _dev([0], np.float32),
                      _dev([1], np.float32), _dev([1], np.float32), fed=_dev([9], np.int32))
    for pos in (5, 5, 6, 6, 6):  # replays of a position (a rollback, a relaunch) count once
        ops.process(logits, cupy.zeros_like(logits), _dev([pos], np.int32), _out(1),
                    row_rules=rr, state=st, stream=stream)
    stream.synchronize()
    assert st.counts[1, 9].get() == 2 and st.counted[1].get() == 7
    assert int(st.counts.sum()) == 2


def test_rules_start_and_mark_install_a_sequences_state(stream):
    vocab, slots, seqs = 100, 4, 3
    st = ops.RuleState(slots, vocab)
    st.counts[:] = 5  # what an earlier sequence left
    st.counted[:] = 9
    install = _dev([1 | 2, 0, 1], np.int32)  # piece 0: marks its prompt; 2: bias only
    seq_slots = _dev([2, 0, 3], np.int32)
    staged = {"nb": _dev([2, 0, 1], np.int32),
              "ids": _dev(np.zeros(seqs * BIAS_CAP), np.int32),
              "vals": _dev(np.zeros(seqs * BIAS_CAP), np.float32),
              "until": _dev(np.zeros(seqs * BIAS_CAP), np.int32)}
    staged["ids"][:2] = cupy.asarray([7, 11], np.int32)
    staged["vals"][:2] = cupy.asarray([1.5, -3], np.float32)
    staged["until"][BIAS_CAP] = 0
    staged["ids"][2 * BIAS_CAP] = 50
    staged["until"][2 * BIAS_CAP] = 12
    ids = _dev([7, 8, 8, 60, 1, 2], np.int32)
    tok_slots = _dev([2, 2, 2, 0, 3, 3], np.int32)
    ops.rules_start(st, 3, install, seq_slots, staged, stream=stream)
    ops.rules_mark(st, 6, ids, tok_slots, 3, install, seq_slots, staged, stream=stream)
    stream.synchronize()
    c = st.counts.get().view(np.uint32)
    want2 = np.zeros(vocab, np.uint32)
    want2[[7, 8]] |= PROMPT_BIT
    want2[[7, 11]] |= BIAS_BIT
    np.testing.assert_array_equal(c[2], want2)
    want3 = np.zeros(vocab, np.uint32)  # no marks (repetition off): only the bias bit
    want3[50] = BIAS_BIT
    np.testing.assert_array_equal(c[3], want3)
    assert (c[0] == 5).all() and (c[1] == 5).all()  # not installed: untouched
    assert st.counted.get().tolist() == [9, 9, 0, 0]
    assert st.marks.get().tolist()[2:] == [1, 0]
    assert st.bias_n.get()[[2, 3]].tolist() == [2, 1]
    assert st.bias_ids.get()[2, :2].tolist() == [7, 11]
    assert st.bias_val.get()[2, :2].tolist() == [1.5, -3]
    assert st.bias_until.get()[3, 0] == 12


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_sampler_reads_the_processed_row_and_writes_the_chosen_entry(stream, rng, dtype):
    rows, vocab = 3, 4099
    x = rng.standard_normal((rows, vocab)).astype(np.float32)
    stored = to_storage(x, dtype)
    logits = cupy.asarray(stored)
    px = x.copy()
    px[0, 1234] = 50  # a processed row whose argmax is elsewhere
    px[2, 77] = 50    # ... but row 2 has no rules: the raw argmax
    proc = cupy.asarray(to_storage(px, dtype))
    rules = _dev([1, 0, 0], np.int32)
    out = cupy.full(rows, -1, np.int32)
    lp = _out(rows)
    lp.top_n.set(np.array([2, -1, 0], np.int32))
    zeros = cupy.zeros(rows, np.float32)
    ops.process(logits, proc, cupy.zeros(rows, np.int32), lp, stream=stream)
    ops.sample(logits, out, zeros, cupy.zeros(rows, np.int32), cupy.ones(rows, np.float32),
               cupy.zeros(rows, np.uint64), cupy.zeros(rows, np.int32), proc=proc,
               rules=rules, logprobs=lp, stream=stream)
    stream.synchronize()
    xs = to_float32(stored, dtype)
    got = out.get()
    assert got[0] == 1234 and got[2] == int(np.argmax(xs[2]))
    lse = lp.lse.get()
    ids, lps = lp.ids.get(), lp.lp.get()
    assert ids[0, 0] == 1234 and np.isclose(lps[0, 0], xs[0, 1234] - lse[0], atol=1e-5)
    assert ids[2, 0] == got[2] and ids[1, 0] == -7  # row 1 asked nothing
