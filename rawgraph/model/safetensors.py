"""The safetensors file format, read and written with NumPy (bf16 included).

Format: 8-byte little-endian header length N, N bytes of JSON
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`, then the
tensor bytes (offsets relative to the end of the header). The `safetensors` package cannot
hand bf16 to NumPy, and rawgraph keeps bf16 as uint16 bits anyway, so it reads the format
itself: tensors come back as read-only memory maps, with nothing copied until used.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# safetensors dtype -> (numpy dtype of the stored bits, rawgraph name)
DTYPES = {"F16": (np.float16, "float16"), "BF16": (np.uint16, "bfloat16"),
          "F32": (np.float32, "float32")}
_NAMES = {v[1]: k for k, v in DTYPES.items()}


class CheckpointError(ValueError):
    """A checkpoint file or directory is not what rawgraph can load; says which and why."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry in a safetensors header."""

    name: str
    dtype: str        # "float16", "bfloat16" or "float32"
    shape: tuple
    begin: int        # absolute byte offsets in the file
    end: int


def read_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors a .safetensors file holds, validated against the file's size."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path.name}: too short to be a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > 100 << 20:
            raise CheckpointError(f"{path.name}: header length {n} does not fit the file")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path.name}: header is not JSON ({e})") from None
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dt = entry.get("dtype")
        if dt not in DTYPES:
            raise CheckpointError(f"{path.name}: tensor {name!r} has dtype {dt}; rawgraph loads "
                                  f"{', '.join(DTYPES)}")
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        want = int(np.prod(shape, dtype=np.int64)) * np.dtype(DTYPES[dt][0]).itemsize
        if end - begin != want or 8 + n + end > size:
            raise CheckpointError(f"{path.name}: tensor {name!r} {shape} {dt} has {end - begin} "
                                  f"bytes at [{begin}, {end}); expected {want} inside the file")
        out[name] = TensorInfo(name, DTYPES[dt][1], shape, 8 + n + begin, 8 + n + end)
    return out


def open_tensor(path: Path, info: TensorInfo) -> np.ndarray:
    """A read-only memory map of one tensor (bf16 as uint16 bits)."""
    dt = DTYPES[_NAMES[info.dtype]][0]
    count = int(np.prod(info.shape, dtype=np.int64))
    return np.memmap(path, dtype=dt, mode="r", offset=info.begin, shape=info.shape) if count \
        else np.zeros(info.shape, dt)


def write(path: Path, tensors: dict[str, tuple[str, np.ndarray]],
          metadata: dict[str, str] | None = None) -> None:
    """Write {name: (dtype, array)}; dtype 'bfloat16' takes uint16 bits."""
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
