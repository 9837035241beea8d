"""Quantized weights (ops.Fp8Weight, ops.Int4Weight) in the projections: the decode GEMV
against the float64 reference of the weight its kernel computes with (every variant, the
residual, rows past m unwritten), the LM head's greedy keys, the fused _silu and _rope forms
against the projection then the kernel, a 16-bit copy or a scratch for more rows, graph
replay with the rows patched, the GPU quantizers and dequantizers against their references,
refused input."""

import cupy
import numpy as np
import pytest

from rawgraph import Range, Symbols, capture, ops
from rawgraph.dtypes import to_float32, to_storage
from rawgraph.ops import reference as ref
from rawgraph.ops.quantized import (
    dequantize,
    pack_int4,
    quantize_fp8,
    quantize_int4,
    takes_quantized,
    unpack_int4,
)
from tests.helpers import DTYPES, POISON, ULP, bits, gate_up_both, host, poisoned, randn
from tests.ops.test_quantized import CASES, FORMATS

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _new_enough():
    if not takes_quantized("e4m3"):
        pytest.skip("the FP8 kernels need compute capability 8.9")


def make(rng: np.random.Generator, fmt: str, n: int, k: int, dtype: str, group: int = 128):
    """(a quantized weight on the device, the float64 weight its GEMV computes with): FP8
    codes over every finite e4m3 value with scales near k**-0.5 / 16; 4-bit values with
    scales (in `dtype`) near k**-0.5 / 8 and zeros 0-15 by groups of `group`."""
    if fmt == "e4m3":
        finite = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], np.uint8)
        codes = rng.choice(finite, (n, k))
        scale = (rng.uniform(0.5, 2.0, n) * k**-0.5 / 16).astype(np.float32)
        w = ops.fp8_weight(cupy.asarray(codes), cupy.asarray(scale))
        return w, ref.dequantize_fp8(codes, scale)
    q = rng.integers(0, 16, (n, k)).astype(np.uint8)
    s = to_storage((rng.uniform(0.5, 2.0, (n, k // group)) * k**-0.5 / 8).astype(np.float32),
                   dtype)
    z = rng.integers(0, 16, (n, k // group)).astype(np.uint8)
    w = ops.int4_weight(cupy.asarray(pack_int4(q)), cupy.asarray(s), cupy.asarray(z), group)
    return w, ref.dequantize_int4(q, to_float32(s, dtype), z, group, dtype).astype(np.float64)




@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k"), CASES)
@pytest.mark.parametrize("fused", [False, True])
def test_the_quantized_gemv_matches_the_reference_of_its_weight(stream, rng, fmt, dtype, m, n,
                                                                 k, fused):
    # every variant (n past the last 16-row block, one row to 16, long rows in 16-warp blocks),
    # with and without the residual: within 2 ulp of the float64 product with the weight the
    # kernel computes with, rows past m unwritten
    rows = m + 1
    x, xh = randn(rng, (rows, k), dtype)
    w, wd = make(rng, fmt, n, k, dtype)
    y = poisoned((rows, n), dtype)
    kw, rh = {}, None
    if fused:
        r, rh = randn(rng, (rows, n), dtype)
        kw = {"residual": r}
    cupy.cuda.Device().synchronize()
    ops.linear(x, w, y, m=m, stream=stream, **kw)
    stream.synchronize()
    want = ref.linear(xh[:m], wd, dtype, None if rh is None else rh[:m])
    np.testing.assert_allclose(host(y, dtype)[:m], want, rtol=2 * ULP[dtype],
                               atol=2 * ULP[dtype])
    assert (bits(y)[m:] == POISON[dtype]).all()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 50000, 256), (8, 50000, 256), (12, 50000, 256),
                                           (12, 2000, 8192)])
def test_a_quantized_lm_head_keeps_each_rows_greedy_pick(stream, rng, fmt, dtype, m, n, k):
    # linear(..., row_max=) merges each row's greedy key (a wide head's 12 rows too: the GEMV
    # takes a quantized weight through 16 rows); sample's greedy rows take it: the argmax of
    # the logits the kernel wrote
    rows = m + 1
    x, _ = randn(rng, (rows, k), dtype)
    w, _ = make(rng, fmt, n, k, dtype)
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


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("n", "k", "rows"), [(512, 256, 8), (2048, 16384, 8), (1024, 8192, 16)])
def test_the_quantized_gemv_replays_the_eager_bits_with_rows_patched(stream, rng, fmt, n, k,
                                                                      rows):
    # captured for 3 rows, patched to all: the eager launch's bits (the residual in place),
    # replayed twice
    x, _ = randn(rng, (rows, k), "bfloat16")
    w, _ = make(rng, fmt, n, k, "bfloat16")
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


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_quantized_weight_with_its_16_bit_copy_takes_every_row_count(stream, rng, fmt,
                                                                        dtype):
    # the GEMV's rows read the quantized weight; more rows take the 16-bit copy's path, whose
    # bits they give; captured over 1-64 rows and patched, each count gives the eager bits
    n, k = 1024, 2048
    wq, wd = make(rng, fmt, n, k, dtype)
    wide, _ = randn(rng, (n, k), dtype, k**-0.5)
    w = type(wq)(*wq.args(), wide) if fmt == "e4m3" else ops.int4_weight(*wq.args(), wide)
    x, xh = randn(rng, (64, k), dtype)
    y, y16 = cupy.empty((64, n), x.dtype), cupy.empty((64, n), x.dtype)
    cupy.cuda.Device().synchronize()
    for m in (1, 8, 16, 17, 40, 64):
        ops.linear(x, w, y, m=m, stream=stream)
        ops.linear(x, wide, y16, m=m, stream=stream)
        stream.synchronize()
        if m <= 16:
            np.testing.assert_allclose(host(y, dtype)[:m], ref.linear(xh[:m], wd, dtype),
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


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "inter", "k"), [(1, 1024, 2048), (5, 4096, 4096), (16, 520, 1024)])
def test_gate_up_silu_of_a_quantized_weight_is_its_projection_then_silu_mul(stream, rng, fmt,
                                                                             dtype, m, inter, k):
    # the quantized GEMV's _silu form: the bits of its projection then silu_mul, rows past m
    # unwritten and gu untouched
    x, _ = randn(rng, (m + 1, k), dtype)
    w, _ = make(rng, fmt, 2 * inter, k, dtype)
    out, gu, want = gate_up_both(stream, x, w, m, dtype)
    np.testing.assert_array_equal(bits(out)[:m], want[:m])
    assert (bits(out)[m:] == POISON[dtype]).all() and (gu == POISON[dtype]).all()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_qkv_rope_of_a_quantized_weight_is_its_projection_then_rope_append(stream, rng, fmt,
                                                                           dtype, bias):
    # the quantized GEMV's _rope form: the bits of its projection then rope_append, in qkv
    # and in the cache (with a Qwen2-style bias too)
    m, heads, kv_heads, d, bs = 6, 8, 2, 64, 4
    n, k, row = (heads + 2 * kv_heads) * d, 512, kv_heads * d
    x, _ = randn(rng, (m, k), dtype)
    w, _ = make(rng, fmt, n, k, dtype)
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
def test_quantize_fp8_gives_the_references_codes_and_scales(stream, rng, dtype, n, k):
    # per output row, round to nearest even, saturating: reference.quantize_fp8's bits; a row
    # of zeros takes the least scale
    w, wh = randn(rng, (n, k), dtype)
    w[0] = 0
    wh[0] = 0
    codes, scale = cupy.empty((n, k), np.uint8), cupy.empty(n, np.float32)
    cupy.cuda.Device().synchronize()
    quantize_fp8(w, codes, scale, stream=stream)
    stream.synchronize()
    want_codes, want_scale = ref.quantize_fp8(wh)
    np.testing.assert_array_equal(scale.get(), want_scale)
    np.testing.assert_array_equal(codes.get(), want_codes)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k", "group"), [(64, 128, 128), (1000, 2048, 128), (3, 4096, 32),
                                               (17, 256, 256)])
