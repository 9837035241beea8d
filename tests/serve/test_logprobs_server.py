"""Log-probabilities, echo and the sampling rules through the server on the CPU (the NumPy
reference decoder behind the engine, `rawgraph serve --reference`'s), checked against the
reference forward pass of the same weights: what lm-evaluation-harness's completions backend
and OpenAI's clients read."""

import math

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("tokenizers")

from rawgraph.model.reference import KVState, float_weights, forward  # noqa: E402
from rawgraph.ops.reference import apply_rules  # noqa: E402
from tests.serve.conftest import CFG, events  # noqa: E402

PROMPT = [5, 6, 7, 40, 41]


def _log_softmax(x):
    x = x.astype(np.float64)
    return x - (x.max() + np.log(np.exp(x - x.max()).sum()))


def _logits(tensors, ids):
    """Each position's next-token logits of `ids` (float32, the reference forward)."""
    return forward(CFG, float_weights(CFG, tensors), np.asarray(ids), KVState())


def _greedy(tensors, prompt, n, rule=None):
    """n greedy tokens, each step's logits through `rule(logits, out_so_far)` if given."""
    ids, out = list(prompt), []
    for _ in range(n):
        x = _logits(tensors, ids)[-1]
        y = x if rule is None else rule(x, out)
        out.append(int(np.argmax(y)))
        ids.append(out[-1])
    return out


def test_completion_logprobs_are_the_models_log_softmax(served, checkpoint):
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 3,
            "ignore_eos": True}
    r = httpx.post(f"{served.url}/v1/completions", json=body, timeout=30).json()
    c = r["choices"][0]
    ids, lp = c["token_ids"], c["logprobs"]
    assert ids == _greedy(checkpoint[1], PROMPT, 6)
    assert lp["tokens"] == [f"w{t}" for t in ids]
    every = _logits(checkpoint[1], PROMPT + ids)
    for i, t in enumerate(ids):
        want = _log_softmax(every[len(PROMPT) - 1 + i])
        assert math.isclose(lp["token_logprobs"][i], want[t], abs_tol=1e-4)
        top = np.argsort(-want, kind="stable")[:3]
        got = lp["top_logprobs"][i]
        assert [k for k in got][:3] == [f"w{j}" for j in top]  # larger first
        assert all(math.isclose(got[f"w{j}"], want[j], abs_tol=1e-4) for j in top)
    # offsets: each token's place in the text
    assert lp["text_offset"] == [sum(len(f"w{t}") for t in ids[:i]) for i in range(len(ids))]
    # streamed: the chunks' logprobs add up to the whole's
    with httpx.stream("POST", f"{served.url}/v1/completions",
                      json=body | {"stream": True}) as s:
        chunks = events(s.iter_lines())
    streamed = [x for ch in chunks if ch["choices"][0]["logprobs"]
                for x in ch["choices"][0]["logprobs"]["token_logprobs"]]
    assert streamed == lp["token_logprobs"]


