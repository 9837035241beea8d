"""The server end to end on the CPU: the real ASGI app under uvicorn over a real decoder (the
NumPy reference of the tiny preset, behind the engine), driven over HTTP with httpx:
completions and chat, streamed and whole, the tokens `Engine.generate` gives, refusals with
OpenAI's error JSON, stop strings, a full queue, clients that leave, and SIGTERM."""

import argparse
import asyncio
import gc
import json
import math
import os
import signal
import threading
import time

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
tokenizers = pytest.importorskip("tokenizers")

from rawgraph.bench.serve import server_log, spawn_server  # noqa: E402
from rawgraph.engine.reference import reference_engine  # noqa: E402
from rawgraph.engine.request import Request  # noqa: E402
from rawgraph.serve.metrics import Histogram, Metrics, quantile, sample  # noqa: E402
from rawgraph.serve.protocol import APIError  # noqa: E402
from rawgraph.serve.worker import Job, Worker  # noqa: E402
from tests.serve.conftest import CFG, CONTEXT, TEMPLATE, Served, events  # noqa: E402


def _options(root):
    """`rawgraph serve` options for the tiny checkpoint on the NumPy decoder."""
    return ["--reference", "--model", str(root), "--max-context", str(CONTEXT), "--chunk", "32",
            "--max-batch", "2"]


def _slowed(s):
    """`s` with its engine taking 20 ms a step (so requests run long enough to interrupt)."""
    step = s.engine.step

    def slow_step():
        time.sleep(0.02)
        return step()
    s.engine.step = slow_step
    return s


def _used_blocks(s):
    t = s.engine.model.kv.tables
    return t.alloc.num_blocks - t.alloc.num_free


PROMPTS = [[5, 6, 7], list(range(10, 50)), [300] * 7, [9]]


def test_greedy_completions_give_the_engines_tokens(served, checkpoint):
    want = reference_engine(CFG, checkpoint[1], max_batch=4, max_context=CONTEXT,
                            max_chunk=32).generate(PROMPTS, max_new_tokens=12)
    results = [None] * len(PROMPTS)

    def ask(i):  # concurrent clients
        r = httpx.post(f"{served.url}/v1/completions", json={
            "model": "tiny", "prompt": PROMPTS[i], "max_tokens": 12, "temperature": 0,
            "stop_token_ids": []}, timeout=30)
        results[i] = r
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r, w, p in zip(results, want, PROMPTS):
        assert r.status_code == 200, r.text
        body = r.json()
        ids = body["choices"][0]["token_ids"]
        n = body["usage"]["completion_tokens"]
        cut = w.index(2) + 1 if 2 in w else len(w)  # </s> (eos) ends it, unseen
        assert ids == [t for t in w[:cut] if t != 2] and n == cut
        assert body["choices"][0]["finish_reason"] == ("stop" if 2 in w else "length")
        assert body["usage"]["prompt_tokens"] == len(p)
        assert body["choices"][0]["text"] == " ".join(f"w{t}" for t in ids)


def test_a_stream_is_server_sent_events_that_add_up_to_the_whole(served):
    body = {"prompt": [5, 6, 7], "max_tokens": 10, "temperature": 0}
    whole = httpx.post(f"{served.url}/v1/completions", json=body).json()
    with httpx.stream("POST", f"{served.url}/v1/completions",
                      json=body | {"stream": True, "stream_options": {"include_usage": True}}
                      ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        chunks = events(r.iter_lines())
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    ids = [t for c in chunks[:-1] for t in c["choices"][0]["token_ids"]]
    assert ids == whole["choices"][0]["token_ids"]
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]][-1] == \
        whole["choices"][0]["finish_reason"]
    assert all(c["id"] == chunks[0]["id"] for c in chunks)


def test_chat_renders_the_template_and_streams_deltas(served):
    msgs = [{"role": "user", "content": "w5 w6 w7"}]
    whole = httpx.post(f"{served.url}/v1/chat/completions", json={
        "messages": msgs, "max_tokens": 8, "temperature": 0}).json()
    assert whole["object"] == "chat.completion"
    msg = whole["choices"][0]["message"]
    assert msg["role"] == "assistant" and whole["usage"]["completion_tokens"] >= 1
    # the prompt: <s> [user] w5 w6 w7 [assistant] -> unknown words are <unk>, special <s> once
    assert whole["usage"]["prompt_tokens"] == len("<s> [user] w5 w6 w7 [assistant]".split())
    with httpx.stream("POST", f"{served.url}/v1/chat/completions", json={
            "messages": msgs, "max_tokens": 8, "temperature": 0, "stream": True}) as r:
        chunks = events(r.iter_lines())
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:])
    assert text == msg["content"] and chunks[-1]["choices"][0]["finish_reason"] in \
        ("stop", "length")


