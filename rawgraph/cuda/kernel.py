"""Kernels of kernels_cu/: compiled once through CuPy (NVRTC), launched with cuLaunchKernelEx."""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import cupy
from cuda.bindings import driver, runtime

from rawgraph.cuda.check import CompileError, check
from rawgraph.cuda.device import compute_capability, ensure_context, multiprocessors
from rawgraph.cuda.launch import Launch, launch_now, observers, pdl_default
from rawgraph.cuda.signature import Signature
from rawgraph.symbols import current as current_symbols


def _kernels_dir() -> Path:
    """RAWGRAPH_KERNELS, else rawgraph/kernels_cu (an installed wheel), else the source
    checkout's kernels_cu/ (an editable install)."""
    if os.environ.get("RAWGRAPH_KERNELS"):
        return Path(os.environ["RAWGRAPH_KERNELS"])
    here = Path(__file__).resolve()
    packaged = here.parents[1] / "kernels_cu"
    return packaged if packaged.is_dir() else here.parents[2] / "kernels_cu"


KERNELS_DIR = _kernels_dir()
_STATIC_SMEM_LIMIT = 48 * 1024
# Sources using features of one exact architecture (wgmma: Hopper), compiled for its
# architecture-specific target (sm_90a) and only there.
ARCH_SPECIFIC = {"gemm_sm90": (9, 0), "skinny_sm90": (9, 0), "prefill_attention_sm90": (9, 0)}
_BY_HANDLE: dict[int, Kernel] = {}  # CUfunction -> Kernel, to decode captured graph nodes


def source_path(op: str) -> Path:
    """kernels_cu/<op>.cu, or FileNotFoundError naming the directory searched."""
    path = KERNELS_DIR / f"{op}.cu"
    if not path.is_file():
        raise FileNotFoundError(f"no kernel source {path} (set RAWGRAPH_KERNELS to the "
                                f"kernels_cu directory)")
    return path


def _cuda_include() -> list[str]:
    for root in (os.environ.get("CUDA_PATH"), cupy.cuda.get_cuda_path(), "/usr/local/cuda"):
        if root and Path(root, "include", "cuda_fp16.h").is_file():
            return [f"-I{Path(root, 'include')}"]
    return []  # NVRTC's built-in headers


