"""Engine options refused before anything is built, without a GPU."""

from types import SimpleNamespace

import pytest

from rawgraph.engine.engine import Engine


def test_a_batch_invariant_engine_refuses_mixed_iterations_before_building_anything():
    model = SimpleNamespace(batch_invariant=True, max_chunk=64)  # nothing else is touched
    with pytest.raises(ValueError, match="mixed=True with batch_invariant"):
        Engine(model, mixed=True)
    with pytest.raises(ValueError, match="mixed=True with batch_invariant"):
        Engine(SimpleNamespace(batch_invariant=False, max_chunk=64), mixed=True,
               batch_invariant=True)