def test_sampling_with_a_seed_is_reproducible(served):
    body = {"prompt": [5, 6, 7], "max_tokens": 12, "temperature": 0.9, "top_p": 0.95,
            "top_k": 50, "seed": 1234}
    a, b = (httpx.post(f"{served.url}/v1/completions", json=body).json() for _ in range(2))
    assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]


def test_a_stop_string_ends_the_text_and_frees_the_request(served):
    body = {"prompt": [5, 6, 7], "max_tokens": 20, "temperature": 0}
    full = httpx.post(f"{served.url}/v1/completions", json=body).json()["choices"][0]
    words = full["text"].split()
    assert len(words) >= 3
    r = httpx.post(f"{served.url}/v1/completions", json=body | {"stop": [words[2]]}).json()
    assert r["choices"][0]["text"] == " ".join(words[:2]) + " "
    assert r["choices"][0]["finish_reason"] == "stop"
    _wait(lambda: _used_blocks(served) == 0)


def _wait(cond, timeout=10.0):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.01)


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"prompt": list(range(3, 3 + CONTEXT))}, 400, "prompt"),
    ({"prompt": [5], "max_tokens": CONTEXT}, 400, "max_tokens"),
    ({"prompt": [CFG.vocab]}, 400, "prompt"),
    ({"prompt": [5], "stop_token_ids": [CFG.vocab]}, 400, "stop"),
    ({"prompt": [5], "n": 65}, 400, "n"),
    ({"prompt": [[5], [CFG.vocab]]}, 400, "prompt"),
    ({"prompt": [5], "model": "gpt-4"}, 404, "model"),
    ({"prompt": [5], "unknown": 1}, 400, "unknown")])
def test_refusals_are_openai_errors_and_the_server_goes_on(served, body, status, param):
    r = httpx.post(f"{served.url}/v1/completions", json=body)
    assert r.status_code == status and r.json()["error"]["param"] == param
    assert httpx.post(f"{served.url}/v1/completions", json={"prompt": [5], "max_tokens": 2}
                      ).status_code == 200


