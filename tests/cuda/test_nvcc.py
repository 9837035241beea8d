"""Every kernel compiles with nvcc for sm_90 without register spills (no GPU needed)."""

import shutil

import pytest

from rawgraph.cuda.kernel import KERNELS_DIR
from rawgraph.cuda.nvcc import (
    compile_file,
    noncoherent_loads,
    nvrtc_compile,
    nvrtc_ptx,
    parse_ptxas,
)

LOG = """ptxas info    : Compiling entry function 'a' for 'sm_90'
ptxas info    : Function properties for a
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers
ptxas info    : Compiling entry function 'b' for 'sm_90'
ptxas info    : Function properties for b
    40 bytes stack frame, 16 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 255 registers
"""


def test_parse_ptxas_finds_registers_and_spills():
    regs, spills = parse_ptxas(LOG)
    assert regs == {"a": 24, "b": 255} and spills == {"a": 0, "b": 24}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("path", sorted(KERNELS_DIR.glob("*.cu")), ids=lambda p: p.name)
def test_kernel_compiles_for_sm90_without_spills(path):
    r = compile_file(path, "sm_90")
    assert r.returncode == 0, r.log
    assert r.registers, f"no kernels found in {path.name}:\n{r.log}"
    assert not any(r.spills.values()), f"spills: {r.spills}\n{r.log}"


def test_nvrtc_log_leaves_shared_bytes_alone(tmp_path):
    ok_src = tmp_path / "ok.cu"
    ok_src.write_text('extern "C" __global__ void k(float* y) { y[0] = 1.f; }\n')
    assert nvrtc_compile(ok_src) == (True, "")
    assert b" " == bytes([32]) and b" " * 3 == b"   "  # an empty log once overwrote b" "


def test_nvrtc_rejects_what_only_nvcc_accepts(tmp_path):
    bad = tmp_path / "inf.cu"
    bad.write_text('extern "C" __global__ void k(float* y) { y[0] = -INFINITY; }\n')
    ok, log = nvrtc_compile(bad)
    assert not ok and "INFINITY" in log


# files whose kernels read weights (never written after loading) through the read-only path,
# and stream_read.cu, whose loads all come after its PDL wait (the GEMV's loads, as a ceiling)
WEIGHT_READERS = {"gemv.cu", "gemv_quant.cu", "gemm.cu", "embedding.cu", "rmsnorm.cu", "rope.cu",
                  "rope_append.cu", "stream_read.cu"}


@pytest.mark.parametrize("path", sorted(KERNELS_DIR.glob("*.cu")), ids=lambda p: p.name)
def test_kernel_compiles_with_nvrtc_and_reads_only_weights_through_the_read_only_cache(path):
    # NVRTC is what compiles at run time (nvrtc_ptx raises with its log if it fails).
    # Under programmatic dependent launch a kernel starts while the previous one still
    # writes; ld.global.nc of such data can hit stale lines (1B decode tokens once varied
    # from run to run that way). const __restrict__ lets the compiler pick it, so activation
    # pointers carry no __restrict__.
    n = noncoherent_loads(nvrtc_ptx(path))
    assert path.name in WEIGHT_READERS or n == 0, f"{path.name}: {n} ld.global.nc loads"


def test_noncoherent_loads_counts_only_nc():
    ptx = "ld.global.nc.v4.u32 {a}, [p];\nld.global.v4.u32 {b}, [q];\nld.global.nc.f32 c, [r];"
    assert noncoherent_loads(ptx) == 2


def test_kernels_include_their_headers_from_kernels_cu_not_the_working_directory(
        tmp_path, monkeypatch):
    # quoted includes are searched in the working directory first: a user's own mma.cuh or
    # common.cuh there would have been compiled into rawgraph's kernels
    for header in KERNELS_DIR.glob("*.cuh"):
        (tmp_path / header.name).write_text('#error "a decoy in the working directory"\n')
    monkeypatch.chdir(tmp_path)
    for name in ("prefill_attention.cu", "gemv.cu", "gemm_sm90.cu"):
        ok, log = nvrtc_compile(KERNELS_DIR / name)
        assert ok, f"{name}: {log}"
