"""The device: whether one is visible, its facts, and a current context for driver calls."""

from __future__ import annotations

import functools
from importlib import metadata
from typing import Any

from cuda.bindings import driver, runtime

from rawgraph.cuda.check import check


@functools.cache
def available() -> tuple[bool, str]:
    """(True, "") when a CUDA device can be used, else (False, why not)."""
    try:
        err, = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return False, f"cuInit failed: {err.name}"
        err, n = driver.cuDeviceGetCount()
        if err != driver.CUresult.CUDA_SUCCESS or n == 0:
            return False, "no CUDA device visible"
    except Exception as e:  # no driver library at all (CI machines)
        return False, f"no CUDA driver: {type(e).__name__}: {str(e).splitlines()[0]}"
    return True, ""


@functools.cache
def ensure_context() -> None:
    """Make the primary context of device 0 current (the one CuPy uses), once per process.

    The runtime call does it the same way CuPy does, so driver calls, CuPy kernels and
    rawgraph graphs all share one context.
    """
    ok, why = available()
    if not ok:
        raise RuntimeError(f"rawgraph needs a CUDA device: {why}")
    check(runtime.cudaFree(0), "initialise the primary context")


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def info() -> dict[str, Any]:
    """Versions, and the device's name, compute capability, SMs, L2, memory and driver."""
    out: dict[str, Any] = {
        "rawgraph": _version("rawgraph"),
        "cuda-bindings": _version("cuda-bindings"),
        "cupy": _version("cupy-cuda13x"),
        "numpy": _version("numpy"),
    }
    ok, why = available()
    out["device"] = None
    if not ok:
        out["device_error"] = why
        return out
    ensure_context()
    dev = check(driver.cuDeviceGet(0))
    attr = driver.CUdevice_attribute

    def get(a: Any) -> int:
        return check(driver.cuDeviceGetAttribute(a, dev))

    drv = check(driver.cuDriverGetVersion())
    rt = check(runtime.cudaRuntimeGetVersion())
    out["device"] = check(driver.cuDeviceGetName(256, dev)).split(b"\0")[0].decode()
    out["compute_capability"] = (f"{get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)}."
                                 f"{get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)}")
    out["sms"] = get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
    out["l2_mb"] = get(attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE) / 2**20
    out["memory_gib"] = round(check(driver.cuDeviceTotalMem(dev)) / 2**30, 1)
    out["driver_cuda"] = f"{drv // 1000}.{drv % 1000 // 10}"
    out["free_memory_gib"] = round(check(driver.cuMemGetInfo())[0] / 2**30, 1)
    out["runtime_cuda"] = f"{rt // 1000}.{rt % 1000 // 10}"
    return out


@functools.cache
def multiprocessors() -> int:
    """Streaming multiprocessors of device 0."""
    ensure_context()
    dev = check(driver.cuDeviceGet(0))
    return check(driver.cuDeviceGetAttribute(
        driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))


def compute_capability() -> tuple[int, int]:
    """(major, minor) of device 0."""
    ensure_context()
    dev = check(driver.cuDeviceGet(0))
    attr = driver.CUdevice_attribute
    major = attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    minor = attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
    return (check(driver.cuDeviceGetAttribute(major, dev)),
            check(driver.cuDeviceGetAttribute(minor, dev)))
