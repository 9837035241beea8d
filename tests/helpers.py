"""Test helpers: random device tensors in rawgraph storage, poisoned outputs, a paged cache
of random keys and values, a linear layer checked against its reference, and driving an
engine through injected faults."""

from __future__ import annotations

import cupy
import numpy as np

from rawgraph.dtypes import storage_dtype, to_float32, to_storage

POISON = {"float16": 0x7E00, "bfloat16": 0x7FC1}  # NaN bit patterns no kernel writes
ULP = {"float16": 2.0**-10, "bfloat16": 2.0**-7}  # one unit in the last place at 1.0
DTYPES = ("float16", "bfloat16")  # the storage types every kernel takes


def randn(rng: np.random.Generator, shape: tuple, dtype: str, scale: float = 1.0):
    """(device array in storage dtype, its float32 values on the host)."""
    host = to_storage((rng.standard_normal(shape) * scale).astype(np.float32), dtype)
    return cupy.asarray(host), to_float32(host, dtype)


def poisoned(shape: tuple, dtype: str):
    """A device array filled with a NaN pattern: unwritten elements stay visible."""
    return cupy.full(shape, POISON[dtype], dtype=np.uint16).view(storage_dtype(dtype))


def bits(arr) -> np.ndarray:
    """A 16-bit device array's raw bits on the host (bit-for-bit comparisons)."""
    return cupy.asnumpy(arr.view(np.uint16))


def unwritten(arr, dtype: str) -> np.ndarray:
    """Where a poisoned array still holds the poison (what no kernel wrote)."""
    return bits(arr) == POISON[dtype]


def host(arr, dtype: str) -> np.ndarray:
    """Device storage -> float32 on the host."""
    return to_float32(cupy.asnumpy(arr), dtype)


def paged_cache(rng: np.random.Generator, dtype: str, kv_heads: int, d: int,
                lens: dict[int, int], *, block_size: int = 16, num_blocks: int = 256,
                max_blocks: int = 96):
    """A one-layer PagedKVCache holding `lens[slot]` random tokens per slot (synced to the
    device); returns (cache, K as float32, V as float32)."""
    from rawgraph.memory.paged import PagedKVCache

    kv = PagedKVCache(layers=1, kv_heads=kv_heads, head_dim=d, block_size=block_size,
                      num_blocks=num_blocks, max_seqs=8, max_blocks_per_seq=max_blocks,
                      dtype=dtype)
    for s, n in lens.items():
        kv.tables.add(s)
        kv.tables.append(s, n)
    kv.sync()
    k, kh = randn(rng, kv.k.shape[1:], dtype)
    v, vh = randn(rng, kv.v.shape[1:], dtype)
    kv.k[0], kv.v[0] = k, v
    return kv, kh, vh


def layer0(kv):
    """Layer 0 of a `PagedKVCache` as the ops read it (`ops.Cache`)."""
    from rawgraph import ops
    return ops.Cache(kv.k[0], kv.v[0], kv.block_tables, kv.seq_lens)


def check_linear(stream, rng: np.random.Generator, dtype: str, m: int, n: int, k: int,
                 fused: bool, rows: int) -> None:
    """ops.linear on the first m of `rows` rows (with a residual when `fused`) against the
    float64 reference within 2 ulp, rows past m left unwritten."""
    from rawgraph import ops
    from rawgraph.ops import reference as ref

    x, xh = randn(rng, (rows, k), dtype)
    w, wh = randn(rng, (n, k), dtype, k**-0.5)
    y = poisoned((rows, n), dtype)
    kw, rh = {}, None
    if fused:
        r, rh = randn(rng, (rows, n), dtype)
        kw = {"residual": r}
    cupy.cuda.Device().synchronize()  # inputs made on the default stream; kernels use another
    ops.linear(x, w, y, m=m, stream=stream, **kw)
    stream.synchronize()
    want = ref.linear(xh[:m], wh, dtype, None if rh is None else rh[:m])
    # fp32 accumulation in a different order than float64: allow one rounding step either way
    np.testing.assert_allclose(host(y, dtype)[:m], want, rtol=2 * ULP[dtype],
                               atol=2 * ULP[dtype])
    assert (cupy.asnumpy(y.view(np.uint16))[m:] == POISON[dtype]).all()


def gate_up_both(stream, x, w, m: int, dtype: str):
    """ops.gate_up_silu of x's first m rows through w (fused where the path fuses) beside
    linear then silu_mul on fresh poisoned buffers: (its out on the device, the bits of its
    gu and of the unfused out)."""
    from rawgraph import ops

    rows, inter = x.shape[0], w.shape[0] // 2
    gu, out = poisoned((rows, 2 * inter), dtype), poisoned((rows, inter), dtype)
    gu2, out2 = poisoned((rows, 2 * inter), dtype), poisoned((rows, inter), dtype)
    cupy.cuda.Device().synchronize()
    ops.gate_up_silu(x, w, gu, out, m=m, stream=stream)
    ops.linear(x, w, gu2, m=m, stream=stream)
    ops.silu_mul(gu2, out2, rows=m, stream=stream)
    stream.synchronize()
    return out, bits(gu), bits(out2)


def drive(engine, requests) -> int:
    """Queue `requests` (arrivals counted from now) and step until they finish, carrying on
    after each exception a step raises (RuntimeError, KeyboardInterrupt); how many raised."""
    start = engine.steps
    for r in requests:
        r.arrival += start
        engine.add(r)
    faults = 0
    while not engine.scheduler.idle:
        try:
            engine.step()
        except (KeyboardInterrupt, RuntimeError):
            faults += 1
    engine.drain()
    return faults


def inject(monkeypatch, owner, name: str, at: int, after: bool, error: BaseException) -> dict:
    """Make owner.name raise `error` at its `at`-th call, before or after doing its work;
    returns the call counter ({"n": calls so far})."""
    original, calls = getattr(owner, name), {"n": 0}

    def wrapper(*args, **kw):
        calls["n"] += 1
        if calls["n"] == at and not after:
            raise error
        out = original(*args, **kw)
        if calls["n"] == at:
            raise error
        return out

    monkeypatch.setattr(owner, name, wrapper)
    return calls


def check_quantized_load(ck, method: str, want: dict, plain: dict, head_quantized: bool,
                         tokens) -> float:
    """A quantized checkpoint loaded (`ck`): its format's method, exactly the weights its
    format's math gives (`want`), the LM head quantized or left as it was, and the relative
    L2 distance of its logits over `tokens` from the unquantized model's (`plain`), which
    it returns (above 0: quantized means not equal)."""
    from rawgraph.model.reference import KVState, float_weights, forward

    assert ck.quant is not None and ck.quant.method == method
    assert set(ck.tensors) == set(want)
    for name, w in want.items():
        assert np.array_equal(ck.tensors[name], w), name
    same_head = np.array_equal(ck.tensors["lm_head.weight"], plain["lm_head.weight"])
    assert same_head != head_quantized
    cfg = ck.config
    got = forward(cfg, float_weights(cfg, ck.tensors), tokens, KVState())
    ref = forward(cfg, float_weights(cfg, plain), tokens, KVState())
    err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    assert err > 0
    return err


def drop_tensor(name: str):
    """An edit of a checkpoint's {name: (dtype, array)} that leaves `name` out."""
    return lambda out: out.pop(name)


def set_tensor(name: str, dtype: str, value):
    """An edit of a checkpoint's {name: (dtype, array)} that stores `value` as `name`."""
    return lambda out: out.__setitem__(name, (dtype, value))
