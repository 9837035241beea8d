"""Model's arguments are refused before anything touches the GPU."""

import pytest

from rawgraph.model.config import preset
from rawgraph.model.decoder import Model


@pytest.mark.parametrize("bad", [-1, 1.5, "256", True])
def test_runs_up_to_must_be_a_chunk_size(bad):
    with pytest.raises(ValueError, match="runs_up_to"):
        Model(preset("tiny"), None, runs_up_to=bad)


@pytest.mark.parametrize("bad", ["int3", "FP8", 8])
def test_quantize_names_a_known_format(bad):
    with pytest.raises(ValueError, match="quantize"):
        Model(preset("tiny"), None, quantize=bad)
