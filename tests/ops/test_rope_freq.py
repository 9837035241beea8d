"""RoPE inverse frequencies, with and without LLaMA-3 scaling (CPU)."""

import math

import numpy as np
import pytest

from rawgraph.ops.rope import Llama3Scaling, inv_freq


def test_plain_frequencies():
    f = inv_freq(64, 500000.0)
    assert f.dtype == np.float32 and f.shape == (32,)
    np.testing.assert_allclose(f, 500000.0 ** (-np.arange(0, 64, 2) / 64), rtol=1e-6)


def test_llama3_scaling_bands():
    s = Llama3Scaling()
    plain, scaled = inv_freq(64, 500000.0), inv_freq(64, 500000.0, s)
    wavelen = 2 * math.pi / plain
    high = wavelen < s.original_max_position_embeddings / s.high_freq_factor
    low = wavelen > s.original_max_position_embeddings / s.low_freq_factor
    np.testing.assert_array_equal(scaled[high], plain[high])          # short waves: untouched
    np.testing.assert_allclose(scaled[low], plain[low] / s.factor, rtol=1e-6)  # long: / factor
    mid = ~high & ~low
    assert mid.any() and ((scaled[mid] < plain[mid]) & (scaled[mid] > plain[mid] / s.factor)).all()


def test_odd_head_dim():
    with pytest.raises(ValueError, match="even"):
        inv_freq(63)
