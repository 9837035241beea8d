"""RoPE on the device (LLaMA-3 frequencies, GQA head counts) against the NumPy reference."""

import cupy
import numpy as np
import pytest

from rawgraph import ops
from rawgraph.ops import reference as ref
from tests.helpers import DTYPES, ULP, host, randn

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("q_heads", "kv_heads", "head_dim"), [(32, 8, 64), (4, 4, 128), (3, 1, 8)])
def test_rope(stream, rng, dtype, q_heads, kv_heads, head_dim):
    n = 11
    q, qh = randn(rng, (n, q_heads, head_dim), dtype)
    k, kh = randn(rng, (n, kv_heads, head_dim), dtype)
    pos = rng.integers(0, 131072, n).astype(np.int32)
    f = ops.inv_freq(head_dim, 500000.0, ops.Llama3Scaling())
    ops.rope(q, k, cupy.asarray(pos), cupy.asarray(f), stream=stream)
    stream.synchronize()
    for got, x in [(host(q, dtype), qh), (host(k, dtype), kh)]:
        np.testing.assert_allclose(got, ref.rope(x, pos, f, dtype), rtol=ULP[dtype],
                                   atol=ULP[dtype])
