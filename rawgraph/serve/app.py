"""The HTTP side: an ASGI app (Starlette) with OpenAI's routes over a `Worker`.

    POST /v1/completions, POST /v1/chat/completions   (streamed as server-sent events or not)
    GET /v1/models, GET /health, GET /metrics

Handlers are asynchronous and never touch the engine: a request is checked, turned into
token ids, submitted, and its events relayed. A client that disconnects (or outlives
`timeout_s`) has its request aborted, freeing its slot and cache blocks at the next step.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from rawgraph.engine.request import Logprob, Request
from rawgraph.ops.logits import MAX_BANS
from rawgraph.ops.sampling import GREEDY_TEMPERATURE, SamplingParams
from rawgraph.serve import logprobs, protocol
from rawgraph.serve.protocol import APIError, Generation
from rawgraph.serve.text import ChatTemplate, TextStream
from rawgraph.serve.worker import Job, Worker

FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


@dataclass
class ModelInfo:
    """What the handlers need to know of the model: its name and limits, the tokenizer
    (None: prompts as token ids only), chat template (None: no chat), end-of-sequence ids,
    and the sampling defaults of its generation_config.json (temperature, top_p, top_k: what
    a request that sets none gets) with the fields it sets that are not applied."""

    model_id: str
    vocab: int
    max_context: int
    tokenizer: Any = None
    template: ChatTemplate | None = None
    eos: tuple[int, ...] = ()
    created: int = field(default_factory=lambda: int(time.time()))
    sampling: dict[str, Any] = field(default_factory=dict)
    unapplied: tuple[str, ...] = ()
    family: str = "llama"  # rawgraph.model.family's row

    def piece(self, token: int) -> str:
        """A token's own text as log-probabilities name it (without a tokenizer, its id as
        vLLM spells it)."""
        return self.tokenizer.piece(token) if self.tokenizer is not None \
            else f"token_id:{token}"

    def logprobs(self, g: Generation, ids: list[int], entries: list, offset: int = 0
                 ) -> dict:
        """The `logprobs` object of tokens `ids` in the route's shape."""
        if g.chat:
            return logprobs.chat(ids, entries, self.piece)
        return logprobs.completion(ids, entries, self.piece, offset)


