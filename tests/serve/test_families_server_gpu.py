"""`rawgraph serve --model DIR` on Qwen2, Qwen3 and Mistral checkpoints (tiny shapes, random
weights, written as Hugging Face tools lay them out): the served greedy tokens, whole and
streamed, are the tokens `Engine.generate` gives offline from the same checkpoint."""

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

pytestmark = pytest.mark.gpu
PROMPTS = [[5, 6, 7], list(range(10, 90)), [9]]
EXTRA = {"ignore_eos": True}  # Engine.generate knows no eos id
SHAPES = {"qwen2": {"family": "qwen2"}, "qwen3": {"family": "qwen3", "head_dim": 128},
          "mistral": {"family": "mistral", "sliding_window": 512}}


@pytest.mark.parametrize("family", list(SHAPES))
def test_served_tokens_are_the_offline_tokens(tmp_path, family):
    from rawgraph import Engine, Model, load_checkpoint, preset, random_weights
    from rawgraph.bench.serve import spawn_server
    from rawgraph.model.checkpoint import save

    cfg = preset("tiny").replace(**SHAPES[family])
    save(tmp_path / family, cfg, random_weights(cfg, 3))
    model = Model.from_checkpoint(load_checkpoint(tmp_path / family), max_batch=4,
                                  max_context=512, max_chunk=256, max_chunk_seqs=4)
    eng = Engine(model, progress=False)
    want = [eng.generate([p], max_new_tokens=16)[0] for p in PROMPTS]
    eng.close()
    model.close()

    proc, url = spawn_server(["--model", str(tmp_path / family), "--max-batch", "4",
                              "--max-context", "512", "--chunk", "256"], timeout_s=120)
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
        name = client.models.list().data[0].id
        for p, w in zip(PROMPTS, want):
            r = client.completions.create(model=name, prompt=p, max_tokens=16, temperature=0,
                                          extra_body=EXTRA)
            assert r.choices[0].token_ids == w, (family, p)
            chunks = client.completions.create(model=name, prompt=p, max_tokens=16,
                                               temperature=0, stream=True,
                                               extra_body=EXTRA)
            assert [t for c in chunks for t in c.choices[0].token_ids] == w, (family, p)
    finally:
        proc.terminate()
        assert proc.wait(60) == 0
