"""FP8 weights (ops.Fp8Weight) in the projections: the decode GEMV's e4m3 codes and a scale
per row against the float64 reference of the dequantized weight (every variant, the
residual, rows past m unwritten), the LM head's greedy keys, the fused _silu and _rope forms
against the projection then the kernel, a 16-bit copy for more rows, graph replay with the
rows patched, the GPU quantizer against its reference, refused input."""

import cupy
import numpy as np
import pytest

from rawgraph import Range, Symbols, capture, ops
from rawgraph.dtypes import e4m3_decode, to_storage
from rawgraph.ops import gemv
from rawgraph.ops import reference as ref
from rawgraph.ops.fp8 import takes_fp8
from tests.helpers import DTYPES, POISON, ULP, bits, host, poisoned, randn

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _ada_or_newer():
    if not takes_fp8():
        pytest.skip("the FP8 GEMV needs compute capability 8.9")


def fp8(rng: np.random.Generator, n: int, k: int):
    """(an Fp8Weight on the device, its codes and scales on the host): codes over every finite
    e4m3 value, scales near k**-0.5 / 16 (outputs of order 1 for x of order 1)."""
    finite = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], np.uint8)
    codes = rng.choice(finite, (n, k))
    scale = (rng.uniform(0.5, 2.0, n) * k**-0.5 / 16).astype(np.float32)
    return ops.fp8_weight(cupy.asarray(codes), cupy.asarray(scale)), codes, scale


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k", "form"), [
    (1, 2048, 2048, (8, 4, False, 8)), (3, 2048, 8192, (8, 4, True, 8)),
    (8, 2048, 16384, (8, 4, True, 16)), (5, 8200, 1040, (8, 4, True, 8)),
    (16, 1000, 4096, (16, 2, True, 8)), (12, 2048, 16384, (16, 2, True, 16)),
    (2, 24, 272, (8, 4, False, 8)), (7, 136, 16, (8, 4, False, 8))])
@pytest.mark.parametrize("fused", [False, True])
def test_linear_fp8_matches_the_dequantized_reference(stream, rng, dtype, m, n, k, form, fused):
    # every variant (k past the last whole chunk, n past the last 16-row block, one row to 16),
    # with and without the residual: within 2 ulp of the float64 product with the dequantized
    # weight, rows past m unwritten
    assert gemv.gemv_launch(dtype, m, n, k, fp8=True)[0][1:] == form
    rows = m + 1
    x, xh = randn(rng, (rows, k), dtype)
    w, codes, scale = fp8(rng, n, k)
    y = poisoned((rows, n), dtype)
    kw, rh = {}, None
    if fused:
        r, rh = randn(rng, (rows, n), dtype)
        kw = {"residual": r}
    cupy.cuda.Device().synchronize()
    ops.linear(x, w, y, m=m, stream=stream, **kw)
    stream.synchronize()
    want = ref.linear_fp8(xh[:m], codes, scale, dtype, None if rh is None else rh[:m])
    np.testing.assert_allclose(host(y, dtype)[:m], want, rtol=2 * ULP[dtype],
                               atol=2 * ULP[dtype])
    assert (bits(y)[m:] == POISON[dtype]).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_fp8_weight_of_exact_values_gives_the_16_bit_weights_products(stream, rng, dtype):
    # codes whose scaled values fp16/bf16 hold exactly (scale a power of two) through the
    # FP8 GEMV and through the 16-bit GEMV of the same values: both within 2 ulp of one
    # reference, and within 2 ulp of each other
    m, n, k = 4, 2048, 4096
    x, xh = randn(rng, (m, k), dtype)
    finite = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], np.uint8)
    codes = rng.choice(finite, (n, k))
    scale = np.full(n, 2.0**-10, np.float32)
    w8 = ops.fp8_weight(cupy.asarray(codes), cupy.asarray(scale))
    wh = e4m3_decode(codes) * scale[:, None]
    w16 = cupy.asarray(to_storage(wh, dtype))
    a, b = cupy.empty((m, n), x.dtype), cupy.empty((m, n), x.dtype)
    cupy.cuda.Device().synchronize()
    ops.linear(x, w8, a, stream=stream)
    ops.linear(x, w16, b, stream=stream)
    stream.synchronize()
    want = ref.linear(xh, wh, dtype)
    for got in (a, b):
        np.testing.assert_allclose(host(got, dtype), want, rtol=2 * ULP[dtype],
                                   atol=2 * ULP[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 50000, 256), (8, 50000, 256), (12, 2000, 8192)])
