"""The decode step's ceiling as a graph of kernels (`bench decode`'s "read chain ms").

The floor counts a step's bytes at the copy rate as if one kernel moved them all. A step built
of kernels has one for each projection and for each layer's attention, each depending on the
one before, and pays every boundary and every kernel's ramp. The read chain is that step with
nothing else: the bytes the floor counts (each projection's weight, each layer's K and V of the
batch's context, the LM head), each kernel's moved by a read-only kernel
(`stream_read_chained`: loads and an XOR, no arithmetic, no combine, norm or sampling
kernels), in the step's order, in one programmatic chain as the step runs (each link requests
its first bytes before it waits for the one ahead, as the decode GEMV does). No step of one
kernel per projection and attention can beat it, so a row whose goal is under it asks for
more than a graph of such kernels can give (a megakernel's grid barriers are another
design).

Which links launch programmatically is the chain's own best: the programmatic launch saves
small links their start but costs large ones ~12% of their read rate (H200: eight 1 GiB
links 3.94 TB/s chained, 4.51 launched plainly), so the chain is timed under each of
`launch_plans` and the fastest counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import cupy
import numpy as np

from rawgraph.bench.kernels import READ_BLOCKS_PER_SM, READ_THREADS
from rawgraph.cuda.device import multiprocessors
from rawgraph.cuda.kernel import Kernel
from rawgraph.cuda.timing import device_us
from rawgraph.graph.capture import capture
from rawgraph.model.config import ModelConfig
from rawgraph.ops.quantized import Quantized

STREAM_READ_CHAINED = Kernel("stream_read", "stream_read_chained",
                             "const uint4* p, long long n, const uint4* q, long long m, "
                             "unsigned* out")
PROJECTIONS = ("qkv", "o_proj", "gate_up", "down_proj")  # a layer's weights, in step order
LAYER_LINKS = len(PROJECTIONS) + 1  # a layer's kernels: qkv, attention, o, gate_up, down
ATTENTION_AT = 1
PLAIN_FROM = (256 << 20, 32 << 20, 0)  # bytes: a plan launches links moving this much plainly

Range = tuple[int, int]  # (device address, bytes): 16-byte aligned, a multiple of 16 bytes
Link = tuple[Range, ...]  # what one kernel of the chain reads: one range or two


def _range(a: Any, nbytes: int | None = None, what: str = "") -> Range:
    """The first `nbytes` (default all) of CuPy array `a` as a Range."""
    n = a.nbytes if nbytes is None else nbytes
    ptr = int(a.data.ptr)
    if n > a.nbytes:
        raise ValueError(f"{what}: {n} bytes asked of an array of {a.nbytes}")
    if ptr % 16 or n % 16 or n <= 0:
        raise ValueError(f"{what}: {n} bytes at address % 16 = {ptr % 16}: need a positive "
                         f"multiple of 16 bytes, 16-byte aligned")
    return ptr, n


def _weight(w: Any, what: str) -> Link:
    """What a projection's kernel reads of weight `w`: the array, or a quantized record's
    values and scales (`ops.quantized`; the decode GEMV reads no 16-bit copy; a link holds two
    ranges, so a 4-bit weight's zero points, under 2% of its bytes, are left out)."""
    if isinstance(w, Quantized):
        values, scales = w.args()[:2]
        return _range(values, what=what), _range(scales, what=what + " scales")
    return (_range(w, what=what),)


def link_parts(cfg: ModelConfig) -> list[str]:
    """The step part each link of `step_reads` stands for, in its order: per layer "qkv",
    "attention", "o_proj", "gate_up", "down_proj"; then "lm_head"."""
    layer = [*PROJECTIONS[:ATTENTION_AT], "attention", *PROJECTIONS[ATTENTION_AT:]]
    return layer * cfg.layers + ["lm_head"]


def step_reads(cfg: ModelConfig, weights: Mapping[str, Any], k_layers: Sequence[Any],
               v_layers: Sequence[Any], batch: int, ctx: int) -> list[Link]:
    """What each kernel of a decode step of `batch` rows at context `ctx` must read, in the
    step's order: per layer the QKV weight, K and V of batch x ctx tokens (one kernel: the
    attention), the o, gate_up and down weights (a quantized one's values and scales); then the
    LM head. `weights`: the model's (`Model.w`), `k_layers[i]` / `v_layers[i]`: layer i's
    cache (its first batch x ctx token rows are read: the bytes, not the blocks). The bytes
    are the floor's but for the norms' weights (folded into the projections) and the
    embedding row."""
    if batch < 1 or ctx < 1:
        raise ValueError(f"batch {batch}, ctx {ctx}: need at least one row and one token")
    kv = batch * ctx * cfg.kv_size * 2  # one layer's K (or V) bytes, 16-bit storage
    links: list[Link] = []
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        w = [_weight(weights[p + n], p + n) for n in PROJECTIONS]
        kv_read = (_range(k_layers[i], kv, f"layer {i} K"), _range(v_layers[i], kv,
                                                                    f"layer {i} V"))
        links += [w[0], kv_read, w[1], w[2], w[3]]
    links.append(_weight(weights["lm_head"], "lm_head"))
    return links


def read_chain_ms(links: Sequence[Link], stream: Any, *, plain: Sequence[int] = ()) -> float:
    """Median device ms of one replay of a graph that launches `links` (`step_reads`) in
    order as `stream_read_chained` kernels: the first plainly, the others programmatically
    but for the indices in `plain` (launched plainly, each ends the chain there)."""
    if not links:
        raise ValueError("no links to launch")
    out = cupy.zeros(1, np.uint32)
    grid, stops = READ_BLOCKS_PER_SM * multiprocessors(), set(plain)
    with capture(stream, name="read chain") as cap:
        for j, link in enumerate(links):
            (p, n), (q, m) = link[0], link[1] if len(link) > 1 else (0, 0)
            STREAM_READ_CHAINED.launch(grid, READ_THREADS, (p, n // 16, q, m // 16, out), stream,
                                       pdl=j > 0 and j not in stops)
    with cap.graph as g, g.instantiate(upload_stream=stream) as ex:
        return device_us(lambda: ex.launch(stream), stream, reps=10) / 1e3


def launch_plans(links: Sequence[Link], after_attention: Sequence[int]) -> list[tuple[int, ...]]:
    """The sets of links (indices, for `read_chain_ms`'s `plain`) the chain is timed launching
    plainly, each once: none (one unbroken chain); those in `after_attention` (the step ends
    its chain once a layer there: "The programmatic chain" in benchmarks/NOTES.md); and for
    each of PLAIN_FROM, every link that moves at least that many bytes."""
    plans = [(), tuple(sorted(after_attention))]
    for least in PLAIN_FROM:
        plans.append(tuple(j for j, link in enumerate(links)
                           if j > 0 and sum(n for _, n in link) >= least))
    return list(dict.fromkeys(plans))


def _plan_times(cfg: ModelConfig, links: Sequence[Link], stream: Any) -> dict[tuple, float]:
    """`links` (a decode step's, `step_reads`) timed under each of its `launch_plans`: plan
    (the plainly launched indices) -> ms."""
    after_attention = [LAYER_LINKS * i + ATTENTION_AT + 1 for i in range(cfg.layers)]
    return {plain: read_chain_ms(links, stream, plain=plain)
            for plain in launch_plans(links, after_attention)}


def step_chain_ms(cfg: ModelConfig, weights: Mapping[str, Any], k_layers: Sequence[Any],
                  v_layers: Sequence[Any], batch: int, ctx: int, stream: Any) -> float:
    """The read chain of a decode step (`step_reads`), its ceiling as a graph of kernels: the
    fastest of its `launch_plans`."""
    links = step_reads(cfg, weights, k_layers, v_layers, batch, ctx)
    return min(_plan_times(cfg, links, stream).values())


def part_costs(cfg: ModelConfig, weights: Mapping[str, Any], k_layers: Sequence[Any],
               v_layers: Sequence[Any], batch: int, ctx: int, stream: Any) -> dict[str, float]:
    """What each step part costs the read chain, in ms: the chain (its fastest plan) less the
    chain without that part's links (the same plan: the one that was fastest whole), so a
    part's cost includes the boundaries its links add. Keys: "chain" (the whole), then
    `link_parts`'s names. The parts' costs need not add up to the whole: a link removed
    also removes the overlap it gave its neighbours."""
    links, parts = step_reads(cfg, weights, k_layers, v_layers, batch, ctx), link_parts(cfg)
    timed = _plan_times(cfg, links, stream)
    best = min(timed, key=timed.__getitem__)
    costs = {"chain": timed[best]}
    for part in dict.fromkeys(parts):
        keep = [j for j, p in enumerate(parts) if p != part]
        where = {j: i for i, j in enumerate(keep)}  # a kept link's index in the shorter chain
        plain = [where[j] for j in best if j in where]
        costs[part] = timed[best] - read_chain_ms([links[j] for j in keep], stream, plain=plain)
    return costs
