"""ops.variant: which counts take which variant, without a GPU."""

import pytest

from rawgraph.ops.variant import MAX_VALUES, by_count, spans
from rawgraph.symbols import Pointer, Range, Symbols


def test_spans_group_every_value_by_its_variant_in_ascending_intervals():
    S = Symbols(seq=Range(1, 20), past=Range(0, 4))
    key = lambda v: "a" if v <= 5 or v > 15 else "b"  # noqa: E731  (a comes back above 15)
    assert spans(S.seq, S, key) == {"a": [(1, 5), (16, 20)], "b": [(6, 15)]}
    # an expression of two symbols: from its bottom (1 + 0) to its top (20 + 4)
    assert spans(S.seq + S.past, S, key) == {"a": [(1, 5), (16, 24)], "b": [(6, 15)]}


def test_a_count_below_one_takes_the_variant_of_one():
    S = Symbols(n=Range(0, 3))
    seen = []
    assert spans(S.n, S, lambda v: seen.append(v) or v > 2) == {False: [(0, 2)], True: [(3, 3)]}
    assert min(seen) == 1


def test_spans_refuse_what_they_cannot_list():
    S = Symbols(n=Range(1, MAX_VALUES + 1), p=Range(0, 1))
    with pytest.raises(ValueError, match="name the bound"):
        spans(S.n, S, lambda v: 0)
    S2 = Symbols(n=Range(1, 4), p=Pointer(16))
    with pytest.raises(ValueError, match="needs a Range"):
        spans(S2.n + S2.p, S2, lambda v: 0)


def test_a_plain_count_runs_its_own_variant():
    ran = []
    by_count(7, ran.append, lambda v: v > 4)
    assert ran == [7]


def test_a_symbolic_count_needs_its_table():
    S = Symbols(n=Range(1, 4))
    with pytest.raises(ValueError, match="pass symbols"):
        by_count(S.n, print, lambda v: 0)


def test_kernel_forms_are_chosen_in_a_block_and_put_back_after_it():
    import threading

    from rawgraph.ops import matmul
    from rawgraph.ops.variant import DEFAULT, Variants, choose, chosen

    assert chosen() == DEFAULT == Variants() and DEFAULT.split_k and DEFAULT.chained_attention
    with choose(split_k=False) as outer:
        assert chosen() is outer and not outer.split_k
        with choose(persistent=False):  # nested: the outer block's choices carry on
            assert not chosen().split_k and not chosen().persistent
        with choose(Variants(fused_silu=False)):  # a whole table replaces them
            assert chosen().split_k and not chosen().fused_silu
        seen = []
        t = threading.Thread(target=lambda: seen.append(chosen()))  # per thread
        t.start()
        t.join()
        assert seen == [DEFAULT]
        assert chosen() is outer
    assert chosen() == DEFAULT
    with pytest.raises(TypeError, match="split_kk"):
        with choose(split_kk=False):
            pass
    with pytest.raises(RuntimeError), choose(split_k=False):
        raise RuntimeError  # put back on the way out of an exception too
    assert chosen() == DEFAULT
    # the ops read the table (test_op_plans: each switch's effect): past 64 rows the tiled
    # GEMM without asking the device, unless the table sends them to the skinny GEMM
    assert matmul.path(100, 4096) == "gemm"
