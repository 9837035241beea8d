"""Signatures: parsing, cross-check against the .cu source, value checks, argument storage."""

import ctypes
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from rawgraph.cuda.kernel import KERNELS_DIR, Kernel
from rawgraph.cuda.signature import ArgPack, Signature, decode
from rawgraph.ops.elementwise import ADD, SILU_MUL
from rawgraph.ops.norm import RMSNORM


def test_parse_normalises_types_and_names():
    sig = Signature.parse("const __half* __restrict__ x, float  *y, unsigned int n, float eps")
    assert [(p.name, p.ctype) for p in sig.params] == [
        ("x", "const __half*"), ("y", "float*"), ("n", "unsigned int"), ("eps", "float")]
    assert [p.size for p in sig.params] == [8, 8, 4, 4]
    assert [p.is_output for p in sig.params] == [False, True, False, False]
    assert sig.params[0].pointee == "__half"


@pytest.mark.parametrize("bad", ["struct foo x", "int", "int a, int a", "float3 v"])
def test_parse_rejects(bad):
    with pytest.raises(ValueError):
        Signature.parse(bad)


def test_from_source_reads_extern_c_line(tmp_path: Path):
    src = tmp_path / "k.cu"
    src.write_text('// extern "C" __global__ void k(int wrong)\n'
                   'extern "C" __global__ void __launch_bounds__(256) k(const float* a,\n'
                   '    float* b, int n) { }\n')
    assert Signature.from_source(src, "k") == Signature.parse("const float* a, float* b, int n")
    with pytest.raises(ValueError, match="no `extern"):
        Signature.from_source(src, "other")


@pytest.mark.parametrize("kernel", [*ADD.values(), *SILU_MUL.values(), *RMSNORM.values()])
def test_every_declared_kernel_matches_its_source(kernel):
    assert kernel.sig == Signature.from_source(KERNELS_DIR / f"{kernel.op}.cu", kernel.name)


def test_declared_signature_mismatch_raises():
    with pytest.raises(ValueError, match="declared in Python"):
        Kernel("add", "add_f16", "const __half* a, const __half* b, __half* out, long long n")


def test_missing_source_raises():
    with pytest.raises(FileNotFoundError, match="no kernel source"):
        Kernel("no_such_op", "k", "int n")


def _arr(ptr, dtype):
    return SimpleNamespace(data=SimpleNamespace(ptr=ptr), dtype=np.dtype(dtype))


def test_convert_accepts_arrays_ints_none_and_numpy_scalars():
    sig = Signature.parse("const __half* x, __nv_bfloat16* y, void* z, int n, float eps")
    got = sig.convert([_arr(0x1000, "float16"), _arr(0x2000, "uint16"), None, np.int32(5), 1])
    assert got == (0x1000, 0x2000, 0, 5, 1.0)


@pytest.mark.parametrize(("values", "err", "match"), [
    ([_arr(16, "float32"), 1], TypeError, "needs float16"),
    ([_arr(16, "float16")], TypeError, "expected 2 arguments"),
    ([_arr(16, "float16"), 2**31], ValueError, "outside"),
    ([_arr(16, "float16"), 1.5], TypeError, "needs an integer"),
    ([_arr(16, "float16"), True], TypeError, "bool"),
    (["x", 1], TypeError, "device array"),
    ([-1, 1], ValueError, "address"),
])
def test_convert_rejects_with_the_parameter_named(values, err, match):
    sig = Signature.parse("const __half* x, int n")
    with pytest.raises(err, match=match):
        sig.convert(values, "k")


def test_argpack_layout_and_decode_roundtrip():
    sig = Signature.parse("const float* x, int n, float eps, unsigned long long big, double d")
    pack = ArgPack(sig)
    vals = sig.convert([0xDEADBEEF000, -7, 0.25, 2**63 + 5, -1.5])
    pack.write(vals)
    ptrs = (ctypes.c_void_p * 5).from_address(pack.address)
    assert struct.unpack("i", ctypes.string_at(ptrs[1], 4))[0] == -7
    assert decode(sig, pack.address) == vals
    pack.write(sig.convert([1, 2, 3.0, 4, 5.0]))
    assert decode(sig, pack.address) == (1, 2, 3.0, 4, 5.0)


def test_descriptor_parameters_are_128_bytes_by_value():
    sig = Signature.parse("const __grid_constant__ TensorMap xmap, const __half* r, int m, "
                          "const __grid_constant__ TensorMap wmap, float s")
    assert [(p.ctype, p.size, p.is_blob) for p in sig.params[:2]] == [
        ("const TensorMap", 128, True), ("const __half*", 8, False)]
    pack = ArgPack(sig)
    a, b = bytes(range(128)), bytes(range(128, 256))
    vals = sig.convert([a, 0xABC0, -3, b, 0.5])
    pack.write(vals)
    ptrs = (ctypes.c_void_p * 5).from_address(pack.address)
    assert ctypes.string_at(ptrs[0], 128) == a and ctypes.string_at(ptrs[3], 128) == b
    assert struct.unpack("i", ctypes.string_at(ptrs[2], 4))[0] == -3
    assert pack.values == vals
    assert [pack.offset(i) for i in range(5)] == [40, 168, 176, 184, 312]  # after 5 pointers
    pack.write_slots((2,), (9,))
    assert pack.values[2] == 9 and pack.values[3] == b


@pytest.mark.parametrize("value, match", [(b"\0" * 64, "needs 128 bytes"), (7, "needs 128"),
                                          (None, "needs 128")])
def test_descriptor_values_are_checked(value, match):
    sig = Signature.parse("const __grid_constant__ TensorMap xmap")
    with pytest.raises(TypeError, match=match):
        sig.convert([value], "k")


def test_the_compiled_text_changes_with_any_header(tmp_path, monkeypatch):
    # CuPy's compile cache keys on the source text and options, not on included headers:
    # the text carries the headers' digest, so a header changed alone is compiled again
    from rawgraph.cuda import kernel

    for path in KERNELS_DIR.iterdir():
        if path.suffix in (".cu", ".cuh"):
            (tmp_path / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(kernel, "KERNELS_DIR", tmp_path)
    kernel.headers_digest.cache_clear()
    try:
        before = kernel.module_source("prefill_attention")
        assert before.split("\n", 1)[1] == (tmp_path / "prefill_attention.cu").read_text()
        with open(tmp_path / "mma.cuh", "a") as f:
            f.write("// an edit\n")
        kernel.headers_digest.cache_clear()
        after = kernel.module_source("prefill_attention")
        assert after != before and after.split("\n", 1)[1] == before.split("\n", 1)[1]
    finally:
        kernel.headers_digest.cache_clear()
