"""Write the generated ends of kernels_cu/ files from rawgraph.ops' kernel tables: each
family's `extern "C"` wrappers, one per instantiation of its template (name, launch bounds,
parameters as the table's `Kernel` declares them):
`python -m rawgraph.ops.generate [DIR]` (a test checks that the files match)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from rawgraph.cuda.generated import forward, splice, wrapper
from rawgraph.cuda.kernel import KERNELS_DIR, Kernel
from rawgraph.dtypes import KERNEL_TYPES
from rawgraph.ops import attention, gemv, norm
from rawgraph.ops.matmul import (
    GEMM,
    GEMM90,
    GEMM90_SILU,
    GEMM90_STAGES,
    SKINNY,
    SKINNY90,
    SKINNY90_SILU,
    SKINNY90_STAGES,
)

MODULE = "rawgraph/ops/generate.py"
_GEMV_CALL = {  # gemv_impl's arguments after the template's, per form
    "": "(x, w, residual, y, m, n, k, -1.f, row_max);",
    "_silu": "(x, w, nullptr, y, m, n, k, norm_eps);",
    "_rope": "(x, w, nullptr, y, m, n, k, norm_eps, nullptr, {k_cache, v_cache, block_tables, "
             "seq_slots, positions, inv_freq, q_size, kv_size, head_dim, block_size, "
             "max_blocks, bias});",
}


def _t(dtype: str) -> str:
    return KERNEL_TYPES[dtype][1]


def _bounds(threads: int | str, blocks: int = 0, cluster: int = 1) -> str:
    dims = f"__cluster_dims__({cluster}, 1, 1) " if cluster > 1 else ""
    return dims + f"__launch_bounds__({threads}{f', {blocks}' if blocks else ''})"


def _call(k: Kernel, impl: str) -> str:
    return f"{impl}({forward(k.declaration)});"


# the quantized forms' calls: the weight's scales (and zeros) after the rope record (`Quant`)
_QUANT = {"e4m3": "{w_scale, nullptr, nullptr, 0}", "i4": "{nullptr, w_scales, w_zeros, group}"}


def _quant_call(epi: str, fmt: str) -> str:
    q = _QUANT[fmt]
    return {"": f"(x, w, residual, y, m, n, k, -1.f, row_max, {{}}, {q});",
            "_silu": f"(x, w, nullptr, y, m, n, k, norm_eps, nullptr, {{}}, {q});",
            "_rope": _GEMV_CALL["_rope"].replace("bias});", f"bias}}, {q});")}[epi]


def _gemv_forms(fmt: str | None) -> list[str]:
    """The GEMV's wrappers over 16-bit weights (`fmt` None) or a quantized format's."""
    variants = gemv.QUANT_VARIANTS[fmt] if fmt else gemv.VARIANTS
    forms = gemv.GEMV_QUANT[fmt] if fmt else (gemv.GEMV, gemv.GEMV_SILU, gemv.GEMV_ROPE)
    wf = {"e4m3": "Wf::kF8", "i4": "Wf::kI4"}.get(fmt or "")
    out = []
    for i, (epi, form) in enumerate(zip(gemv.EPILOGUES, forms)):
        tag = {"": "", "_silu": ", Epi::kSilu", "_rope": ", Epi::kRope"}[epi]
        for dt in KERNEL_TYPES:
            for v in variants:
                k = form[(dt, *v.key)]
                extra = tag if v.warps == 8 and not wf else \
                    (tag or ", Epi::kPlain") + f", {v.warps}" + (f", {wf}" if wf else "")
                args = (f"{_t(dt)}, {v.tile // 8}, {v.unroll}, "
                        f"{'true' if v.segments else 'false'}{extra}")
                call = _quant_call(epi, fmt) if fmt else _GEMV_CALL[epi]
                out.append(wrapper(k.name, k.declaration, f"gemv_impl<{args}>{call}",
                                   _bounds(32 * v.warps, v.min_blocks[i])))
    return out


def _gemv() -> list[str]:
    return _gemv_forms(None)


def _gemv_quant() -> list[str]:
    return [w for fmt in gemv.QUANT_VARIANTS for w in _gemv_forms(fmt)]


def _skinny() -> list[str]:
    return [wrapper(k.name, k.declaration, _call(k, f"skinny_impl<{_t(dt)}, {c}>"),
                    _bounds("kThreads", 2, c)) for (dt, c), k in SKINNY.items()]


def _skinny90() -> list[str]:
    return [wrapper(k.name, k.declaration,
                    _call(k, f"skinny90_impl<{_t(dt)}, {mx}, {c}, "
                             f"{SKINNY90_STAGES[mx, deep]}{', true' if silu else ''}>"),
                    _bounds("kThreads", 1 if deep else 2, c))  # deep: one block an SM
            for silu, table in ((False, SKINNY90), (True, SKINNY90_SILU))
            for (dt, mx, c, deep), k in table.items()]


def _gemm() -> list[str]:
    return [wrapper(k.name, k.declaration, _call(k, f"gemm_impl<{_t(dt)}, {bm}, {bn}>"),
                    _bounds("kThreads")) for (dt, (bm, bn)), k in GEMM.items()]


def _gemm90() -> list[str]:
    # a warpgroup per 64 rows and a producer warp, one block an SM (its ring, GEMM90_STAGES)
    return [wrapper(k.name, k.declaration,
                    _call(k, f"gemm90_impl<{_t(dt)}, {bm // 64}, {bn}, "
                             f"{GEMM90_STAGES[bm, bn]}, {c}>"),
                    _bounds(2 * bm + 32, 1, c))
            for (dt, (bm, bn), c), k in GEMM90.items()] + [
        wrapper(k.name, k.declaration,
                _call(k, f"gemm90_impl<{_t(dt)}, {bm // 64}, {bn}, {GEMM90_STAGES[bm, bn]}, 1, "
                         f"true>"),
                _bounds(2 * bm + 32, 1, 1))
        for (dt, (bm, bn)), k in GEMM90_SILU.items()]


def _decode_attention() -> list[str]:
    out = []
    for (dt, d), k in attention.ATTEND.items():
        c = attention.COMBINE[dt, d]
        out.append(wrapper(k.name, k.declaration, _call(k, f"attend<{_t(dt)}, {d}>"),
                           _bounds(32 * attention.DECODE_WARPS)))
        out.append(wrapper(c.name, c.declaration, _call(c, f"combine<{_t(dt)}, {d}>")))
    return out


# (head dim, rows) -> blocks an SM the TMA prefill kernels are held to: as many as their shared
# memory allows, where ptxas fits the registers without spilling (split d=128 r=128 in 126,
# split d=64 r=64 in 94); their blocks' tiles and softmaxes interleave on the tensor cores
# (benchmarks/NOTES.md, "Prefill")
TMA_BLOCKS_PER_SM = {(128, 128): 2, (64, 64): 5}


def _prefill_loops(unsplit: dict, split: dict, mma: str, kv: str = "") -> list[str]:
    """prefill_loop's wrappers for one family of products (its `Mma`) and of K/V loads (its
    `Kv`: the default gathers; TmaKv's kernels end in the two maps)."""
    out = []
    for table, run in ((unsplit, "false"), (split, "true")):
        for (dt, d, r), k in table.items():
            loop = (f"prefill_loop<{_t(dt)}, {d}, {r}, {run}, {mma}<{_t(dt)}, {d}, {r}>"
                    f"{', ' + kv if kv else ''}>")
            args = forward(k.declaration).split(", ")
            maps = args[-2:] if kv else []  # the runs' arguments (or their defaults) first
            args = args[:len(args) - len(maps)] + (["nullptr", "1", "1"] if run == "false"
                                                   else []) + maps
            blocks = TMA_BLOCKS_PER_SM.get((d, r), 0) if kv else 0
            out.append(wrapper(k.name, k.declaration, f"{loop}({', '.join(args)});",
                               _bounds(2 * r, blocks)))
    return out


