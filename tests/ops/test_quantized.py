"""Quantized weights without a GPU: the records' checks, the 4-bit packing, the references'
math."""

import numpy as np
import pytest

from rawgraph.dtypes import E4M3, e4m3_decode, round_to, to_storage
from rawgraph.ops import fp8_weight, gemv, int4_weight
from rawgraph.ops import reference as ref
from rawgraph.ops.quantized import I4_NIBBLE, pack_int4, unpack_int4

FORMATS = ("e4m3", "i4")
# the GEMV cases of tests/ops/test_quantized_gpu.py: (rows, n, k), every variant of each format
CASES = [(1, 2048, 2048), (3, 2048, 8192), (8, 2048, 16384), (5, 8200, 1024), (16, 1000, 4096),
         (12, 2048, 16384), (2, 24, 256), (7, 136, 128), (4, 1024, 65536), (10, 1024, 65536),
         (12, 16400, 256)]  # the last: a wide weight, which 16-bit rows take to the skinny GEMM


def test_quantized_weights_take_the_gemv_through_16_rows_whatever_their_width():
    from rawgraph.ops.matmul import WIDE, keeps_row_max, path

    assert path(12, WIDE) == "skinny" and path(12, WIDE, quantized=True) == "gemv"
    assert path(16, 128256, quantized=True) == "gemv" and path(17, 2048, quantized=True) != "gemv"
    assert keeps_row_max(16, 128256, quantized=True) and not keeps_row_max(16, 128256)


def test_the_gpu_cases_reach_every_quantized_variant():
    for fmt in FORMATS:
        reached = {gemv.gemv_launch("float16", m, n, k, fmt)[0][1:] for m, n, k in CASES}
        assert reached == {v.key for v in gemv.QUANT_VARIANTS[fmt]}, fmt


class Dev:
    """A host array dressed as a device one (shape, dtype, flags, data.ptr): the records'
    checks without a GPU."""

    def __init__(self, a: np.ndarray):
        self.a, self.shape, self.dtype, self.flags = a, a.shape, a.dtype, a.flags
        self.ndim, self.nbytes = a.ndim, a.nbytes
        self.data = type("Ptr", (), {"ptr": a.ctypes.data})()


def test_an_fp8_weight_is_uint8_codes_with_a_float32_scale_a_row():
    codes, scale = np.zeros((4, 32), np.uint8), np.ones(4, np.float32)
    w = fp8_weight(codes, scale)
    assert w.shape == (4, 32) and w.codes is codes and w.scale is scale and w.fmt == "e4m3"
    assert w.args() == (codes, scale) and w.nbytes == 4 * 32 + 16
    with pytest.raises(ValueError, match=r"codes must be \(n, k\)"):
        fp8_weight(np.zeros(32, np.uint8), scale)
    with pytest.raises(ValueError, match="codes must be a contiguous uint8"):
        fp8_weight(np.zeros((4, 32), np.int8), scale)
    with pytest.raises(ValueError, match="k = 40 must be a multiple of 16"):
        fp8_weight(np.zeros((4, 40), np.uint8), scale)
    with pytest.raises(ValueError, match="scale must be a contiguous float32"):
        fp8_weight(codes, np.ones(5, np.float32))
    with pytest.raises(ValueError, match="scale must be a contiguous float32"):
        fp8_weight(codes, np.ones(4, np.float64))
    with pytest.raises(ValueError, match="codes must be a contiguous"):
        fp8_weight(np.zeros((4, 64), np.uint8)[:, ::2], scale)


