"""Ops run on CuPy's current stream by default, so they see what CuPy (or a kernel) wrote
there just before, however slow that write. Each op family's inputs are written by a kernel
that first spins for a few milliseconds, on the current stream, right before the op is called
without a stream: the op must produce exactly what it produces on inputs written long ago.
An op on a stream of its own would run during the spin and read the zeros beneath."""

import cupy
import numpy as np
import pytest

from rawgraph import ops
from rawgraph.ops.attention import workspace_floats

pytestmark = pytest.mark.gpu
SPIN_MS = 5

_SLOW_COPY = cupy.RawKernel(r"""
extern "C" __global__ void slow_copy(const unsigned char* src, unsigned char* dst,
                                     unsigned long long n, unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    dst[i] = src[i];
}""", "slow_copy")


def slow_copy(dst: cupy.ndarray, src: cupy.ndarray, ms: float = SPIN_MS) -> None:
    """dst[...] = src on the current stream, by a kernel that spins `ms` first."""
    n = src.nbytes
    _SLOW_COPY((max(1, min(256, -(-n // 256))),), (256,),
               (src, dst, np.uint64(n), np.uint64(int(ms * 1e6))))


def _h(rng, *shape, scale=1.0):
    return cupy.asarray((rng.standard_normal(shape) * scale).astype(np.float16))


def _i32(values):
    return cupy.asarray(np.asarray(values, np.int32))


def _cache(rng, kv_heads, d, lens, block_size=16, blocks=16, max_blocks=8):
    """A paged cache with random K/V; slot s holds lens[s] tokens in blocks s*max_blocks..."""
    k = _h(rng, blocks * len(lens), block_size, kv_heads * d)
    v = _h(rng, blocks * len(lens), block_size, kv_heads * d)
    table = np.full((len(lens), max_blocks), -1, np.int32)
    for s, n in enumerate(lens):
        nb = -(-n // block_size)
        table[s, :nb] = np.arange(s * blocks, s * blocks + nb)
    return k, v, _i32(table), _i32(lens)


def _families(rng):
    """name -> (arrays, call(arrays)): every op family on small shapes."""
    fam = {}
    fam["add"] = ({"a": _h(rng, 999), "b": _h(rng, 999), "out": _h(rng, 999)},
                  lambda a: ops.add(a["a"], a["b"], a["out"]))
    fam["rmsnorm"] = ({"x": _h(rng, 5, 256), "w": _h(rng, 256), "out": _h(rng, 5, 256),
                       "r": _h(rng, 5, 256)},
                      lambda a: ops.rmsnorm(a["x"], a["w"], a["out"], residual=a["r"],
                                            residual_out=a["r"]))
    fam["silu_mul"] = ({"gu": _h(rng, 4, 512), "out": _h(rng, 4, 256)},
                       lambda a: ops.silu_mul(a["gu"], a["out"]))
    fam["fold_norm"] = ({"w": _h(rng, 64, 256), "g": _h(rng, 256)},
                        lambda a: ops.fold_norm(a["w"], a["g"]))
    freqs = cupy.asarray(ops.inv_freq(64))
    fam["rope"] = ({"q": _h(rng, 6, 4, 64), "k": _h(rng, 6, 2, 64), "pos": _i32(range(6)),
                    "f": freqs}, lambda a: ops.rope(a["q"], a["k"], a["pos"], a["f"]))
    fam["embedding"] = ({"ids": _i32([3, 1, 7]), "t": _h(rng, 16, 256), "out": _h(rng, 3, 256)},
                        lambda a: ops.embedding(a["ids"], a["t"], a["out"]))
    for m in (3, 32, 256):  # GEMV, skinny GEMM, tiled GEMM
        fam[f"linear m={m}"] = ({"x": _h(rng, m, 512), "w": _h(rng, 384, 512, scale=0.05),
                                 "y": _h(rng, m, 384)},
                                lambda a: ops.linear(a["x"], a["w"], a["y"]))
    fam["gate_up_silu"] = ({"x": _h(rng, 2, 256), "w": _h(rng, 1024, 256, scale=0.05),
                            "gu": _h(rng, 2, 1024), "out": _h(rng, 2, 512)},
                           lambda a: ops.gate_up_silu(a["x"], a["w"], a["gu"], a["out"]))
    k, v, table, lens = _cache(rng, 2, 64, [40, 17])
    fam["kv_append"] = ({"kn": _h(rng, 2, 128), "vn": _h(rng, 2, 128), "kc": k, "vc": v,
                         "t": table, "slots": _i32([0, 1]), "pos": _i32([39, 16])},
                        lambda a: ops.kv_append(a["kn"], a["vn"],
                                                ops.Cache(a["kc"], a["vc"], a["t"]),
                                                a["slots"], a["pos"]))
    k, v, table, lens = _cache(rng, 2, 64, [40, 17])
    fam["rope_append"] = ({"q": _h(rng, 2, 4, 64), "kn": _h(rng, 2, 128),
                           "vn": _h(rng, 2, 128), "kc": k, "vc": v, "t": table,
                           "slots": _i32([0, 1]), "pos": _i32([39, 16]), "f": freqs},
                          lambda a: ops.rope_append(a["q"], a["kn"], a["vn"],
                                                    ops.Cache(a["kc"], a["vc"], a["t"]),
                                                    a["slots"], a["pos"], a["f"]))
    k, v, table, lens = _cache(rng, 2, 64, [40, 17])
    fam["qkv_rope"] = ({"x": _h(rng, 2, 256), "w": _h(rng, 512, 256, scale=0.05),
                        "qkv": _h(rng, 2, 512), "kc": k, "vc": v, "t": table,
                        "slots": _i32([0, 1]), "pos": _i32([39, 16]), "f": freqs},
                       lambda a: ops.qkv_rope(a["x"], a["w"], a["qkv"],
                                              ops.Cache(a["kc"], a["vc"], a["t"]), a["slots"],
                                              a["pos"], a["f"], head_dim=64))
    k, v, table, lens = _cache(rng, 2, 64, [40, 17])
    fam["kv_gather"] = ({"kc": k, "t": table, "lens": lens, "out": _h(rng, 64, 128)},
                        lambda a: ops.kv_gather(a["kc"], a["t"], a["lens"], 0, a["out"]))
    k, v, table, lens = _cache(rng, 2, 128, [100, 33])
    fam["decode_attention"] = (
        {"q": _h(rng, 2, 8, 128), "kc": k, "vc": v, "t": table, "lens": lens,
         "slots": _i32([0, 1]), "out": _h(rng, 2, 8, 128),
         "ws": cupy.zeros(workspace_floats(2, 8, 128, 4), np.float32)},
        lambda a: ops.decode_attention(a["q"], ops.Cache(a["kc"], a["vc"], a["t"], a["lens"]),
                                       a["slots"], a["out"], a["ws"], 100, splits=4))
    k, v, table, lens = _cache(rng, 2, 64, [70, 33])
    fam["prefill_attention"] = (
        {"q": _h(rng, 50, 4, 64), "kc": k, "vc": v, "t": table, "lens": lens,
         "cu": _i32([0, 30, 50]), "slots": _i32([0, 1]), "out": _h(rng, 50, 4, 64)},
        lambda a: ops.prefill_attention(a["q"], ops.Cache(a["kc"], a["vc"], a["t"], a["lens"]),
                                        ops.Chunk(a["cu"], a["slots"], 30), a["out"]))
    logits = _h(rng, 3, 1000)
    fam["argmax"] = ({"l": logits, "out": _i32([0, 0, 0])},
                     lambda a: ops.argmax(a["l"], a["out"]))
    fam["sample"] = ({"l": logits.copy(), "out": _i32([0, 0, 0]),
                      "t": cupy.asarray(np.float32([0.0, 0.8, 1.2])), "k": _i32([0, 20, 0]),
                      "p": cupy.asarray(np.float32([1.0, 0.9, 0.5])),
                      "seed": cupy.asarray(np.uint64([1, 2, 3])), "pos": _i32([5, 6, 7])},
                     lambda a: ops.sample(a["l"], a["out"], a["t"], a["k"], a["p"], a["seed"],
                                          a["pos"]))
    return fam


FAMILIES = ["add", "rmsnorm", "silu_mul", "fold_norm", "rope", "embedding", "linear m=3",
            "linear m=32", "linear m=256", "gate_up_silu", "kv_append", "rope_append",
            "qkv_rope", "kv_gather", "decode_attention", "prefill_attention", "argmax",
            "sample"]


@pytest.mark.parametrize("family", FAMILIES)
def test_ops_see_what_was_written_just_before_on_the_current_stream(stream, family):
    families = _families(np.random.default_rng(0))
    assert sorted(families) == sorted(FAMILIES)
    arrays, call = families[family]
    initial = {k: v.copy() for k, v in arrays.items()}
    cupy.cuda.Device().synchronize()
    call(arrays)  # written long before: the expected result
    cupy.cuda.Device().synchronize()
    fresh = {k: cupy.zeros_like(v) for k, v in initial.items()}
    cupy.cuda.Device().synchronize()
    for k in fresh:  # slow writes on the current stream (the fixture's), then the op at once
        slow_copy(fresh[k], initial[k])
    call(fresh)
    stream.synchronize()
    for k in arrays:
        assert cupy.array_equal(fresh[k].view(np.uint8), arrays[k].view(np.uint8)), (family, k)
