"""Launch validation happens before anything touches the GPU."""

import pytest

from rawgraph.cuda.launch import Launch
from rawgraph.ops.elementwise import ADD
from rawgraph.symbols import Range, Symbols

K = ADD["float16"]
ARGS = (0x1000, 0x2000, 0x3000, 8)


@pytest.mark.parametrize(("grid", "block", "kw", "match"), [
    (0, 256, {}, "grid"),
    ((1, 70000), 256, {}, "grid"),
    (1.0, 256, {}, "grid"),
    (1, 2048, {}, "block"),
    (1, (32, 32, 2), {}, "more than 1024"),
    (1, (1, 1, 1, 1), {}, "1 to 3"),
    (1, 256, {"smem": -1}, "shared memory"),
])
def test_bad_geometry_raises(grid, block, kw, match):
    with pytest.raises(ValueError, match=match):
        Launch(K, grid, block, ARGS, **kw)


def test_bad_arguments_raise():
    with pytest.raises(TypeError, match="expected 4 arguments"):
        Launch(K, 1, 256, ARGS[:3])
    with pytest.raises(TypeError, match="'n'"):
        Launch(K, 1, 256, (*ARGS[:3], "8"))


def test_symbolic_launch_needs_symbols_and_resolves():
    S = Symbols(n=Range(1, 64))
    with pytest.raises(ValueError, match="symbols="):
        Launch(K, 1, 256, (*ARGS[:3], S.n))
    S.set(n=33)
    L = Launch(K, S.n // 8, 256, (*ARGS[:3], S.n), symbols=S)
    assert L.grid == (4, 1, 1) and L.args[3] == 33 and L.reads == {"n"} and L.env == {"n": 33}
    c = L.clone((8, 1, 1), (*L.args[:3], 64))  # a copy with its own storage
    assert (L.grid, L.args[3]) == ((4, 1, 1), 33) and (c.grid, c.args[3]) == ((8, 1, 1), 64)
    with pytest.raises(KeyError, match="'m' has no value"):
        Launch(K, 1, 256, (*ARGS[:3], Symbols(m=Range(1, 9)).m),
               symbols=Symbols(m=Range(1, 9)))


def test_a_descriptor_argument_cannot_follow_a_symbol():
    from rawgraph.ops.matmul import GEMM90

    k = GEMM90["float16", (128, 256), 1]
    S = Symbols(m=Range(1, 512))
    S.set(m=100)
    with pytest.raises(ValueError, match="cannot follow a symbol"):
        Launch(k, 1, 288, (S.m, b"\0" * 128, b"\0" * 128, None, 0x1000, S.m, 256, 64),
               symbols=S)
    L = Launch(k, S.m, 288, (b"\1" * 128, b"\2" * 128, b"\3" * 128, None, 0x1000, S.m, 256, 64),
               symbols=S)
    assert L.args[0] == b"\1" * 128 and L.args[5] == 100 and L.grid == (100, 1, 1)


def test_launches_carry_the_innermost_label_around_their_making():
    from rawgraph.cuda.launch import labelled

    assert Launch(K, 1, 256, ARGS).label is None
    with labelled("qkv"):
        assert Launch(K, 1, 256, ARGS).label == "qkv"
        with labelled("attention"):
            L = Launch(K, 1, 256, ARGS)
        assert Launch(K, 1, 256, ARGS).label == "qkv"
    assert L.label == "attention" and L.clone().label == "attention"
    assert Launch(K, 1, 256, ARGS).label is None
