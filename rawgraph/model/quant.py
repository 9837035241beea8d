"""FP8 checkpoints: the `quantization_config` formats published FP8 models use, read strictly,
and their weights turned back into the numbers the decoder multiplies.

Formats (config.json's `quantization_config.quant_method`):
- `compressed-tensors` (llm-compressor, Neural Magic / Red Hat "FP8" and "FP8-dynamic"
  models): one config group of 8-bit float weights over the Linear layers, per `channel`,
  per `tensor` or per `block` (`block_structure`), scales in `<module>.weight_scale`; input
  activations dynamic per token, static per tensor (`<module>.input_scale`) or none; `ignore`
  names modules left unquantized (exact names or `re:` patterns).
- `fbgemm_fp8` (Meta's FP8 Llama 3.1 releases): per-channel `weight_scale`, dynamic
  activations bounded by `activation_scale_ub`; `modules_to_not_convert`.
- `fp8` (transformers' and vLLM's): `activation_scheme` static (`input_scale`) or dynamic;
  per-tensor `weight_scale`, or blocks of `weight_block_size` with `weight_scale_inv`;
  `modules_to_not_convert` / `ignored_layers`.

Weights are stored as `F8_E4M3` (e4m3fn: 4 exponent bits, bias 7, 3 mantissa bits, no
infinities, largest 448). rawgraph has no FP8 kernels yet: `dequantize` multiplies each
weight by its scale in float32 at load, and the model runs in the checkpoint's fp16/bf16
(the memory and speed of an unquantized model; activations are not quantized, so input
scales are checked and not applied). Anything else in `quantization_config` is refused by
name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

E4M3_MAX = 448.0


def _e4m3_table() -> np.ndarray:
    """float32 value of each of the 256 e4m3fn codes (0x7F and 0xFF: NaN)."""
    code = np.arange(256)
    sign = np.where(code & 0x80, -1.0, 1.0)
    exp, man = (code >> 3) & 0xF, code & 0x7
    val = np.where(exp == 0, man / 8 * 2.0**-6, (1 + man / 8) * 2.0 ** (exp - 7.0))
    out = (sign * val).astype(np.float32)
    out[[0x7F, 0xFF]] = np.nan
    return out


E4M3 = _e4m3_table()
_POSITIVE = E4M3[:0x7F]  # codes 0x00..0x7E: 0 and the positive finite values, increasing


def e4m3_decode(bits: np.ndarray) -> np.ndarray:
    """e4m3fn codes (uint8) as float32."""
    return E4M3[np.asarray(bits, np.uint8)]


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    """float32 to the nearest e4m3fn code (ties to the even code), saturating at +-448 (as
    torch's float8_e4m3fn cast of a clamped tensor does); NaN stays NaN."""
    x = np.asarray(x, np.float32)
    a = np.minimum(np.abs(x), E4M3_MAX)
    hi = np.clip(np.searchsorted(_POSITIVE, a), 1, 0x7E)
    lo = hi - 1
    d_lo, d_hi = a - _POSITIVE[lo], _POSITIVE[hi] - a
    up = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(up, hi, lo).astype(np.uint8)
    code |= np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    return np.where(np.isnan(x), np.uint8(0x7F), code).astype(np.uint8)


@dataclass(frozen=True)
class Fp8:
    """How a checkpoint's FP8 weights are stored (see the module docstring)."""

    method: str                          # quant_method
    strategy: str                        # "channel", "tensor" or "block"
    block: tuple[int, int] | None        # (rows, columns) a block scale covers
    scale: str                           # "weight_scale" or "weight_scale_inv"
    ignore: tuple[str, ...]              # modules left unquantized: names or "re:" patterns
    activations: str                     # "dynamic", "static" or "none" (not applied)

    def quantized(self, module: str) -> bool:
        """Whether Linear module `module` (e.g. model.layers.0.self_attn.q_proj) is FP8."""
        for p in self.ignore:
            if p.startswith("re:"):
                if re.fullmatch(p[3:], module):
                    return False
            elif module == p or module.endswith("." + p) or (
                    self.method != "compressed-tensors" and p in module):
                return False
        return True

    def extras(self, module: str) -> tuple[list[str], list[str]]:
        """(tensor names a quantized module must have beside its weight, names it may have):
        its weight scale, and its input scale when activations are static (read, checked,
        not applied; some exporters keep a calibrated one for dynamic ones too)."""
        need, may = [f"{module}.{self.scale}"], [f"{module}.input_scale"]
        if self.activations == "static":
            need.append(may.pop())
        if self.method == "fbgemm_fp8":
            may.append(f"{module}.input_scale_ub")
        return need, may

    def dequantize(self, bits: np.ndarray, scale: np.ndarray, where: str) -> np.ndarray:
        """A weight (out, in) of e4m3 codes times its scale, as float32; ValueError naming
        `where` for a scale of the wrong shape or with values that are not positive and
        finite."""
        out, k = bits.shape
        s = np.asarray(scale, np.float32)
        if not np.isfinite(s).all() or (s <= 0).any():
            raise ValueError(f"{where}: scales must be positive and finite")
        w = e4m3_decode(bits)
        if np.isnan(w).any():
            raise ValueError(f"{where}: holds NaN codes")
        if self.strategy == "tensor":
            if s.size != 1:
                raise ValueError(f"{where}: a per-tensor scale is one number, got shape "
                                 f"{s.shape}")
            return w * s.reshape(())
        if self.strategy == "channel":
            if s.shape not in ((out,), (out, 1)):
                raise ValueError(f"{where}: per-channel scales have shape ({out}, 1), got "
                                 f"{s.shape}")
            return w * s.reshape(out, 1)
        assert self.block is not None
        bm, bn = self.block
        want = (-(-out // bm), -(-k // bn))
        if s.shape != want:
            raise ValueError(f"{where}: {bm} x {bn} block scales of a ({out}, {k}) weight have "
                             f"shape {want}, got {s.shape}")
        full = np.repeat(np.repeat(s, bm, 0), bn, 1)[:out, :k]
        return w * full


def _bad(field: str, why: str) -> ValueError:
    return ValueError(f"quantization_config.{field}: {why}")


def _known(d: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(d) - allowed)
    if extra:
        raise _bad(f"{where}{extra[0]}", "not supported (rawgraph reads FP8 weights only)")


def _names(v: Any, field: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _bad(field, f"must be a list of module names, got {v!r}")
    return tuple(v)


def _float8(w: Any, field: str) -> None:
    if not isinstance(w, dict):
        raise _bad(field, f"must be an object, got {w!r}")
    if w.get("num_bits") != 8 or w.get("type") != "float":
        raise _bad(field, f"num_bits {w.get('num_bits')!r} type {w.get('type')!r}: only 8-bit "
                          f"float (FP8 e4m3) is supported")
    if w.get("symmetric", True) is not True:
        raise _bad(f"{field}.symmetric", "only symmetric FP8 is supported")


def _compressed(qc: dict) -> Fp8:
    _known(qc, {"quant_method", "format", "config_groups", "ignore", "quantization_status",
                "kv_cache_scheme", "global_compression_ratio", "version", "sparsity_config",
                "transform_config", "provider"}, "")
    if qc.get("format", "float-quantized") not in ("float-quantized", "naive-quantized"):
        raise _bad("format", f"{qc.get('format')!r}: float-quantized FP8 only")
    if qc.get("kv_cache_scheme") is not None:
        raise _bad("kv_cache_scheme", "an FP8 KV cache is not supported yet")
    if qc.get("sparsity_config") not in (None, {}):
        raise _bad("sparsity_config", "sparse checkpoints are not supported")
    if qc.get("transform_config") not in (None, {}):
        raise _bad("transform_config", "transformed (rotated) weights are not supported")
    if qc.get("quantization_status", "compressed") not in ("compressed", "frozen"):
        raise _bad("quantization_status", f"{qc.get('quantization_status')!r}: a compressed "
                                          f"checkpoint")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        got = len(groups) if isinstance(groups, dict) else repr(groups)
        raise _bad("config_groups", f"one group (FP8 weights over the Linear layers) expected, "
                                    f"got {got}")
    name, g = next(iter(groups.items()))
    where = f"config_groups.{name}."
    if not isinstance(g, dict):
        raise _bad(where[:-1], f"must be an object, got {g!r}")
    _known(g, {"targets", "weights", "input_activations", "output_activations", "format"},
           where)
    if g.get("targets") not in (["Linear"], ["re:.*Linear"]):
        raise _bad(f"{where}targets", f"{g.get('targets')!r}: FP8 over every Linear only")
    w = g.get("weights")
    _float8(w, f"{where}weights")
    _known(w, {"num_bits", "type", "symmetric", "strategy", "dynamic", "group_size",
               "block_structure", "observer", "observer_kwargs", "actorder", "zp_dtype",
               "scale_dtype"}, f"{where}weights.")
    if w.get("dynamic", False) is not False:
        raise _bad(f"{where}weights.dynamic", "weights must be stored quantized")
    strategy = w.get("strategy")
    if strategy not in ("channel", "tensor", "block"):
        raise _bad(f"{where}weights.strategy", f"{strategy!r}: channel, tensor or block")
    block = None
    if strategy == "block":
        b = w.get("block_structure")
        if not (isinstance(b, list) and len(b) == 2 and all(type(x) is int and x > 0
                                                              for x in b)):
            raise _bad(f"{where}weights.block_structure", f"{b!r}: [rows, columns]")
        block = (b[0], b[1])
    if g.get("output_activations") is not None:
        raise _bad(f"{where}output_activations", "not supported")
    acts = g.get("input_activations")
    if acts is None:
        mode = "none"
    else:
        _float8(acts, f"{where}input_activations")
        mode = "dynamic" if acts.get("dynamic") else "static"
        if acts.get("strategy") not in ("token", "tensor", "group"):
            raise _bad(f"{where}input_activations.strategy",
                       f"{acts.get('strategy')!r}: token, tensor or group")
    return Fp8("compressed-tensors", strategy, block, "weight_scale",
               _names(qc.get("ignore"), "ignore"), mode)


def _fbgemm(qc: dict) -> Fp8:
    _known(qc, {"quant_method", "activation_scale_ub", "modules_to_not_convert"}, "")
    ub = qc.get("activation_scale_ub", 1200.0)
    if isinstance(ub, bool) or not isinstance(ub, (int, float)) or not ub > 0:
        raise _bad("activation_scale_ub", f"{ub!r}: a positive number")
    return Fp8("fbgemm_fp8", "channel", None, "weight_scale",
               _names(qc.get("modules_to_not_convert"), "modules_to_not_convert"), "dynamic")


def _fp8(qc: dict) -> Fp8:
    _known(qc, {"quant_method", "activation_scheme", "weight_block_size",
                "modules_to_not_convert", "ignored_layers", "fmt", "dequantize"}, "")
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise _bad("activation_scheme", f"{scheme!r}: dynamic or static")
    if qc.get("fmt", "e4m3") != "e4m3":
        raise _bad("fmt", f"{qc.get('fmt')!r}: e4m3 only")
    if qc.get("dequantize", False):
        raise _bad("dequantize", "a checkpoint to dequantize is refused: load its original")
    ignore = _names(qc.get("modules_to_not_convert"), "modules_to_not_convert") + _names(
        qc.get("ignored_layers"), "ignored_layers")
    b = qc.get("weight_block_size")
    if b is None:
        return Fp8("fp8", "tensor", None, "weight_scale", ignore, scheme)
    if not (isinstance(b, list) and len(b) == 2 and all(type(x) is int and x > 0 for x in b)):
        raise _bad("weight_block_size", f"{b!r}: [rows, columns]")
    return Fp8("fp8", "block", (b[0], b[1]), "weight_scale_inv", ignore, scheme)


def read(qc: Any) -> Fp8 | None:
    """A config.json's `quantization_config` (None: none), checked; ValueError naming the
    field for any format or setting rawgraph does not load."""
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise _bad("", f"must be an object, got {qc!r}")
    method = qc.get("quant_method")
    readers = {"compressed-tensors": _compressed, "fbgemm_fp8": _fbgemm, "fp8": _fp8}
    if method not in readers:
        raise _bad("quant_method", f"{method!r} is not supported: rawgraph loads "
                                   f"{', '.join(readers)} (FP8 weights)")
    return readers[method](qc)


def quantize(w: np.ndarray, fp8: Fp8) -> tuple[np.ndarray, np.ndarray]:
    """(e4m3 codes, scales) of a float32 weight (out, in) in `fp8`'s layout, each scale its
    group's largest magnitude over 448 (round to nearest): how exporters quantize, for test
    checkpoints."""
    w = np.asarray(w, np.float32)
    out, k = w.shape
    if fp8.strategy == "tensor":
        s = np.array(max(float(np.abs(w).max()), 1e-12) / E4M3_MAX, np.float32)
        return e4m3_encode(w / s), s
    if fp8.strategy == "channel":
        s = (np.maximum(np.abs(w).max(1, keepdims=True), 1e-12) / E4M3_MAX).astype(np.float32)
        return e4m3_encode(w / s), s
    assert fp8.block is not None
    bm, bn = fp8.block
    s = np.zeros((-(-out // bm), -(-k // bn)), np.float32)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            tile = w[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn]
            s[i, j] = max(float(np.abs(tile).max()), 1e-12) / E4M3_MAX
    full = np.repeat(np.repeat(s, bm, 0), bn, 1)[:out, :k]
    return e4m3_encode(w / full), s