def _prefill_attention() -> list[str]:  # unsplit: no workspace, one run
    out = _prefill_loops(attention.PREFILL, attention.PREFILL_SPLIT, "SyncMma")
    for (dt, d), k in attention.PREFILL_COMBINE.items():
        out.append(wrapper(k.name, k.declaration, _call(k, f"combine<{_t(dt)}, {d}>")))
    return out


def _prefill_attention90() -> list[str]:
    return (_prefill_loops(attention.PREFILL90, attention.PREFILL90_SPLIT, "Wgmma90")
            + _prefill_loops(attention.PREFILL90T, attention.PREFILL90T_SPLIT, "Wgmma90",
                             "TmaKv"))


def _rmsnorm() -> list[str]:  # a block a row, then a warp a row
    return [wrapper(k.name, k.declaration,
                    _call(k, f"rmsnorm_impl<{_t(dt)}, {'true' if warp else 'false'}>"))
            for warp, table in ((False, norm.RMSNORM), (True, norm.RMSNORM_ROWS))
            for dt, k in table.items()]


GENERATED: dict[str, Callable[[], list[str]]] = {
    "gemv.cu": _gemv, "gemv_quant.cu": _gemv_quant, "skinny.cu": _skinny,
    "skinny_sm90.cu": _skinny90, "gemm.cu": _gemm,
    "gemm_sm90.cu": _gemm90, "decode_attention.cu": _decode_attention,
    "prefill_attention.cu": _prefill_attention,
    "prefill_attention_sm90.cu": _prefill_attention90, "rmsnorm.cu": _rmsnorm,
}


def source(path: Path) -> str:
    """The text `path` (one of GENERATED's files) should have: its hand-written part, then
    the wrappers generated from its table."""
    return splice(path, MODULE, GENERATED[path.name]())


def main(argv: list[str] | None = None) -> int:
    """Rewrite every generated file (in the package's kernels_cu/, or DIR); 0."""
    args = sys.argv[1:] if argv is None else argv
    folder = Path(args[0]) if args else KERNELS_DIR
    for name in GENERATED:
        target = folder / name
        target.write_text(source(target))
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
