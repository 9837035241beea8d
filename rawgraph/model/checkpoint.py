"""Checkpoints as users have them: a directory with config.json and *.safetensors (one file,
or shards with model.safetensors.index.json), optionally tokenizer.json.

`load` checks everything before handing weights over: the architecture, every file named, every
expected tensor present with its shape, nothing unexpected, dtypes among F16/BF16/F32, and
values representable in the dtype the model runs in. Errors name the file and the key. FP8
checkpoints (`quantization_config`, `model.quant`) have their projections stored as F8_E4M3
with scales beside them, 4-bit ones (AWQ, GPTQ) as packed words with zero points and scales
in their place: each is checked against the format and dequantized at load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rawgraph.dtypes import from_bf16_bits, to_bf16_bits
from rawgraph.model import quant
from rawgraph.model.config import ModelConfig
from rawgraph.model.safetensors import CheckpointError, TensorInfo, open_tensor, read_header, write
from rawgraph.model.weights import shapes

INDEX = "model.safetensors.index.json"
_IGNORED = ("rotary_emb.inv_freq",)  # buffers some exporters save; recomputed from the config
_QUANTIZED = {"float8_e4m3": "F8_E4M3", "int32": "I32"}  # dtypes only quantized modules hold


@dataclass
class Checkpoint:
    """A loaded checkpoint: its config, tensors in the config's storage dtype, the file each
    tensor came from, its tokenizer.json if it has one, and how its weights were stored
    (`fp8`: the FP8 format they were dequantized from, None for fp16/bf16/fp32)."""

    config: ModelConfig
    tensors: dict[str, np.ndarray]
    tokenizer: Path | None = None
    files: dict[str, Path] = field(default_factory=dict)
    quant: quant.Format | None = None


def _json(path: Path) -> Any:
    """A JSON file's value; CheckpointError naming the file if it cannot be read or parsed."""
    if not path.is_file():
        raise CheckpointError(f"{path}: not a file")
    try:
        return json.loads(path.read_bytes())
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"{path}: not JSON ({e})") from None