def test_an_fp8_lm_head_keeps_each_rows_greedy_pick(stream, rng, dtype, m, n, k):
    # linear_fp8(..., row_max=) merges each row's greedy key; sample's greedy rows take it:
    # the argmax of the logits the kernel wrote
    rows = m + 1
    x, _ = randn(rng, (rows, k), dtype)
    w, _, _ = fp8(rng, n, k)
    logits = cupy.zeros((rows, n), x.dtype)
    best = cupy.zeros(rows, np.uint64)
    args = [cupy.asarray(a) for a in (np.zeros(rows, np.float32), np.zeros(rows, np.int32),
                                      np.ones(rows, np.float32), np.arange(rows, dtype=np.uint64),
                                      np.zeros(rows, np.int32))]
    got = cupy.full(rows, -1, np.int32)
    cupy.cuda.Device().synchronize()
    ops.linear(x, w, logits, m=m, row_max=best, stream=stream)
    ops.sample(logits, got, *args, rows=m, row_max=best, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(got.get()[:m], ref.argmax(host(logits, dtype)[:m]))


@pytest.mark.parametrize(("n", "k", "rows"), [(512, 256, 8), (2048, 16384, 8), (1024, 8192, 16)])
def test_linear_fp8_replays_the_eager_bits_with_rows_patched(stream, rng, n, k, rows):
    # captured for 3 rows, patched to all: the eager launch's bits (the residual in place),
    # replayed twice
    x, _ = randn(rng, (rows, k), "bfloat16")
    w, _, _ = fp8(rng, n, k)
    r, _ = randn(rng, (rows, n), "bfloat16")
    start, eager = r.copy(), r.copy()
    S = Symbols(b=Range(1, rows))
    S.set(b=3)
    with capture(stream) as cap:
        ops.linear(x, w, r, residual=r, m=S.b, stream=stream, symbols=S)
    cupy.cuda.Device().synchronize()
    ops.linear(x, w, eager, residual=eager, stream=stream)
    ops.linear(x, w, eager, residual=eager, stream=stream)
    with cap.graph as g, g.instantiate() as ex:
        ex.set(b=rows)
        for _ in range(2):
            ex.launch(stream)
        stream.synchronize()
    np.testing.assert_array_equal(bits(r), bits(eager))
    assert not np.array_equal(bits(r), bits(start))


def test_linear_fp8_rejects_bad_input(rng):
    w, _, _ = fp8(rng, 64, 64)
    x, y = cupy.ones((4, 64), np.float16), cupy.ones((4, 64), np.float16)
    with pytest.raises(ValueError, match="k = 32 columns"):
        ops.linear(cupy.ones((4, 32), np.float16), w, y)
    with pytest.raises(ValueError, match="without a 16-bit copy"):
        ops.linear(cupy.ones((17, 64), np.float16), w, cupy.ones((17, 64), np.float16))
    with pytest.raises(ValueError, match="y has shape"):
        ops.linear(x, w, cupy.ones((4, 9), np.float16))
    with pytest.raises(ValueError, match="must not overlap x"):
        ops.linear(x, w, x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_fp8_weight_with_its_16_bit_copy_takes_every_row_count(stream, rng, dtype):
    # the GEMV's rows read the codes; more rows take the 16-bit copy's path, whose bits they
    # give; captured over 1-64 rows and patched, each count gives the eager bits
    n, k = 1024, 2048
    w8, codes, scale = fp8(rng, n, k)
    wide, _ = randn(rng, (n, k), dtype, k**-0.5)
    w = ops.fp8_weight(w8.codes, w8.scale, wide)
    x, xh = randn(rng, (64, k), dtype)
    y, y16 = cupy.empty((64, n), x.dtype), cupy.empty((64, n), x.dtype)
    cupy.cuda.Device().synchronize()
    for m in (1, 8, 16, 17, 40, 64):
        ops.linear(x, w, y, m=m, stream=stream)
        ops.linear(x, wide, y16, m=m, stream=stream)
        stream.synchronize()
        if m <= 16:
            np.testing.assert_allclose(host(y, dtype)[:m], ref.linear_fp8(xh[:m], codes, scale,
                                                                          dtype),
                                       rtol=2 * ULP[dtype], atol=2 * ULP[dtype])
        else:
            np.testing.assert_array_equal(bits(y)[:m], bits(y16)[:m])
    S = Symbols(b=Range(1, 64))
    S.set(b=1)
    g_out = cupy.empty((64, n), x.dtype)
    with capture(stream) as cap:
        ops.linear(x, w, g_out, m=S.b, stream=stream, symbols=S)
    with cap.graph as g, g.instantiate() as ex:
        for m in (3, 16, 30, 64):
            ex.set(b=m)
            ex.launch(stream)
            ops.linear(x, w, y, m=m, stream=stream)
            stream.synchronize()
            np.testing.assert_array_equal(bits(g_out)[:m], bits(y)[:m])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "inter", "k"), [(1, 1024, 2048), (5, 4096, 4096), (16, 520, 1024)])
