"""Timing: host time per call (perf_counter) and device time (CUDA events), medians."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import cupy


def host_us(fn: Callable[[], Any], calls: int = 200, batches: int = 7, warmup: int = 20,
            sync: Any = None) -> float:
    """Median over `batches` of the host time of one call to `fn`, in microseconds.

    `sync` (a stream) is synchronized between batches, outside the timed region, so queued
    device work never backs up into the host timing.
    """
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(batches):
        if sync is not None:
            sync.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    if sync is not None:
        sync.synchronize()
    return statistics.median(out)


def device_us(fn: Callable[[], Any], stream: cupy.cuda.Stream, reps: int = 20,
              warmup: int = 3, before: Callable[[], Any] | None = None) -> float:
    """Median device time of `fn`'s work on `stream` (CUDA events), in microseconds.
    `before` (untimed) runs ahead of each repetition: work that keeps the GPU busy while
    `fn` queues host-heavy calls, say."""
    for _ in range(warmup):
        fn()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    out = []
    for _ in range(reps):
        if before is not None:
            before()
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        out.append(cupy.cuda.get_elapsed_time(start, end) * 1e3)
    return statistics.median(out)


def wall_ms(fn: Callable[[], Any], reps: int = 5) -> float:
    """Median wall time of `fn` in milliseconds (for one-off costs like capture)."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)