def test_malformed_json_unknown_routes_and_methods(served):
    r = httpx.post(f"{served.url}/v1/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    assert httpx.get(f"{served.url}/v1/nothing").json()["error"]["type"] == "not_found_error"
    assert httpx.get(f"{served.url}/v1/completions").status_code == 405
    assert httpx.get(f"{served.url}/v1/models").json()["data"][0]["id"] == "tiny"
    assert httpx.get(f"{served.url}/health").json()["status"] == "ok"


def test_a_client_that_leaves_mid_stream_is_aborted_and_others_are_untouched(served):
    body = {"prompt": [9, 8, 7], "max_tokens": 60, "temperature": 0, "stop_token_ids": [],
            "stream": True}
    alone = httpx.post(f"{served.url}/v1/completions", json={
        "prompt": [5, 6], "max_tokens": 30, "temperature": 0}).json()
    before = served.worker.metrics.requests["aborted"]
    other = {}

    def bystander():
        other["r"] = httpx.post(f"{served.url}/v1/completions", json={
            "prompt": [5, 6], "max_tokens": 30, "temperature": 0}, timeout=30).json()
    t = threading.Thread(target=bystander)
    with httpx.stream("POST", f"{served.url}/v1/completions", json=body) as r:
        t.start()
        for i, _ in enumerate(r.iter_lines()):
            if i >= 3:
                break  # the client goes away
    t.join()
    _wait(lambda: served.worker.metrics.requests["aborted"] == before + 1)
    _wait(lambda: _used_blocks(served) == 0)
    assert other["r"]["choices"][0]["token_ids"] == alone["choices"][0]["token_ids"]


def test_a_full_queue_answers_429_with_retry_after(checkpoint):
    s = Served(checkpoint[1], max_queue=1, start=False)  # nothing admits: the queue fills
    try:
        first = threading.Thread(target=lambda: httpx.post(
            f"{s.url}/v1/completions", json={"prompt": [5], "max_tokens": 2}, timeout=30))
        first.start()
        _wait(lambda: s.worker.load[1] == 1)
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": [5], "max_tokens": 2})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
        s.worker.start()  # the engine catches up: the queued request completes
        first.join()
        assert httpx.post(f"{s.url}/v1/completions", json={"prompt": [5], "max_tokens": 2}
                          ).status_code == 200
    finally:
        s.close()


def test_metrics_report_the_engines_graph_pool(served, monkeypatch):
    # the reference decoder has no graphs; an engine's pool is read after each iteration
    class Pool:
        captures, evictions, nbytes = 9, 2, 3 << 20

        def __len__(self):
            return 7
    monkeypatch.setattr(served.engine.runner, "pool", Pool(), raising=False)
    m = Metrics()  # a worker reports the graphs captured at start-up before any request
    Worker(served.engine, m)
    assert (m.graphs, m.graph_bytes, m.graph_captures, m.graph_evictions) == (7, 3 << 20, 9, 2)
    httpx.post(f"{served.url}/v1/completions", json={"prompt": [5], "max_tokens": 2})
    text = httpx.get(f"{served.url}/metrics").text
    assert (sample(text, "graphs_held"), sample(text, "graph_memory_bytes"),
            sample(text, "graph_captures_total"), sample(text, "graph_evictions_total")) == (
                7, 3 << 20, 9, 2)


def test_metrics_are_prometheus_text(served):
    httpx.post(f"{served.url}/v1/completions", json={"prompt": [5], "max_tokens": 3})
    text = httpx.get(f"{served.url}/metrics").text
    for name in ("requests_total", "generation_tokens_total", "requests_running",
                 "requests_waiting", "batch_size", "kv_blocks_used", "iterations_total",
                 "nodes_patched_total", "time_to_first_token_seconds_bucket",
                 "inter_token_latency_seconds_count", "generation_tokens_per_second",
                 "graphs_held", "graph_memory_bytes", "graph_captures_total",
                 "graph_evictions_total", "decode_rows_total"):
        assert f"rawgraph_{name}" in text
    assert sample(text, "decode_rows_total") >= 2  # the request's own rows, at least
    assert 'rawgraph_iterations_total{mode="eager"}' in text
    # the request's prompt went in a prefill chunk, its tokens in decode steps (with the
    # module's other requests, some iterations were both); each step after the first is one
    # period of the engine's thread
    assert quantile(text, "iteration_seconds", 0.5, 'kind="prefill"') > 0
    assert quantile(text, "iteration_seconds", 0.5, 'kind="decode"') > 0
    assert 'rawgraph_iteration_seconds_count{kind="mixed"} ' in text
    assert 0 < quantile(text, "iteration_host_seconds", 0.5, 'kind="decode"') < 1
    assert quantile(text, "iteration_period_seconds", 0.99) > 0
    # an iteration with decode rows either continued the last step on the device or was fed
    # from the host: the first step of the request's rows was fed, the same rows after it
    # continued (the engine overlaps steps)
    for kind in ('kind="decode"', 'kind="mixed"'):
        assert (sample(text, "iterations_continued_total", kind)
                + sample(text, "iteration_fed_seconds_count", kind)
                == sample(text, "iteration_seconds_count", kind))
    assert sample(text, "iteration_fed_seconds_count", 'kind="decode"') >= 1
    assert sample(text, "iterations_continued_total", 'kind="decode"') >= 1
    assert sample(text, "requests_running") >= 0
    assert math.isnan(sample(text, "iterations_continued_total", 'kind="prefill"'))


def test_the_engine_process_collector_passes_are_timed(served):
    # the worker's thread times the collector's passes in its process (this one: the engine
    # runs on a thread here) and folds them into /metrics when it publishes an iteration
    before = sample(httpx.get(f"{served.url}/metrics").text, "gc_pause_seconds_count",
                    'generation="2"')
    gc.collect()
    httpx.post(f"{served.url}/v1/completions", json={"prompt": [5], "max_tokens": 2})
    text = httpx.get(f"{served.url}/metrics").text
    assert sample(text, "gc_pause_seconds_count", 'generation="2"') >= before + 1
    assert 0 < quantile(text, "gc_pause_seconds", 0.5, 'generation="2"') < 1
    assert sample(text, "gc_frozen_objects") == 0  # nothing froze here: not `rawgraph serve`


def test_http_processes_metrics_sum_over_their_shared_slots():
    from rawgraph.serve.metrics import http_block

    block = http_block(3)
    a, b, c = Metrics(), Metrics(), Metrics()
    for i, m in enumerate((a, b, c)):
        m.share(block, i)
    with pytest.raises(ValueError, match="slot 3 outside"):
        Metrics().share(block, 3)
    a.ttft.observe(0.002)
    a.itl.observe(0.004, 5)
    a.tokens_out(6)
    b.ttft.observe(0.3)
    b.itl.observe(0.02, 2)
    b.tokens_out(3)
    with b.lock:
        b.publish()  # c has published nothing: its slot is zeros
    a.requests["completed"] = 2  # the engine's side: each process's own copy, not summed
    text = a.render()
    for name, want in (("time_to_first_token_seconds_count", 2),
                       ("inter_token_latency_seconds_count", 7),
                       ("generation_tokens_total", 9), ('requests_total{status="completed"}', 2)):
        assert _metric(text, name) == want
    assert _metric(text, "inter_token_latency_seconds_sum") == pytest.approx(0.06)
    assert 'inter_token_latency_seconds_bucket{le="0.005"} 5' in text
    assert 'inter_token_latency_seconds_bucket{le="0.003"} 0' in text
    assert 'inter_token_latency_seconds_bucket{le="0.015"} 5' in text
    assert 'inter_token_latency_seconds_bucket{le="0.02"} 7' in text
    assert 'time_to_first_token_seconds_bucket{le="0.0025"} 1' in text
    assert 'time_to_first_token_seconds_bucket{le="0.5"} 2' in text
    assert _metric(text, "generation_tokens_per_second") == pytest.approx(0.9)
    assert _metric(c.render(), "generation_tokens_total") == 9  # any process renders all


def test_quantiles_come_from_the_histogram_buckets_as_prometheus_computes_them():
    h = Histogram((0.001, 0.002, 0.004))
    text = "\n".join(h.lines("rawgraph_x", 'kind="a"'))
    assert math.isnan(quantile(text, "x", 0.5, 'kind="a"'))
    h.observe(0.0015, 3)  # (0.001, 0.002]
    h.observe(0.003)      # (0.002, 0.004]
    text = "\n".join(h.lines("rawgraph_x", 'kind="a"'))
    assert 'rawgraph_x_sum{kind="a"} 0.0075' in text
    assert quantile(text, "x", 0.5, 'kind="a"') == pytest.approx(0.001 + 0.001 * 2 / 3)
    assert quantile(text, "x", 1.0, 'kind="a"') == pytest.approx(0.004)
    assert math.isnan(quantile(text, "x", 0.5, 'kind="b"'))  # other labels: not this one
    h.observe(1.0)  # past the last bound: the quantile is that bound
    text = "\n".join(h.lines("rawgraph_x"))
    assert quantile(text, "x", 1.0) == 0.004
    with pytest.raises(ValueError, match="q = 99: a quantile lies in"):
        quantile(text, "x", 99)


def test_text_prompts_and_stop_strings_need_a_tokenizer_and_chat_a_template(checkpoint):
    s = Served(checkpoint[1])
    try:
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": "w5 w6"})
        assert r.status_code == 400 and "token ids" in r.json()["error"]["message"]
        r = httpx.post(f"{s.url}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": [5, 6], "stop": "w7"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "stop"
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": [5, 6], "max_tokens": 3,
                                                        "stop": [7]})  # ids need none
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == ""
    finally:
        s.close()


