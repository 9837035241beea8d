"""Log-probabilities in OpenAI's response shapes: the completions route's (parallel lists
of tokens, their log-probabilities, the top alternatives and text offsets, the prompt's
first entry null when echoed) and the chat route's (a `content` list of token objects with
their UTF-8 bytes and top alternatives)."""

from __future__ import annotations

from collections.abc import Callable

from rawgraph.engine.request import Logprob

Piece = Callable[[int], str]  # a token id's own text


def _number(v: float) -> float:
    # JSON has no infinity: a token with no chance gets OpenAI's floor, as vLLM does
    return v if v > -9999.0 else -9999.0


def completion(ids: list[int], entries: list[Logprob | None], piece: Piece,
               offset: int) -> dict:
    """The completions route's `logprobs` of tokens `ids` (entries None: a token with no
    log-probability, the echoed prompt's first), text offsets counted from `offset`. Each
    top_logprobs holds the top alternatives and the token itself (vLLM's shape)."""
    tokens, lps, tops, offsets = [], [], [], []
    for t, e in zip(ids, entries):
        text = piece(t)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if e is None:
            lps.append(None)
            tops.append(None)
            continue
        lps.append(_number(e.logprob))
        top = {piece(i): _number(v) for i, v in e.top}
        top.setdefault(text, _number(e.logprob))
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops,
            "text_offset": offsets}


def _token(text: str, lp: float) -> dict:
    return {"token": text, "logprob": _number(lp), "bytes": list(text.encode())}


def chat(ids: list[int], entries: list[Logprob], piece: Piece) -> dict:
    """The chat route's `logprobs` of tokens `ids`: {"content": [...]}, each token with its
    top alternatives (top_logprobs of them)."""
    return {"content": [_token(piece(t), e.logprob)
                        | {"top_logprobs": [_token(piece(i), v) for i, v in e.top]}
                        for t, e in zip(ids, entries)]}
