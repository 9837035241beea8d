"""Offline kernel checks (no GPU needed; CI runs them): every kernels_cu/*.cu must compile
with nvcc for sm_90 without register spills (ptxas' resource report), and with NVRTC, the
compiler rawgraph uses at run time.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cuda.bindings import nvrtc

from rawgraph.cuda.check import check
from rawgraph.cuda.kernel import ARCH_SPECIFIC, KERNELS_DIR

_FUNC = re.compile(r"Compiling entry function '(\w+)'")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


@dataclass
class Report:
    """What ptxas said about one .cu file."""

    path: Path
    returncode: int
    log: str
    registers: dict[str, int] = field(default_factory=dict)
    spills: dict[str, int] = field(default_factory=dict)  # kernel -> spilled bytes

    @property
    def ok(self) -> bool:
        """Compiled, and no kernel spilled."""
        return self.returncode == 0 and not any(self.spills.values())

    def summary(self) -> str:
        """One line per file."""
        status = "ok" if self.ok else ("SPILLS" if self.returncode == 0 else "ERROR")
        regs = ", ".join(f"{k}:{v}r" for k, v in sorted(self.registers.items()))
        return f"{status:6s} {self.path.name}: {regs}"


def parse_ptxas(log: str) -> tuple[dict[str, int], dict[str, int]]:
    """(registers, spilled bytes) per kernel from `-Xptxas -v` output."""
    regs, spills, current = {}, {}, None
    for line in log.splitlines():
        if m := _FUNC.search(line):
            current = m.group(1)
        elif current and (m := _SPILL.search(line)):
            spills[current] = int(m.group(1)) + int(m.group(2))
        elif current and (m := _REGS.search(line)):
            regs[current] = int(m.group(1))
    return regs, spills


def nvcc_path() -> str | None:
    """The nvcc on PATH, if any."""
    return shutil.which("nvcc")


def compile_file(path: Path, arch: str = "sm_90") -> Report:
    """nvcc -cubin one file with -Xptxas -v (ARCH_SPECIFIC files for their exact target)."""
    arch = _target(path, arch)
    nvcc = nvcc_path()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [nvcc, f"-arch={arch}", "-std=c++17", f"-I{KERNELS_DIR}", "-Xptxas", "-v",
               "-cubin", "-o", str(Path(tmp) / "k.cubin"), str(path)]
        p = subprocess.run(cmd, capture_output=True, text=True)
    log = p.stdout + p.stderr
    regs, spills = parse_ptxas(log)
    return Report(path, p.returncode, log, regs, spills)


def compile_all(arch: str = "sm_90", *, nvcc: bool = True, nvrtc: bool = True) -> list[Report]:
    """Compile every kernels_cu/*.cu with nvcc (spills counted), then NVRTC (its errors join
    the report); either may be left out."""
    paths = sorted(KERNELS_DIR.glob("*.cu"))
    reports = [compile_file(p, arch) if nvcc else Report(p, 0, "") for p in paths]
    for r in reports if nvrtc else ():
        ok, log = nvrtc_compile(r.path, arch.replace("sm_", "compute_"))
        if not ok:
            r.returncode = r.returncode or 1
            r.log += f"\n--- NVRTC ---\n{log}"
    return reports


def cuda_include() -> Path | None:
    """The CUDA toolkit's include directory (cuda_fp16.h), if one is installed."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda",
             *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]
    for root in roots:
        if root and Path(root, "include", "cuda_fp16.h").is_file():
            return Path(root, "include")
    return None


def nvrtc_compile(path: Path, arch: str = "compute_90") -> tuple[bool, str]:
    """Compile one file with NVRTC, as rawgraph does at run time (to PTX, no GPU needed).

    NVRTC is stricter than nvcc (no host headers: no INFINITY, no <cmath>), so a kernel that
    nvcc accepts can still fail here. Returns (ok, log).
    """
    ok, log, _ = _nvrtc(path, arch)
    return ok, log


def nvrtc_ptx(path: Path, arch: str = "compute_90") -> str:
    """The PTX NVRTC makes of one file (what runs on the GPU); raises if it does not compile."""
    ok, log, ptx = _nvrtc(path, arch)
    if not ok:
        raise RuntimeError(f"{path.name} does not compile with NVRTC:\n{log}")
    return ptx


def noncoherent_loads(ptx: str) -> int:
    """How many `ld.global.nc` (read-only cache) loads a PTX text has. Such a load may return
    stale data for memory written while the kernel runs, which programmatic dependent launch
    allows for anything an earlier kernel writes: only weights may be read this way."""
    return len(re.findall(r"\bld\.global\.nc\b", ptx))


def _target(path: Path, arch: str) -> str:
    """`arch` (sm_XY / compute_XY), or the exact target of an ARCH_SPECIFIC source."""
    if path.stem in ARCH_SPECIFIC:
        kind = arch.split("_")[0]
        major, minor = ARCH_SPECIFIC[path.stem]
        return f"{kind}_{major}{minor}a"
    return arch


def _nvrtc(path: Path, arch: str) -> tuple[bool, str, str]:
    arch = _target(path, arch)
    opts = [b"-std=c++17", f"-I{KERNELS_DIR}".encode(), f"--gpu-architecture={arch}".encode()]
    inc = cuda_include()
    if inc is not None:
        opts.append(f"-I{inc}".encode())
    prog = check(nvrtc.nvrtcCreateProgram(path.read_bytes(), path.name.encode(), 0, [], []))
    try:
        err, = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        size = check(nvrtc.nvrtcGetProgramLogSize(prog))
        # a fresh mutable buffer: NVRTC writes into it (`b" " * 1` would be the interpreter's
        # shared one-byte object, and an empty log would overwrite every b" " in the process)
        log = bytearray(size)
        check(nvrtc.nvrtcGetProgramLog(prog, log))
        ok = err == nvrtc.nvrtcResult.NVRTC_SUCCESS
        ptx = b""
        if ok:
            ptx = bytearray(check(nvrtc.nvrtcGetPTXSize(prog)))
            check(nvrtc.nvrtcGetPTX(prog, ptx))
        return ok, log.decode(errors="replace").strip("\0 "), bytes(ptx).decode().strip("\0")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