@pytest.mark.parametrize(("mode", "to_group"), [(["--engine", "thread"], False), ([], False),
                                               ([], True), (["--http-processes", "2"], True)],
                         ids=["thread", "process", "process-group", "http-processes-group"])
def test_sigterm_ends_streams_with_a_final_event_and_exits_0(checkpoint, mode, to_group):
    # to_group: the signal reaches the engine's process too (a terminal's Ctrl-C, a service
    # manager stopping the group); the server still drains through the pipe
    root, _ = checkpoint
    proc, url = spawn_server([*_options(root), "--grace", "0.5", *mode], timeout_s=30,
                             own_group=to_group)
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json={
                "prompt": [5, 6], "max_tokens": 80, "temperature": 0, "stop_token_ids": [],
                "stream": True}, timeout=30) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            if to_group:
                os.killpg(proc.pid, signal.SIGTERM)
            else:
                proc.send_signal(signal.SIGTERM)
            chunks = events(list(lines))
        assert chunks[-1]["choices"][0]["finish_reason"] in ("abort", "length")
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_several_http_processes_serve_one_engine(checkpoint):
    # --http-processes 3: three event loops on one port (SO_REUSEPORT spreads connections),
    # one engine: the engine's greedy tokens whichever process answers, /metrics summing
    # every process's latency histograms and tokens, clients leaving mid-stream in any of
    # them freeing their blocks, and SIGTERM to the main process ending every stream with a
    # final event and every process with it
    root, tensors = checkpoint
    proc, url = spawn_server([*_options(root), "--max-batch", "4", "--http-processes", "3",
                              "--grace", "0.5"], timeout_s=60)
    try:
        def metrics():
            return httpx.get(f"{url}/metrics").text

        seen, t0 = set(), time.monotonic()
        while len(seen) < 3 and time.monotonic() - t0 < 30:  # a new connection each
            seen.add(httpx.get(f"{url}/health").json()["process"])
        assert seen == {0, 1, 2}
        prompts = PROMPTS * 3
        want = reference_engine(CFG, tensors, max_batch=4, max_context=CONTEXT,
                                max_chunk=32).generate(prompts, max_new_tokens=12)
        results = [None] * len(prompts)

        def ask(i):
            results[i] = httpx.post(f"{url}/v1/completions", json={
                "prompt": prompts[i], "max_tokens": 12, "temperature": 0,
                "stop_token_ids": []}, timeout=60).json()
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = [r["choices"][0]["token_ids"] for r in results]
        assert got == [[t for t in w[:w.index(2) + 1 if 2 in w else None] if t != 2]
                       for w in want]
        tokens = sum(r["usage"]["completion_tokens"] for r in results)
        # each process publishes its share as the engine's next post reaches it (50 ms idle)
        _wait(lambda: _metric(metrics(), "time_to_first_token_seconds_count") == len(prompts))
        text = metrics()
        assert _metric(text, "generation_tokens_total") == tokens
        assert 0 < _metric(text, "inter_token_latency_seconds_count") <= tokens - len(prompts)
        assert _metric(text, 'requests_total{status="completed"}') == len(prompts)
        # the engine's process froze its start-up heap (engine, app) out of the collector's
        # reach, and its passes since are timed (their counts come with the engine's posts)
        assert _metric(text, "gc_frozen_objects") > 1000
        assert 'rawgraph_gc_pause_seconds_count{generation="2"} ' in text

        def leave():  # read two events, then go
            with httpx.stream("POST", f"{url}/v1/completions", json={
                    "prompt": [9, 8, 7], "max_tokens": 80, "temperature": 0,
                    "stop_token_ids": [], "stream": True}, timeout=30) as r:
                for i, _ in enumerate(r.iter_lines()):
                    if i >= 2:
                        break
        leaving = [threading.Thread(target=leave) for _ in range(6)]
        for t in leaving:
            t.start()
        for t in leaving:
            t.join()
        _wait(lambda: _metric(metrics(), 'requests_total{status="aborted"}') == 6)
        _wait(lambda: _metric(metrics(), "kv_blocks_used") == 0)

        streams, started = [None] * 4, [threading.Event() for _ in range(4)]

        def last_event(i):  # four streams running (the batch), then the signal
            with httpx.stream("POST", f"{url}/v1/completions", json={
                    "prompt": [5, 6], "max_tokens": 80, "temperature": 0,
                    "stop_token_ids": [], "stream": True}, timeout=30) as r:
                lines = r.iter_lines()
                first = next(lines)
                started[i].set()
                streams[i] = events([first, *lines])[-1]
        running = [threading.Thread(target=last_event, args=(i,)) for i in range(4)]
        for t in running:
            t.start()
        for e in started:
            assert e.wait(30)
        proc.send_signal(signal.SIGTERM)
        for t in running:
            t.join()
        assert all(e["choices"][0]["finish_reason"] in ("abort", "length") for e in streams)
        assert proc.wait(30) == 0
        assert "did not stop" not in server_log(proc, 20000)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("holder", ["listening", "another server's SO_REUSEPORT"])
