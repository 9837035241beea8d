"""The PyTorch peer of the benchmarks, without torch: what runs it, what a missing or failing
peer gives, and where its numbers land in `bench decode`'s rows."""


import pytest

from rawgraph.bench import decode, peer

ECHO = """import json, sys
cases = sys.argv[sys.argv.index("--cases") + 1].split(",")
rows = [{"B": int(c.split(":")[0]), "context": int(c.split(":")[1]), "ms": 2.0,
         **({"compiled ms": 1.5} if c.startswith("1:") and "--compile" in sys.argv else {})}
        for c in cases]
rows[-1] = {**rows[-1], "skipped": "no room"}
print(json.dumps(rows))
"""


@pytest.fixture
def script(tmp_path, monkeypatch):
    def make(text):
        path = tmp_path / "torch_reference.py"
        path.write_text(text)
        monkeypatch.setattr(peer, "SCRIPT", path)
        monkeypatch.setattr(peer, "missing", lambda: None)
        return path
    return make


def test_a_missing_script_or_torch_is_a_reason_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(peer, "SCRIPT", tmp_path / "none.py")
    assert peer.measure("decode", [(1, 1024)]) == ([], f"{tmp_path / 'none.py'} not found "
                                                       "(a source checkout has it)")
    monkeypatch.setattr(peer, "SCRIPT", peer.Path(__file__))
    monkeypatch.setattr(peer.importlib.util, "find_spec", lambda name: None)
    assert peer.measure("decode", [(1, 1024)])[1] == "torch is not importable"
    monkeypatch.setenv("RAWGRAPH_NO_PEER", "1")  # asked not to run: said so, nothing run
    assert peer.measure("decode", [(1, 1024)]) == ([], "RAWGRAPH_NO_PEER is set")


def test_the_repository_has_the_script():
    assert peer.SCRIPT.is_file() and peer.SCRIPT.parent.name == "benchmarks"


def test_a_failing_peer_is_reported_with_its_last_words(script):
    script("import sys; print('cuda out of memory', file=sys.stderr); sys.exit(1)")
    rows, why = peer.measure("decode", [(1, 1024)], preset="llama-1b")
    assert rows == [] and why.endswith("cuda out of memory")
    script("print('loading...'); print('[{\"B\": 1, \"context\": 8, \"ms\": 1.0}]')")
    assert peer.measure("decode", [(1, 8)])[0] == [{"B": 1, "context": 8, "ms": 1.0}]
    script("print('no rows here')")
    assert peer.measure("decode", [(1, 8)])[1].endswith("printed no rows: no rows here")


def test_the_peer_s_rows_land_beside_ours(script):
    script(ECHO)
    ours = [{"preset": "llama-1b", "B": 1, "context": 1024, "overlapped ms": 0.8},
            {"preset": "llama-1b", "B": 8, "context": 4096, "overlapped ms": 1.0},
            {"preset": "llama-1b", "B": "all", "capture ms": 50.0},
            {"preset": "llama-1b", "B": 128, "context": 4096, "overlapped ms": 4.0}]
    rows = decode.with_peer(ours, "llama-1b")
    assert rows[0]["PyTorch ms"] == 2.0 and rows[0]["speed-up"] == pytest.approx(2.5)
    assert rows[0]["PyTorch compiled ms"] == 1.5 and "PyTorch compiled ms" not in rows[1]
    assert rows[1]["speed-up"] == pytest.approx(2.0)
    assert "PyTorch ms" not in rows[2]  # not a decode case
    assert rows[3]["PyTorch ms"] == "skipped" and rows[3]["speed-up"] == ""


def test_a_row_s_goal():
    assert decode.goal_ms("llama-1b", 1, 1024, 0.60) == pytest.approx(0.74)  # published
    assert decode.goal_ms("llama-8b", 1, 1024, 3.61) == pytest.approx(3.80)
    assert decode.goal_ms("llama-8b", 64, 2048, 7.70) == pytest.approx(1.2 * 7.70)
    assert decode.goal_ms("llama-1b", 8, 1024, 0.50) == pytest.approx(0.64)  # floor + 0.14


ATTENTION = """import json, sys
cases = sys.argv[sys.argv.index("--cases") + 1].split(",")
rows = []
for c in cases:
    S, d = map(int, c.split(":"))
    rows += [{"S": S, "head_dim": d, "backend": "flash", "us": 100.0},
             {"S": S, "head_dim": d, "backend": "cudnn", "us": 50.0},
             {"S": S, "head_dim": d, "backend": "efficient", "skipped": "no"}]
print(json.dumps(rows))
"""


def test_prefill_attention_rows_meet_pytorch_s_fastest_backend(script):
    from rawgraph.bench import compute

    script(ATTENTION)
    rows = [{"kernel": "prefill attention d=128 r=64", "us": 60.0, "S": 4096, "head_dim": 128,
             "TFLOP/s": 500.0, "target": ">= 470 TFLOP/s", "ok": True},
            {"kernel": "prefill attention d=64 r=64", "us": 50.0, "S": 1024, "head_dim": 64},
            {"kernel": "gemm", "us": 1.0}]
    compute.attention_peer(rows)
    assert rows[0]["PyTorch backend"] == "cudnn" and rows[0]["x PyTorch"] == pytest.approx(50 / 60)
    assert rows[0]["target"] == ">= 470 TFLOP/s and >= 0.9x PyTorch" and rows[0]["ok"] is False
    assert rows[1]["x PyTorch"] == 1.0 and rows[1]["ok"] is True
    assert "PyTorch us" not in rows[2]


PREFILL = """import json, sys
cases = sys.argv[sys.argv.index("--cases") + 1].split(",")
assert sys.argv[sys.argv.index("--preset") + 1] == "llama-8b"
print(json.dumps([{"tokens": int(c), "ms": 10.0 * int(c) / 512} for c in cases]))
"""


def test_time_to_first_token_rows_get_pytorch_s_forward(script):
    from rawgraph.bench import prefill

    script(PREFILL)
    rows = [{"preset": "llama-8b", "prompt": 512, "chunk": 256, "TTFT ms": 8.0},
            {"preset": "llama-8b", "prompt": 2048, "chunk": 256, "TTFT ms": 50.0},
            {"preset": "llama-8b", "prompt": "8192 beside 8 decoding", "chunk": 256,
             "decode-only iteration ms": 5.0}]
    prefill.with_peer(rows, "llama-8b")
    assert rows[0]["PyTorch ms"] == 10.0 and rows[0]["x PyTorch"] == 1.25 and rows[0]["ok"]
    assert rows[1]["x PyTorch"] == pytest.approx(0.8) and rows[1]["ok"] is False
    assert "PyTorch ms" not in rows[2]



def test_the_peer_finds_the_rawgraph_that_runs_the_bench(script, monkeypatch):
    # started from a checkout's root without PYTHONPATH (python -m rawgraph.cli there, no
    # install), the script in benchmarks/ must still import rawgraph for its presets: it
    # runs with this rawgraph's folder first on its path, the caller's path after it
    script("import json, os\nprint(json.dumps([{'path': os.environ['PYTHONPATH']}]))")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert peer.measure("decode", [(1, 8)]) == ([{"path": str(peer.ROOT)}], "")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    want = f"{peer.ROOT}{peer.os.pathsep}/elsewhere"
    assert peer.measure("decode", [(1, 8)]) == ([{"path": want}], "")
