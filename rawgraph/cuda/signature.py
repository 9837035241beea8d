"""C signatures of kernels: parsing, value checking, and rawgraph-owned argument storage.

A signature is declared once in Python as the kernel's C parameter list, e.g.
`"const __half* x, __half* y, int n, float eps"`, and cross-checked against the
`extern "C"` line of the .cu file (here, on the CPU) and cuFuncGetParamInfo (on the GPU).
Besides pointers and scalars, a parameter may be a TMA descriptor passed by value
(`const __grid_constant__ TensorMap map`, kernels_cu/tma.cuh): 128 opaque bytes
(rawgraph.cuda.tensormap makes them).
"""

from __future__ import annotations

import ctypes
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cupy
import numpy as np

# C scalar type -> (struct format, size)
_SCALARS: dict[str, tuple[str, int]] = {
    "int": ("i", 4), "int32_t": ("i", 4), "unsigned int": ("I", 4), "unsigned": ("I", 4),
    "uint32_t": ("I", 4), "long long": ("q", 8), "int64_t": ("q", 8),
    "unsigned long long": ("Q", 8), "uint64_t": ("Q", 8), "size_t": ("Q", 8),
    "float": ("f", 4), "double": ("d", 8),
}
# pointee type -> numpy dtype a pointer argument must carry (void*: any)
_POINTEE_DTYPES: dict[str, str] = {
    "__half": "float16", "half": "float16", "__nv_bfloat16": "uint16",  # bf16 bits (see dtypes)
    "float": "float32",
    "double": "float64", "int": "int32", "int32_t": "int32", "unsigned int": "uint32",
    "uint32_t": "uint32", "long long": "int64", "int64_t": "int64", "uint64_t": "uint64",
    "unsigned long long": "uint64", "uint8_t": "uint8", "unsigned char": "uint8",
    "int8_t": "int8", "char": "int8",
}
_BLOBS: dict[str, int] = {"const TensorMap": 128}  # by-value structs -> size (bytes)
_SLOT = 8  # every argument gets an 8-byte, 8-aligned slot in rawgraph's storage (blobs: more)
_NDARRAY = cupy.ndarray


@dataclass(frozen=True)
class Param:
    """One kernel parameter: its name, C type, and how it is stored."""

    name: str
    ctype: str          # normalised, e.g. "const __half*", "int"
    fmt: str            # struct format of the stored value
    size: int           # bytes the kernel reads

    @property
    def is_pointer(self) -> bool:
        """True for `T*` parameters."""
        return self.ctype.endswith("*")

    @property
    def is_output(self) -> bool:
        """True for non-const pointers: memory the kernel may write."""
        return self.is_pointer and not self.ctype.startswith("const ")

    @property
    def is_blob(self) -> bool:
        """True for by-value structs (a TMA descriptor): bytes, never a symbol."""
        return self.fmt.endswith("s")

    @property
    def pointee(self) -> str:
        """`T` of a `T*` parameter (without const)."""
        return self.ctype.removeprefix("const ").removesuffix("*").strip()


def _normalise_type(t: str) -> str:
    t = re.sub(r"\b(__restrict__|__restrict|restrict|__grid_constant__)\b", "", t)
    t = re.sub(r"\s*\*\s*", "*", t)
    t = re.sub(r"\s+", " ", t).strip()
    return t.replace(" *", "*")


def _parse_param(text: str) -> Param:
    m = re.fullmatch(r"(.*?[\s*])([A-Za-z_]\w*)", text.strip())
    if not m:
        raise ValueError(f"cannot parse kernel parameter {text!r}")
    ctype, name = _normalise_type(m.group(1)), m.group(2)
    if ctype.endswith("*"):
        return Param(name, ctype, "Q", 8)
    if ctype in _BLOBS:
        return Param(name, ctype, f"{_BLOBS[ctype]}s", _BLOBS[ctype])
    if ctype not in _SCALARS:
        raise ValueError(f"parameter {name!r}: unsupported C type {ctype!r} "
                         f"(supported: pointers, {', '.join(sorted([*_SCALARS, *_BLOBS]))})")
    fmt, size = _SCALARS[ctype]
    return Param(name, ctype, fmt, size)