def _sse(obj: dict) -> str:
    """One server-sent event of a JSON object."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _prompt_ids(g: Generation, info: ModelInfo) -> list[list[int]]:
    """The token ids of each prompt (a chat request's one: its messages through the
    template)."""
    tok = info.tokenizer
    if g.chat:
        if info.template is None or tok is None:
            raise APIError(400, f"model {info.model_id!r} has no chat template "
                           f"(chat_template.jinja or tokenizer_config.json) and tokenizer; "
                           f"use /v1/completions", "messages")
        try:
            text = info.template.render(g.messages)
        except ValueError as e:
            raise APIError(400, str(e), "messages") from None
        return [tok.encode(text, special=False)]  # the template wrote the special tokens
    if tok is None and any(isinstance(p, str) for p in g.prompts):
        raise APIError(400, f"model {info.model_id!r} has no tokenizer.json; send the "
                       f"prompt as token ids", "prompt")
    return [tok.encode(p) if isinstance(p, str) else p for p in g.prompts]


def _requests(g: Generation, info: ModelInfo) -> list[Request]:
    """The engine requests of a checked generation, one per choice (each prompt's n in
    turn: choice i * n + j is prompt i's sample j, seeded `seed + j` when the request gives
    a seed); APIError for a prompt or length the model cannot take, before any is made."""
    param = "messages" if g.chat else "prompt"
    prompts = _prompt_ids(g, info)
    for ids in prompts:
        if not ids:
            raise APIError(400, "the prompt encodes to no tokens", param)
        bad = max(ids)
        if bad >= info.vocab:
            raise APIError(400, f"token id {bad} is outside the vocabulary [0, {info.vocab})",
                           param)
        room = info.max_context - len(ids)
        if room < 1:
            raise APIError(400, f"the prompt is {len(ids)} tokens; this server's context "
                           f"holds {info.max_context} (prompt and output)", param)
        if g.max_tokens is not None and g.max_tokens > room:
            raise APIError(400, f"max_tokens = {g.max_tokens}: the prompt's {len(ids)} tokens "
                           f"leave room for {room} in the context of {info.max_context}",
                           "max_tokens")
    if any(t >= info.vocab for t in g.stop_ids):
        raise APIError(400, f"stop token ids must be < {info.vocab}", "stop")
    if g.stop and info.tokenizer is None:
        raise APIError(400, f"model {info.model_id!r} has no tokenizer.json, so no text to "
                       f"find stop strings in; give stop token ids", "stop")
    bad = [t for t in g.logit_bias if t >= info.vocab]
    if bad:
        raise APIError(400, f"logit_bias: token id {min(bad)} is outside the vocabulary "
                       f"[0, {info.vocab})", "logit_bias")
    temperature = 0.0 if g.temperature <= GREEDY_TEMPERATURE else g.temperature
    stop = sorted({*g.stop_ids, *(() if g.ignore_eos else info.eos)})
    if g.min_tokens and len(stop) > MAX_BANS:
        raise APIError(400, f"min_tokens bans the {len(stop)} stop ids and eos ids, at most "
                       f"{MAX_BANS}", "stop_token_ids")
    scored = g.echo and g.logprobs is not None  # the prompt's own log-probabilities
    out = []
    for ids in prompts:
        for j in range(g.n):
            seed = protocol.random_seed() if g.seed is None else (g.seed + j) % 2**64
            params = SamplingParams(
                temperature, g.top_k, g.top_p, seed, presence_penalty=g.presence_penalty,
                frequency_penalty=g.frequency_penalty, repetition_penalty=g.repetition_penalty,
                logit_bias=g.logit_bias, min_tokens=g.min_tokens, logprobs=g.logprobs,
                prompt_logprobs=g.logprobs if scored else None)
            # max_tokens 0 (echo): one token made with the prompt's last logits, not shown
            out.append(Request(ids, g.max_tokens or (1 if g.max_tokens == 0 else
                                                     info.max_context - len(ids)),
                               params, stop))
    return out


class _Relay:
    """A job's events turned into text and token ids (stop ids and stop strings applied),
    with its latency metrics. A deadline is one timer and a whole (not streamed) request's
    watch for its client one task, so an event costs a queue read: a timeout per event (an
    `asyncio.wait_for`) cost more than the rest of a streamed token's work together."""

    def __init__(self, g: Generation, job: Job, info: ModelInfo, worker: Worker,
                 http: HTTPRequest, timeout_s: float | None):
        self.g, self.job, self.worker, self.http = g, job, worker, http
        self.stops = set(job.request.stop)
        # without a tokenizer there is no text (token ids only): nothing to decode
        self.text = None if info.tokenizer is None else TextStream(info.tokenizer.decode, g.stop)
        self.ids: list[int] = []
        self.lps: list[Logprob] = []  # the shown tokens', when asked
        self.prompt_lp: list[Logprob | None] | None = None  # the prompt's, when asked
        self.shown = g.max_tokens != 0  # max_tokens 0 (echo): the output is not shown
        self.info = info
        self.offset = 0  # characters of text sent so far (completions' text_offset)
        self.generated = 0
        self.cached = 0  # prompt tokens the prefix cache held (told when it finishes)
        self.finish: str | None = None
        self.t0 = time.monotonic()
        self.last: float | None = None
        self._held: tuple | None = None  # an event read ahead while merging tokens
        loop = asyncio.get_running_loop()
        # past the deadline the request is aborted; its finish event ends the relay
        self._timer = None if timeout_s is None else loop.call_later(
            timeout_s, worker.abort, job)
        self._watch = None if g.stream else loop.create_task(self._watch_client())

    async def _watch_client(self) -> None:
        """A whole request learns of its client leaving by asking (a stream is cancelled)."""
        while not self.job.done:
            await asyncio.sleep(0.5)
            if await self.http.is_disconnected():
                self.worker.abort(self.job)
                return

    def close(self) -> None:
        """Stop the deadline's timer and the client watch (the relay has ended)."""
        if self._timer is not None:
            self._timer.cancel()
        if self._watch is not None:
            self._watch.cancel()

    async def next(self) -> tuple[str, list[int], list[Logprob]] | None:
        """The next piece of output (text, token ids, their log-probabilities when asked),
        or None once finished (`finish` set); raises APIError for a failure after
        acceptance."""
        events = self.job.events
        while True:
            if self._held is not None:
                event, self._held = self._held, None
            else:
                event = await events.get()
            if event[0] == "error":
                raise event[1]
            if event[0] == "finish":
                self.finish = self.finish or FINISH.get(event[1], event[1])
                self.cached = event[2] if len(event) > 2 else 0
                if not self.shown:  # max_tokens 0: the prompt alone, as long as asked
                    self.finish = "length"
                return None
            if event[0] == "prompt":
                self.prompt_lp = list(event[1])
            if event[0] == "tokens" and self.finish is None and self.shown:
                new, lps = list(event[1]), list(event[2] or ())
                while not events.empty():  # the handler fell behind: one chunk
                    more = events.get_nowait()
                    if more[0] != "tokens":
                        self._held = more  # the next call's event
                        break
                    new += more[1]
                    lps += more[2] or ()
                return self._tokens(new, lps)

    def _tokens(self, new: list[int], lps: list[Logprob]) -> tuple[str, list[int],
                                                                     list[Logprob]]:
        now = time.monotonic()
        m = self.worker.metrics
        with m.lock:
            if self.last is None:
                m.ttft.observe(now - self.t0)
            else:
                m.itl.observe((now - self.last) / len(new), len(new))
        self.last = now
        self.generated += len(new)
        keep = [t not in self.stops for t in new]  # a stop id ends the output unseen
        shown = [t for t, k in zip(new, keep) if k]
        lps = [e for e, k in zip(lps, keep) if k]
        text = "" if self.text is None else self.text.push(shown)
        if self.text is not None and self.text.stopped:  # a stop string: text ends before it
            self.finish = "stop"
            self.worker.abort(self.job)
        self.ids += shown
        self.lps += lps
        return text, shown, lps

    def rest(self) -> str:
        """Text held back until the end."""
        return "" if self.text is None else self.text.finish()

    def echo(self, prompt: str | list[int]) -> tuple[str, dict | None]:
        """An echoing completion's prompt: its text (`prompt`'s, or its ids' decoded) and
        its logprobs object when asked (the first token's entry null); text offsets move
        on past it."""
        ids, info = self.job.request.prompt, self.info
        text = prompt if isinstance(prompt, str) else \
            "" if info.tokenizer is None else info.tokenizer.decode(ids)
        lp = None
        if self.g.logprobs is not None:
            entries = self.prompt_lp or [None] * len(ids)
            lp = info.logprobs(self.g, ids, entries)
        self.offset = len(text)
        return text, lp

    def piece_logprobs(self, text: str, ids: list[int], lps: list[Logprob]) -> dict | None:
        """A piece of output's logprobs object when asked; text offsets move on past it."""
        lp = None if self.g.logprobs is None else \
            self.info.logprobs(self.g, ids, lps, self.offset)
        self.offset += len(text)
        return lp


