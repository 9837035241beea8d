"""The safetensors file format, read and written with NumPy (bf16 included).

Format: 8-byte little-endian header length N, N bytes of JSON
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`, then the
tensor bytes (offsets relative to the end of the header). The `safetensors` package cannot
hand bf16 to NumPy, and rawgraph keeps bf16 as uint16 bits anyway, so it reads the format
itself: tensors come back as read-only memory maps, with nothing copied until used.
"""

from __future__ import annotations

import itertools
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# safetensors dtype -> (numpy dtype of the stored bits, rawgraph name)
DTYPES = {"F16": (np.float16, "float16"), "BF16": (np.uint16, "bfloat16"),
          "F32": (np.float32, "float32"), "F8_E4M3": (np.uint8, "float8_e4m3"),
          "I32": (np.int32, "int32")}
_NAMES = {v[1]: k for k, v in DTYPES.items()}


class CheckpointError(ValueError):
    """A checkpoint file or directory is not what rawgraph can load; says which and why."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry in a safetensors header."""

    name: str
    dtype: str        # "float16", "bfloat16", "float32" or "float8_e4m3" (uint8 codes)
    shape: tuple
    begin: int        # absolute byte offsets in the file
    end: int


def _entry(path: Path, name: str, entry: Any, data_bytes: int) -> TensorInfo:
    """One header entry, checked: dtype, shape and byte range (relative to the data)."""
    where = f"{path.name}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise CheckpointError(f"{where}: header entry must be an object, got {entry!r}")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in entry:
            raise CheckpointError(f"{where}: header entry has no {key!r}")
    dt, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dt, str) or dt not in DTYPES:
        raise CheckpointError(f"{where} has dtype {dt}; rawgraph loads {', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise CheckpointError(f"{where}: shape must be a list of sizes, got {shape!r}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(
            type(o) is int and o >= 0 for o in offsets) or offsets[0] > offsets[1]:
        raise CheckpointError(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= "
                              f"end, got {offsets!r}")
    begin, end = offsets
    want = math.prod(shape) * np.dtype(DTYPES[dt][0]).itemsize
    if end - begin != want or end > data_bytes:
        raise CheckpointError(f"{where} {tuple(shape)} {dt} has {end - begin} bytes at "
                              f"[{begin}, {end}); expected {want} inside the file's "
                              f"{data_bytes} data bytes")
    return TensorInfo(name, DTYPES[dt][1], tuple(shape), begin, end)


def read_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors a .safetensors file holds, validated against the file's size: every entry
    well-formed, inside the data, and no two tensors sharing bytes. CheckpointError otherwise."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: not a file" if path.exists() else f"{path}: missing")
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path.name}: too short to be a safetensors file")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > 100 << 20:
                raise CheckpointError(f"{path.name}: header length {n} does not fit the file")
            raw = f.read(n)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"{path.name}: header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path.name}: header must be a JSON object, got "
                              f"{type(header).__name__}")
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path.name}: __metadata__ must be an object")
    out = {name: _entry(path, name, e, size - 8 - n) for name, e in header.items()
           if name != "__metadata__"}
    spans = sorted((t.begin, t.end, t.name) for t in out.values() if t.end > t.begin)
    for (_, end, a), (begin, _, b) in itertools.pairwise(spans):
        if begin < end:
            raise CheckpointError(f"{path.name}: tensors {a!r} and {b!r} share bytes")
    base = 8 + n  # offsets are relative to the end of the header
    return {k: TensorInfo(t.name, t.dtype, t.shape, base + t.begin, base + t.end)
            for k, t in out.items()}


def open_tensor(path: Path, info: TensorInfo) -> np.ndarray:
    """A read-only memory map of one tensor (bf16 as uint16 bits, FP8 as uint8 codes)."""
    dt = DTYPES[_NAMES[info.dtype]][0]
    count = int(np.prod(info.shape, dtype=np.int64))
    return np.memmap(path, dtype=dt, mode="r", offset=info.begin, shape=info.shape) if count \
        else np.zeros(info.shape, dt)


def write(path: Path, tensors: dict[str, tuple[str, np.ndarray]],
          metadata: dict[str, str] | None = None) -> None:
    """Write {name: (dtype, array)}; dtype 'bfloat16' takes uint16 bits, 'float8_e4m3'
    uint8 codes."""
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
    offset, blobs = 0, []
    for name, (dtype, arr) in tensors.items():
        bits = np.ascontiguousarray(arr, dtype=DTYPES[_NAMES[dtype]][0])
        header[name] = {"dtype": _NAMES[dtype], "shape": list(bits.shape),
                        "data_offsets": [offset, offset + bits.nbytes]}
        offset += bits.nbytes
        blobs.append(bits)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b.tobytes())
