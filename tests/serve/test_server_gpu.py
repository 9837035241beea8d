"""`rawgraph serve` on the GPU, as a subprocess driven by the official `openai` client and
httpx: whole and streamed completions, concurrent clients, and the greedy tokens
`Engine.generate` gives for the same requests."""

import threading

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

pytestmark = pytest.mark.gpu
ARGS = ["--preset", "tiny", "--max-batch", "8", "--max-context", "512", "--chunk", "256"]
PROMPTS = [[5, 6, 7], list(range(10, 90)), [300] * 7, [9], list(range(100, 400))]


@pytest.fixture(scope="module")
def server():
    from rawgraph.bench.serve import spawn_server

    proc, url = spawn_server(ARGS, timeout_s=120)
    yield url
    proc.terminate()
    assert proc.wait(60) == 0


@pytest.fixture(scope="module")
def want():
    from rawgraph import Engine, Model, preset, random_weights

    cfg = preset("tiny")
    model = Model(cfg, random_weights(cfg, 0), max_batch=8, max_context=512, max_chunk=256,
                  max_chunk_seqs=8)
    eng = Engine(model, progress=False)
    out = [eng.generate([p], max_new_tokens=24)[0] for p in PROMPTS]  # one at a time
    eng.close()
    model.close()
    return out


def test_openai_client_whole_and_streamed(server, want):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none")
    assert [m.id for m in client.models.list()] == ["tiny"]
    for p, w in zip(PROMPTS, want):
        r = client.completions.create(model="tiny", prompt=p, max_tokens=24, temperature=0)
        assert r.choices[0].token_ids == w and r.usage.completion_tokens == 24
        assert r.choices[0].finish_reason == "length"
        chunks = list(client.completions.create(model="tiny", prompt=p, max_tokens=24,
                                                temperature=0, stream=True))
        assert [t for c in chunks for t in c.choices[0].token_ids] == w


def test_concurrent_clients_get_their_own_tokens(server, want):
    got: list[tuple[int, list[int]]] = []

    def ask(i):
        r = httpx.post(f"{server}/v1/completions", json={
            "prompt": PROMPTS[i], "max_tokens": 24, "temperature": 0}, timeout=120)
        got.append((i, r.json()["choices"][0]["token_ids"]))
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(PROMPTS))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 3 * len(PROMPTS)
    for i, ids in got:  # three clients per prompt, all at once
        assert ids == want[i], i
    text = httpx.get(f"{server}/metrics").text
    assert 'rawgraph_iterations_total{mode="graph"}' in text


def test_openai_client_batch_of_prompts_and_n(server, want):
    # a list of prompts, n = 2 each, greedy: choice 2i and 2i + 1 are prompt i's tokens
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none")
    r = client.completions.create(model="tiny", prompt=PROMPTS, n=2, max_tokens=24,
                                  temperature=0)
    assert sorted(c.index for c in r.choices) == list(range(2 * len(PROMPTS)))
    for c in r.choices:
        assert c.token_ids == want[c.index // 2], c.index
    assert r.usage.prompt_tokens == sum(map(len, PROMPTS))
    chunks = list(client.completions.create(model="tiny", prompt=PROMPTS[:2], n=2,
                                            max_tokens=24, temperature=0, stream=True))
    for i in range(4):
        ids = [t for c in chunks for ch in c.choices if ch.index == i for t in ch.token_ids]
        assert ids == want[i // 2], i


def test_openai_client_logprobs_echo_and_rules(server, want):
    from rawgraph import Engine, Model, Request, SamplingParams, preset, random_weights

    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none")
    p = PROMPTS[1]
    r = client.completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0,
                                  logprobs=5, echo=True)
    lp = r.choices[0].logprobs
    assert r.choices[0].token_ids == want[1][:8]
    assert len(lp.token_logprobs) == len(p) + 8 and lp.token_logprobs[0] is None
    assert all(len(t) >= 5 for t in lp.top_logprobs[1:])
    # the engine's own numbers for the same request, on the same GPU
    cfg = preset("tiny")
    model = Model(cfg, random_weights(cfg, 0), max_batch=8, max_context=512, max_chunk=256,
                  max_chunk_seqs=8)
    eng = Engine(model, progress=False)
    (q,) = eng.run([Request(p, 8, SamplingParams(logprobs=5, prompt_logprobs=5))])
    eng.close()
    model.close()
    assert lp.token_logprobs[1:] == pytest.approx(
        [e.logprob for e in q.prompt_logprobs[1:]] + [e.logprob for e in q.logprobs],
        abs=1e-6)
    # penalties and a bias change the tokens, a -100 bias bans one
    banned = want[1][0]
    r = client.completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0,
                                  logit_bias={str(banned): -100}, frequency_penalty=1.5)
    assert banned not in r.choices[0].token_ids
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.completions.create(model="tiny", prompt=p, max_tokens=2, logprobs=21)
