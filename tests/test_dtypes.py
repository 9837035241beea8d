"""bf16 bit conversions on the host: exact round-to-nearest-even."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from rawgraph.dtypes import from_bf16_bits, round_to, to_bf16_bits


def test_known_values():
    x = np.array([1.0, -2.0, 1.00390625, 1.01171875, np.inf, 3.0e38], np.float32)
    # 1 + 2^-8 is a tie -> even (1.0); 1 + 3*2^-8 is a tie -> even (1 + 2^-6)
    assert list(from_bf16_bits(to_bf16_bits(x))) == [1.0, -2.0, 1.0, 1.015625, np.inf,
                                                     from_bf16_bits(np.uint16(0x7F62))]
    assert np.isnan(from_bf16_bits(to_bf16_bits(np.array([np.nan], np.float32))))[0]


@given(st.floats(-(2.0**99), 2.0**99, width=32))
def test_rounding_is_nearest(v):
    x = np.array([v], np.float32)
    r = from_bf16_bits(to_bf16_bits(x))[0]
    bits = int(to_bf16_bits(x)[0])
    neighbours = from_bf16_bits(np.array([(bits - 1) & 0xFFFF, (bits + 1) & 0xFFFF], np.uint16))
    assert all(abs(float(r) - v) <= abs(float(n) - v) for n in neighbours if np.isfinite(n))
    if abs(v) < 65504:
        assert round_to(x, "float16")[0] == np.float32(np.float16(v))