def test_a_port_taken_is_one_line_and_exit_2_before_anything_starts(capsys, holder):
    # several HTTP processes bind with SO_REUSEPORT, which would let a second such server
    # share the port with the first: the main process checks that nothing holds it
    import socket

    from rawgraph.cli import main

    with socket.socket() as taken:
        if holder == "listening":
            taken.bind(("127.0.0.1", 0))
            taken.listen()
        else:
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        assert main(["serve", "--reference", "--http-processes", "2", "--port",
                     str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"--port {port}: Address already in use" in err


def _metric(text, name):
    for line in text.splitlines():
        if line.startswith(f"rawgraph_{name} "):
            return float(line.split()[1])
    raise KeyError(name)


def test_a_spawned_server_keeps_serving_past_64_kib_of_access_log(checkpoint):
    # a pipe nobody reads would fill after 64 KiB and stop the server on its next write
    root, _ = checkpoint
    proc, url = spawn_server(_options(root), timeout_s=30)
    try:
        with httpx.Client(timeout=10) as client:
            for _ in range(1500):  # an access-log line each, about 100 KB
                assert client.get(f"{url}/health").status_code == 200
            # greedy: a sampled stream stops early at the end-of-text token now and then
            # (tiny's random weights: 2 to 4 in 150 requests)
            r = client.post(f"{url}/v1/completions", json={"prompt": [5, 6], "max_tokens": 3,
                                                             "temperature": 0})
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 3
        assert server_log(proc).count("GET /health") > 10
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_draining_finishes_what_it_can_then_aborts_the_rest(checkpoint):
    s = _slowed(Served(checkpoint[1]))  # 80 tokens cannot finish within the grace
    try:
        with httpx.stream("POST", f"{s.url}/v1/completions", json={
                "prompt": [5, 6], "max_tokens": 80, "temperature": 0, "stream": True},
                timeout=30) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            drain = threading.Thread(target=s.worker.drain_and_stop, args=(0.1,))
            drain.start()
            chunks = events(list(lines))
        drain.join()
        assert chunks[-1]["choices"][0]["finish_reason"] == "abort"
        assert httpx.post(f"{s.url}/v1/completions", json={"prompt": [5]}).status_code == 503
        assert httpx.get(f"{s.url}/health").status_code == 503
        assert _used_blocks(s) == 0
    finally:
        s.close()


def test_a_request_past_its_deadline_is_aborted_with_what_it_has(checkpoint):
    s = _slowed(Served(checkpoint[1], timeout_s=0.3))  # 80 tokens outlast the deadline
    try:
        r = httpx.post(f"{s.url}/v1/completions", json={
            "prompt": [5, 6], "max_tokens": 80, "temperature": 0}, timeout=30).json()
        choice = r["choices"][0]
        assert choice["finish_reason"] == "abort" and 0 < len(choice["token_ids"]) < 80
        assert r["usage"]["completion_tokens"] == len(choice["token_ids"])
        _wait(lambda: _used_blocks(s) == 0)
    finally:
        s.close()


def test_an_engine_that_keeps_failing_fails_its_requests_and_the_server_goes_on(checkpoint):
    s = Served(checkpoint[1])
    step = s.engine.step
    broken = {"on": True}

    def flaky():  # every iteration fails (as a rolled-back one leaves it) until repaired
        if broken["on"]:
            raise RuntimeError("injected")
        return step()
    s.engine.step = flaky
    try:
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": [5, 6], "max_tokens": 8},
                       timeout=30)
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        # several choices, whole and streamed: the failure ends the request, all choices
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": [[5, 6], [7]], "n": 2,
                                                         "max_tokens": 8}, timeout=30)
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        with httpx.stream("POST", f"{s.url}/v1/completions", timeout=30, json={
                "prompt": [5, 6], "n": 3, "max_tokens": 8, "stream": True}) as st:
            got = events(st.iter_lines())
        assert got[-1]["error"]["type"] == "server_error"
        broken["on"] = False
        _wait(lambda: _used_blocks(s) == 0 and s.worker.load == (0, 0))
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": [5, 6], "max_tokens": 8,
                                                         "temperature": 0})
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 8
        m = s.worker.metrics
        assert m.step_failures >= 3 and m.requests["failed"] == 8  # 1 + 4 + 3 choices
    finally:
        s.close()