_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache")]


class _EventStream:
    """A streamed response (an ASGI app): the server-sent events `lines` yields, one `send`
    each and no wrapper around it (per-event Python is what the event loop spends per
    streamed token; benchmarks/NOTES.md, "Serving"). A watch on `receive` cancels the
    stream when the client goes; `lines` is closed either way (its `finally` aborts an
    unfinished job)."""

    def __init__(self, lines: AsyncGenerator[str, None]):
        self.lines = lines

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        task = asyncio.current_task()
        assert task is not None
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            task.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            async for line in self.lines:
                await send({"type": "http.response.body", "body": line.encode(),
                            "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not gone:
                raise
            if sys.version_info >= (3, 11):  # the handler goes on as not cancelled
                task.uncancel()
        finally:
            watcher.cancel()
            await self.lines.aclose()


def create_app(worker: Worker, info: ModelInfo, *, timeout_s: float | None = None,
               process: int = 0) -> Starlette:
    """The ASGI app over a started `worker`; `process`: which of the server's HTTP processes
    serves it (/health says)."""

    async def generate(http: HTTPRequest, chat: bool) -> Response | _EventStream:
        try:
            try:
                body = await http.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise APIError(400, "the request body is not valid JSON") from None
            g = protocol.parse(body, chat, info.model_id, info.sampling)
            jobs = await _submit(_requests(g, info))
        except APIError as e:
            return _error(e)
        relays = [_Relay(g, job, info, worker, http, timeout_s) for job in jobs]
        rid = protocol.new_id(chat)
        if g.stream:
            return _EventStream(_stream(relays[0], rid) if len(relays) == 1
                                else _stream_many(relays, rid))
        return await _whole(relays, rid)

    async def _submit(requests: list[Request]) -> list[Job]:
        """Queue a request's choices and wait until the engine took them all; if one is
        refused, the others are aborted and the refusal raised."""
        loop, jobs = asyncio.get_running_loop(), []
        try:
            for r in requests:
                job = Job(r, loop)
                worker.submit(job)
                jobs.append(job)
            for job in jobs:
                event = await job.events.get()
                if event[0] == "error":
                    raise event[1]
        except BaseException:  # a refusal, or the client left before the engine took them
            for job in jobs:
                worker.abort(job)
            raise
        return jobs

    async def _collect(relay: _Relay) -> str:
        """A relay's whole text (its job aborted if the relay ends early)."""
        text = []
        try:
            while (piece := await relay.next()) is not None:
                text.append(piece[0])
        finally:
            relay.close()
            if relay.finish is None:
                worker.abort(relay.job)
        return "".join(text) + relay.rest()

    def _choice(i: int, relay: _Relay, text: str) -> dict[str, Any]:
        """Choice i of a whole response: its text (after the echoed prompt, if asked) and
        its log-probabilities (the prompt's first, if echoed)."""
        g, lp = relay.g, None
        if g.echo:
            head, head_lp = relay.echo(g.prompts[i // g.n])
            text = head + text
            if head_lp is not None:
                tail = info.logprobs(g, relay.ids, relay.lps, relay.offset)
                lp = {k: head_lp[k] + tail[k] for k in head_lp}
        elif g.logprobs is not None:
            lp = info.logprobs(g, relay.ids, relay.lps)
        return protocol.choice(g, i, text, relay.ids, relay.finish, lp)

    def _usage(relays: list[_Relay]) -> tuple[int, int, int]:
        """(prompt tokens, each prompt once: the first of its n choices; completion tokens,
        every choice's; of the prompt tokens, those found in the prefix cache)."""
        prompts = relays[::relays[0].g.n]
        return (sum(len(r.job.request.prompt) for r in prompts),
                sum(r.generated for r in relays), sum(r.cached for r in prompts))

    async def _whole(relays: list[_Relay], rid: str) -> Response:
        tasks = [asyncio.ensure_future(_collect(r)) for r in relays]
        try:  # the first failure ends the rest (each collect aborts its job as it ends)
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        failed = next((t.exception() for t in tasks if not t.cancelled() and t.exception()),
                      None)
        if isinstance(failed, APIError):
            return _error(failed)
        if failed is not None:
            raise failed
        g = relays[0].g
        choices = [_choice(i, r, t.result()) for i, (t, r) in enumerate(zip(tasks, relays))]
        return JSONResponse(protocol.response(g, rid, info.model_id, choices,
                                              *_usage(relays)))

    async def _stream(relay: _Relay, rid: str) -> AsyncGenerator[str, None]:
        g, created = relay.g, int(time.time())

        try:
            if g.chat:
                yield _sse(protocol.stream_chunk(g, rid, info.model_id, created, None, [], None,
                                                 True))
            line = protocol.chunk_line(g, rid, info.model_id, created)
            try:
                if g.echo:
                    yield await _echoed(relay, 0, rid, created)
                while (piece := await relay.next()) is not None:
                    text, ids, lps = piece
                    if g.logprobs is not None:
                        yield _sse(protocol.stream_chunk(g, rid, info.model_id, created, text, ids,
                                                 None, logprobs=relay.piece_logprobs(text, ids,
                                                                                     lps)))
                    elif text or (ids and not g.chat):
                        yield line(text, ids)
            except APIError as e:
                yield _sse(e.body())
                yield "data: [DONE]\n\n"
                return
            rest = relay.rest()
            yield _sse(protocol.stream_chunk(g, rid, info.model_id, created, rest or None, [],
                                     relay.finish))
            if g.include_usage:
                yield _sse(protocol.usage_chunk(g, rid, info.model_id, created,
                                               *_usage([relay])))
            yield "data: [DONE]\n\n"
        finally:  # the client went away (the stream was cancelled) or the stream ended
            relay.close()
            if relay.finish is None:
                worker.abort(relay.job)

    async def _stream_many(relays: list[_Relay], rid: str) -> AsyncGenerator[str, None]:
        """The stream of several choices: each one's chunks (its index) as they come."""
        g, created = relays[0].g, int(time.time())
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, relay: _Relay) -> None:
            try:
                if g.echo:
                    merged.put_nowait((i, await _echoed(relay, i, rid, created)))
                while (piece := await relay.next()) is not None:
                    merged.put_nowait((i, piece))
                merged.put_nowait((i, None))
            except Exception as e:  # handed to the stream, which ends with it
                merged.put_nowait((i, e))

        tasks = [asyncio.get_running_loop().create_task(pump(i, r))
                 for i, r in enumerate(relays)]
        try:
            if g.chat:
                for i in range(len(relays)):
                    yield _sse(protocol.stream_chunk(g, rid, info.model_id, created, None, [], None,
                                             True, i))
            for _ in relays:
                while True:
                    i, piece = await merged.get()
                    if isinstance(piece, APIError):
                        yield _sse(piece.body())
                        yield "data: [DONE]\n\n"
                        return
                    if isinstance(piece, Exception):
                        raise piece
                    if piece is None:
                        r = relays[i]
                        yield _sse(protocol.stream_chunk(g, rid, info.model_id, created,
                                                 r.rest() or None, [], r.finish, index=i))
                        break
                    if isinstance(piece, str):  # an echoed prompt's chunk
                        yield piece
                        continue
                    text, ids, lps = piece
                    if text or ids:
                        lp = relays[i].piece_logprobs(text, ids, lps)
                        if text or lp is not None or not g.chat:
                            yield _sse(protocol.stream_chunk(g, rid, info.model_id, created, text,
                                                     ids, None, index=i, logprobs=lp))
            if g.include_usage:
                yield _sse(protocol.usage_chunk(g, rid, info.model_id, created,
                                               *_usage(relays)))
            yield "data: [DONE]\n\n"
        finally:  # the client went away (the stream was cancelled) or the stream ended
            for task in tasks:
                task.cancel()
            for r in relays:
                r.close()
                if r.finish is None:
                    worker.abort(r.job)

    async def _echoed(relay: _Relay, i: int, rid: str, created: int) -> str:
        """The first chunk of an echoing stream's choice i: its prompt (and the prompt's
        log-probabilities, which come with the first tokens: waited for when asked)."""
        g = relay.g
        if g.logprobs is not None and relay.prompt_lp is None:
            relay._held = await relay.job.events.get()  # the prompt's come first
            if relay._held[0] == "prompt":
                relay.prompt_lp, relay._held = list(relay._held[1]), None
        text, lp = relay.echo(g.prompts[i // g.n])
        return _sse(protocol.stream_chunk(g, rid, info.model_id, created, text,
                                   relay.job.request.prompt, None, index=i, logprobs=lp))

    async def completions(http: HTTPRequest) -> Response | _EventStream:
        return await generate(http, chat=False)

    async def chat_completions(http: HTTPRequest) -> Response | _EventStream:
        return await generate(http, chat=True)

    async def models(http: HTTPRequest) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": info.model_id, "object": "model", "created": info.created,
             "owned_by": "rawgraph", "max_model_len": info.max_context}]})

    async def health(http: HTTPRequest) -> Response:
        if not worker.admitting:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        running, waiting = worker.load
        return JSONResponse({"status": "ok", "running": running, "waiting": waiting,
                             "process": process})

    async def metrics(http: HTTPRequest) -> Response:
        return PlainTextResponse(worker.metrics.render(),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    async def http_error(http: HTTPRequest, e: Exception) -> Response:
        assert isinstance(e, HTTPException)
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return _error(APIError(e.status_code, f"{http.method} {http.url.path}: {e.detail}",
                               kind=kind))

    routes = [Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]),
              Route("/health", health, methods=["GET"]),
              Route("/metrics", metrics, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})
