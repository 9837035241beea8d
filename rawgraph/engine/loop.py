"""A whole decode loop in one graph launch: a WHILE conditional node
whose body is a bucket's decode step, its sampler handing each token on as the next step's
input (position and cache length moved on, on the device), plus `decode_advance`, which
records the sampled tokens, stops rows at their stop id or budget and sets the loop
condition. Generating N tokens costs one host launch.

Inside the loop the host cannot patch anything, so the body's decode attention is captured
for the longest context the model allows: each row's split length follows from its own
length, splits past its last find no tokens and leave weight zero in the combine, so tokens
are bit-identical to host-driven decode steps from the same cache (a prompt prefilled with
the kernels of another chunk size rounds differently, which greedy decoding can amplify at a
near-tie: `Model.prefill` picks the engine's chunk). The cache blocks the loop may need are reserved
before the launch and the unused tail is given back after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rawgraph.cuda.kernel import Kernel
from rawgraph.cuda.stream import cupy_stream
from rawgraph.graph.conditional import WhileGraph
from rawgraph.memory.staging import Staging
from rawgraph.model.decoder import Model
from rawgraph.model.step import Shape

ADVANCE = Kernel("decode_loop", "decode_advance",
                 "const int* next, int* slots, const int* stop, int* remaining, int* out, "
                 "int* count, int* step, int batch, int max_steps, unsigned long long handle")
MAX_ROWS = 128  # decode_advance: one thread per row


class DecodeLoop:
    """Up to `max_steps` decode steps of up to `bucket` rows in one launch (`pdl`: the
    body's kernels with programmatic dependent launch, as in `Runner`)."""

    def __init__(self, model: Model, bucket: int, max_steps: int, stream: Any,
                 pdl: bool = True, max_len: int | None = None):
        """`max_len` (default the model's max_context) bounds every context the loop reaches;
        its attention is captured for it, so a tighter bound runs fewer empty splits."""
        max_len = model.max_context if max_len is None else max_len
        if not 1 <= bucket <= min(model.max_batch, MAX_ROWS) or max_steps < 1:
            raise ValueError(f"bucket {bucket}, max_steps {max_steps}: need 1 <= bucket <= "
                             f"{min(model.max_batch, MAX_ROWS)} and max_steps >= 1")
        if not 1 <= max_len <= model.max_context:
            raise ValueError(f"max_len {max_len} outside [1, {model.max_context}] (max_context)")
        self.model, self.bucket, self.max_steps, self.stream = model, bucket, max_steps, stream
        self.pdl, self.max_len = pdl, max_len
        self.state = Staging({"stop": (np.int32, bucket), "remaining": (np.int32, bucket),
                              "count": (np.int32, bucket), "step": (np.int32, 1),
                              "out": (np.int32, max_steps * bucket)})
        self.graph = WhileGraph(self._body, stream, name=f"decode loop B={bucket}")

    def _body(self, stream: Any, handle: int) -> None:
        m, b, st = self.model, self.bucket, self.state.dev
        meta = m.inputs.dec_meta.dev
        m.launch(Shape(batch=b), {"max_len": self.max_len, "advance": 1}, stream, pdl=self.pdl)
        ADVANCE.launch(1, MAX_ROWS, (m.dec["next"], meta["slots"], st["stop"], st["remaining"],
                                     st["out"], st["count"], st["step"], b, self.max_steps,
                                     handle), stream)

    def run(self, slots: Sequence[int], tokens: Sequence[int], budgets: Sequence[int],
            stops: Sequence[int] | None = None) -> list[list[int]]:
        """Feed `tokens` to sequences `slots` and generate until each row has produced its
        budget (at most max_steps) or its stop id; returns each row's tokens."""
        m, n, t = self.model, len(slots), self.model.kv.tables
        if not 0 < n == len(tokens) == len(budgets) <= self.bucket:
            raise ValueError(f"{n} slots, {len(tokens)} tokens, {len(budgets)} budgets: need "
                             f"1 to {self.bucket} rows, one of each")
        stops = list(stops) if stops is not None else [-1] * n
        steps = [min(int(x), self.max_steps) for x in budgets]
        if min(steps) < 1:
            raise ValueError(f"budgets {list(budgets)} must be >= 1")
        was = {s: s in t.active for s in slots}
        start = {s: int(t.lens[s]) if was[s] else 0 for s in slots}
        reach = max(start[s] + k for s, k in zip(slots, steps))
        if reach > self.max_len:
            raise ValueError(f"a row's context would reach {reach} tokens; this loop was "
                             f"captured for max_len = {self.max_len}")
        # host side of the first step, and every block the loop may fill, reserved up front
        m.inputs.decode(slots, tokens, self.stream, sync=False)
        extra = {s: k - 1 for s, k in zip(slots, steps) if k > 1}
        try:
            m.inputs.grow(extra)
        except Exception:
            for s in slots:  # undo the first step's growth: all or nothing
                if was[s]:
                    t.truncate(s, start[s])
                else:
                    t.free(s)
            raise
        m.kv.sync(self.stream, lens={s: start[s] + 1 for s in slots})
        h = self.state.begin()
        h["stop"][:] = -1
        h["stop"][:n] = stops
        h["remaining"][:] = 0
        h["remaining"][:n] = steps
        h["count"][:] = 0
        h["step"][:] = 0
        self.state.push(self.stream)
        self.graph.launch(self.stream)
        s = cupy_stream(self.stream)
        out = self.state.dev["out"].reshape(self.max_steps, self.bucket).get(stream=s)
        count = self.state.dev["count"].get(stream=s)
        result = []
        for b, slot in enumerate(slots):
            c = int(count[b])
            result.append(out[:c, b].tolist())
            t.truncate(slot, start[slot] + c)  # the cache holds the input and c - 1 tokens
        return result

    def close(self) -> None:
        """Destroy the loop's graph."""
        self.graph.close()