def _serve_args(root, **kw):
    from rawgraph.cli import parser

    args = parser().parse_args(["serve", *_options(root)])
    return argparse.Namespace(**{**vars(args), **kw})


def test_a_checkpoint_the_engine_process_refuses_is_one_line_and_exit_2(tmp_path, checkpoint,
                                                                         capsys):
    from rawgraph.cli import main

    (tmp_path / "config.json").write_text((checkpoint[0] / "config.json").read_text())
    assert main(["serve", "--reference", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no *.safetensors files" in err


def test_an_engine_process_that_dies_ends_its_requests_with_500(checkpoint):
    from rawgraph.serve.process import EngineProcess

    ep = EngineProcess(_serve_args(checkpoint[0]), Metrics())
    ep.start()
    try:
        assert ep.admitting and ep.metrics.kv_blocks_total > 0

        async def go():
            loop = asyncio.get_running_loop()
            job = Job(Request([5, 6, 7], 3), loop)
            ep.submit(job)
            served = [await job.events.get() for _ in range(2)]  # accepted, then tokens
            os.kill(ep._proc.pid, signal.SIGSTOP)  # the engine takes nothing more ...
            doomed = Job(Request([5, 6], 20), loop)
            ep.submit(doomed)
            os.kill(ep._proc.pid, signal.SIGKILL)  # ... and dies with a request open
            return served, await asyncio.wait_for(doomed.events.get(), 30)
        served, last = asyncio.run(go())
        assert served[0] == ("accepted",) and served[1][0] in ("tokens", "finish")
        assert last[0] == "error" and last[1].status == 500 and not ep.admitting
        with pytest.raises(APIError, match=r"shutting down|ended"):
            ep.submit(Job(Request([5], 2), None))
    finally:
        ep.stop()


def test_an_engine_link_follows_the_engine_draining_and_ending():
    import multiprocessing

    from rawgraph.serve.process import EngineLink

    ours, theirs = multiprocessing.Pipe()
    link = EngineLink(ours, Metrics())
    assert not link.ended and not link.admitting  # not started
    theirs.send(("ready", {"kv_blocks_total": 7}))
    link.start()
    assert link.admitting and not link.ended and link.metrics.kv_blocks_total == 7
    theirs.send(("draining",))
    _wait(lambda: link.draining and not link.admitting)
    with pytest.raises(APIError, match="shutting down"):
        link.submit(Job(Request([5], 2), None))
    theirs.close()  # the engine's process is gone: an HTTP process past the first then exits
    _wait(lambda: link.ended)
    link.stop()


def test_the_engine_process_sends_a_link_its_events_and_the_metrics_when_due(monkeypatch):
    # each iteration's events go to the link their job came by, with the engine's metrics
    # pickled once; a link whose jobs had no events gets the metrics when a job ends, when
    # nothing happened (idle), or when they are SNAPSHOT_S old; a job's finish forgets it
    import multiprocessing
    import pickle

    from rawgraph.serve import process

    pipes = [multiprocessing.Pipe() for _ in range(3)]
    links = process._Links([ours for ours, _ in pipes])
    a, b = Job(Request([5], 2), None), Job(Request([6], 2), None)
    for i, job in ((0, a), (2, b)):
        links.of[job], links.jobs[i, job.id] = i, job
    m = Metrics()
    m.running = 2

    def got() -> dict[int, tuple]:
        return {i: theirs.recv() for i, (_, theirs) in enumerate(pipes) if theirs.poll(0.2)}

    monkeypatch.setattr(process, "SNAPSHOT_S", 3600.0)
    links.post([(a, ("tokens", [7], None))], m, (2, 0))  # never told yet: every link
    first = got()
    assert sorted(first) == [0, 1, 2]
    assert first[0][1] == [(a.id, ("tokens", [7], None))] and first[1][1] == first[2][1] == []
    assert pickle.loads(first[1][2])["running"] == 2 and first[1][3] == (2, 0)
    links.post([(a, ("tokens", [8], None)),
                (Job(Request([1], 1), None), ("tokens", [1]))],  # an unknown job: nowhere
               m, (2, 0))
    second = got()
    assert list(second) == [0] and second[0][1] == [(a.id, ("tokens", [8], None))]
    m.running = 1
    links.post([(b, ("finish", "length", 0))], m, (1, 0))  # a job ends: every link
    third = got()
    assert sorted(third) == [0, 1, 2] and third[2][1] == [(b.id, ("finish", "length", 0))]
    assert third[0][1] == [] and pickle.loads(third[1][2])["running"] == 1
    assert b not in links.of and (2, b.id) not in links.jobs and a in links.of
    links.post([], m, (1, 0))  # nothing happened: the idle engine's state, everywhere
    assert sorted(got()) == [0, 1, 2]
    for ours, theirs in pipes:
        ours.close()
        theirs.close()


def test_a_stream_ends_quietly_when_its_client_goes_and_closes_itsevents():
    # the streamed response alone, over a fake connection. The client leaves while the
    # events wait: the handler returns (no CancelledError escapes to the server). A send
    # raises (a server of ASGI 2.4): the error propagates. Either way the events' generator
    # is closed, its `finally` being where a job is aborted
    from rawgraph.serve.app import _EventStream

    def scenario(leave: str) -> tuple[list, list, BaseException | None]:
        sent: list = []
        closed: list = []
        gone = asyncio.Event()

        async def lines():
            try:
                yield "data: 1\n\n"
                if leave == "waiting":
                    await asyncio.sleep(3600)  # an engine that never answers
                yield "data: 2\n\n"
            finally:
                closed.append(True)

        async def receive():
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
            if message.get("body") == b"data: 1\n\n":
                if leave == "waiting":
                    gone.set()
                elif leave == "raise":
                    raise OSError("the client went away")

        async def go() -> tuple[list, BaseException | None]:
            # what was closed when the handler ended (not at the loop's shutdown, which
            # finalizes any generator left open)
            try:
                await asyncio.wait_for(_EventStream(lines())({"type": "http"}, receive, send),
                                       5)
            except OSError as e:
                return list(closed), e
            return list(closed), None
        return sent, *asyncio.run(go())

    sent, closed, err = scenario("waiting")
    assert [m.get("body") for m in sent] == [None, b"data: 1\n\n"] and closed == [True]
    assert err is None
    sent, closed, err = scenario("raise")
    assert isinstance(err, OSError) and closed == [True]
    sent, closed, err = scenario("stays")
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert [m.get("body") for m in sent[1:]] == [b"data: 1\n\n", b"data: 2\n\n", b""]
    assert sent[-1]["more_body"] is False and closed == [True] and err is None


def test_a_checkpoint_as_transformers_5_writes_it(tmp_path, checkpoint):
    # the chat template in chat_template.jinja (not in tokenizer_config.json), sampling
    # defaults and more eos ids in generation_config.json; ignore_eos leaves the eos ids out
    import shutil

    from rawgraph.serve import protocol
    from rawgraph.serve.app import _requests
    from rawgraph.serve.engine import model_info

    root = tmp_path / "hf5"
    shutil.copytree(checkpoint[0], root)
    (root / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>",
                                                            "eos_token": "</s>"}))
    (root / "chat_template.jinja").write_text(TEMPLATE)
    (root / "generation_config.json").write_text(json.dumps({
        "eos_token_id": [2, 7], "temperature": 0.0, "top_k": 5, "repetition_penalty": 1.1,
        "min_p": 0.05}))
    info = model_info(_serve_args(root))
    assert info.template is not None and info.eos == (2, 7)  # config.json's 2, then 7
    assert info.sampling == {"temperature": 0.0, "top_k": 5, "repetition_penalty": 1.1}
    assert info.unapplied == ("min_p=0.05",)
    g = protocol.parse({"messages": [{"role": "user", "content": "w5"}]}, True, "m",
                       info.sampling)
    req, = _requests(g, info)
    assert req.prompt[0] == 1 and req.sampling.temperature == 0.0 and req.sampling.top_k == 5
    assert req.sampling.repetition_penalty == pytest.approx(1.1)
    assert set(info.eos) <= set(req.stop)
    g = protocol.parse({"prompt": [5, 6], "ignore_eos": True}, False, "m", info.sampling)
    assert not set(info.eos) & set(_requests(g, info)[0].stop)


