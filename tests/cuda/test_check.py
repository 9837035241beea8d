"""check(): result tuples in, values or a named CudaError out."""

import pytest
from cuda.bindings import driver, nvrtc, runtime

from rawgraph.cuda.check import CompileError, CudaError, check, is_error

OK = driver.CUresult.CUDA_SUCCESS


@pytest.mark.parametrize(("result", "want"), [
    ((OK,), None),
    ((OK, 7), 7),
    ((OK, 1, 2), (1, 2)),
    (OK, None),
    ((runtime.cudaError_t.cudaSuccess, "x"), "x"),
    ((nvrtc.nvrtcResult.NVRTC_SUCCESS, b"log"), b"log"),
])
def test_success_unwraps(result, want):
    assert check(result) == want


@pytest.mark.parametrize("err", [
    driver.CUresult.CUDA_ERROR_INVALID_VALUE,
    runtime.cudaError_t.cudaErrorStreamCaptureInvalidated,
    nvrtc.nvrtcResult.NVRTC_ERROR_COMPILATION,
])
def test_error_names_the_error_and_the_call(err):
    with pytest.raises(CudaError) as e:
        check((err, None), "launch foo")
    assert e.value.name == err.name
    assert err.name in str(e.value) and "launch foo" in str(e.value)
    assert is_error((err,), err.name)


def test_compile_error_carries_log():
    e = CompileError("NVRTC_ERROR_COMPILATION", "compiling x.cu", log="x.cu(3): error: oops")
    assert "x.cu(3): error: oops" in str(e) and e.log.endswith("oops")