def test_gate_up_silu_of_an_fp8_weight_is_its_projection_then_silu_mul(stream, rng, dtype, m,
                                                                        inter, k):
    # the FP8 GEMV's _silu form: the bits of the FP8 projection then silu_mul, rows past m
    # unwritten and gu untouched
    rows = m + 1
    x, _ = randn(rng, (rows, k), dtype)
    w, _, _ = fp8(rng, 2 * inter, k)
    gu, out = poisoned((rows, 2 * inter), dtype), poisoned((rows, inter), dtype)
    gu2, out2 = poisoned((rows, 2 * inter), dtype), poisoned((rows, inter), dtype)
    cupy.cuda.Device().synchronize()
    ops.gate_up_silu(x, w, gu, out, m=m, stream=stream)
    ops.linear(x, w, gu2, m=m, stream=stream)
    ops.silu_mul(gu2, out2, rows=m, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(bits(out)[:m], bits(out2)[:m])
    assert (bits(out)[m:] == POISON[dtype]).all() and (bits(gu) == POISON[dtype]).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_qkv_rope_of_an_fp8_weight_is_its_projection_then_rope_append(stream, rng, dtype, bias):
    # the FP8 GEMV's _rope form: the bits of the FP8 projection then rope_append, in qkv and
    # in the cache (with a Qwen2-style bias too)
    m, heads, kv_heads, d, bs = 6, 8, 2, 64, 4
    n, k, row = (heads + 2 * kv_heads) * d, 512, kv_heads * d
    x, _ = randn(rng, (m, k), dtype)
    w, _, _ = fp8(rng, n, k)
    b = randn(rng, (n,), dtype, 0.5)[0] if bias else None
    extras = ops.Extras(b, None, 1e-6)
    tables = cupy.asarray(np.array([[3, 1], [0, -1], [5, 7]], np.int32))
    slots = cupy.asarray(np.array([0, 1, -1, 2, 0, 1], np.int32))  # row 2: padding
    pos = cupy.asarray(np.array([2, 3, 0, 6, 5, 4], np.int32))  # row 5: unmapped block
    f = cupy.asarray(ops.inv_freq(d, 1000000.0))
    out = {}
    for fused in (True, False):
        kc, vc = poisoned((8, bs, row), dtype), poisoned((8, bs, row), dtype)
        cache = ops.Cache(kc, vc, tables)
        qkv = poisoned((m, n), dtype)
        cupy.cuda.Device().synchronize()
        if fused:
            ops.qkv_rope(x, w, qkv, cache, slots, pos, f, head_dim=d, extras=extras,
                         stream=stream)
        else:
            ops.linear(x, w, qkv, stream=stream)
            q, kn, vn = ops.qkv_views(qkv, heads, d)
            ops.rope_append(q, kn, vn, cache, slots, pos, f, m, extras=extras, stream=stream)
        stream.synchronize()
        out[fused] = bits(qkv), bits(kc), bits(vc)
    for got, want in zip(out[True], out[False]):
        np.testing.assert_array_equal(got, want)
    assert (out[True][1] != POISON[dtype]).any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k"), [(64, 64), (1000, 2048), (3, 4098)])
def test_quantize_gives_the_references_codes_and_scales(stream, rng, dtype, n, k):
    # per output row, round to nearest even, saturating: reference.quantize_fp8's bits; a row
    # of zeros takes the least scale
    w, wh = randn(rng, (n, k), dtype)
    w[0] = 0
    wh[0] = 0
    codes, scale = cupy.empty((n, k), np.uint8), cupy.empty(n, np.float32)
    cupy.cuda.Device().synchronize()
    ops.fp8.quantize(w, codes, scale, stream=stream)
    stream.synchronize()
    want_codes, want_scale = ref.quantize_fp8(wh)
    np.testing.assert_array_equal(scale.get(), want_scale)
    np.testing.assert_array_equal(codes.get(), want_codes)
