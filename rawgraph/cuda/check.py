"""One `check()` for every cuda.bindings call: `(err, *values)` -> values, or a CudaError."""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver, nvrtc, runtime


class CudaError(RuntimeError):
    """A failed CUDA driver/runtime/NVRTC call; `.name` is the error's enum name."""

    def __init__(self, err: Any, what: str = "", log: str = ""):
        self.err = err
        self.name = getattr(err, "name", str(err))
        self.description = _describe(err)
        self.log = log
        msg = f"{self.name}: {self.description}" if self.description else self.name
        if what:
            msg = f"{what}: {msg}"
        if log:
            msg += f"\n--- compiler log ---\n{log}"
        super().__init__(msg)


class CompileError(CudaError):
    """A kernel source failed to compile; `.log` holds the NVRTC log."""


def _describe(err: Any) -> str:
    # The description needs the driver library; on a machine without one, the name must do.
    try:
        if isinstance(err, driver.CUresult):
            e, s = driver.cuGetErrorString(err)
        elif isinstance(err, runtime.cudaError_t):
            e, s = runtime.cudaGetErrorString(err)
        elif isinstance(err, nvrtc.nvrtcResult):
            e, s = nvrtc.nvrtcGetErrorString(err)
        else:
            return ""
    except Exception:  # no driver library: keep the name alone
        return ""
    return s.decode() if isinstance(s, bytes) and int(e) == 0 else ""


def check(result: Any, what: str = "") -> Any:
    """Unwrap a cuda.bindings result tuple.

    `(SUCCESS,)` -> None, `(SUCCESS, v)` -> v, `(SUCCESS, v1, v2)` -> (v1, v2);
    any other error code raises CudaError naming the error (and `what`, the call's purpose).
    """
    if not isinstance(result, tuple):
        result = (result,)
    if result[0] != 0:  # every success code is 0 (the enums are ints)
        raise CudaError(result[0], what)
    n = len(result)
    return None if n == 1 else result[1] if n == 2 else result[1:]


def is_error(result: Any, name: str) -> bool:
    """True when a result tuple (or bare code) failed with the error enum called `name`."""
    err = result[0] if isinstance(result, tuple) else result
    return getattr(err, "name", None) == name
