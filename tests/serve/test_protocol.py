"""OpenAI request bodies checked field by field (CPU): what is honoured, what is refused by
name, and the shapes of responses and chunks."""

import pytest

from rawgraph.serve import protocol
from rawgraph.serve.protocol import APIError, parse


def _refused(body, chat=False, status=400):
    with pytest.raises(APIError) as e:
        parse(body, chat, "m")
    assert e.value.status == status
    return e.value


def test_a_completion_body_is_read_with_openai_defaults():
    g = parse({"model": "m", "prompt": "hello"}, False, "m")
    assert (g.prompts, g.n, g.max_tokens, g.temperature, g.top_p, g.top_k, g.seed) == \
        (["hello"], 1, 16, 1.0, 1.0, 0, None)
    g = parse({"prompt": [[1, 2, 3]], "max_tokens": 5, "temperature": 0, "top_k": -1,
               "seed": 7, "stop": ["\n", 9], "stop_token_ids": [4], "stream": True,
               "stream_options": {"include_usage": True}}, False, "m")
    assert g.prompts == [[1, 2, 3]] and g.max_tokens == 5 and g.temperature == 0.0
    assert g.top_k == 0 and g.seed == 7 and g.stop == ["\n"] and g.stop_ids == [9, 4]
    assert g.stream and g.include_usage


def test_a_chat_body_takes_text_parts_and_either_token_limit():
    g = parse({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                          {"type": "text", "text": "b"}]}],
               "max_completion_tokens": 3}, True, "m")
    assert g.messages == [{"role": "user", "content": "ab"}] and g.max_tokens == 3
    assert parse({"messages": [{"role": "user", "content": "x"}]}, True, "m").max_tokens is None


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "x", "n": 0}, "n"), ({"prompt": "x", "n": 65}, "n"),
    ({"prompt": ["a"] * 9, "n": 8}, "n"), ({"prompt": "x", "n": 1.5}, "n"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"), ({"prompt": "x", "logprobs": -1}, "logprobs"),
    ({"prompt": "x", "logprobs": True}, "logprobs"), ({"prompt": "x", "echo": 1}, "echo"),
    ({"prompt": "x", "best_of": 3}, "best_of"),
    ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": -2.01}, "frequency_penalty"),
    ({"prompt": "x", "frequency_penalty": "high"}, "frequency_penalty"),
    ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "x", "repetition_penalty": 2.5}, "repetition_penalty"),
    ({"prompt": "x", "logit_bias": {"a": 5}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"-1": 5}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"1": 101}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"1": True}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": [1, 2]}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
    ({"prompt": "x", "min_tokens": -1}, "min_tokens"),
    ({"prompt": "x", "min_tokens": 20, "max_tokens": 10}, "min_tokens"),
    ({"prompt": "x", "max_tokens": 0, "echo": False}, "max_tokens"),
    ({"prompt": "x", "suffix": "y"}, "suffix"), ({"prompt": "x", "bogus": 1}, "bogus"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 2.5}, "max_tokens"),
    ({"prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"prompt": "x", "temperature": 3}, "temperature"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"), ({"prompt": "x", "top_k": -2}, "top_k"),
    ({"prompt": "x", "seed": -1}, "seed"), ({"prompt": "x", "seed": 2**64}, "seed"),
    ({"prompt": "x", "stop": [""]}, "stop"), ({"prompt": "x", "stop": 5}, "stop"),
    ({"prompt": "x", "stop": ["a"] * 17}, "stop"),
    ({"prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": ""}, "prompt"), ({"prompt": []}, "prompt"), ({"prompt": [1.5]}, "prompt"),
    ({"prompt": [True]}, "prompt"), ({"prompt": [1, 2, True]}, "prompt"),
    ({"prompt": [1, 2, -1]}, "prompt"), ({"prompt": ["a", ""]}, "prompt[1]"),
    ({"prompt": ["a", [1, -2]]}, "prompt[1]"), ({"prompt": ["a", 5]}, "prompt"), ({}, "prompt"),
    ({"prompt": {"text": "x"}}, "prompt")])
def test_bad_completion_fields_are_refused_by_name(body, param):
    e = _refused(body)
    assert e.param == param and e.message.startswith(param + ":")
    assert e.body()["error"]["param"] == param and e.body()["error"]["type"]


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": []}, "messages"), ({"messages": "hi"}, "messages"),
    ({"messages": [{"content": "x"}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     "tools"),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json"}},
     "response_format"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3,
      "max_completion_tokens": 3}, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "prompt": "x"}, "prompt"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "narrator", "content": "y"}]},
     "messages[1].role"),
    ({"messages": [{"role": "developer", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "x"}], "ignore_eos": 1}, "ignore_eos"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": 1}, "logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "echo": True}, "echo")])
def test_bad_chat_fields_are_refused_by_name(body, param):
    assert _refused(body, chat=True).param == param


def test_logprobs_echo_and_rules_are_parsed():
    g = parse({"prompt": [1, 2], "logprobs": 5, "echo": True, "max_tokens": 0,
               "presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.2,
               "logit_bias": {"7": -100, " 9": 2.5}, "min_tokens": 0}, False, "m")
    assert (g.logprobs, g.echo, g.max_tokens) == (5, True, 0)
    assert (g.presence_penalty, g.frequency_penalty, g.repetition_penalty) == (0.5, -1, 1.2)
    assert g.logit_bias == {7: -100.0, 9: 2.5}
    c = parse({"messages": [{"role": "user", "content": "x"}], "logprobs": True,
               "top_logprobs": 20}, True, "m")
    assert c.logprobs == 20
    c = parse({"messages": [{"role": "user", "content": "x"}], "logprobs": True}, True, "m")
    assert c.logprobs == 0
    assert parse({"prompt": "x"}, False, "m").logprobs is None