@dataclass(frozen=True)
class Signature:
    """A kernel's parameter list."""

    params: tuple[Param, ...]

    def __post_init__(self) -> None:
        # (kind, lo, hi, dtype) per parameter for convert()'s fast path
        fast = []
        for p in self.params:
            if p.is_pointer:
                want = _POINTEE_DTYPES.get(p.pointee)
                fast.append(("p", 0, 0, None if want is None else np.dtype(want)))
            elif p.is_blob:
                fast.append(("b", 0, 0, None))
            elif p.fmt in "fd":
                fast.append(("f", 0, 0, None))
            else:
                fast.append(("i", *int_bounds(p), None))
        object.__setattr__(self, "_fast", tuple(fast))

    @staticmethod
    def parse(text: str) -> Signature:
        """Parse a C parameter list such as `"const float* x, float* y, int n"`."""
        parts = [p for p in (s.strip() for s in text.split(",")) if p]
        if parts == ["void"]:
            parts = []
        sig = Signature(tuple(_parse_param(p) for p in parts))
        names = [p.name for p in sig.params]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate parameter names in {text!r}")
        return sig

    @staticmethod
    def from_source(path: Path, kernel: str) -> Signature:
        """The signature on the `extern "C" __global__ void kernel(...)` line of a .cu file."""
        src = re.sub(r"//[^\n]*|/\*.*?\*/", "", path.read_text(), flags=re.S)
        bounds = r"(?:__\w+__\s*\([^)]*\)\s*)*"  # __launch_bounds__(...), __cluster_dims__(...)
        pat = (rf'extern\s+"C"\s+__global__\s+{bounds}void\s+{bounds}'
               + re.escape(kernel) + r"\s*\(([^)]*)\)")
        m = re.search(pat, src)
        if not m:
            raise ValueError(f'{path.name}: no `extern "C" __global__ void {kernel}(...)`')
        return Signature.parse(m.group(1))

    def __len__(self) -> int:
        return len(self.params)

    def __str__(self) -> str:
        return ", ".join(f"{p.ctype} {p.name}" for p in self.params)

    def convert(self, values: tuple | list, kernel: str = "kernel") -> tuple:
        """Check `values` against the parameters and return them as plain Python numbers.

        Pointers accept CuPy arrays (dtype checked against the pointee type), objects with
        `__cuda_array_interface__`, ints (raw addresses) and None (NULL).
        """
        if len(values) != len(self.params):
            raise TypeError(f"{kernel}: expected {len(self.params)} arguments "
                            f"({self}), got {len(values)}")
        out = []
        for (kind, lo, hi, want), p, v in zip(self._fast, self.params, values):
            t = type(v)  # fast paths for the usual cases; anything else gets the full check
            if kind == "p" and t is _NDARRAY and (want is None or v.dtype == want):
                out.append(v.data.ptr)
            elif kind == "i" and t is int and lo <= v <= hi:
                out.append(v)
            elif kind == "f" and t is float:
                out.append(v)
            else:
                out.append(convert_value(p, v, kernel))
        return tuple(out)


def _where(p: Param, kernel: str) -> str:
    return f"{kernel}: argument {p.name!r} ({p.ctype})"