def test_an_int4_weight_is_packed_values_with_a_scale_and_zero_a_group():
    packed = np.zeros((4, 64), np.uint8)  # k = 128
    scales, zeros = Dev(np.ones((4, 2), np.float16)), np.full((4, 2), 8, np.uint8)
    w = int4_weight(packed, scales, zeros, 64)
    assert w.shape == (4, 128) and w.fmt == "i4" and w.args() == (packed, scales, zeros, 64)
    assert w.nbytes == 4 * 64 + 4 * 2 * 2 + 4 * 2
    with pytest.raises(ValueError, match="group = 48: a multiple of 32 that divides k = 128"):
        int4_weight(packed, scales, zeros, 48)
    with pytest.raises(ValueError, match="group = 96"):
        int4_weight(packed, scales, zeros, 96)
    with pytest.raises(ValueError, match="scales has shape"):
        int4_weight(packed, Dev(np.ones((4, 4), np.float16)), zeros, 64)
    with pytest.raises(ValueError, match="zeros must be a contiguous uint8"):
        int4_weight(packed, scales, zeros.astype(np.int32), 64)
    with pytest.raises(ValueError, match="wide has shape"):
        int4_weight(packed, scales, zeros, 64, Dev(np.zeros((4, 64), np.float16)))


def test_int4_packing_puts_value_pairs_where_the_gemv_unpacks_them():
    # the kernel masks nibbles i and i + 4 of each word into a half2: values 2i and 2i + 1
    q = np.arange(16, dtype=np.uint8).reshape(1, 16) % 16
    words = pack_int4(q).view(np.uint32)[0]
    for w, base in zip(words, (0, 8)):
        for i in range(4):
            assert (w >> 4 * i) & 0xF == q[0, base + 2 * i]
            assert (w >> 4 * (i + 4)) & 0xF == q[0, base + 2 * i + 1]
    assert sorted(I4_NIBBLE) == list(range(8))
    rng = np.random.default_rng(0)
    q = rng.integers(0, 16, (5, 64)).astype(np.uint8)
    assert np.array_equal(unpack_int4(pack_int4(q)), q)
    with pytest.raises(ValueError, match="each 0-15"):
        pack_int4(np.full((1, 8), 16, np.uint8))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_int4_quantization_rounds_each_group_to_15_levels_with_zero_exact(dtype):
    rng = np.random.default_rng(1)
    w = round_to(rng.standard_normal((6, 256)).astype(np.float32), dtype)
    w[0, :128] = 0  # an empty group: scale 1, every value its zero point
    w[1, :128] = np.abs(w[1, :128])  # all positive: lo is 0
    q, s, z = ref.quantize_int4(w, 128, dtype)
    assert q.shape == w.shape and s.shape == z.shape == (6, 2) and q.max() <= 15
    assert s[0, 0] == 1 and (q[0, :128] == z[0, 0]).all() and z[1, 0] == 0
    assert np.array_equal(round_to(s, dtype), s)  # the scales are the dtype's values
    back = ref.dequantize_int4(q, s, z, 128, dtype)
    err = np.abs(back - w).reshape(6, 2, 128).max(-1)
    assert (err <= 0.5 * s + np.abs(w).reshape(6, 2, 128).max(-1) * 2**-7).all()
    assert (back[0, :128] == 0).all()


def test_the_references_are_the_linear_of_the_dequantized_weight():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 0x7F, (24, 48)).astype(np.uint8) | \
        (rng.integers(0, 2, (24, 48)) << 7).astype(np.uint8)
    scale = rng.uniform(0.1, 2, 24).astype(np.float32)
    x = rng.standard_normal((3, 48)).astype(np.float32)
    w = E4M3[codes].astype(np.float64) * scale[:, None]
    assert np.isfinite(w).all()
    np.testing.assert_array_equal(ref.linear_fp8(x, codes, scale, "float16"),
                                  ref.linear(x, w, "float16"))
    assert e4m3_decode(np.array([0x38, 0xB8], np.uint8)).tolist() == [1.0, -1.0]
    q = rng.integers(0, 16, (24, 64)).astype(np.uint8)
    s = round_to(rng.uniform(0.01, 0.1, (24, 2)).astype(np.float32), "bfloat16")
    z = rng.integers(0, 16, (24, 2)).astype(np.uint8)
    got = ref.dequantize_int4(q, s, z, 32, "bfloat16")
    want = (q.astype(np.float32) - np.repeat(z, 32, 1)) * np.repeat(s, 32, 1)
    assert np.array_equal(got, round_to(want, "bfloat16"))
    assert np.array_equal(to_storage(got, "bfloat16"), to_storage(want, "bfloat16"))
