"""The command line works without a GPU."""

from pathlib import Path

import pytest

from rawgraph.cli import main


def test_info_runs_anywhere(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "cuda-bindings" in out and "device" in out


def test_info_says_what_a_models_weights_take_quantized(capsys):
    assert main(["info", "--model", "llama-70b"]) == 0
    out = capsys.readouterr().out
    assert "131.42 GiB" in out  # 16-bit: 141.1 GB, all of an H200 and more
    fp8 = next(line for line in out.splitlines() if line.startswith("--quantize fp8"))
    alone = float(fp8.split(", ")[1].split()[0])
    assert 65 < alone < 75 and "with --quantized-only" in fp8


def test_check_kernels_reports(capsys, monkeypatch):
    # the compiles themselves are tests/cuda/test_nvcc.py's (once per file); here the command
    from rawgraph.cuda import nvcc

    ok = nvcc.Report(Path("a.cu"), 0, "", {"k": 40}, {"k": 0})
    spills = nvcc.Report(Path("b.cu"), 0, "ptxas: spills", {"j": 255}, {"j": 24})
    monkeypatch.setattr(nvcc, "nvcc_path", lambda: "/usr/bin/nvcc")
    monkeypatch.setattr(nvcc, "compile_all", lambda arch, nvcc, nvrtc: [ok])
    assert main(["check-kernels"]) == 0
    assert "all 1 kernel files compile for sm_90 with nvcc and NVRTC with no spills" in \
        capsys.readouterr().out
    monkeypatch.setattr(nvcc, "compile_all", lambda arch, nvcc, nvrtc: [ok, spills])
    assert main(["check-kernels", "--compiler", "nvrtc"]) == 1
    captured = capsys.readouterr()
    assert "SPILLS b.cu" in captured.out and "1 of 2 kernel files failed" in captured.err


def _error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(("argv", "match"), [
    (["demo", "--preset", "nosuch"], "--preset 'nosuch': choose one of tiny"),
    (["demo", "--model", "/nonexistent"], "--model /nonexistent: not a directory"),
    (["demo", "--max-batch", "0"], "--max-batch: 0 must be at least 1"),
    (["demo", "--max-batch", "257"], "--max-batch 257: 1 to 256"),
    (["demo", "--requests", "many"], "'many' is not an integer"),
    (["demo", "--max-context", "100", "--chunk", "64"], "need up to 448 tokens"),
    (["serve", "--preset", "nosuch"], "--preset 'nosuch': choose one of tiny"),
    (["serve", "--reference", "--mixed"], "--mixed: the reference decoder"),
    (["serve", "--model", "/nonexistent"], "--model /nonexistent: not a directory"),
    (["serve", "--preset", "llama-8b", "--reference"], "--reference runs the NumPy decoder"),
    (["serve", "--port", "70000"], "--port 70000: 1 to 65535"),
    (["serve", "--max-queue", "0"], "--max-queue: 0 must be at least 1"),
    (["serve", "--max-context", "64"], "--chunk 256 exceeds --max-context 64"),
    (["serve", "--decode-chunk", "300"], "--decode-chunk 300 exceeds --chunk 256"),
    (["serve", "--request-timeout", "0"], "--request-timeout 0.0: seconds, more than 0"),
    (["serve", "--grace", "-1"], "--grace -1.0: seconds, 0 or more"),
    (["serve", "--http-processes", "0"], "--http-processes: 0 must be at least 1"),
    (["serve", "--batch-invariant", "--mixed"], "--mixed with --batch-invariant: a mixed"),
    (["serve", "--reference", "--quantize", "fp8"], "--quantize fp8: the reference decoder"),
    (["serve", "--batch-invariant", "--quantize", "fp8"], "--quantize fp8 with --batch-inv"),
    (["serve", "--quantize", "int3"], "argument --quantize: invalid choice: 'int3'"),
    (["demo", "--quantize", "fp4"], "argument --quantize: invalid choice: 'fp4'"),
    (["demo", "--quantized-only"], "--quantized-only: with --quantize fp8 or int4"),
    (["serve", "--quantized-only"], "--quantized-only: with --quantize fp8 or int4"),
    (["serve", "--http-processes", "2", "--engine", "thread"],
     "--http-processes 2: the HTTP processes share an engine in a process of its own"),
    (["bench", "nosuch"], "invalid choice: 'nosuch'"),
    (["bench", "decode", "--only", "profile:x:y"], "profile\\[:PRESET\\]:BATCH:CONTEXT"),
    (["bench", "decode", "--only", "profile:llama-70b:8:1024"], "a preset of \\['llama-1b'"),
    (["bench", "decode", "--only", "llama-405b"], "matches no preset"),
    (["bench", "prefill", "--only", "profile:0"], "profile\\[:PRESET\\]:CHUNK:PAST"),
    (["bench", "prefill", "--only", "profile:llama-70b:2048"], "a preset of \\['llama-1b'"),
    (["bench", "prefill", "--only", "profile:4096:130000"], "at most 131072 tokens of context"),
    (["bench", "prefill", "--only", "prefix:llama-70b"], "prefix\\[:PRESET\\] with a preset"),
    (["bench", "decode", "--only", "profile:llama-8b:512:1024"], "and 256 rows"),
    (["bench", "kernels", "--only", "gemv,nope"], "unknown parts \\['nope'\\]"),
    (["bench", "memory", "--only", "x"], "takes no --only"),
    (["check-kernels", "--arch", "ampere"], "--arch 'ampere'"),
    (["nosuch"], "invalid choice"),
])
def test_user_errors_are_one_line_and_exit_2(capsys, argv, match):
    import re

    assert re.search(match, _error(capsys, argv))


@pytest.mark.parametrize("command", ["demo", "serve"])
def test_a_checkpoints_config_is_checked_before_the_gpu_is_looked_for(capsys, tmp_path, command):
    # a CPU-only machine learns of a bad --model from its config.json, not "needs a GPU"
    (tmp_path / "config.json").write_text("{not json")
    assert "config.json: not JSON" in _error(capsys, [command, "--model", str(tmp_path)])
    (tmp_path / "config.json").write_text('{"model_type": "llama", "hidden_size": 64}')
    assert "config.json" in _error(capsys, [command, "--model", str(tmp_path)])
    (tmp_path / "config.json").unlink()
    assert "no config.json" in _error(capsys, [command, "--model", str(tmp_path)])


def test_gpu_commands_without_a_gpu(capsys, monkeypatch):
    from rawgraph import cli

    monkeypatch.setattr(cli, "available", lambda: (False, "no CUDA driver"))
    assert "bench decode needs a CUDA GPU (no CUDA driver)" in _error(capsys, ["bench", "decode"])
    assert "--reference serves the NumPy decoder on the CPU" in _error(capsys, ["serve"])
    assert main(["demo"]) == 0  # the README's main job: says so, runs nothing
    assert "nothing ran" in capsys.readouterr().out
    from rawgraph.cuda import nvcc

    monkeypatch.setattr(nvcc, "nvcc_path", lambda: None)
    assert "nvcc is not on PATH" in _error(capsys, ["check-kernels"])


def test_plain_rawgraph_prints_the_help_with_every_default(capsys):
    assert main([]) == 0
    assert "COMMAND" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # as argparse wraps it at any width
    assert "(default: tiny)" in out and "(default: 1024)" in out and "(default: 256)" in out