def _whole_choices(served, route, body):
    r = httpx.post(f"{served.url}/v1/{route}", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_batch_of_prompts_and_n_samples_each_are_choices_in_order(served):
    # choice i * n + j is prompt i's sample j (seeded seed + j): each the engine's own tokens
    prompts, n = [[5, 6, 7], list(range(10, 30)), [9]], 2
    body = {"prompt": prompts, "n": n, "max_tokens": 6, "temperature": 0.9, "seed": 40}
    whole = _whole_choices(served, "completions", body)
    assert [c["index"] for c in whole["choices"]] == list(range(len(prompts) * n))
    for i, p in enumerate(prompts):
        for j in range(n):
            alone = _whole_choices(served, "completions", {**body, "prompt": p, "n": 1,
                                                          "seed": 40 + j})
            assert whole["choices"][i * n + j]["token_ids"] == \
                alone["choices"][0]["token_ids"]
    assert whole["usage"]["prompt_tokens"] == sum(map(len, prompts))  # each prompt once
    assert whole["usage"]["completion_tokens"] == sum(
        len(c["token_ids"]) for c in whole["choices"])
    # streamed: every choice's chunks (its index) add up to its whole text, one final chunk
    with httpx.stream("POST", f"{served.url}/v1/completions", timeout=60,
                      json={**body, "stream": True,
                            "stream_options": {"include_usage": True}}) as r:
        chunks = events(r.iter_lines())
    assert chunks[-1]["usage"] == whole["usage"]
    for c in whole["choices"]:
        mine = [k["choices"][0] for k in chunks[:-1] if k["choices"][0]["index"] == c["index"]]
        assert [t for x in mine for t in x["token_ids"]] == c["token_ids"]
        assert "".join(x["text"] for x in mine) == c["text"]
        assert [x["finish_reason"] for x in mine][-1] == c["finish_reason"]
        assert all(x["finish_reason"] is None for x in mine[:-1])


def test_chat_with_n_choices_streams_each_from_its_role(served):
    msgs = [{"role": "user", "content": "w5 w6 w7"}]
    body = {"messages": msgs, "n": 3, "max_tokens": 5, "temperature": 0}
    whole = _whole_choices(served, "chat/completions", body)
    texts = [c["message"]["content"] for c in whole["choices"]]
    assert len(texts) == 3 and len(set(texts)) == 1  # greedy: the same answer thrice
    with httpx.stream("POST", f"{served.url}/v1/chat/completions", timeout=60,
                      json={**body, "stream": True}) as r:
        chunks = events(r.iter_lines())
    for i in range(3):
        mine = [k["choices"][0] for k in chunks if k["choices"][0]["index"] == i]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(x["delta"].get("content", "") for x in mine) == texts[i]


def test_a_refused_choice_queues_none_of_them(checkpoint):
    # a queue with room for one: the second choice is refused (429) and the first aborted
    s = Served(checkpoint[1], max_queue=1, start=False)
    try:
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": [5], "n": 2,
                                                        "max_tokens": 3})
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
        s.worker.start()
        deadline = time.monotonic() + 10
        while s.worker.load != (0, 0):
            assert time.monotonic() < deadline, s.worker.load
            time.sleep(0.01)
        assert _used_blocks(s) == 0
    finally:
        s.close()