def test_logprob_objects_have_openais_shapes():
    from rawgraph.engine.request import Logprob
    from rawgraph.serve import logprobs

    piece = {1: "a", 2: "bc", 3: "d"}.get
    lp = logprobs.completion([1, 2], [None, Logprob(2, -0.5, ((3, -0.25), (2, -0.5)))], piece,
                             10)
    assert lp == {"tokens": ["a", "bc"], "token_logprobs": [None, -0.5],
                  "top_logprobs": [None, {"d": -0.25, "bc": -0.5}], "text_offset": [10, 11]}
    # the token itself is among the alternatives even when not in the top k (vLLM's shape)
    lp = logprobs.completion([1], [Logprob(1, float("-inf"), ((3, -0.1),))], piece, 0)
    assert lp["top_logprobs"] == [{"d": -0.1, "a": -9999.0}]
    assert lp["token_logprobs"] == [-9999.0]  # JSON has no infinity
    ch = logprobs.chat([2], [Logprob(2, -0.5, ((3, -0.25),))], piece)
    assert ch == {"content": [{"token": "bc", "logprob": -0.5, "bytes": [98, 99],
                               "top_logprobs": [{"token": "d", "logprob": -0.25,
                                                 "bytes": [100]}]}]}


def test_another_model_is_404_and_a_non_object_is_400():
    assert _refused({"model": "other", "prompt": "x"}, status=404).param == "model"
    assert _refused([1, 2]).param is None


def test_response_and_chunk_shapes():
    g = parse({"prompt": [1]}, False, "m")
    r = protocol.response(g, "cmpl-1", "m", [protocol.choice(g, 0, "hi", [5, 6], "stop"),
                                             protocol.choice(g, 1, "yo", [7], "length")], 1, 3)
    assert r["object"] == "text_completion" and r["choices"][0]["text"] == "hi"
    assert r["choices"][0]["token_ids"] == [5, 6] and r["usage"]["total_tokens"] == 4
    assert [c["index"] for c in r["choices"]] == [0, 1]
    got = protocol.stream_chunk(g, "id", "m", 0, "a", [3], None, index=5)
    assert got["choices"][0]["index"] == 5
    c = parse({"messages": [{"role": "user", "content": "x"}], "stream": True}, True, "m")
    first = protocol.stream_chunk(c, "id", "m", 0, None, [], None, role=True)
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    last = protocol.stream_chunk(c, "id", "m", 0, None, [], "length")
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "length"
    assert protocol.usage_chunk(c, "id", "m", 0, 4, 5)["choices"] == []
    assert protocol.new_id(True).startswith("chatcmpl-")


@pytest.mark.parametrize("chat", [False, True])
def test_a_streamed_chunk_line_is_the_chunk_as_json(chat):
    import json

    body = {"messages": [{"role": "user", "content": "x"}]} if chat else {"prompt": [1]}
    g = parse({**body, "model": "m", "stream": True}, chat, "m")
    model = "m\ue000[4611686018427387921]"  # a name holding the marks the line is cut at
    line = protocol.chunk_line(g, "cmpl-7", model, 1700000000)
    for text, ids in [("", [5]), ("h\u00e9llo \"q\" \\ \n\U0001f680", [1, 2, 3]), ("\ue000", []),
                      ("[2]", [2])]:
        want = protocol.stream_chunk(g, "cmpl-7", model, 1700000000, text, ids, None)
        assert line(text, ids) == f"data: {json.dumps(want, ensure_ascii=False)}\n\n"


def test_the_models_sampling_defaults_fill_what_a_request_leaves_out():
    # generation_config.json's temperature, top_p and top_k (ModelInfo.sampling)
    model = {"temperature": 0.6, "top_p": 0.9, "top_k": 20}
    g = parse({"prompt": "x"}, False, "m", model)
    assert (g.temperature, g.top_p, g.top_k) == (0.6, 0.9, 20)
    g = parse({"prompt": "x", "temperature": 0, "top_p": 1, "top_k": -1}, False, "m", model)
    assert (g.temperature, g.top_p, g.top_k) == (0.0, 1.0, 0)  # the request's own win
    g = parse({"prompt": "x", "top_k": 0}, False, "m", model)
    assert g.top_k == 0
    assert parse({"prompt": "x"}, False, "m", {"top_p": 0.5}).temperature == 1.0


def test_ignore_eos_and_the_roles_templates_know():
    assert not parse({"prompt": "x"}, False, "m").ignore_eos
    assert parse({"prompt": "x", "ignore_eos": True}, False, "m").ignore_eos
    msgs = [{"role": r, "content": "c"} for r in protocol.ROLES]
    assert [m["role"] for m in parse({"messages": msgs}, True, "m").messages] == \
        list(protocol.ROLES)


def test_a_batch_of_prompts_and_n_choices_each():
    g = parse({"prompt": ["a b", [3, 4], "c"], "n": 2}, False, "m")
    assert g.prompts == ["a b", [3, 4], "c"] and g.n == 2
    assert parse({"prompt": [[5, 6]]}, False, "m").prompts == [[5, 6]]  # a batch of one
    g = parse({"messages": [{"role": "user", "content": "x"}], "n": 3}, True, "m")
    assert g.n == 3 and g.prompts == []