def test_quantize_int4_gives_the_references_values_scales_and_zeros(stream, rng, dtype, n, k,
                                                                     group):
    # asymmetric, a group's range with 0 in it over 15 levels: reference.quantize_int4's bits,
    # packed as pack_int4 packs them; an all-zero group, and one all positive
    w, wh = randn(rng, (n, k), dtype)
    w[0, :group], wh[0, :group] = 0, 0
    w[1 % n, :group] = abs(w[1 % n, :group])
    wh[1 % n, :group] = abs(wh[1 % n, :group])
    packed = cupy.empty((n, k // 2), np.uint8)
    scales, zeros = cupy.empty((n, k // group), w.dtype), cupy.empty((n, k // group), np.uint8)
    cupy.cuda.Device().synchronize()
    quantize_int4(w, packed, scales, zeros, group, stream=stream)
    stream.synchronize()
    q, s, z = ref.quantize_int4(wh, group, dtype)
    np.testing.assert_array_equal(packed.get(), pack_int4(q))
    np.testing.assert_array_equal(host(scales, dtype), s)
    np.testing.assert_array_equal(zeros.get(), z)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_quantized_projection_refuses_bad_input(rng, fmt):
    w, _ = make(rng, fmt, 64, 128, "float16", group=64)
    x, y = cupy.ones((4, 128), np.float16), cupy.ones((4, 64), np.float16)
    with pytest.raises(ValueError, match="k = 32 columns"):
        ops.linear(cupy.ones((4, 32), np.float16), w, y)
    with pytest.raises(ValueError, match="without a 16-bit copy"):
        ops.linear(cupy.ones((17, 128), np.float16), w, cupy.ones((17, 64), np.float16))
    with pytest.raises(ValueError, match="y has shape"):
        ops.linear(x, w, cupy.ones((4, 9), np.float16))
    with pytest.raises(ValueError, match="must not overlap x"):
        ops.linear(x, w, x.reshape(-1)[:4 * 64].reshape(4, 64))
    if fmt == "i4":  # its scales are the activations' dtype
        with pytest.raises(ValueError, match=r"w\.scales is float16, expected bfloat16"):
            ops.linear(x.view(np.uint16), w, y.view(np.uint16))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_gives_the_references_values(stream, rng, fmt, dtype):
    # FP8's T(float32(code x scale)), 4-bit's T((q - zero) x scale): the references' bits
    n, k = 300, 1024
    w, _ = make(rng, fmt, n, k, dtype)
    out = poisoned((n, k), dtype)
    cupy.cuda.Device().synchronize()
    dequantize(w, out, stream=stream)
    stream.synchronize()
    want = _values16(w, dtype)
    np.testing.assert_array_equal(bits(out), to_storage(want, dtype).view(np.uint16))


def _values16(w, dtype: str) -> np.ndarray:
    """A quantized record's values as `dequantize` rounds them, on the host (float32)."""
    if w.fmt == "e4m3":
        return ref.dequantize_fp8_to(w.codes.get(), w.scale.get(), dtype)
    return ref.dequantize_int4(unpack_int4(w.packed.get()), to_float32(w.scales.get(), dtype),
                               w.zeros.get(), w.group, dtype)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_quantized_weight_alone_takes_more_rows_through_its_scratch(stream, rng, fmt, dtype):
    # no 16-bit copy: past the GEMV's rows the projection is dequantized into the scratch and
    # read by the 16-bit path, whose bits it then gives (linear and gate_up_silu); captured
    # over 1-64 rows and patched, each count gives the eager bits
    n, k = 1024, 2048
    w, _ = make(rng, fmt, n, k, dtype)
    w16 = cupy.asarray(to_storage(_values16(w, dtype), dtype))
    scratch = cupy.empty(n * k + 100, w16.dtype)
    x, _ = randn(rng, (64, k), dtype)
    y, y16 = cupy.empty((64, n), x.dtype), cupy.empty((64, n), x.dtype)
    cupy.cuda.Device().synchronize()
    for m in (17, 40, 64):
        ops.linear(x, w, y, m=m, scratch=scratch, stream=stream)
        ops.linear(x, w16, y16, m=m, stream=stream)
        stream.synchronize()
        np.testing.assert_array_equal(bits(y)[:m], bits(y16)[:m])
        want = gate_up_both(stream, x, w16, m, dtype)[0]  # the 16-bit weight's, fused
        got = poisoned((64, n // 2), dtype)
        ops.gate_up_silu(x, w, poisoned((64, n), dtype), got, m=m, scratch=scratch,
                         stream=stream)
        stream.synchronize()
        np.testing.assert_array_equal(bits(got)[:m], bits(want)[:m])
    S = Symbols(b=Range(1, 64))
    S.set(b=1)
    g_out = cupy.empty((64, n), x.dtype)
    with capture(stream) as cap:
        ops.linear(x, w, g_out, m=S.b, scratch=scratch, stream=stream, symbols=S)
    with cap.graph as g, g.instantiate() as ex:
        for m in (3, 16, 30, 64):
            ex.set(b=m)
            ex.launch(stream)
            ops.linear(x, w, y, m=m, scratch=scratch, stream=stream)
            stream.synchronize()
            np.testing.assert_array_equal(bits(g_out)[:m], bits(y)[:m])
    with pytest.raises(ValueError, match="scratch"):
        ops.linear(x, w, y, scratch=cupy.empty(n * k - 1, w16.dtype))
