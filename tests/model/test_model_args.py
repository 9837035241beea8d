"""Model's arguments are refused before anything touches the GPU."""

import pytest

from rawgraph.model.config import preset
from rawgraph.model.decoder import Model


@pytest.mark.parametrize("bad", [-1, 1.5, "256", True])
def test_runs_up_to_must_be_a_chunk_size(bad):
    with pytest.raises(ValueError, match="runs_up_to"):
        Model(preset("tiny"), None, runs_up_to=bad)


def test_keeping_no_16_bit_weights_needs_a_quantized_format():
    with pytest.raises(ValueError, match="keep_16bit = False: only with quantize"):
        Model(preset("tiny"), None, keep_16bit=False)


@pytest.mark.parametrize("bad", ["int3", "FP8", 8])
def test_quantize_names_a_known_format(bad):
    with pytest.raises(ValueError, match="quantize"):
        Model(preset("tiny"), None, quantize=bad)
