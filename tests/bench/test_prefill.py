"""bench prefill's measuring loops on the NumPy decoder (the GPU runs the same code)."""


def test_time_to_first_token_and_beside_decode_leave_the_engine_empty(monkeypatch):
    from rawgraph.bench import prefill
    from rawgraph.engine.reference import reference_engine
    from rawgraph.model.config import preset
    from rawgraph.model.weights import random_weights

    monkeypatch.setattr(prefill, "BESIDE", 2)
    monkeypatch.setattr(prefill, "BESIDE_CTX", 8)
    monkeypatch.setattr(prefill, "REPS", 1)
    cfg = preset("tiny")
    engine = reference_engine(cfg, random_weights(cfg, 0), max_batch=3, max_context=1100,
                              max_chunk=32)
    assert prefill._ttft_ms(engine, 40) > 0
    alone, mixed = prefill._beside(engine, 70)
    assert alone > 0 and mixed > 0
    free = engine.model.kv.tables.alloc
    assert engine.scheduler.idle and free.num_free == free.num_blocks


def test_prompts_are_varied_ids_the_same_every_run():
    import pytest

    from rawgraph.bench.shapes import prompt

    p = prompt(2048, 128256)
    assert p == prompt(2048, 128256) and len(p) == 2048
    assert all(1 <= t < 128256 for t in p)
    assert len(set(p)) > 2000  # not one id repeated: rows of x alike change GEMM power
    assert prompt(2, 2) == [1, 1]
    for tokens, vocab in ((0, 100), (5, 1)):
        with pytest.raises(ValueError, match="prompt of"):
            prompt(tokens, vocab)
