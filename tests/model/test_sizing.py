"""The default batch of `rawgraph serve`: what the GPU holds beside the weights at the
context asked for (no GPU needed: the device's sizes are arguments)."""

import pytest

from rawgraph.model import sizing
from rawgraph.model.config import preset

GIB = 2**30
H200 = 140 * GIB


def test_a_small_model_at_a_short_context_takes_the_largest_batch():
    assert sizing.max_batch(preset("llama-1b"), 2048, H200, H200 - GIB) == 256


def test_the_batch_shrinks_with_the_context_and_what_is_used():
    cfg = preset("llama-8b")
    per = sizing.sequence_bytes(cfg, 131072)
    assert per > 16 * GIB  # 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes a token
    n = sizing.max_batch(cfg, 131072, H200, H200 - GIB)
    budget = 0.9 * H200 - GIB - sizing.weight_bytes(cfg) - sizing.RESERVE
    assert n == int(budget // per) or n == int(budget // per) - int(budget // per) % 8
    assert 1 <= n < 8
    half = sizing.max_batch(cfg, 131072, H200, H200 // 2)  # another process holds half
    assert half < n


def test_a_model_that_does_not_fit_is_refused_with_the_sizes():
    with pytest.raises(ValueError, match="not one sequence of 131072 tokens fits"):
        sizing.max_batch(preset("llama-8b"), 131072, 24 * GIB, 24 * GIB)


def test_batches_are_multiples_of_8_from_8_up():
    cfg = preset("llama-8b")
    for ctx in (4096, 8192, 16384, 32768, 65536):
        n = sizing.max_batch(cfg, ctx, H200, H200)
        assert n < 8 or n % 8 == 0


def test_a_quantizing_model_counts_its_copies_beside_the_16_bit_weights():
    # llama-8b: every projection and the LM head (k 4096 or 14336, multiples of 16 and 128)
    cfg = preset("llama-8b")
    plain = sizing.weight_bytes(cfg)
    params = cfg.layers * cfg._layer_params() + cfg.vocab * cfg.hidden  # the copies' values
    rows = cfg.layers * (cfg.q_size + 2 * cfg.kv_size + cfg.hidden + 2 * cfg.intermediate
                         + cfg.hidden) + cfg.vocab
    fp8 = sizing.weight_bytes(cfg, "fp8") - plain
    int4 = sizing.weight_bytes(cfg, "int4") - plain
    norms = cfg.layers * 2 * cfg.hidden  # the layers' norm weights are not projections
    assert fp8 == params - norms + 4 * rows
    assert int4 == (params - norms) // 2 + 3 * (params - norms) // 128
    assert sizing.max_batch(cfg, 8192, H200, H200, quantize="int4") <= \
        sizing.max_batch(cfg, 8192, H200, H200)


def test_a_70b_model_fits_one_h200_quantized_alone():
    # 141 GB of 16-bit weights do not; FP8 (70 GB) and 4-bit ones do, with a batch of 8 at 8k
    cfg = preset("llama-70b")
    with pytest.raises(ValueError, match="not one sequence"):
        sizing.max_batch(cfg, 8192, H200, H200)
    fp8 = sizing.weight_bytes(cfg, "fp8", keep_16bit=False)
    assert 70 * GIB < fp8 < 80 * GIB  # + the 16-bit embedding and LM head and 3 scratches
    assert sizing.weight_bytes(cfg, "int4", keep_16bit=False) < 0.6 * fp8
    assert sizing.max_batch(cfg, 8192, H200, H200, quantize="fp8", keep_16bit=False) >= 8
