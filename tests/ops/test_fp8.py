"""FP8 weights without a GPU: the record's checks and the reference's math."""

import numpy as np
import pytest

from rawgraph.dtypes import E4M3, e4m3_decode
from rawgraph.ops import fp8_weight
from rawgraph.ops import reference as ref


def test_an_fp8_weight_is_uint8_codes_with_a_float32_scale_a_row():
    codes, scale = np.zeros((4, 32), np.uint8), np.ones(4, np.float32)
    w = fp8_weight(codes, scale)
    assert w.shape == (4, 32) and w.codes is codes and w.scale is scale
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


def test_the_fp8_reference_is_the_linear_of_the_dequantized_weight():
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
