"""rmsnorm (with the residual add, with or without its weight) and fold_norm against their
NumPy references; rows past the active ones left unwritten."""

import cupy
import numpy as np
import pytest

from rawgraph import ops
from rawgraph.dtypes import to_float32, to_storage
from rawgraph.ops import reference as ref
from rawgraph.ops.variant import choose
from tests.helpers import DTYPES, ULP, host, poisoned, randn, unwritten

pytestmark = pytest.mark.gpu


@pytest.fixture(params=["block", "warp"])
def form(request):
    """Each rmsnorm test on both kernels: a block per row and a warp per row."""
    with choose(norm_warp_rows_from=10**9 if request.param == "block" else 1):
        yield request.param


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "dim", "active"), [
    (1, 8, None), (3, 2048, None), (7, 4096, 5), (2, 8192, None), (2, 8200, None),
    (33, 264, 17)])
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("weighted", [True, False])  # False: the weight folded elsewhere
def test_rmsnorm(stream, rng, form, dtype, rows, dim, active, fused, weighted):
    x, xh = randn(rng, (rows, dim), dtype, 3.0)
    w, wh = randn(rng, (dim,), dtype)
    if not weighted:
        w = wh = None
    out = poisoned((rows, dim), dtype)
    kw, rh = {}, None
    if fused:
        r, rh = randn(rng, (rows, dim), dtype)
        kw = {"residual": r, "residual_out": poisoned((rows, dim), dtype)}
    ops.rmsnorm(x, w, out, rows=active, eps=1e-5, stream=stream, **kw)
    stream.synchronize()
    k = active or rows
    want, h = ref.rmsnorm(xh[:k], wh, 1e-5, dtype, None if rh is None else rh[:k])
    got = host(out, dtype)
    np.testing.assert_allclose(got[:k], want, rtol=2 * ULP[dtype], atol=1e-6)
    assert np.abs(got[:k] - want).mean() < 0.05 * ULP[dtype] * np.abs(want).mean() + 1e-7
    assert unwritten(out, dtype)[k:].all()
    if fused:
        np.testing.assert_array_equal(host(kw["residual_out"], dtype)[:k], h)
        assert unwritten(kw["residual_out"], dtype)[k:].all()


def test_rmsnorm_in_place_residual(stream, rng, form):
    x, xh = randn(rng, (4, 64), "float16")
    r, rh = randn(rng, (4, 64), "float16")
    w, wh = randn(rng, (64,), "float16")
    out = poisoned((4, 64), "float16")
    ops.rmsnorm(x, w, out, residual=r, residual_out=r, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(host(r, "float16"), ref.rmsnorm(xh, wh, 1e-5, "float16", rh)[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_of_gathered_rows(stream, rng, form, dtype):
    # a prefill chunk's head: row r normalizes x's row gather[r]; a bad index gives zeros
    x, xh = randn(rng, (10, 264), dtype, 3.0)
    w, wh = randn(rng, (264,), dtype)
    gather = cupy.asarray(np.array([7, 0, 9, -1, 10, 3], np.int32))
    out = poisoned((6, 264), dtype)
    ops.rmsnorm(x, w, out, rows=5, gather=gather, stream=stream)
    stream.synchronize()
    got, want = host(out, dtype), ref.rmsnorm(xh[[7, 0, 9]], wh, 1e-5, dtype)[0]
    np.testing.assert_allclose(got[:3], want, rtol=2 * ULP[dtype], atol=1e-6)
    assert (got[3:5] == 0).all() and unwritten(out, dtype)[5:].all()
    # the same rows as the ungathered norm of a copy, bit for bit
    rows = poisoned((3, 264), dtype)
    ops.rmsnorm(x[cupy.asarray([7, 0, 9])], w, rows, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(host(rows, dtype), got[:3])


def test_rmsnorm_gather_is_checked(rng):
    x = cupy.zeros((10, 64), np.float16)
    out = poisoned((4, 64), "float16")
    with pytest.raises(ValueError, match="gather must be a contiguous int32"):
        ops.rmsnorm(x, None, out, gather=cupy.zeros(3, np.int32))
    with pytest.raises(ValueError, match="gather takes no residual"):
        ops.rmsnorm(x, None, out, gather=cupy.zeros(4, np.int32), residual=x, residual_out=x)
    with pytest.raises(ValueError, match="out has shape"):
        ops.rmsnorm(x, None, out)  # without gather, out is x's shape
    assert unwritten(out, "float16").all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "dim"), [(1, 8), (3072, 2048), (5, 264), (1000, 8200)])
def test_fold_norm(stream, rng, dtype, n, dim):
    # one rounding of an exact product: the reference's bits, in place
    w, wh = randn(rng, (n, dim), dtype, dim**-0.5)
    stored = to_storage((1.0 + 0.3 * rng.standard_normal(dim)).astype(np.float32), dtype)
    g, gh = cupy.asarray(stored), to_float32(stored, dtype)  # norm weights: 1 + N(0, 0.3)
    cupy.cuda.Device().synchronize()
    ops.fold_norm(w, g, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(host(w, dtype), ref.fold_norm(wh, gh, dtype))


def test_fold_norm_rejects_bad_input():
    w, g = cupy.zeros((4, 16), np.float16), cupy.ones(16, np.float16)
    with pytest.raises(ValueError, match="g has shape"):
        ops.fold_norm(w, g[:8])
    with pytest.raises(ValueError, match="dim = 12"):
        ops.fold_norm(cupy.zeros((4, 12), np.float16), g[:12])
    with pytest.raises(ValueError, match="w must be"):
        ops.fold_norm(g, g)
    assert (w == 0).all()
