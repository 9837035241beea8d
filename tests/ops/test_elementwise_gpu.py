"""add, silu_mul and embedding against their NumPy references; bad input raises before any
launch and leaves the outputs unwritten."""

import cupy
import numpy as np
import pytest

from rawgraph import Range, Symbols, ops
from rawgraph.ops import reference as ref
from tests.helpers import DTYPES, POISON, ULP, host, poisoned, randn, unwritten

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("size", "n", "offset"), [
    (1, None, 0), (7, None, 0), (8, None, 0), (4099, None, 0), (1 << 20, None, 0),
    (5000, 4097, 0), (333, None, 1), (2048 * 3 + 5, 2048 * 2 + 3, 3)])
def test_add(stream, rng, dtype, size, n, offset):
    a, ah = randn(rng, (size + offset,), dtype)
    b, bh = randn(rng, (size + offset,), dtype)
    out = poisoned((size + offset,), dtype)
    a, b, out, ah, bh = a[offset:], b[offset:], out[offset:], ah[offset:], bh[offset:]
    ops.add(a, b, out, n, stream=stream)
    stream.synchronize()
    n = n or size
    np.testing.assert_array_equal(host(out, dtype)[:n], ref.add(ah, bh, dtype)[:n])
    assert unwritten(out, dtype)[n:].all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "inter", "active"), [(1, 8, None), (4, 8192, None),
                                                       (9, 1032, 5)])
def test_silu_mul(stream, rng, dtype, rows, inter, active):
    gu, guh = randn(rng, (rows, 2 * inter), dtype, 4.0)
    out = poisoned((rows, inter), dtype)
    ops.silu_mul(gu, out, active, stream=stream)
    stream.synchronize()
    k = active or rows
    np.testing.assert_allclose(host(out, dtype)[:k], ref.silu_mul(guh[:k], dtype),
                               rtol=ULP[dtype], atol=1e-6)
    assert unwritten(out, dtype)[k:].all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding(stream, rng, dtype):
    table, th = randn(rng, (1000, 264), dtype)
    ids = np.array([0, 999, 5, 5, -1, 1000, 17], np.int32)
    out = poisoned((9, 264), dtype)
    ops.embedding(cupy.asarray(np.pad(ids, (0, 2))), table, out, 7, stream=stream)
    stream.synchronize()
    got = host(out, dtype)
    np.testing.assert_array_equal(got[:7], ref.embedding(ids, th))
    assert (cupy.asnumpy(out.view(np.uint16))[7:] == POISON[dtype]).all()


def _bad_calls(x, w, out, x32, S):
    return [
        (lambda: ops.rmsnorm(x32, w, out), "unsupported dtype"),
        (lambda: ops.rmsnorm(x, w[:8], out), "w has shape"),
        (lambda: ops.rmsnorm(x, w, out[:, :8]), "out has shape"),
        (lambda: ops.rmsnorm(x[:, ::2], w[::2], out[:, ::2]), "contiguous"),
        (lambda: ops.rmsnorm(x, w, out, rows=5), r"rows = 5 must be an integer in \[1, 4\]"),
        (lambda: ops.rmsnorm(x, w, out, rows=0), "rows"),
        (lambda: ops.rmsnorm(x, w, out, rows=S.seq, symbols=S), "reaches 9"),
        (lambda: ops.rmsnorm(x, w, out, rows=S.seq), "pass symbols="),
        (lambda: ops.rmsnorm(x, w, out, residual=x), "together"),
        (lambda: ops.rmsnorm(x, w, x), "must not be x"),
        (lambda: ops.silu_mul(x, out), "out has shape"),
        (lambda: ops.add(x, w, out), "b has shape"),
        (lambda: ops.add(x.ravel()[1:], x.ravel()[1:], out.ravel()[1:], 600), "n = 600"),
    ]


def test_bad_input_raises_before_launch(stream):
    x = cupy.ones((4, 64), np.float16)
    w = cupy.ones((64,), np.float16)
    out = poisoned((4, 64), "float16")
    x32 = cupy.ones((4, 64), np.float32)
    S = Symbols(seq=Range(1, 9))
    S.set(seq=2)
    for call, match in _bad_calls(x, w, out, x32, S):
        with pytest.raises(ValueError, match=match):
            call()
    stream.synchronize()
    assert unwritten(out, "float16").all()
    misaligned = cupy.ones(4 * 64 + 1, np.float16)[1:].reshape(4, 64)
    with pytest.raises(ValueError, match="aligned"):
        ops.rmsnorm(misaligned, w, out)