def int_bounds(p: Param) -> tuple[int, int]:
    """The values an integer (or pointer) parameter can hold."""
    bits = 8 * p.size
    return (0, 2**bits - 1) if p.fmt.isupper() else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def convert_value(p: Param, v: Any, kernel: str) -> int | float | bytes:
    """One argument value, checked against its parameter (messages name both)."""
    if hasattr(v, "symbols") and hasattr(v, "render"):  # a symbol expression
        raise ValueError(f"{_where(p, kernel)} is the expression {v!r}: pass symbols=")
    if p.is_pointer:
        return _address(p, v, kernel)
    if p.is_blob:
        if not isinstance(v, bytes) or len(v) != p.size:
            raise TypeError(f"{_where(p, kernel)} needs {p.size} bytes (a descriptor), got "
                            f"{type(v).__name__}" + (f" of {len(v)}" if isinstance(v, bytes)
                                                     else ""))
        return v
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{_where(p, kernel)} got a bool")
    if p.fmt in "fd":
        if not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"{_where(p, kernel)} needs a number, got {type(v).__name__}")
        return float(v)
    if not isinstance(v, (int, np.integer)):
        raise TypeError(f"{_where(p, kernel)} needs an integer, got {type(v).__name__}")
    v = int(v)
    lo, hi = int_bounds(p)
    if not lo <= v <= hi:
        raise ValueError(f"{_where(p, kernel)} = {v} is outside [{lo}, {hi}]")
    return v


def _address(p: Param, v: Any, kernel: str) -> int:
    if v is None:
        return 0
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        if not 0 <= int(v) < 2**64:
            raise ValueError(f"{_where(p, kernel)}: address {v} out of range")
        return int(v)
    dtype = getattr(v, "dtype", None)
    want = _POINTEE_DTYPES.get(p.pointee)
    if dtype is not None and want is not None and np.dtype(dtype) != want:
        raise TypeError(f"{_where(p, kernel)} needs {want} data, got {np.dtype(dtype)}")
    data = getattr(v, "data", None)
    if data is not None and hasattr(data, "ptr"):
        return int(data.ptr)
    cai = getattr(v, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    raise TypeError(f"{_where(p, kernel)} needs a device array or an address, "
                    f"got {type(v).__name__}")


class ArgPack:
    """rawgraph-owned argument storage: one slot per parameter (8 bytes; a blob its size) and
    a `void**` to them.

    `address` is what `kernelParams` takes. The storage lives as long as this object, so
    the driver never sees memory it handed out itself (we never write into GetParams memory).
    """

    def __init__(self, sig: Signature):
        self.sig = sig
        n = max(len(sig), 1)
        sizes = [max(_SLOT, -(-p.size // _SLOT) * _SLOT) for p in sig.params]
        self._offsets = [_SLOT * n + sum(sizes[:i]) for i in range(len(sizes))]
        # one allocation: n pointers (the void**), then the value slots they point at
        self.buffer = ctypes.create_string_buffer(_SLOT * n + max(sum(sizes), _SLOT))
        self.address = ctypes.addressof(self.buffer)
        self._base = _SLOT * n
        struct.pack_into(f"{len(sizes)}Q", self.buffer, 0,
                         *(self.address + o for o in self._offsets))
        self.fmts = tuple(p.fmt for p in sig.params)
        self._pack = struct.Struct("<" + "".join(
            p.fmt + (f"{size - p.size}x" if size > p.size else "")
            for p, size in zip(sig.params, sizes))).pack_into

    def offset(self, i: int) -> int:
        """Byte offset of parameter i's slot in `buffer`."""
        return self._offsets[i]

    def write(self, values: tuple) -> None:
        """Store already-converted values (see Signature.convert); cannot fail."""
        self._pack(self.buffer, self._base, *values)

    def write_slots(self, slots: tuple[int, ...], values: tuple) -> None:
        """Store converted values of the parameters at `slots` only."""
        fmts, buf, offs = self.fmts, self.buffer, self._offsets
        for i, v in zip(slots, values):
            struct.pack_into(fmts[i], buf, offs[i], v)

    @property
    def values(self) -> tuple:
        """The stored values, read back."""
        return decode(self.sig, self.address)


def decode(sig: Signature, kernel_params: int) -> tuple:
    """Read argument values through a `void**` (for example a graph node's kernelParams).

    Reads only; the memory may belong to the driver.
    """
    ptrs = (ctypes.c_void_p * max(len(sig), 1)).from_address(kernel_params)
    return tuple(struct.unpack(p.fmt, ctypes.string_at(ptrs[i], p.size))[0]
                 for i, p in enumerate(sig.params))
