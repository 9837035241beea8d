"""The server's counters, gauges and latency histograms, written in Prometheus' text format.

Updated from two sides (the engine's thread and the HTTP handlers), so every change takes
the lock; `render()` reads a consistent snapshot. With several HTTP processes
(`rawgraph serve --http-processes`), each keeps what its handlers measure (the token latency
histograms, tokens out) in its own slot of a shared block (`http_block`, `Metrics.share`),
and any of them renders the sum over every slot.
"""

from __future__ import annotations

import bisect
import multiprocessing
import threading
import time
from collections import deque
from typing import Any

# seconds: time to first token
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# seconds: inter-token latency and engine iterations, about as fine as the steps' at every
# size (a 1B step is 1.5 ms, an 8B one 6: a p99 of 2 steps must be told from one of 2.3);
# the quantiles `bench serve` reads from them interpolate within a bucket
_MS = (*[0.5 * i for i in range(1, 9)], *range(5, 17), *range(18, 31, 2), 40, 50, 75, 100,
       250)  # 0.5 ms apart to 4, 1 ms to 16, 2 ms to 30
ITL_BUCKETS = (*[t / 1e3 for t in _MS], 1.0, 5.0, 30.0)
# seconds: engine iterations and the engine thread's period (a decode step is milliseconds)
STEP_BUCKETS = (*[t / 1e3 for t in _MS], 1.0)
# seconds: an iteration's host work before the GPU runs it (prepare, patch, launch)
HOST_BUCKETS = (0.00005, 0.0001, 0.00015, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.002,
                0.005, 0.01)
# seconds: the garbage collector's passes in the engine's process, by generation
GC_BUCKETS = (0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
              0.1, 1.0)