def test_echo_with_max_tokens_0_scores_the_prompt_as_lm_eval_asks(served, checkpoint):
    r = httpx.post(f"{served.url}/v1/completions", json={
        "prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0},
        timeout=30).json()
    c = r["choices"][0]
    lp = c["logprobs"]
    assert c["text"] == " ".join(f"w{t}" for t in PROMPT) and c["finish_reason"] == "length"
    assert r["usage"]["completion_tokens"] == 0 and c["token_ids"] == []
    assert lp["tokens"] == [f"w{t}" for t in PROMPT]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    every = _logits(checkpoint[1], PROMPT)
    for i in range(1, len(PROMPT)):
        want = _log_softmax(every[i - 1])
        assert math.isclose(lp["token_logprobs"][i], want[PROMPT[i]], abs_tol=1e-4)
        best = int(np.argmax(want))  # lm-eval's is_greedy: the top entry against the token
        assert max(lp["top_logprobs"][i], key=lp["top_logprobs"][i].get) == f"w{best}"
    # a text prompt, several prompts in one request, and a stream give the same numbers
    text = " ".join(f"w{t}" for t in PROMPT)
    many = httpx.post(f"{served.url}/v1/completions", json={
        "prompt": [text, PROMPT[:3]], "max_tokens": 0, "echo": True, "logprobs": 1},
        timeout=30).json()
    # (the reference's float32 rounds a shorter prompt's rows in another order)
    got = [c["logprobs"]["token_logprobs"] for c in many["choices"]]
    assert np.allclose(got[0][1:], lp["token_logprobs"][1:], atol=1e-5)
    assert got[1][0] is None and np.allclose(got[1][1:], lp["token_logprobs"][1:3], atol=1e-5)
    with httpx.stream("POST", f"{served.url}/v1/completions", json={
            "prompt": PROMPT, "max_tokens": 2, "echo": True, "logprobs": 1,
            "temperature": 0, "stream": True}) as s:
        chunks = events(s.iter_lines())
    assert chunks[0]["choices"][0]["text"] == text
    assert chunks[0]["choices"][0]["logprobs"]["token_logprobs"] == lp["token_logprobs"]


def test_chat_logprobs_have_the_top_alternatives(served, checkpoint):
    r = httpx.post(f"{served.url}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "w5 w6"}], "max_tokens": 4, "temperature": 0,
        "logprobs": True, "top_logprobs": 2}, timeout=30).json()
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == r["usage"]["completion_tokens"] - \
        (r["choices"][0]["finish_reason"] == "stop")
    for e in content:
        assert len(e["top_logprobs"]) == 2 and e["bytes"] == list(e["token"].encode())
        assert e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"]
        assert e["logprob"] <= e["top_logprobs"][0]["logprob"] + 1e-6


def test_penalties_and_bias_change_tokens_as_the_rule_says(served, checkpoint):
    tensors = checkpoint[1]
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "presence_penalty": 1.5, "frequency_penalty": 0.7, "repetition_penalty": 1.3,
            "logit_bias": {"9": 3.0, "5": -2.0}}
    r = httpx.post(f"{served.url}/v1/completions", json=body, timeout=30).json()

    def rule(x, out):
        counts = np.bincount(out, minlength=CFG.vocab)[:CFG.vocab]
        in_prompt = np.zeros(CFG.vocab, bool)
        in_prompt[PROMPT] = True
        return apply_rules(x, None, counts=counts, in_prompt=in_prompt, presence=1.5,
                           frequency=0.7, repetition=1.3, bias={9: 3.0, 5: -2.0})
    want = _greedy(tensors, PROMPT, 8, rule)
    assert r["choices"][0]["token_ids"] == want
    assert want != _greedy(tensors, PROMPT, 8)  # the rules did change something


def test_min_tokens_holds_back_eos_and_a_bias_forces_a_token(served):
    base = {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "logit_bias": {"2": 100}}
    r = httpx.post(f"{served.url}/v1/completions", json=base, timeout=30).json()
    assert r["usage"]["completion_tokens"] == 1 and r["choices"][0]["finish_reason"] == "stop"
    r = httpx.post(f"{served.url}/v1/completions", json=base | {"min_tokens": 4},
                   timeout=30).json()
    # eos (2) banned for 4 tokens, then forced by its bias: the 5th ends it
    assert r["usage"]["completion_tokens"] == 5 and r["choices"][0]["finish_reason"] == "stop"
    assert 2 not in r["choices"][0]["token_ids"]
    r = httpx.post(f"{served.url}/v1/completions", json=base | {
        "min_tokens": 3, "logit_bias": {"2": -100, "17": 100}, "stop_token_ids": [17]},
        timeout=30).json()
    # stop ids are banned too: 17 is forced only once 3 tokens are out
    assert r["usage"]["completion_tokens"] == 4 and 17 not in r["choices"][0]["token_ids"]


@pytest.mark.parametrize(("body", "param"), [
    ({"logit_bias": {str(CFG.vocab): 1}}, "logit_bias"),
    ({"min_tokens": 1, "stop_token_ids": list(range(3, 70))}, "stop_token_ids")])
def test_rules_the_model_cannot_take_are_400_and_nothing_is_queued(served, body, param):
    r = httpx.post(f"{served.url}/v1/completions", json={"prompt": PROMPT} | body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert served.worker.load == (0, 0)
