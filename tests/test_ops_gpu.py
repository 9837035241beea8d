"""Kernels against their NumPy references; bad input raises before any launch."""

import cupy
import numpy as np
import pytest

from rawgraph import ops
from rawgraph.dtypes import to_float32, to_storage
from rawgraph.ops import reference as ref
from rawgraph.ops.elementwise import ADD, SILU_MUL
from rawgraph.ops.norm import FOLD, RMSNORM
from rawgraph.symbols import Range, Symbols
from tests.helpers import POISON, host, poisoned, randn

pytestmark = pytest.mark.gpu
DTYPES = ["float16", "bfloat16"]
# fp32 math, outputs rounded once to the storage type: results may differ from the
# reference by the last bit where a reduction's order differs (rmsnorm).
ULP = {"float16": 2.0**-10, "bfloat16": 2.0**-7}


def _unwritten(arr, dtype) -> np.ndarray:
    return cupy.asnumpy(arr.view(np.uint16)) == POISON[dtype]


@pytest.mark.parametrize("kernel", [*ADD.values(), *SILU_MUL.values(), *RMSNORM.values(),
                                    *FOLD.values()])
def test_compiled_parameters_match_declared_signature(kernel):
    info = kernel.param_info()  # loading already cross-checked the sizes; check layout too
    assert [s for _, s in info] == [p.size for p in kernel.sig.params]
    assert [o for o, _ in info] == sorted(o for o, _ in info)


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
    assert _unwritten(out, dtype)[n:].all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "dim", "active"), [
    (1, 8, None), (3, 2048, None), (7, 4096, 5), (2, 8192, None), (33, 264, 17)])
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("weighted", [True, False])  # False: the weight folded elsewhere
def test_rmsnorm(stream, rng, dtype, rows, dim, active, fused, weighted):
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
    assert _unwritten(out, dtype)[k:].all()
    if fused:
        np.testing.assert_array_equal(host(kw["residual_out"], dtype)[:k], h)
        assert _unwritten(kw["residual_out"], dtype)[k:].all()


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
    assert _unwritten(out, dtype)[k:].all()


def test_rmsnorm_in_place_residual(stream, rng):
    x, xh = randn(rng, (4, 64), "float16")
    r, rh = randn(rng, (4, 64), "float16")
    w, wh = randn(rng, (64,), "float16")
    out = poisoned((4, 64), "float16")
    ops.rmsnorm(x, w, out, residual=r, residual_out=r, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(host(r, "float16"), ref.rmsnorm(xh, wh, 1e-5, "float16", rh)[1])


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
    assert _unwritten(out, "float16").all()
    misaligned = cupy.ones(4 * 64 + 1, np.float16)[1:].reshape(4, 64)
    with pytest.raises(ValueError, match="aligned"):
        ops.rmsnorm(misaligned, w, out)


def test_compile_error_carries_the_nvrtc_log(tmp_path, monkeypatch):
    from rawgraph import CompileError, Kernel
    from rawgraph.cuda import kernel as kmod

    (tmp_path / "broken_op.cu").write_text(
        'extern "C" __global__ void broken(float* y, int n) { y[0] = undefined_name; }\n')
    monkeypatch.setattr(kmod, "KERNELS_DIR", tmp_path)
    k = Kernel("broken_op", "broken", "float* y, int n")
    with pytest.raises(CompileError, match="undefined_name") as e:
        k.launch(1, 32, (None, 1))
    assert "broken_op.cu" in str(e.value) and "undefined_name" in e.value.log