@functools.cache
def headers_digest() -> str:
    """A digest of every header (*.cuh) in KERNELS_DIR."""
    h = hashlib.sha256()
    for path in sorted(KERNELS_DIR.glob("*.cuh")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def module_source(op: str) -> str:
    """The text compiled for kernels_cu/<op>.cu: the file, after a comment naming the
    headers' digest. CuPy's on-disk compile cache keys on the source text and the options,
    not on the headers the source includes; without the digest a header changed alone (a
    new rawgraph, an edit) would get the binary built from the old one."""
    return f"// kernels_cu headers {headers_digest()}\n" + source_path(op).read_text()


@functools.cache
def load_module(op: str) -> cupy.RawModule:
    """Compile kernels_cu/<op>.cu for this device (c++17, include path kernels_cu/), once;
    ARCH_SPECIFIC sources for their exact target (ValueError on any other device)."""
    ensure_context()
    major, minor = compute_capability()
    arch = f"sm_{major}{minor}"
    if op in ARCH_SPECIFIC:
        if (major, minor) != ARCH_SPECIFIC[op]:
            raise ValueError(f"{op}.cu needs compute capability {ARCH_SPECIFIC[op]}, this "
                             f"device has {(major, minor)}")
        arch += "a"
    opts = ("-std=c++17", f"-I{KERNELS_DIR}", f"--gpu-architecture={arch}", *_cuda_include())
    return cupy.RawModule(code=module_source(op), options=opts)


def compiled(op: str) -> cupy.RawModule:
    """load_module(op), compiled and loaded now (CuPy's `module` is lazy: it compiles on
    first access, once); CompileError with NVRTC's log if the source does not compile."""
    mod = load_module(op)
    try:
        _ = mod.module
    except cupy.cuda.compiler.CompileException as e:
        raise CompileError("NVRTC_ERROR_COMPILATION", f"compiling {op}.cu",
                           log=str(e)) from None
    return mod


def loadable_ops() -> list[str]:
    """The kernels_cu modules this device can load: every .cu but the ARCH_SPECIFIC ones
    of another architecture."""
    cc = compute_capability()
    return sorted(p.stem for p in KERNELS_DIR.glob("*.cu")
                  if ARCH_SPECIFIC.get(p.stem, cc) == cc)


def precompile(ops: Iterable[str] | None = None, workers: int | None = None) -> None:
    """Compile and load kernels_cu modules (default: `loadable_ops()`) on `workers` threads
    (default: one a CPU), so that first launches find them loaded. NVRTC compiles without
    the GIL and a module is its unit: loaded one by one as launches first need them, a
    cold start compiled for about a minute, its longest module about 12 s. Modules already
    loaded, or found in CuPy's disk cache, cost a lookup. CompileError names the first
    module that fails."""
    ensure_context()
    todo = list(ops) if ops is not None else loadable_ops()
    workers = max(1, min(workers or os.cpu_count() or 1, len(todo)))

    def build(op: str) -> None:
        # a thread has no current context until a runtime call makes the primary one
        # current (the one ensure_context made current for the caller)
        check(runtime.cudaFree(0), "make the primary context current")
        compiled(op)

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for f in [pool.submit(build, op) for op in todo]:
            f.result()


def kernel_for_handle(handle: int) -> Kernel | None:
    """The rawgraph Kernel whose CUfunction is `handle`, if any was loaded."""
    return _BY_HANDLE.get(handle)


class Kernel:
    """A kernel in kernels_cu/<op>.cu: its name, C signature, and function handle.

    The signature is declared here once and checked against the source's `extern "C"`
    line now (CPU) and against cuFuncGetParamInfo when the function is first loaded (GPU).
    """

    def __init__(self, op: str, name: str, signature: str):
        self.op, self.name = op, name
        self.declaration = signature  # the C parameter list as written (generated wrappers)
        self.sig = Signature.parse(signature)
        in_source = Signature.from_source(source_path(op), name)
        if in_source != self.sig:
            raise ValueError(f"{op}.cu: {name} is declared in Python as ({self.sig}) but the "
                             f"source says ({in_source})")
        self._function: driver.CUfunction | None = None
        self._raw: cupy.RawKernel | None = None
        self._smem_limit = _STATIC_SMEM_LIMIT

    def __repr__(self) -> str:
        return f"Kernel({self.op}.cu:{self.name}({self.sig}))"

    @property
    def raw(self) -> cupy.RawKernel:
        """The CuPy RawKernel (compiles on first use)."""
        if self._raw is None:
            self._raw = compiled(self.op).get_function(self.name)
            handle = self._raw.kernel.ptr
            self._function = driver.CUfunction(handle)
            self._check_param_info()
            _BY_HANDLE[int(handle)] = self
        return self._raw

    @property
    def function(self) -> driver.CUfunction:
        """The driver's CUfunction handle."""
        if self._function is None:
            _ = self.raw
        return self._function

    def param_info(self) -> list[tuple[int, int]]:
        """(offset, size) of each parameter as the compiled function lays them out. The
        driver of CUDA 13.0 has no cuFuncGetParamCount, so this asks until it says no (the
        one driver call rawgraph expects to fail; memcheck reports it, tests/sanitize.py
        tells it not to)."""
        out, fn = [], self.function
        while True:
            err, off, size = driver.cuFuncGetParamInfo(fn, len(out))
            if err != driver.CUresult.CUDA_SUCCESS:
                return out
            out.append((off, size))

    def _check_param_info(self) -> None:
        info = self.param_info()
        sizes = [s for _, s in info]
        want = [p.size for p in self.sig.params]
        if sizes != want:
            raise ValueError(f"{self.name}: compiled parameter sizes {sizes} do not match the "
                             f"declared signature ({self.sig}) sizes {want}")

    def allow_shared_memory(self, nbytes: int) -> None:
        """Opt in to more than 48 KiB of dynamic shared memory for this kernel."""
        if nbytes > self._smem_limit:
            check(driver.cuFuncSetAttribute(
                self.function,
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                nbytes), f"{self.name}: allow {nbytes} B of shared memory")
            self._smem_limit = nbytes

    def resident_blocks(self, block: int, smem: int = 0) -> int:
        """Blocks of `block` threads and `smem` dynamic shared bytes that the whole GPU holds
        at once (occupancy per SM x SMs): one full wave."""
        self.allow_shared_memory(smem)
        per_sm = check(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            self.function, block, smem), f"{self.name}: occupancy")
        return per_sm * multiprocessors()

    def resident_clusters(self, block: int, smem: int, cluster: int) -> int:
        """Clusters of `cluster` blocks (its __cluster_dims__) of `block` threads and `smem`
        dynamic shared bytes that the whole GPU holds at once: a cluster's blocks must share
        a GPC, so this can be fewer than resident_blocks / cluster."""
        self.allow_shared_memory(smem)
        config = driver.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = cluster, 1, 1
        config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
        config.sharedMemBytes = smem
        return check(driver.cuOccupancyMaxActiveClusters(self.function, config),
                     f"{self.name}: cluster occupancy")

    def launch(self, grid: Any, block: Any, args: tuple, stream: Any = None, *,
               smem: int = 0, pdl: bool | None = None, symbols: Any = None) -> None:
        """Launch now on `stream` (validated first; grid/args may be symbol expressions of
        `symbols`, or of the table a `with` block made current).

        Under a capture (or with symbols) the launch keeps its own storage as the record of
        the graph node it becomes; otherwise it takes the eager fast path. `pdl` None: this
        thread's default (`rawgraph.cuda.launch.programmatic`).
        """
        if pdl is None:
            pdl = pdl_default()
        symbols = current_symbols(symbols)
        if symbols is None and not observers():
            launch_now(self, grid, block, args, stream, smem=smem, pdl=pdl)
        else:
            Launch(self, grid, block, args, smem=smem, pdl=pdl, symbols=symbols).launch(stream)

