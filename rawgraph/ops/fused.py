"""The GEMV's fused epilogues: the attention's QKV projection with RoPE and the cache append
(`qkv_rope`), the MLP's gate_up projection with SiLU(gate) * up (`gate_up_silu`), either of
rmsnorm(x) without its weight. Decode-sized inputs run one GEMV kernel; larger ones the
projection (`linear`) and then the kernel the epilogue stands for, with the same bits.
"""

from __future__ import annotations

from typing import Any

from rawgraph.ops import shapes
from rawgraph.ops.elementwise import GATE_UP_GROUP, silu_mul
from rawgraph.ops.gemv import GEMV_QUANT, GEMV_ROPE, GEMV_ROWS, GEMV_SILU, gemv_launch
from rawgraph.ops.kv import (
    NO_EXTRAS,
    Cache,
    Extras,
    check_extras,
    qkv_views,
    rope_append,
    rope_append_args,
)
from rawgraph.ops.matmul import (
    device_plan,
    gemm90_launch,
    hopper,
    launch_linear,
    linear_key,
    operands,
    path_of,
    skinny_gemm,
    skinny_wgmma,
)
from rawgraph.ops.norm import rmsnorm
from rawgraph.ops.quantized import Quantized, wide
from rawgraph.ops.variant import by_count, chosen
from rawgraph.symbols import Symbols

# gate_up_silu on the wgmma GEMMs (the tiled GEMM's unsplit tiles, the skinny GEMM) finishes
# SiLU(gate) * up in their epilogue; `Variants.fused_silu` False: the projection, then
# silu_mul (the same bits)


def _check_normed(x: Any, dt: str, norm_eps: float | None, normed: Any, gemv: bool) -> None:
    """Checks for a projection of rmsnorm(x) without its weight (norm_eps given; the weight
    is folded into w): `normed` (x's shape) unless every variant is the GEMV's (`gemv`)."""
    if norm_eps is None:
        return
    if not norm_eps >= 0:
        raise ValueError(f"norm_eps = {norm_eps}: RMSNorm's epsilon must be >= 0")
    if gemv:
        return
    if normed is None:
        raise ValueError("pass `normed` (x's shape): this path normalizes x ahead of the "
                         "projection")
    shapes.tensor(normed, "normed", x.shape, dt)
    if shapes.overlap(x, normed):
        raise ValueError("normed must not overlap x")


def _normed(x: Any, norm_eps: float | None, normed: Any, m: Any, gemv: bool, stream: Any,
            symbols: Symbols | None) -> tuple[Any, float]:
    """(the x a projection reads, the GEMV's norm_eps argument), checked by _check_normed.
    The GEMV (`gemv`) scales its sums by each row's 1 / rms (one kernel); the other paths
    normalize into `normed` first."""
    if norm_eps is None:
        return x, -1.0
    if gemv:
        return x, float(norm_eps)
    rmsnorm(x, None, normed, rows=m, eps=norm_eps, stream=stream, symbols=symbols)
    return normed, -1.0


def qkv_rope(x: Any, w: Any, qkv: Any, cache: Cache, seq_slots: Any, positions: Any,
             freqs: Any, *, head_dim: int, m: Any = None, m_max: int | None = None,
             norm_eps: float | None = None, normed: Any = None, extras: Extras = NO_EXTRAS,
             scratch: Any = None, stream: Any = None, symbols: Symbols | None = None) -> None:
    """The attention's input projection with RoPE and the cache append of its m tokens:
    qkv[:m] = x[:m] @ w.T for the stacked q, k, v weight w ((heads + 2 kv_heads) * head_dim,
    k) (kv_heads from the cache's rows, heads from w's), then `rope_append` on qkv's q, k, v
    (`qkv_views`): q rotated in place, k rotated into cache.k (qkv keeps it as projected), v
    copied into cache.v.

    On the GEMV path (decode-sized m) one kernel does all of it, the append in its epilogue,
    with the same bits as the two kernels the other paths run. `m`, `m_max` as for
    `linear`; seq_slots, positions (tokens,) as for `rope_append`, and like `freqs` and the
    block tables ready before the previous kernel on the stream starts (the GEMV reads them
    while it waits for that kernel, under programmatic dependent launch).

    `norm_eps`: project rmsnorm(x) without its weight instead of x (the input norm's weight
    folded into w, `fold_norm`): the GEMV multiplies its sums by each row's 1 / rms, in the
    same kernel; the other paths first write rmsnorm(x) into `normed` (x's shape).

    `extras`: a family's q, k, v biases and head norms, as `rope_append` applies them (the
    GEMV's epilogue adds a bias the same way; a head norm needs a token's heads whole, so
    with one the GEMV is followed by rope_append). `scratch`: as `linear`'s.
    """
    dt, cap, n, k, m, top = operands(x, w, m, m_max, symbols, scratch)
    if not isinstance(cache, Cache):
        raise TypeError(f"cache must be an ops.Cache, got {type(cache).__name__}")
    kv_size = getattr(cache.k, "shape", (0,))[-1]  # the cache's row: kv_heads * head_dim
    if type(head_dim) is not int or head_dim < 1 or (n - 2 * kv_size) % head_dim \
            or n <= 2 * kv_size:
        raise ValueError(f"w has {n} rows: not q heads of {head_dim} and a k and a v of the "
                         f"cache's row ({kv_size})")
    heads = (n - 2 * kv_size) // head_dim
    shapes.tensor(qkv, "qkv", (cap, n), dt, align=2)
    q, kn, vn = qkv_views(qkv, heads, head_dim)
    _, _, sizes = rope_append_args(q, kn, vn, cache, seq_slots, positions, freqs)
    d, block_size, max_blocks = sizes[2], sizes[5], sizes[6]
    check_extras(dt, sizes, extras)
    if shapes.overlap(x, qkv):
        raise ValueError("qkv must not overlap x (other blocks still read x while it is written)")
    # the GEMV's epilogue rotates whole heads of its 16-row blocks, and normalizes none
    fits = d % GEMV_ROWS == 0 and extras.qk_norm is None
    _check_normed(x, dt, norm_eps, normed, fits and path_of(w, top) == "gemv")
    if path_of(w, top) == "gemm":
        shapes.multiple(n, 2, "n")  # the GEMM stores pairs of outputs

    def run(rows: int) -> None:
        gemv = fits and path_of(w, rows) == "gemv"
        xn, eps = _normed(x, norm_eps, normed, m, gemv, stream, symbols)
        if not gemv:
            launch_linear(dt, rows, xn, w, None, qkv, m, cap, None, stream, symbols, scratch)
            rope_append(q, kn, vn, cache, seq_slots, positions, freqs, m, extras=extras,
                        stream=stream, symbols=symbols)
            return
        key, grid, threads = gemv_launch(dt, rows, n, k, fmt)
        form, ws = (GEMV_QUANT[fmt][2], w.args()) if fmt else (GEMV_ROPE, (w,))
        form[key].launch(grid, threads, (xn, *ws, qkv, m, n, k, cache.k, cache.v,
                                         cache.block_tables, seq_slots, positions, freqs,
                                         heads * d, kn.shape[1], d, block_size, max_blocks,
                                         eps, extras.bias), stream, symbols=symbols)
    fmt = w.fmt if isinstance(w, Quantized) else None
    by_count(m if m_max is None else m_max, run, lambda v: linear_key(v, n, k, fmt),
             stream=stream, symbols=symbols)