def json_object(path: Path) -> dict | None:
    """A checkpoint's optional JSON file as an object (None: no such file); CheckpointError
    naming the file if it cannot be read, is not JSON or is not an object."""
    if not path.is_file():
        return None
    got = _json(path)
    if not isinstance(got, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    return got


def _files(root: Path) -> dict[str, Path]:
    """tensor name -> file, from the index or the single file."""
    index = root / INDEX
    if index.exists():
        got = _json(index)
        weight_map = got.get("weight_map") if isinstance(got, dict) else None
        if not isinstance(weight_map, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
            raise CheckpointError(f"{index}: not a safetensors index (needs a weight_map "
                                  f"object of tensor name -> file name)")
        bad = sorted({f for f in weight_map.values() if Path(f).name != f or f in ("", ".", "..")})
        if bad:
            raise CheckpointError(f"{index} names files outside the directory: {bad[:3]}")
        missing = sorted({f for f in weight_map.values() if not (root / f).is_file()})
        if missing:
            raise CheckpointError(f"{index} names files that are missing (or not files): "
                                  f"{missing[:3]}")
        return {k: root / f for k, f in weight_map.items()}
    found = sorted(root.glob("*.safetensors"))
    if not found:
        raise CheckpointError(f"{root}: no *.safetensors files (and no {INDEX})")
    if len(found) > 1:
        raise CheckpointError(f"{root}: {len(found)} safetensors files but no {INDEX} "
                              f"saying which tensor is where")
    return {name: found[0] for name in read_header(found[0])}


def _convert(x: np.ndarray, src: str, dst: str, where: str) -> np.ndarray:
    if src == dst:
        return x
    f32 = from_bf16_bits(x) if src == "bfloat16" else np.asarray(x, np.float32)
    if dst == "bfloat16":
        return to_bf16_bits(f32)
    if np.abs(f32).max(initial=0) > 65504:  # (NaN compares False: the GPU upload checks it)
        raise CheckpointError(f"{where} has values beyond float16's range; load with "
                              f"dtype='bfloat16'")
    return f32.astype(np.float16)


def _quant_weight(fmt: quant.Format, module: str, shape: tuple[int, int],
                  infos: dict[str, tuple[Path, TensorInfo]], dtype: str) -> np.ndarray:
    """A quantized module's weight, dequantized by its format into `dtype` storage."""
    need, may = fmt.extras(module)
    names = ([f"{module}.weight"] if not fmt.replaces_weight else []) + need + [
        n for n in may if n in infos]
    parts = {}
    for name in names:
        f, info = infos[name]
        parts[name[len(module) + 1:]] = quant.Stored(open_tensor(f, info), info.dtype,
                                                     f"{f.name}: tensor {name!r}")
    try:
        w = fmt.weight(parts, shape)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    return _convert(w, "float32", dtype, f"{module} (dequantized)")


def stored_format(path: str | Path) -> quant.Format | None:
    """The quantized format a checkpoint directory's weights are stored in (None: fp16,
    bf16 or fp32), from its config.json alone; CheckpointError for a quantization_config it
    cannot load."""
    cfg_path = Path(path) / "config.json"
    got = _json(cfg_path)
    try:
        return quant.read(got.get("quantization_config") if isinstance(got, dict) else None)
    except ValueError as e:
        raise CheckpointError(f"{cfg_path}: {e}") from None


def config(path: str | Path, dtype: str | None = None) -> ModelConfig:
    """A checkpoint directory's configuration alone (config.json; no tensor is read)."""
    if dtype not in (None, "float16", "bfloat16"):
        raise ValueError(f"dtype {dtype!r}: float16, bfloat16 or None (the checkpoint's)")
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a directory")
    cfg_path = root / "config.json"
    if not cfg_path.exists():
        raise CheckpointError(f"{root}: no config.json")
    try:
        return ModelConfig.from_hf(_json(cfg_path), dtype)
    except ValueError as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{cfg_path}: {e}") from None


def load(path: str | Path, dtype: str | None = None) -> Checkpoint:
    """Load and check a checkpoint directory (tensors memory-mapped when no conversion;
    FP8 and 4-bit weights dequantized)."""
    cfg = config(path, dtype)
    root = Path(path)
    fmt = stored_format(root)
    where = _files(root)
    headers: dict[Path, dict[str, TensorInfo]] = {f: read_header(f) for f in set(where.values())}
    want = shapes(cfg)
    # the Linear modules a quantized checkpoint stores quantized, and what stands beside (FP8:
    # scales) or for (4-bit: packed words, zero points, scales) their weights
    modules = [n[:-len(".weight")] for n in want
               if n.endswith("_proj.weight") or n == "lm_head.weight"]
    quantized = {m for m in modules if fmt is not None and fmt.quantized(m)}
    need, may = set(want), set()
    for m in quantized:
        assert fmt is not None
        n, o = fmt.extras(m)
        need.update(n)
        may.update(o)
        if fmt.replaces_weight:
            need.discard(f"{m}.weight")
    have = {k for k in where if not k.endswith(_IGNORED)}
    if cfg.tie_embeddings:
        have.discard("lm_head.weight")  # tied: the embedding is the head
    missing, unexpected = sorted(need - have), sorted(have - need - may)
    if missing:
        raise CheckpointError(f"{root}: {len(missing)} tensors missing, e.g. {missing[:3]}")
    if unexpected:
        raise CheckpointError(f"{root}: {len(unexpected)} unexpected tensors, e.g. "
                              f"{unexpected[:3]} (not a plain {cfg.fam.architecture}?)")
    infos: dict[str, tuple[Path, TensorInfo]] = {}
    for name in need | (may & have):
        f = where[name]
        info = headers[f].get(name)
        if info is None:
            raise CheckpointError(f"{f.name}: the index puts {name!r} here but the file lacks it")
        infos[name] = (f, info)
    tensors: dict[str, np.ndarray] = {}
    for name, shape in want.items():
        module = name[:-len(".weight")]
        try:
            if module in quantized:
                assert fmt is not None and len(shape) == 2
                tensors[name] = _quant_weight(fmt, module, (shape[0], shape[1]), infos,
                                              cfg.dtype)
                continue
            f, info = infos[name]
            if info.shape != shape:
                raise CheckpointError(f"{f.name}: {name!r} has shape {info.shape}, the "
                                      f"config implies {shape}")
            if info.dtype in _QUANTIZED:
                raise CheckpointError(
                    f"{f.name}: tensor {name!r} is {_QUANTIZED[info.dtype]}, but " + (
                        "config.json has no quantization_config" if fmt is None else
                        f"quantization_config leaves {module} unquantized"))
            tensors[name] = _convert(open_tensor(f, info), info.dtype, cfg.dtype,
                                     f"{f.name}: tensor {name!r}")
        except OSError as e:
            raise CheckpointError(f"{infos.get(name, (root,))[0]}: cannot read {name!r} "
                                  f"({e})") from None
    tok = root / "tokenizer.json"
    if tok.exists() and not tok.is_file():
        raise CheckpointError(f"{tok}: not a file")
    files = {k: where[k] if k in where else where[f"{k[:-len('.weight')]}.qweight"]
             for k in tensors}
    return Checkpoint(cfg, tensors, tok if tok.is_file() else None, files, fmt)


def save(path: str | Path, cfg: ModelConfig, tensors: dict[str, np.ndarray],
         shard_bytes: int | None = None) -> None:
    """Write config.json and the tensors (in `cfg.dtype`), sharded with an index when
    `shard_bytes` is given: the layout Hugging Face tools write."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
    items = [(k, (cfg.dtype, v)) for k, v in tensors.items()]
    if shard_bytes is None:
        write(root / "model.safetensors", dict(items))
        return
    shards: list[list] = [[]]
    size = 0
    for item in items:
        if shards[-1] and size + item[1][1].nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(item)
        size += item[1][1].nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write(root / name, dict(shard))
        weight_map.update({k: name for k, _ in shard})
    (root / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))
