"""Symbols and expressions: arithmetic, evaluation, specs and their errors."""

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rawgraph.symbols import Pointer, Range, Sym, Symbols, cdiv, resolve, smax, smin


@given(st.integers(0, 10**6), st.integers(1, 10**4), st.integers(-50, 50))
def test_expressions_match_python(a, b, c):
    x, y = Sym("x"), Sym("y")
    env = {"x": a, "y": b}
    assert (x + c).eval(env) == a + c and (c - x).eval(env) == c - a
    assert (2 * x * y).eval(env) == 2 * a * b
    assert (x // y).eval(env) == a // b and (x % y).eval(env) == a % b
    assert cdiv(x, y).eval(env) == -(-a // b) and cdiv(a, b) == -(-a // b)
    assert smin(x, y + c).eval(env) == min(a, b + c) and smax(x, 3).eval(env) == max(a, 3)
    assert (cdiv(x, 128) * y).symbols() == {"x", "y"}


def test_resolve_passes_plain_values_and_names_missing_symbols():
    assert resolve(5, None) == 5
    with pytest.raises(ValueError, match="symbols="):
        resolve(Sym("n") + 1, None)
    with pytest.raises(KeyError, match="'n'"):
        resolve(Sym("n") + 1, {})


def test_expression_rejects_non_integers():
    with pytest.raises(TypeError):
        Sym("n") * 1.5


def test_table_validates_before_storing():
    S = Symbols(seq_len=Range(1, 4096), past=Range(0, 100))
    S.set(seq_len=10, past=0)
    for bad, err in [({"seq_len": 0}, ValueError), ({"seq_len": 4097}, ValueError),
                     ({"seq_len": 2.0}, TypeError), ({"nope": 1}, KeyError),
                     ({"past": 5, "seq_len": True}, TypeError)]:
        with pytest.raises(err):
            S.set(**bad)
        assert S.env == {"seq_len": 10, "past": 0}
    S.set(seq_len=np.int64(4096))
    assert S.env["seq_len"] == 4096 and isinstance(S.seq_len, Sym)
    with pytest.raises(AttributeError):
        _ = S.other


def test_pointer_spec_checks_size_and_dtype():
    spec = Pointer(nbytes=64, dtype="float16")
    ok = SimpleNamespace(data=SimpleNamespace(ptr=4096), nbytes=128, dtype="float16")
    assert spec.check("x", ok) == 4096
    with pytest.raises(ValueError, match="smaller"):
        spec.check("x", SimpleNamespace(data=SimpleNamespace(ptr=1), nbytes=32, dtype="float16"))
    with pytest.raises(TypeError, match="float16"):
        spec.check("x", SimpleNamespace(data=SimpleNamespace(ptr=1), nbytes=64, dtype="float32"))
    with pytest.raises(TypeError, match="device array"):
        spec.check("x", 1234)


def test_top_of_an_expression_over_its_ranges():
    from rawgraph.ops.shapes import count, top

    S = Symbols(seq=Range(1, 100), p=Pointer(8))
    assert top(7, "n", None) == 7 and top(S.seq * 2 + 1, "n", S) == 201
    with pytest.raises(ValueError, match="pass symbols="):
        top(S.seq, "n", None)
    with pytest.raises(ValueError, match="needs a Range"):
        top(S.p + 1, "n", S)
    with pytest.raises(ValueError, match="reaches 201"):
        count(S.seq * 2 + 1, 200, "rows", S)
    assert count(None, 5, "rows", S) == 5


def test_a_with_block_makes_a_table_current_on_its_thread_only():
    import threading

    from rawgraph.ops.shapes import count
    from rawgraph.symbols import current, scope

    S, T = Symbols(seq=Range(1, 100)), Symbols(seq=Range(1, 10))
    assert current() is None
    seen = []
    with S:
        assert current() is S and current(T) is T  # a table passed wins
        assert count(S.seq * 2, 200, "rows", None) is not None  # checked against S's range
        with scope(None):  # inside: no table (a conditional body's fixed arguments)
            assert current() is None
            with pytest.raises(ValueError, match="pass symbols="):
                count(S.seq, 200, "rows", None)
        with T:
            assert current() is T
        assert current() is S
        t = threading.Thread(target=lambda: seen.append(current()))
        t.start()
        t.join()
    assert current() is None and seen == [None]
    with pytest.raises(KeyError), S:  # an exception leaves the block's table behind
        S.validate({"nope": 1})
    assert current() is None
