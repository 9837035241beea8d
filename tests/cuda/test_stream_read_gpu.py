"""The read-only ceilings of `bench kernels` and `bench decode` (kernels_cu/stream_read.cu)
against NumPy."""

import cupy
import numpy as np
import pytest

from rawgraph.bench.ceiling import (
    LAYER_LINKS,
    STREAM_READ_CHAINED,
    link_parts,
    part_costs,
    step_chain_ms,
    step_reads,
)
from rawgraph.bench.kernels import READ_BLOCKS_PER_SM, READ_THREADS, stream_read
from rawgraph.cuda.device import multiprocessors
from rawgraph.cuda.stream import new_stream
from tests.engine.test_engine_gpu import _model

pytestmark = pytest.mark.gpu


# one word (no whole 4 KB tile); whole tiles and a partial one; a remainder of 48 bytes past
# whole tiles; many tiles a warp (4 blocks of 256 per SM = 4,224 warps x 4 KB = 17 MB a round)
@pytest.mark.parametrize("nbytes", [16, 16 * 1001, (1 << 20) + 48, (40 << 20) + 16])
def test_stream_read_xors_every_word(stream, rng, nbytes):
    words = rng.integers(0, 2**32, nbytes // 4, dtype=np.uint32)
    buf = cupy.asarray(words)
    out = cupy.asarray(np.array([0x9E3779B9], np.uint32))  # the fold goes into what is there
    cupy.cuda.Device().synchronize()  # inputs made on the default stream; the kernel uses another
    stream_read(buf, out, stream)
    stream_read(buf, out, stream)  # twice: back where it started
    stream_read(buf, out, stream)
    stream.synchronize()
    assert int(out[0]) == 0x9E3779B9 ^ int(np.bitwise_xor.reduce(words))


def test_stream_read_rejects_bad_input():
    out = cupy.zeros(1, np.uint32)
    buf = cupy.zeros(64, np.uint32)
    with pytest.raises(ValueError, match="multiple of 16 bytes, got 12"):
        stream_read(buf[:3], out)
    with pytest.raises(ValueError, match="aligned, got address % 16 = 4"):
        stream_read(buf[1:5], out)
    with pytest.raises(ValueError, match="buf must be C-contiguous"):
        stream_read(buf[::2], out)
    with pytest.raises(ValueError, match=r"CuPy array, got numpy\.ndarray"):
        stream_read(np.zeros(4, np.uint32), out)
    with pytest.raises(ValueError, match="out must be a contiguous uint32"):
        stream_read(buf, cupy.zeros(1, np.int32))


@pytest.mark.parametrize("pdl", [False, True])
def test_stream_read_chained_xors_both_ranges(stream, rng, pdl):
    # the read chain's link (bench.ceiling): p then q, its first loads before its PDL wait
    p = rng.integers(0, 2**32, ((1 << 20) + 48) // 4, dtype=np.uint32)
    q = rng.integers(0, 2**32, 16 * 1001 // 4, dtype=np.uint32)
    bp, bq = cupy.asarray(p), cupy.asarray(q)
    out = cupy.asarray(np.array([0x9E3779B9], np.uint32))
    cupy.cuda.Device().synchronize()
    grid = READ_BLOCKS_PER_SM * multiprocessors()
    for m in (len(q) // 4, 0, len(q) // 4):  # p and q, p alone, p and q again: p once, q not
        STREAM_READ_CHAINED.launch(grid, READ_THREADS, (bp, len(p) // 4, bq, m, out), stream,
                                   pdl=pdl)
    stream.synchronize()
    assert int(out[0]) == 0x9E3779B9 ^ int(np.bitwise_xor.reduce(p))


def test_a_tiny_models_read_chain_replays():
    model = _model()
    s = new_stream()
    links = step_reads(model.cfg, model.w, model.kv.k, model.kv.v, 2, 64)
    assert len(links) == LAYER_LINKS * model.cfg.layers + 1
    ms = step_chain_ms(model.cfg, model.w, model.kv.k, model.kv.v, 2, 64, s)
    model.close()
    assert 0 < ms < float("inf")


def test_a_tiny_models_chain_parts_cost_what_their_links_do():
    model = _model()
    s = new_stream()
    costs = part_costs(model.cfg, model.w, model.kv.k, model.kv.v, 2, 64, s)
    model.close()
    assert list(costs) == ["chain", *dict.fromkeys(link_parts(model.cfg))]
    assert 0 < costs["chain"] < float("inf")
    # each part's links are some of the chain's: removing them cannot take more than all of it
    assert all(costs[p] < costs["chain"] for p in costs if p != "chain")
