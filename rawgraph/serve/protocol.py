"""The OpenAI HTTP protocol: request bodies checked field by field into a `Generation`, and
the response, chunk and error objects.

Every field OpenAI defines is either honoured or refused by name (`best_of`, `suffix`,
tools, ...): a client never gets a silent approximation. Extensions, as vLLM spells them:
`top_k`, `repetition_penalty`, `min_tokens`, `stop_token_ids`, `ignore_eos`, prompts as token
ids, and `token_ids` in each completion choice. Sampling fields a request leaves out take the
model's defaults (its generation_config.json), then OpenAI's.
"""

from __future__ import annotations

import json
import numbers
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rawgraph.ops.logits import MAX_LOGIT_BIAS

MAX_STOP = 16  # stop strings per request
MAX_CHOICES = 64  # choices per request: prompts x n
TOP_LOGPROBS = 20  # top alternatives a token's log-probability may come with


class APIError(Exception):
    """A refusal in OpenAI's error format: HTTP `status`, the offending `param`."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI's clients parse."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": None}}


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param)


@dataclass
class Generation:
    """One request, checked: the prompt (text or token ids; chat messages), how to sample,
    when to stop, how to answer."""

    chat: bool
    prompts: list[str | list[int]] = field(default_factory=list)  # completions: one or more
    messages: list[dict[str, str]] | None = None  # chat
    n: int = 1                                 # choices per prompt
    max_tokens: int | None = None              # None: up to the context
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False                   # the model's eos ids do not stop it
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None                # top alternatives per token; None: none
    echo: bool = False                         # completions: the prompt before the output
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    min_tokens: int = 0


# fields accepted, and those refused unless they hold their neutral value
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
           "stop_token_ids", "ignore_eos", "stream", "stream_options", "user", "n", "logprobs",
           "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
           "min_tokens", "best_of"}
_COMPLETION = _COMMON | {"prompt", "echo", "suffix"}
_CHAT = _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                   "response_format", "parallel_tool_calls", "stream_options"}
_NEUTRAL = {"best_of": (1,), "suffix": (None, ""), "tools": (None,),
            "tool_choice": (None, "none"), "parallel_tool_calls": (None,)}
_WHY = {"best_of": "no server-side choice among samples",
        "suffix": "no suffix (insertion) mode", "tools": "tool calls are not supported",
        "tool_choice": "tool calls are not supported",
        "parallel_tool_calls": "tool calls are not supported"}


def _int(body: dict, name: str, low: int, high: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise _bad(name, f"must be an integer, got {type(v).__name__} {v!r}")
    if v < low or (high is not None and v > high):
        raise _bad(name, f"{v} must be in [{low}, {high}]" if high is not None
                   else f"{v} must be >= {low}")
    return int(v)


def _float(body: dict, name: str, low: float, high: float, default: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or v != v:
        raise _bad(name, f"must be a number, got {type(v).__name__} {v!r}")
    if not low <= v <= high:
        raise _bad(name, f"{v} must be in [{low}, {high}]")
    return float(v)


def _token_ids(v: Any, name: str) -> list[int]:
    # JSON's ids are plain ints: one C-level pass over their types and the minimum (an ABC
    # check an id took ~0.5 us, 1 ms a 2,048-token prompt on the loop every stream shares);
    # a copy, as below: the request's list is its own
    if isinstance(v, list) and v and set(map(type, v)) <= {int} and min(v) >= 0:
        return list(v)
    if not v or any(isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0
                    for t in v):
        raise _bad(name, "token ids must be a non-empty list of integers >= 0")
    return [int(t) for t in v]


def _stops(body: dict) -> tuple[list[str], list[int]]:
    v = body.get("stop")
    items = [] if v is None else [v] if isinstance(v, str) else v
    if not isinstance(items, list):
        raise _bad("stop", f"a string or a list of strings (or token ids), got "
                   f"{type(v).__name__}")
    strings = [s for s in items if isinstance(s, str)]
    ids = [s for s in items if not isinstance(s, str)]
    if any(s == "" for s in strings):
        raise _bad("stop", "stop strings must not be empty")
    ids = _token_ids(ids, "stop") if ids else []
    extra = body.get("stop_token_ids")
    if extra is not None:
        if not isinstance(extra, list):
            raise _bad("stop_token_ids", f"a list of token ids, got {type(extra).__name__}")
        ids += _token_ids(extra, "stop_token_ids") if extra else []
    if len(strings) > MAX_STOP:
        raise _bad("stop", f"at most {MAX_STOP} stop strings, got {len(strings)}")
    return strings, ids


ROLES = ("system", "user", "assistant", "tool")  # what chat templates are written for


def _messages(v: Any) -> list[dict[str, str]]:
    if not isinstance(v, list) or not v:
        raise _bad("messages", "a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(v):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _bad(where, "an object with a string role")
        if m["role"] not in ROLES:
            raise _bad(f"{where}.role", f"{m['role']!r} is not one of {', '.join(ROLES)}")
        if set(m) - {"role", "content", "name"}:
            raise _bad(where, f"unsupported fields {sorted(set(m) - {'role', 'content', 'name'})}")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text"
                       and isinstance(p.get("text"), str) for p in content):
                raise _bad(f"{where}.content", "only text parts are supported")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise _bad(f"{where}.content", "a string (or a list of text parts)")
        out.append({"role": m["role"], "content": content}
                   | ({"name": m["name"]} if isinstance(m.get("name"), str) else {}))
    return out


def parse(body: Any, chat: bool, model_id: str,
          defaults: dict[str, Any] | None = None) -> Generation:
    """A request body (parsed JSON) as a `Generation`; APIError naming the field if any is
    wrong, unknown or unsupported. `defaults`: the model's temperature, top_p, top_k and
    repetition_penalty for a request that leaves them out (generation_config.json)."""
    defaults = defaults or {}
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    known = _CHAT if chat else _COMPLETION
    unknown = sorted(set(body) - known)
    if unknown:
        raise _bad(unknown[0], f"unknown field{'s' if len(unknown) > 1 else ''} "
                   f"{', '.join(unknown)}")
    model = body.get("model")
    if model is not None and model != model_id:
        raise APIError(404, f"model {model!r} is not served here (this server: {model_id!r})",
                       "model", "not_found_error")
    for name, ok in _NEUTRAL.items():
        if name in body and body[name] not in ok:
            raise _bad(name, f"{body[name]!r} is not supported ({_WHY[name]})")
    if chat:
        fmt = body.get("response_format")
        if fmt is not None and fmt != {"type": "text"}:
            raise _bad("response_format", "only {\"type\": \"text\"} is supported")
    g = Generation(chat=chat)
    _logprobs(body, chat, g)
    if chat:
        g.messages = _messages(body.get("messages"))
        if "max_tokens" in body and "max_completion_tokens" in body:
            raise _bad("max_completion_tokens", "give max_tokens or max_completion_tokens")
        g.max_tokens = _int(body, "max_completion_tokens", 1) or _int(body, "max_tokens", 1)
    else:
        g.prompts = _prompts(body.get("prompt"))
        # 0 with echo: the prompt alone, scored (how evaluation harnesses ask)
        g.max_tokens = _int(body, "max_tokens", 0 if g.echo else 1)
        g.max_tokens = 16 if g.max_tokens is None else g.max_tokens  # OpenAI's default
    g.n = _int(body, "n", 1, MAX_CHOICES) or 1
    if max(1, len(g.prompts)) * g.n > MAX_CHOICES:
        raise _bad("n", f"{len(g.prompts)} prompts x n = {g.n} choices: at most "
                   f"{MAX_CHOICES} a request")
    g.temperature = _float(body, "temperature", 0.0, 2.0, defaults.get("temperature", 1.0))
    g.top_p = _float(body, "top_p", 1e-9, 1.0, defaults.get("top_p", 1.0))
    top_k = _int(body, "top_k", -1, 2**31 - 1)
    top_k = defaults.get("top_k", 0) if top_k is None else top_k
    g.top_k = 0 if top_k == -1 else top_k  # -1 or 0: off (vLLM spells -1)
    ignore = body.get("ignore_eos", False)
    if not isinstance(ignore, bool):
        raise _bad("ignore_eos", f"must be true or false, got {ignore!r}")
    g.ignore_eos = ignore
    g.seed = _int(body, "seed", 0, 2**64 - 1)
    g.stop, g.stop_ids = _stops(body)
    _rules(body, g, defaults)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream", f"must be true or false, got {stream!r}")
    g.stream = stream
    opts = body.get("stream_options")
    if opts is not None:
        if not stream:
            raise _bad("stream_options", "only with stream: true")
        if not isinstance(opts, dict) or set(opts) - {"include_usage"} \
                or not isinstance(opts.get("include_usage", False), bool):
            raise _bad("stream_options", "{\"include_usage\": true|false}")
        g.include_usage = opts.get("include_usage", False)
    return g


def _logprobs(body: dict, chat: bool, g: Generation) -> None:
    """logprobs (and chat's top_logprobs) and echo into `g`."""
    v = body.get("logprobs")
    if chat:
        if v is not None and not isinstance(v, bool):
            raise _bad("logprobs", f"must be true or false, got {v!r}")
        top = _int(body, "top_logprobs", 0, TOP_LOGPROBS)
        if top is not None and not v:
            raise _bad("top_logprobs", "needs logprobs: true")
        g.logprobs = (top or 0) if v else None
    else:
        if isinstance(v, bool):
            raise _bad("logprobs", f"the number of top alternatives (0 to {TOP_LOGPROBS}), "
                       f"got {v!r}")
        g.logprobs = _int(body, "logprobs", 0, TOP_LOGPROBS)
        echo = body.get("echo", False)
        if not isinstance(echo, bool):
            raise _bad("echo", f"must be true or false, got {echo!r}")
        g.echo = echo


def _rules(body: dict, g: Generation, defaults: dict[str, Any]) -> None:
    """The penalties (repetition_penalty's default the model's), logit_bias and min_tokens
    into `g`."""
    g.presence_penalty = _float(body, "presence_penalty", -2.0, 2.0, 0.0)
    g.frequency_penalty = _float(body, "frequency_penalty", -2.0, 2.0, 0.0)
    g.repetition_penalty = _float(body, "repetition_penalty", 1e-9, 2.0,
                                  defaults.get("repetition_penalty", 1.0))
    g.min_tokens = _int(body, "min_tokens", 0) or 0
    if g.max_tokens is not None and g.min_tokens > g.max_tokens:
        raise _bad("min_tokens", f"{g.min_tokens} exceeds max_tokens = {g.max_tokens}")
    bias = body.get("logit_bias")
    if bias is None:
        return
    if not isinstance(bias, dict):
        raise _bad("logit_bias", f"an object of token id -> bias, got {type(bias).__name__}")
    if len(bias) > MAX_LOGIT_BIAS:
        raise _bad("logit_bias", f"{len(bias)} entries, at most {MAX_LOGIT_BIAS}")
    for k, b in bias.items():
        key = k.strip()
        if not key.isdigit() or not key.isascii():
            raise _bad("logit_bias", f"key {k!r} is not a token id")
        if isinstance(b, bool) or not isinstance(b, numbers.Real) or not -100 <= b <= 100:
            raise _bad("logit_bias", f"[{k}] = {b!r}: a bias in [-100, 100]")
        if int(key) in g.logit_bias:
            raise _bad("logit_bias", f"token id {int(key)} given twice")
        g.logit_bias[int(key)] = float(b)


def _prompts(v: Any) -> list[str | list[int]]:
    """The prompts of a completions request: a string, a list of token ids, or a list of
    either (one choice each, OpenAI's batch)."""
    if isinstance(v, list) and v and all(isinstance(p, (str, list)) for p in v):
        return [_prompt(p, f"prompt[{i}]") for i, p in enumerate(v)]
    return [_prompt(v, "prompt")]


def _prompt(v: Any, name: str) -> str | list[int]:
    if isinstance(v, str):
        if not v:
            raise _bad(name, "must not be empty")
        return v
    if isinstance(v, list):
        return _token_ids(v, name)
    raise _bad(name, f"a string or a list of token ids, got {type(v).__name__}")


def new_id(chat: bool) -> str:
    """A response id in OpenAI's style."""
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def random_seed() -> int:
    """A seed for a request that gave none (draws differ between requests, as OpenAI's)."""
    return int.from_bytes(os.urandom(8), "little")


def usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    """The usage object (`cached`: the prompt tokens found in the prefix cache)."""
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def choice(g: Generation, index: int, text: str, ids: list[int],
           finish: str | None, logprobs: dict | None = None) -> dict[str, Any]:
    """One choice of a whole response (`logprobs`: its object, `serve.logprobs`)."""
    if g.chat:
        return {"index": index, "message": {"role": "assistant", "content": text},
                "logprobs": logprobs, "finish_reason": finish}
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish,
            "token_ids": ids}


