"""tests/sanitize.py's summary of compute-sanitizer output (CPU)."""

from pathlib import Path

from tests import sanitize
from tests.sanitize import summarize


def test_clean_runs_are_clean_and_errors_or_failures_are_not():
    clean = "========= ERROR SUMMARY: 0 errors\n5 passed in 3.2s\n" \
            "========= ERROR SUMMARY: 0 errors\n===== 3 passed, 1 skipped in 2.0s =====\n"
    assert summarize("memcheck", clean, 0) == (True, "memcheck   0 errors; 8 passed, 1 skipped")
    race = "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n4 passed in 1s"
    assert summarize("racecheck", race, 0)[0]
    assert not summarize("racecheck", race.replace("0 hazards", "2 hazards"), 0)[0]
    assert not summarize("memcheck", "========= ERROR SUMMARY: 2 errors\n4 passed in 1s", 97)[0]
    assert not summarize("memcheck", "========= ERROR SUMMARY: 0 errors\n1 failed, 3 passed in 1s",
                         1)[0]
    assert summarize("initcheck", "Segmentation fault", -11) == (
        False, "initcheck  no summary; no pytest summary (crashed?)")


def test_racecheck_filter_names_every_kernel_rawgraph_defines():
    # the filter keeps racecheck on rawgraph's kernels: a kernel it missed would go unchecked
    root = Path(__file__).resolve().parent.parent / "kernels_cu"
    names = sanitize.rawgraph_kernels(root)
    defined = sum(s.count("__global__") for s in (f.read_text() for f in root.glob("*.cu")))
    assert len(names) == len(set(names)) == defined > 50
    assert {"rmsnorm_f16", "gemv_bf16_n16_u4_t", "sample_bf16"} <= set(names)
