"""Quantized checkpoints: the `quantization_config` formats published models use, read
strictly, and their weights turned back into the numbers the decoder multiplies.

FP8 formats (config.json's `quantization_config.quant_method`):
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
FP8 weights are stored as `F8_E4M3` (e4m3fn: 4 exponent bits, bias 7, 3 mantissa bits, no
infinities, largest 448).

4-bit formats (weight-only, group-wise scales and zero points; `Int4`):
- `awq` (AutoAWQ's GEMM version): `qweight` int32 (in, out / 8), eight output columns a
  word in AWQ's interleaved order (`AWQ_ORDER`); `qzeros` int32 (groups, out / 8) alike;
  `scales` (groups, out); a weight is (q - zero) x scale.
- `gptq` (AutoGPTQ, GPTQModel, transformers' GPTQConfig): `qweight` int32 (in / 8, out),
  eight input rows a word, the lowest nibble first; `qzeros` int32 (groups, out / 8), eight
  columns a word; `scales` (groups, out); `g_idx` (in,) the group of each input row (any
  order with `desc_act`, sequential without). The `gptq` checkpoint format stores each zero
  point less one; `gptq_v2` stores it as it is.

`Fp8.weight` / `Int4.weight` dequantize each weight in float32 at load, and the model runs in
the checkpoint's fp16/bf16 (FP8 activations are not quantized, so input scales are checked and
not applied). `Model(quantize="fp8" | "int4")` then keeps quantized copies of its projections
for the decode GEMV (quantized again from the loaded weights with the norms folded in: a
per-column norm weight does not fold into a checkpoint's per-row or per-group scales).
Anything else in `quantization_config` is refused by name.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from rawgraph.dtypes import E4M3_MAX, e4m3_decode, e4m3_encode, from_bf16_bits


class Stored(NamedTuple):
    """One tensor of a quantized module as the checkpoint stores it: its array (bf16 as
    uint16 bits, FP8 as uint8 codes), its dtype's name (`safetensors.DTYPES`) and where it
    is, for errors (file and tensor name)."""

    array: np.ndarray
    dtype: str
    where: str


def _float32(t: Stored) -> np.ndarray:
    """A stored float tensor as float32; ValueError if it is not a float tensor."""
    if t.dtype not in ("float16", "bfloat16", "float32"):
        raise ValueError(f"{t.where} is {t.dtype}; a float16, bfloat16 or float32 tensor "
                         f"expected")
    return from_bf16_bits(t.array) if t.dtype == "bfloat16" else np.asarray(t.array, np.float32)


def _shape(t: Stored, want: tuple[int, ...]) -> None:
    if tuple(t.array.shape) != want:
        raise ValueError(f"{t.where} has shape {tuple(t.array.shape)}, {want} expected")


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

    replaces_weight = False  # its `.weight` holds the e4m3 codes

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


    def weight(self, parts: dict[str, Stored], shape: tuple[int, int]) -> np.ndarray:
        """A quantized module's weight (out, in) as float32 from its stored tensors (by the
        suffix after the module's name: `weight`, its scale, input scales); ValueError
        naming the tensor for a wrong dtype, shape or value."""
        w, sc = parts["weight"], parts[self.scale]
        if w.dtype != "float8_e4m3":
            raise ValueError(f"{w.where} is {w.dtype}; quantization_config quantizes it "
                             f"(F8_E4M3 expected, or list its module in the ignore list)")
        _shape(w, shape)
        if sc.dtype == "float8_e4m3":
            raise ValueError(f"{sc.where} must be a float scale")
        for name in ("input_scale", "input_scale_ub"):  # checked; activations unquantized
            if name in parts:
                x = parts[name]
                if x.dtype == "float8_e4m3" or not (np.isfinite(_float32(x)).all()
                                                    and (_float32(x) > 0).all()):
                    raise ValueError(f"{x.where} must hold positive, finite scales")
        return self.dequantize(np.asarray(w.array), _float32(sc), w.where)


# -- 4-bit weights --------------------------------------------------------------------------

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds its columns' AWQ_ORDER[i]
_AWQ_FROM = np.argsort(AWQ_ORDER)  # natural column c of a word: nibble _AWQ_FROM[c]


def unpack_nibbles(words: np.ndarray, axis: int) -> np.ndarray:
    """2-D int32 words of eight 4-bit values (the lowest nibble first) spread along `axis`
    (its length times 8), as uint8."""
    u = np.ascontiguousarray(words).view(np.uint32)
    nib = ((u[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF).astype(np.uint8)
    if axis == 1:
        return nib.reshape(u.shape[0], -1)
    return nib.transpose(0, 2, 1).reshape(-1, u.shape[1])


def pack_nibbles(values: np.ndarray, axis: int) -> np.ndarray:
    """The inverse of `unpack_nibbles`: 2-D values in [0, 16) packed eight to an int32 word
    along `axis`."""
    v = np.asarray(values, np.uint32)
    if axis == 1:
        groups = v.reshape(v.shape[0], -1, 8)
    else:
        groups = v.reshape(-1, 8, v.shape[1]).transpose(0, 2, 1)
    return (groups << (4 * np.arange(8, dtype=np.uint32))).sum(-1, dtype=np.uint32).view(
        np.int32)


def _awq_columns(x: np.ndarray) -> np.ndarray:
    """Columns unpacked in AWQ's nibble order, put in their natural order."""
    n = x.shape[1]
    return x[:, (np.arange(n) // 8) * 8 + _AWQ_FROM[np.arange(n) % 8]]


@dataclass(frozen=True)
class Int4:
    """How a checkpoint's 4-bit weights are stored (see the module docstring)."""

    method: str                # "awq" or "gptq"
    group: int                 # input columns a scale and a zero point cover (-1: a row)
    desc_act: bool             # gptq: groups follow g_idx in any order
    zero_offset: int           # added to each stored zero point (gptq's v1 format: 1)
    ignore: tuple[str, ...]    # modules left unquantized (any part of their dotted names)
    lm_head: bool = False      # gptq: the LM head is quantized too

    replaces_weight = True  # `.qweight`, `.qzeros`, `.scales` (`.g_idx`) stand for `.weight`
    strategy = "group"

    def quantized(self, module: str) -> bool:
        """Whether Linear module `module` is stored in 4 bits."""
        if module == "lm_head":
            return self.lm_head
        return not any(p in module for p in self.ignore)  # as transformers matches them

    def extras(self, module: str) -> tuple[list[str], list[str]]:
        """(tensor names a quantized module must have in place of its weight, names it may
        have: gptq's `g_idx` without desc_act, where the groups are sequential)."""
        need = [f"{module}.{t}" for t in ("qweight", "qzeros", "scales")]
        may = []
        if self.method == "gptq":
            (need if self.desc_act else may).append(f"{module}.g_idx")
        return need, may

    def groups(self, k: int) -> int:
        """Scale groups of a weight of `k` input columns."""
        return 1 if self.group == -1 else k // self.group

    def weight(self, parts: dict[str, Stored], shape: tuple[int, int]) -> np.ndarray:
        """A module's weight (out, in) as float32: (q - zero) x scale of each element's
        group; ValueError naming the tensor for a wrong dtype, shape, group or value."""
        out, k = shape
        qw, qz, sc = parts["qweight"], parts["qzeros"], parts["scales"]
        if self.group != -1 and k % self.group:
            raise ValueError(f"{qw.where}: group_size {self.group} does not divide the "
                             f"{k} input columns")
        if out % 8 or k % 8:
            raise ValueError(f"{qw.where}: a ({out}, {k}) weight does not pack eight to a "
                             f"word")
        g = self.groups(k)
        for t in (qw, qz):
            if t.dtype != "int32":
                raise ValueError(f"{t.where} is {t.dtype}; I32 words of eight 4-bit values "
                                 f"expected")
        _shape(qw, (k, out // 8) if self.method == "awq" else (k // 8, out))
        _shape(qz, (g, out // 8))
        _shape(sc, (g, out))
        scales = _float32(sc)
        if not np.isfinite(scales).all():
            raise ValueError(f"{sc.where} holds values that are not finite")
        if self.method == "awq":
            q = _awq_columns(unpack_nibbles(qw.array, 1))  # (k, out)
            z = _awq_columns(unpack_nibbles(qz.array, 1))
        else:
            q, z = unpack_nibbles(qw.array, 0), unpack_nibbles(qz.array, 1)
        rows = self._rows(parts.get("g_idx"), k, g)
        zero = z.astype(np.float32) + self.zero_offset
        return ((q.astype(np.float32) - zero[rows]) * scales[rows]).T.copy()

    def _rows(self, g_idx: Stored | None, k: int, g: int) -> np.ndarray:
        """Each input row's group: sequential, or gptq's `g_idx` (checked)."""
        seq = np.arange(k) // (k if self.group == -1 else self.group)
        if g_idx is None:
            return seq
        if g_idx.dtype != "int32":
            raise ValueError(f"{g_idx.where} is {g_idx.dtype}; I32 group indices expected")
        _shape(g_idx, (k,))
        rows = np.asarray(g_idx.array, np.int64)
        if rows.min(initial=0) < 0 or rows.max(initial=0) >= g:
            raise ValueError(f"{g_idx.where}: group indices outside [0, {g})")
        if not self.desc_act and not np.array_equal(rows, seq):
            raise ValueError(f"{g_idx.where} is not sequential, but desc_act is false")
        return rows


def quantize_int4(w: np.ndarray, group: int, sym: bool = False
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round-to-nearest 4-bit quantization of a float32 weight (out, in) in groups of
    `group` input columns (-1: whole rows): (q (out, in) in [0, 16), zero points (groups,
    out), scales (groups, out) float32), so that w ~ (q - zero) x scale. Asymmetric: a
    group's range over 15 steps; `sym`: its largest magnitude over 7, zero 8."""
    w = np.asarray(w, np.float32)
    out, k = w.shape
    size = k if group == -1 else group
    blocks = w.reshape(out, k // size, size)
    if sym:
        scale = np.maximum(np.abs(blocks).max(-1), 1e-8) / 7
        zero = np.full(scale.shape, 8.0, np.float32)
    else:
        lo, hi = np.minimum(blocks.min(-1), 0), np.maximum(blocks.max(-1), 0)
        scale = np.maximum(hi - lo, 1e-8) / 15
        zero = np.clip(np.round(-lo / scale), 0, 15)
    q = np.clip(np.round(blocks / scale[..., None]) + zero[..., None], 0, 15)
    return (q.reshape(out, k).astype(np.uint8), zero.T.astype(np.int64),
            scale.T.astype(np.float32))


def pack_int4(fmt: Int4, q: np.ndarray, zero: np.ndarray, scale: np.ndarray
              ) -> dict[str, np.ndarray]:
    """The tensors `fmt` stores for a weight quantized as `quantize_int4` gives it: qweight,
    qzeros (less the format's zero offset), scales (float16) and for gptq g_idx, laid out
    as the format's tools write them (for test checkpoints)."""
    qt = np.asarray(q, np.uint8).T  # (in, out)
    z = np.asarray(zero, np.int64) - fmt.zero_offset
    if (z < 0).any():
        raise ValueError("a zero point of 0 cannot be stored in the gptq (v1) format")
    if fmt.method == "awq":
        order = (np.arange(qt.shape[1]) // 8) * 8 + np.asarray(AWQ_ORDER)[
            np.arange(qt.shape[1]) % 8]
        return {"qweight": pack_nibbles(qt[:, order], 1),
                "qzeros": pack_nibbles(z[:, order] & 0xF, 1),
                "scales": scale.astype(np.float16)}
    k = qt.shape[0]
    return {"qweight": pack_nibbles(qt, 0), "qzeros": pack_nibbles(z & 0xF, 1),
            "scales": scale.astype(np.float16),
            "g_idx": (np.arange(k) // (k if fmt.group == -1 else fmt.group)).astype(np.int32)}



def _bad(field: str, why: str) -> ValueError:
    return ValueError(f"quantization_config.{field}: {why}")


def _known(d: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(d) - allowed)
    if extra:
        raise _bad(f"{where}{extra[0]}", "not supported")


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


def _group_size(qc: dict) -> int:
    g = qc.get("group_size", 128)
    if type(g) is not int or not (g == -1 or (g > 0 and g % 8 == 0)):
        raise _bad("group_size", f"{g!r}: a positive multiple of 8 (128, 64, 32) or -1")
    return g


def _bits(qc: dict) -> None:
    if qc.get("bits", qc.get("w_bit")) != 4:
        raise _bad("bits", f"{qc.get('bits')!r}: 4-bit weights only")


def _awq(qc: dict) -> Int4:
    _known(qc, {"quant_method", "bits", "group_size", "zero_point", "version",
                "modules_to_not_convert", "backend", "do_fuse", "fuse_max_seq_len",
                "modules_to_fuse", "exllama_config"}, "")
    _bits(qc)
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        raise _bad("version", f"{qc.get('version')!r}: AWQ's GEMM layout only (gemv, marlin "
                              f"and exllama repack it)")
    if qc.get("zero_point", True) is not True:
        raise _bad("zero_point", "AWQ with zero points only")
    return Int4("awq", _group_size(qc), False, 0,
                _names(qc.get("modules_to_not_convert"), "modules_to_not_convert"))


_GPTQ_FIELDS = {  # those of the quantizing run or of other runtimes have no say in the math
    "quant_method", "bits", "group_size", "desc_act", "sym", "true_sequential",
    "static_groups", "damp_percent", "damp_auto_increment", "checkpoint_format", "format",
    "lm_head", "meta", "pack_dtype", "model_name_or_path", "model_file_base_name", "dataset",
    "tokenizer", "use_cuda_fp16", "model_seqlen", "block_name_to_quantize",
    "module_name_preceding_first_block", "batch_size", "pad_token_id", "use_exllama",
    "max_input_length", "exllama_config", "cache_block_outputs", "backend", "mse",
    "quantizer", "modules_to_not_convert", "dynamic", "modules_in_block_to_quantize",
    "act_group_aware", "hyb_act", "v2", "v2_alpha", "true_seq", "offload_to_disk",
    "offload_to_disk_path", "rotation", "is_marlin_format", "adapter", "hessian"}


def _gptq(qc: dict) -> Int4:
    _known(qc, _GPTQ_FIELDS, "")
    _bits(qc)
    fmt = qc.get("checkpoint_format", qc.get("format", "gptq"))
    if fmt not in ("gptq", "gptq_v2"):
        raise _bad("checkpoint_format", f"{fmt!r}: gptq or gptq_v2 (marlin, bitblas and "
                                        f"ipex repack the weights)")
    for flag in ("desc_act", "sym", "lm_head"):
        if not isinstance(qc.get(flag, False), bool):
            raise _bad(flag, f"{qc.get(flag)!r}: true or false")
    if qc.get("pack_dtype", "int32") not in ("int32", "torch.int32"):
        raise _bad("pack_dtype", f"{qc.get('pack_dtype')!r}: int32 words only")
    if qc.get("dynamic") not in (None, {}):
        raise _bad("dynamic", "per-module overrides (bits, group size) are not supported")
    if qc.get("modules_in_block_to_quantize") is not None:
        raise _bad("modules_in_block_to_quantize", "every Linear of a block quantized only")
    if qc.get("is_marlin_format", False) or qc.get("rotation") or qc.get("adapter"):
        raise _bad("is_marlin_format" if qc.get("is_marlin_format") else
                   "rotation" if qc.get("rotation") else "adapter",
                   "repacked, rotated or adapted weights are not supported")
    return Int4("gptq", _group_size(qc), bool(qc.get("desc_act", False)),
                1 if fmt == "gptq" else 0,
                _names(qc.get("modules_to_not_convert"), "modules_to_not_convert"),
                bool(qc.get("lm_head", False)))


Format = Fp8 | Int4  # what `read` returns: how a checkpoint's Linear weights are stored


def read(qc: Any) -> Format | None:
    """A config.json's `quantization_config` (None: none), checked; ValueError naming the
    field for any format or setting rawgraph does not load."""
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise _bad("", f"must be an object, got {qc!r}")
    method = qc.get("quant_method")
    readers = {"compressed-tensors": _compressed, "fbgemm_fp8": _fbgemm, "fp8": _fp8,
               "awq": _awq, "gptq": _gptq}
    if method not in readers:
        raise _bad("quant_method", f"{method!r} is not supported: rawgraph loads "
                                   f"{', '.join(readers)}")
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