def test_a_prompt_that_starts_with_a_cached_prefix_says_so_in_usage_and_metrics(served):
    head = [int(t) for t in np.random.default_rng(7).integers(3, CFG.vocab, 64)]  # a block
    body = {"prompt": [*head, 5, 6], "max_tokens": 4, "temperature": 0, "stop_token_ids": []}
    first = httpx.post(f"{served.url}/v1/completions", json=body).json()
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    again = httpx.post(f"{served.url}/v1/completions", json=body).json()
    assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": 64}
    assert again["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]
    with httpx.stream("POST", f"{served.url}/v1/completions", json=body | {
            "prompt": [*head, 9], "stream": True, "stream_options": {"include_usage": True}}
            ) as r:
        chunks = events(r.iter_lines())
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 64}
    text = httpx.get(f"{served.url}/metrics").text
    assert sample(text, "prefix_cache_hit_tokens_total") >= 128
    assert sample(text, "prefix_cache_blocks") >= 1
    assert 0 < sample(text, "prefix_cache_hit_rate") < 1
    assert sample(text, "request_cached_tokens_count") >= 3


@pytest.mark.parametrize(("flag", "cached"), [([], True), (["--no-prefix-cache"], False)])
def test_the_prefix_cache_is_on_unless_turned_off(flag, cached):
    from rawgraph.cli import parser
    from rawgraph.serve.engine import build

    args = parser().parse_args(["serve", "--reference", *flag])
    engine, _ = build(args)
    assert (engine.prefix is not None) == cached