def response(g: Generation, rid: str, model: str, choices: list[dict[str, Any]],
             prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
             ) -> dict[str, Any]:
    """A whole (non-streamed) completion or chat completion of `choices` (`choice(...)`)."""
    return {"id": rid, "object": "chat.completion" if g.chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}


def stream_chunk(g: Generation, rid: str, model: str, created: int, text: str | None,
          ids: list[int], finish: str | None, role: bool = False,
          index: int = 0, logprobs: dict | None = None) -> dict[str, Any]:
    """One streamed chunk of choice `index`: new text (and token ids, and their `logprobs`
    object), or the final one with the finish reason; `role`: a chat choice's first chunk,
    which names the assistant."""
    if g.chat:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else \
            ({} if text is None else {"content": text})
        choice = {"index": index, "delta": delta, "logprobs": logprobs,
                  "finish_reason": finish}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs,
                  "finish_reason": finish, "token_ids": ids}
        kind = "text_completion"
    return {"id": rid, "object": kind, "created": created, "model": model, "choices": [choice]}


def chunk_line(g: Generation, rid: str, model: str, created: int
               ) -> Callable[[str, list[int]], str]:
    """line(text, ids): the server-sent event of a streamed chunk of choice 0 with new text
    and token ids (`stream_chunk(...)` as JSON, `data: ` before it, a blank line after), the parts
    that stay the same over the stream rendered once: a token then costs the encoding of
    its own text."""
    mark, mark_id = "\ue000", 2**62 + 17  # values no chunk holds, found and cut out below
    line = f"data: {json.dumps(stream_chunk(g, rid, model, created, mark, [mark_id], None), ensure_ascii=False)}\n\n"  # noqa: E501
    # (the last occurrences: a model name could hold the marks, the choice comes after it)
    head, tail = line.rsplit(json.dumps(mark, ensure_ascii=False), 1)
    if g.chat:  # a chat chunk carries no token ids
        return lambda text, ids: f"{head}{json.dumps(text, ensure_ascii=False)}{tail}"
    mid, end = tail.rsplit(f"[{mark_id}]", 1)
    return lambda text, ids: (f"{head}{json.dumps(text, ensure_ascii=False)}{mid}"
                              f"[{', '.join(map(str, ids))}]{end}")


def usage_chunk(g: Generation, rid: str, model: str, created: int, prompt_tokens: int,
                completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """The last chunk of a stream that asked for usage: no choices, the counts."""
    return {"id": rid, "object": "chat.completion.chunk" if g.chat else "text_completion",
            "created": created, "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}
