"""`rawgraph bench serve`'s harness on the CPU: the same load, faults and counts as on the
GPU, against `rawgraph serve --reference` (the tiny preset on the NumPy decoder)."""

import math

import pytest

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from rawgraph.bench.serve import Load, burst, client_requests, measure


def test_the_plan_is_seeded_and_mixes_streams_faults_and_a_burst():
    load = Load(preset="tiny", requests=40, malformed=8, burst_extra=10)
    a, b = client_requests(load, 512), client_requests(load, 512)
    assert [(p.at, p.prompt, p.max_tokens, p.leave_after, p.bad) for p in a] == \
        [(p.at, p.prompt, p.max_tokens, p.leave_after, p.bad) for p in b]
    assert len(a) == 48 and len(burst(load)) == 50
    assert {p.bad for p in a} == {"", "json", "field", "max_tokens", "context"}
    assert 0 < sum(p.leave_after > 0 for p in a) < 40
    assert all(load.prompt[0] <= len(p.prompt) <= load.prompt[1] for p in a if not p.bad)


@pytest.mark.parametrize(("decode_chunk", "http", "clients"), [(None, 1, 4), (8, 1, 4),
                                                                 (None, 2, 2)])
def test_a_run_loses_no_token_and_leaks_no_block(decode_chunk, http, clients):
    load = Load(preset="tiny", reference=True, requests=24, rate=100.0, prompt=(4, 40),
                output=(4, 24), max_batch=4, max_context=96, burst_extra=80, malformed=8,
                decode_chunk=decode_chunk, http_processes=http, clients=clients)
    row = measure(load)
    assert row["decode chunk"] == (decode_chunk or 96) and row["HTTP processes"] == http
    assert row["client processes"] == clients
    assert row["completed"] + row["cancelled"] == 24 and row["cancelled"] > 0
    assert row["refused 4xx"] == 8 and row["unexpected"] == 0
    # a burst well past the queue, so that it overflows even when a loaded machine's clients
    # send it no faster than the engine drains it
    assert row["burst 429"] + row["burst ok"] == 24 + 80 and row["burst 429"] > 0
    assert row["tokens lost"] == 0 and row["KV blocks leaked"] == 0
    assert row["streams unlike offline"] == 0  # one float32 decoder: batch-invariant
    assert row["recovered"] and row["exit"] == 0
    assert row["served tok/s"] > 0 and row["offline tok/s"] > 0
    # the server's histograms: decode-only and mixed iterations both ran, and its thread's
    # period is at least an iteration
    assert 0 < row["server decode p50 ms"] <= row["server decode p99 ms"]
    assert 0 < row["server mixed p50 ms"] <= row["server mixed p99 ms"]
    # the reference decoder's host work is its whole iteration (each from its own buckets)
    assert 0 < row["server mixed host p50 ms"] < 2 * row["server mixed p99 ms"]
    assert row["server period p99 ms"] >= row["server decode p50 ms"]
    # the ITL as the HTTP side relays tokens: from the HTTP processes' summed histograms
    assert 0 < row["server ITL p50 ms"] <= row["server ITL p99 ms"]
    # rows join and leave through the load: most steps continued the last on the device
    # (rows keep their places), a few were fed from the host
    assert 0 < row["continued share"] < 1  # the first step, and bucket changes, are fed
    assert row["server fed decode p99 ms"] > 0 or row["server fed mixed p99 ms"] > 0
    assert row["gc frozen objects"] > 1000 and row["gc full passes"] >= 0
    assert row["graph captures in load"] == 0 == row["graph evictions"]  # no graphs here


@pytest.mark.parametrize("stream", [True, False])
def test_a_closed_loop_keeps_its_clients_busy_and_loses_nothing(stream):
    # 6 clients in a closed loop over 3 processes (2 each), 18 requests: each client sends
    # its next request when its last ends; no faults, no burst; streamed or whole responses
    load = Load(preset="tiny", reference=True, requests=18, prompt=(16, 16), output=(8, 8),
                leave=0.0, malformed=0, max_batch=4, max_context=96, clients=3, closed=6,
                stream=stream)
    assert all(p.at == 0.0 for p in client_requests(load, 512))
    row = measure(load)
    assert row["closed-loop clients"] == 6 and row["sent"] == 18 == row["completed"]
    assert row["streamed"] == stream
    if not stream:  # one answer each: no inter-token latency, no first token alone
        assert math.isnan(row["ITL p99 ms"]) and math.isnan(row["TTFT p50 ms"])
    assert row["cancelled"] == 0 == row["unexpected"] and row["burst ok"] == 0
    assert row["tokens lost"] == 0 and row["KV blocks leaked"] == 0
    assert row["streams unlike offline"] == 0
    assert row["served tok/s"] > 0 and row["exit"] == 0
    # 6 clients on 4 rows: the batch runs full but for the gaps and the tail
    assert 1 <= row["mean decode rows"] <= 4


def test_the_closed_loop_rows():
    from rawgraph.bench.serve import CLOSED, HTTP_PROCESSES, closed_load

    loads = [closed_load(*row) for row in CLOSED]
    assert all(ld.closed >= ld.max_batch and ld.requests == 512 for ld in loads)
    assert {(ld.preset, ld.max_batch) for ld in loads} == {("llama-1b", 64), ("llama-1b", 128),
                                                           ("llama-8b", 64)}
    assert any(ld.closed > ld.max_batch for ld in loads)  # beyond the batch too
    assert {(ld.preset, ld.max_batch, ld.stream) for ld in loads if ld.closed == ld.max_batch} \
        == {(p, b, s) for p, b in (("llama-1b", 64), ("llama-1b", 128), ("llama-8b", 64))
            for s in (True, False)}  # streamed and whole
    # 1B's streams, whose one event loop falls behind the engine, over several loops too
    assert {(ld.max_batch, ld.http_processes) for ld in loads if ld.http_processes > 1} \
        == {(64, HTTP_PROCESSES), (128, HTTP_PROCESSES)}


def test_the_served_window_is_the_clients_first_send_to_their_last_answer():
    # client processes that start late, and results on their way back, are not serving time
    from rawgraph.bench import serve as bench_serve

    class Pool:  # two client processes that answer at once, with their requests' times
        def map(self, fn, args):
            return [[{"sent": 100.0, "ended": 101.5}, {"sent": 100.2, "ended": 102.0}],
                    [{"sent": 100.1, "ended": 101.0}]]

    load = bench_serve.Load(preset="tiny", clients=2)
    out, wall = bench_serve._send(Pool(), "http://x", [], load)
    assert len(out) == 3 and wall == pytest.approx(2.0)