def gate_up_silu(x: Any, w: Any, gu: Any, out: Any, *, m: Any = None, m_max: int | None = None,
                 norm_eps: float | None = None, normed: Any = None, scratch: Any = None,
                 stream: Any = None, symbols: Symbols | None = None) -> None:
    """out[:m] = silu(x W_gate^T) * (x W_up^T) for the MLP's fused gate_up weight w
    (2 * inter, k), rows interleaved as `stack_gate_up` stacks them; out (rows, inter).

    Decode-sized m (the GEMV) finishes each output in the GEMV's epilogue, and so do the
    wgmma skinny GEMM and the wgmma GEMM's unsplit tiles (`Variants.fused_silu`): one
    kernel, and `gu` is not touched. Otherwise the projection goes to `gu` (rows, 2 *
    inter) and silu_mul follows. Either way the same bits (both round the projection to the
    storage type first). `m`, `m_max` as for `linear`; `norm_eps`, `normed` as for
    `qkv_rope` (the post-attention norm's weight folded into w); `scratch` as `linear`'s.
    """
    dt, cap, n, k, m, top = operands(x, w, m, m_max, symbols, scratch)
    shapes.multiple(n, 2 * GATE_UP_GROUP, "gate_up rows")
    shapes.tensor(gu, "gu", (cap, n), dt)
    shapes.tensor(out, "out", (cap, n // 2), dt)
    if shapes.overlap(x, out):
        raise ValueError("out must not overlap x (other blocks still read x while it is written)")
    _check_normed(x, dt, norm_eps, normed, path_of(w, top) == "gemv")

    def run(rows: int) -> None:
        kind = path_of(w, rows)
        xn, eps = _normed(x, norm_eps, normed, m, kind == "gemv", stream, symbols)
        fused = chosen().fused_silu
        if kind == "skinny" and skinny_wgmma(rows) and fused:
            w16 = wide(w, rows, scratch, stream=stream, symbols=symbols)
            skinny_gemm(dt, rows, xn, w16, None, out, m, cap, stream, symbols, silu=True)
            return
        if kind == "gemm" and hopper() and fused:
            tile, c = device_plan(rows, n, k)
            if c == 1:  # the tile finishes its outputs itself: one kernel, gu untouched
                w16 = wide(w, rows, scratch, stream=stream, symbols=symbols)
                gemm90_launch(dt, tile, 1, xn, w16, None, out, m, cap, stream, symbols,
                              silu=True)
                return
        if kind != "gemv":
            launch_linear(dt, rows, xn, w, None, gu, m, cap, None, stream, symbols, scratch)
            silu_mul(gu, out, rows=m, stream=stream, symbols=symbols)
            return
        key, grid, threads = gemv_launch(dt, rows, n, k, fmt)
        form, ws = (GEMV_QUANT[fmt][1], w.args()) if fmt else (GEMV_SILU, (w,))
        form[key].launch(grid, threads, (xn, *ws, out, m, n, k, eps), stream, symbols=symbols)
    fmt = w.fmt if isinstance(w, Quantized) else None
    by_count(m if m_max is None else m_max, run, lambda v: linear_key(v, n, k, fmt),
             stream=stream, symbols=symbols)