GENERATIONS = (0, 1, 2)
# tokens: the prompt tokens a request found in the prefix cache (a multiple of the block size)
TOKEN_BUCKETS = (0, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
# an iteration's kind: decode rows alone, a prefill chunk alone, or both
KINDS = ("decode", "prefill", "mixed")
ROW_KINDS = ("decode", "mixed")  # the kinds with decode rows
PREFIX = "rawgraph_"


class Histogram:
    """Cumulative buckets, a sum and a count (Prometheus' histogram)."""

    def __init__(self, buckets: tuple[float, ...] = BUCKETS):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum, self.count = 0.0, 0

    def observe(self, v: float, times: int = 1) -> None:
        """Record `times` observations of `v`."""
        self.counts[bisect.bisect_left(self.buckets, v)] += times
        self.sum += v * times
        self.count += times

    def lines(self, name: str, labels: str = "") -> list[str]:
        """Its exposition lines; `labels` like 'kind="decode"' go on every line."""
        out, acc = [], 0
        for le, c in zip((*map(str, self.buckets), "+Inf"), self.counts):
            acc += c
            out.append(f'{name}_bucket{{{labels + "," if labels else ""}le="{le}"}} {acc}')
        tail = f"{{{labels}}}" if labels else ""
        return [*out, f"{name}_sum{tail} {self.sum}", f"{name}_count{tail} {self.count}"]


def quantile(text: str, name: str, q: float, labels: str = "") -> float:
    """The q-quantile (0..1) of histogram `name` (without the prefix) in exposition `text`,
    interpolated linearly inside its bucket as Prometheus' histogram_quantile does; NaN
    without observations. A quantile in the +Inf bucket is the last finite bound."""
    if not 0 <= q <= 1:
        raise ValueError(f"q = {q}: a quantile lies in [0, 1]")
    head = f"{PREFIX}{name}_bucket{{{labels + ',' if labels else ''}le=\""
    bounds, counts = [], []
    for line in text.splitlines():
        if line.startswith(head):
            le, value = line[len(head):].split('"} ')
            bounds.append(float(le))
            counts.append(float(value))
    if not counts or counts[-1] == 0:
        return float("nan")
    rank = q * counts[-1]
    i = next(i for i, c in enumerate(counts) if c >= rank)
    if i == len(bounds) - 1:
        return bounds[-2] if len(bounds) > 1 else float("nan")
    lo, below = (bounds[i - 1], counts[i - 1]) if i else (0.0, 0.0)
    inside = counts[i] - below
    return lo + (bounds[i] - lo) * ((rank - below) / inside if inside else 1.0)


def sample(text: str, name: str, labels: str = "") -> float:
    """The value of sample `name` (without the prefix; a counter, a gauge or a histogram's
    `_count`) with exactly `labels` in exposition `text`; NaN if absent."""
    head = f"{PREFIX}{name}{{{labels}}} " if labels else f"{PREFIX}{name} "
    for line in text.splitlines():
        if line.startswith(head):
            return float(line[len(head):])
    return float("nan")


# a shared slot: the two histograms' bucket counts, sum and count (TTFT's, then ITL's), then
# the tokens out and the tokens per second (float64 each: counts stay exact to 2**53)
_TTFT, _ITL = len(BUCKETS) + 3, len(ITL_BUCKETS) + 3
SLOT = _TTFT + _ITL + 2


def http_block(processes: int) -> Any:
    """Shared memory for the HTTP-side metrics of `processes` HTTP processes (a slot each),
    made before they start and handed to each (`Metrics.share`)."""
    return multiprocessing.RawArray("d", processes * SLOT)


def _hist_values(h: Histogram) -> list[float]:
    return [*map(float, h.counts), h.sum, float(h.count)]


class Metrics:
    """What /metrics reports."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = {"completed": 0, "aborted": 0, "refused": 0, "failed": 0}
        self.prompt_tokens = self.generation_tokens = 0
        self.running = self.waiting = self.batch = 0
        self.kv_blocks_used = self.kv_blocks_total = 0
        self.iterations = {"graph": 0, "eager": 0}
        self.decode_steps = self.nodes_patched = 0
        self.decode_rows = 0  # rows with a sequence, summed over iterations with decode rows
        # the engine's graph pool (none on the reference decoder): held, their memory, and
        # how many it captured (at start-up, then on a miss) and evicted for its budget
        self.graphs = self.graph_bytes = self.graph_captures = self.graph_evictions = 0
        self.step_failures = 0
        # the prefix cache: prompt tokens started and found cached, blocks it holds, evicted
        self.prompt_tokens_started = self.prompt_tokens_cached = 0
        self.prefix_blocks = self.prefix_evictions = 0
        self.cached_tokens = Histogram(TOKEN_BUCKETS)  # per finished request
        self.ttft, self.itl = Histogram(), Histogram(ITL_BUCKETS)
        self.iteration = {k: Histogram(STEP_BUCKETS) for k in KINDS}  # Engine.step's time
        self.host = {k: Histogram(HOST_BUCKETS) for k in KINDS}  # its prepare, patch, launch
        self.period = Histogram(STEP_BUCKETS)  # from one engine step's start to the next
        # iterations with decode rows: those that continued the last step on the device
        # (counted), and the time of those fed from the host (the rows changed)
        self.continued = dict.fromkeys(ROW_KINDS, 0)
        self.fed = {k: Histogram(STEP_BUCKETS) for k in ROW_KINDS}
        # the engine process's collector: its passes, and the objects frozen at start-up
        self.gc_pause = {g: Histogram(GC_BUCKETS) for g in GENERATIONS}
        self.gc_frozen = 0
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens) of the last 10 s
        self._in_recent = 0  # their tokens
        self._block: Any = None  # the HTTP processes' shared slots, and this one's
        self._slot = 0

    def share(self, block: Any, index: int) -> None:
        """Keep this process's HTTP-side values in slot `index` of `block` (`http_block`)
        and render the sum over every slot: the server's HTTP processes together."""
        if not 0 <= index < len(block) // SLOT:
            raise ValueError(f"slot {index} outside the block's {len(block) // SLOT}")
        self._block, self._slot = block, index

    def publish(self) -> None:
        """Write this process's HTTP-side values to its shared slot (nothing if unshared);
        the caller holds the lock. Others see them as of the last call."""
        if self._block is not None:
            at = self._slot * SLOT
            self._block[at:at + SLOT] = [*_hist_values(self.ttft), *_hist_values(self.itl),
                                         float(self.generation_tokens), self.tokens_per_s()]

    def _http_side(self) -> tuple[Histogram, Histogram, int, float]:
        """(ttft, itl, tokens out, tokens per second): this process's, or every slot's sum."""
        if self._block is None:
            return self.ttft, self.itl, self.generation_tokens, self.tokens_per_s()
        self.publish()
        total = [0.0] * SLOT
        for i in range(len(self._block) // SLOT):
            for j, v in enumerate(self._block[i * SLOT:(i + 1) * SLOT]):
                total[j] += v
        hists = []
        for part, buckets in ((total[:_TTFT], BUCKETS),
                              (total[_TTFT:_TTFT + _ITL], ITL_BUCKETS)):
            h = Histogram(buckets)
            h.counts, h.sum, h.count = [int(c) for c in part[:-2]], part[-2], int(part[-1])
            hists.append(h)
        return hists[0], hists[1], int(total[-2]), total[-1]

    def tokens_out(self, n: int) -> None:
        """`n` tokens generated now."""
        with self.lock:
            self.generation_tokens += n
            now = time.monotonic()
            self._recent.append((now, n))
            self._in_recent += n
            self._trim(now)

    def tokens_per_s(self) -> float:
        """Generated tokens per second over the last 10 s (a running total: with several
        HTTP processes it is read on every engine message); the caller holds the lock."""
        self._trim(time.monotonic())
        return self._in_recent / 10

    def _trim(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - 10:
            self._in_recent -= self._recent.popleft()[1]

    def render(self) -> str:
        """The exposition text."""
        with self.lock:
            ttft, itl, generated, rate = self._http_side()
            lines: list[str] = []

            def metric(name: str, kind: str, help_: str, values: list[str] | float) -> None:
                """One metric's lines; a number is its one unlabelled sample."""
                if not isinstance(values, list):
                    values = [f"{name} {values}"]
                lines.extend([f"# HELP {PREFIX}{name} {help_}", f"# TYPE {PREFIX}{name} {kind}"])
                lines.extend(f"{PREFIX}{v}" for v in values)

            def by(name: str, label: str, hists: dict[Any, Histogram]) -> list[str]:
                return [x for k, h in hists.items() for x in h.lines(name, f'{label}="{k}"')]

            metric("requests_total", "counter", "Requests by how they ended (aborted: ended "
                   "early for a client gone, a stop string, a deadline or a shutdown).",
                   [f'requests_total{{status="{k}"}} {v}' for k, v in self.requests.items()])
            metric("prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
                   self.prompt_tokens)
            metric("generation_tokens_total", "counter", "Tokens generated.",
                   generated)
            metric("generation_tokens_per_second", "gauge", "Tokens generated per second, "
                   "over the last 10 s.", rate)
            metric("requests_running", "gauge", "Requests in the batch.",
                   self.running)
            metric("requests_waiting", "gauge", "Requests queued for admission.",
                   self.waiting)
            metric("batch_size", "gauge", "Decode rows in the last step.",
                   self.batch)
            metric("kv_blocks_used", "gauge", "KV cache blocks in use.",
                   self.kv_blocks_used)
            metric("kv_blocks_total", "gauge", "KV cache blocks.",
                   self.kv_blocks_total)
            metric("prefix_cache_queried_tokens_total", "counter", "Prompt tokens of the "
                   "requests started (each prompt once it is in the cache).",
                   self.prompt_tokens_started)
            metric("prefix_cache_hit_tokens_total", "counter", "Of those, the tokens found "
                   "in the prefix cache (not prefilled).", self.prompt_tokens_cached)
            metric("prefix_cache_hit_rate", "gauge", "Hit tokens over queried tokens so far.",
                   self.prompt_tokens_cached / max(self.prompt_tokens_started, 1))
            metric("prefix_cache_blocks", "gauge", "KV blocks the prefix cache holds (in use "
                   "or idle, evicted least recently used first).", self.prefix_blocks)
            metric("prefix_cache_evictions_total", "counter", "Cached blocks evicted for "
                   "fresh ones.", self.prefix_evictions)
            metric("request_cached_tokens", "histogram", "Prompt tokens a finished request "
                   "found in the prefix cache.",
                   self.cached_tokens.lines("request_cached_tokens"))
            metric("iterations_total", "counter", "Engine iterations, by graph replay or "
                   "eager fallback.", [f'iterations_total{{mode="{k}"}} {v}'
                                       for k, v in self.iterations.items()])
            metric("decode_steps_total", "counter", "Decode-only iterations.",
                   self.decode_steps)
            metric("decode_rows_total", "counter", "Rows with a sequence, summed over the "
                   "iterations with decode rows (over their count: how full the batch runs).",
                   self.decode_rows)
            metric("graphs_held", "gauge", "Executable graphs the engine's pool holds.",
                   self.graphs)
            metric("graph_memory_bytes", "gauge", "Device memory those graphs took.",
                   self.graph_bytes)
            metric("graph_captures_total", "counter", "Graphs captured and instantiated: at "
                   "start-up, then on a miss (a bucket or chunk size first used, or one "
                   "evicted before), which the iteration waits for.",
                   self.graph_captures)
            metric("graph_evictions_total", "counter", "Graphs destroyed to keep the pool "
                   "within its budget (the engine's max_graphs and max_graph_bytes).",
                   self.graph_evictions)
            metric("nodes_patched_total", "counter", "Graph kernel nodes patched.",
                   self.nodes_patched)
            metric("step_failures_total", "counter", "Iterations that raised (rolled back).",
                   self.step_failures)
            metric("iteration_seconds", "histogram", "Engine iterations by kind: decode "
                   "rows alone, a prefill chunk alone, or both.",
                   by("iteration_seconds", "kind", self.iteration))
            metric("iteration_host_seconds", "histogram", "Engine iterations' host work "
                   "before the GPU runs them (metadata, patches, launches), by kind.",
                   by("iteration_host_seconds", "kind", self.host))
            metric("iterations_continued_total", "counter", "Iterations with decode rows "
                   "whose step continued the last one on the device (its rows in their "
                   "places: launched before the last one's tokens were read), by kind.",
                   [f'iterations_continued_total{{kind="{k}"}} {v}'
                    for k, v in self.continued.items()])
            metric("iteration_fed_seconds", "histogram", "Iterations with decode rows fed "
                   "from the host (the rows changed: the last step's tokens were read first), "
                   "by kind: Engine.step's time.",
                   by("iteration_fed_seconds", "kind", self.fed))
            metric("gc_pause_seconds", "histogram", "The garbage collector's passes in the "
                   "engine's process, by generation (the engine's thread waits them out).",
                   by("gc_pause_seconds", "generation", self.gc_pause))
            metric("gc_frozen_objects", "gauge", "Objects the engine's process froze out of "
                   "the collector's reach once it had started (gc.freeze).",
                   self.gc_frozen)
            metric("iteration_period_seconds", "histogram", "From one iteration's start to "
                   "the next's while requests run (the iteration, admission and publishing "
                   "its tokens): what a streaming client sees between tokens.",
                   self.period.lines("iteration_period_seconds"))
            metric("time_to_first_token_seconds", "histogram", "Arrival to first token.",
                   ttft.lines("time_to_first_token_seconds"))
            metric("inter_token_latency_seconds", "histogram", "Between streamed tokens.",
                   itl.lines("inter_token_latency_seconds"))
            return "\n".join(lines) + "\n"
