"""The prefill GEMMs against float64 references: wgmma and mma.sync, odd shapes, the residual,
rows patched in a graph."""

import cupy
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rawgraph import Range, Symbols, capture, ops
from rawgraph.ops import matmul
from rawgraph.ops import reference as ref
from rawgraph.ops.variant import choose
from tests.helpers import DTYPES, ULP, bits, check_linear, host, randn

pytestmark = pytest.mark.gpu


@pytest.fixture(params=["wgmma", "mma.sync"])
def gemm_path(request, monkeypatch):
    """Both GEMMs: Hopper's wgmma kernel, and the mma.sync one other GPUs take."""
    from rawgraph.cuda.device import compute_capability

    wgmma = request.param == "wgmma"
    if wgmma and compute_capability() != (9, 0):
        pytest.skip("wgmma needs compute capability 9.0")
    monkeypatch.setattr(matmul, "hopper", lambda: wgmma)  # mma.sync where Hopper has wgmma
    return request.param


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k"), [(65, 64, 64), (128, 128, 32), (300, 2048, 2048),
                                           (512, 3072, 2048), (129, 130, 200), (1000, 258, 72),
                                           (700, 3000, 1000), (1024, 384, 4096),
                                           # the Hopper GEMM's tile groups of 8 row tiles:
                                           # 14 row tiles of 128 x 128, 33 of 128 x 256
                                           (1669, 1000, 64), (4100, 520, 136)])
@pytest.mark.parametrize("fused", [False, True])
def test_gemm(stream, rng, gemm_path, dtype, m, n, k, fused):
    check_linear(stream, rng, dtype, m, n, k, fused, rows=m + 3)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(m=st.integers(65, 400), n=st.integers(1, 200).map(lambda v: 2 * v),
       k=st.integers(1, 80).map(lambda v: 8 * v), dtype=st.sampled_from(DTYPES),
       fused=st.booleans())
def test_gemm_ragged_shapes(m, n, k, dtype, fused):
    stream = cupy.cuda.Stream(non_blocking=True)
    check_linear(stream, np.random.default_rng(m * n + k), dtype, m, n, k, fused, rows=m)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tile", [(128, 256), (128, 192), (128, 128), (64, 128)])
@pytest.mark.parametrize("fused", [False, True])
def test_gemm_blocks_loop_over_several_waves_of_tiles(stream, rng, variants, dtype, tile,
                                                      fused):
    # 2-9 waves of tiles (ragged m, n and k: the ring's phases wrap inside and across
    # tiles) through one wave of blocks: the float64 reference within 2 ulp, rows past m
    # untouched, and the bits of a block a tile (`Variants.persistent` off)
    if not matmul.hopper():
        pytest.skip("the wgmma GEMM needs compute capability 9.0")
    variants(gemm_tiles=(tile,), split_k=False)
    m, n, k = 2100, 4100, 328
    check_linear(stream, rng, dtype, m, n, k, fused, rows=m + 1)
    x, _ = randn(rng, (m, k), dtype)
    w, _ = randn(rng, (n, k), dtype, k**-0.5)
    r = randn(rng, (m, n), dtype)[0] if fused else None
    out = []
    for persistent in (True, False):
        with choose(persistent=persistent):
            y = cupy.zeros((m, n), x.dtype)
            cupy.cuda.Device().synchronize()
            ops.linear(x, w, y, residual=r, stream=stream)
            stream.synchronize()
        out.append(bits(y))
    np.testing.assert_array_equal(out[0], out[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_unsplit_tiles_agree_to_the_bit(stream, rng, variants, dtype):
    """Every unsplit wgmma tile gives the same bits (the same k order for each output), with
    and without a residual: which tile a plan takes never changes a result."""
    if not matmul.hopper():
        pytest.skip("the wgmma GEMM needs compute capability 9.0")
    variants(split_k=False)
    m, n, k = 300, 1000, 520
    x, _ = randn(rng, (m, k), dtype)
    w, _ = randn(rng, (n, k), dtype, k**-0.5)
    r, _ = randn(rng, (m, n), dtype)
    cupy.cuda.Device().synchronize()
    got = {}
    for tile in matmul.GEMM90_TILES:
        for residual in (None, r):
            with choose(gemm_tiles=(tile,)):
                y = cupy.empty((m, n), x.dtype)
                ops.linear(x, w, y, residual=residual, stream=stream)
                stream.synchronize()
            got.setdefault(residual is None, []).append(bits(y))
    for outs in got.values():
        for out in outs[1:]:
            np.testing.assert_array_equal(out, outs[0])


# (the second: 544 tiles of 128 x 256 at the largest m, a one-wave grid patched down to 2)
@pytest.mark.parametrize(("rows", "n", "ms"), [(512, 384, (100, 37, 512, 100)),
                                               (4096, 4100, (4096, 1000, 129, 4096))])
def test_gemm_rows_patched_in_a_graph(stream, rng, rows, n, ms):
    x, xh = randn(rng, (rows, 256), "bfloat16")
    w, wh = randn(rng, (n, 256), "bfloat16", 1 / 16)
    y = cupy.zeros((rows, n), np.uint16)
    S = Symbols(m=Range(17, rows))
    S.set(m=rows)
    cupy.cuda.Device().synchronize()
    with capture(stream) as cap:
        ops.linear(x, w, y, m=S.m, stream=stream, symbols=S)
    with cap.graph as g, g.instantiate() as ex:
        for m in ms:
            y.fill(0)
            stream.synchronize()
            ex.set(m=m)
            ex.launch(stream)
            ex.launch(stream)
            stream.synchronize()
            got = host(y, "bfloat16")
            np.testing.assert_allclose(got[:m], ref.linear(xh[:m], wh, "bfloat16"),
                                       rtol=2 * ULP["bfloat16"], atol=2 * ULP["bfloat16"])
            assert not got[m:].any()


@pytest.fixture
def split(monkeypatch):
    """Force the wgmma GEMM's split of k: `split(c, tile)` makes every GEMM plan `tile` (one
    of SPLIT_TILES, the first by default) in clusters of c blocks."""
    from rawgraph.cuda.device import compute_capability

    if compute_capability() != (9, 0):
        pytest.skip("split k is the wgmma GEMM's (compute capability 9.0)")

    def force(c: int, tile: tuple[int, int] = matmul.SPLIT_TILES[0]) -> None:
        monkeypatch.setattr(matmul, "gemm_plan", lambda *a, **kw: (tile, c))
    return force


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", [2, 3, 4, 5, 6, 7, 8])
# decode's 128 rows; ragged m, n and k; k of 2 k tiles, so that 6 of 8 blocks have none
@pytest.mark.parametrize(("m", "n", "k"), [(128, 4096, 4096), (100, 1030, 520), (300, 514, 2056),
                                           (65, 258, 72)])
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("tile", [(128, 256), (128, 192), (128, 128), (128, 96)])
def test_gemm_split_k(stream, rng, split, dtype, c, m, n, k, fused, tile):
    split(c, tile)
    check_linear(stream, rng, dtype, m, n, k, fused, rows=m + 3)


@pytest.mark.parametrize(("c", "tile"), [(1, None), (2, (128, 256)), (3, (128, 256)),
                                         (7, (128, 256)), (8, (128, 256)), (3, (128, 192)),
                                         (5, (128, 192)), (3, (128, 128)), (8, (128, 128)),
                                         (4, (128, 96))])
def test_gemm_split_k_is_bit_stable_and_in_place(stream, rng, split, c, tile):
    """The same bits every launch whichever block of a cluster ends first, and the residual
    may be y itself."""
    if c > 1:
        split(c, tile)
    x, _ = randn(rng, (128, 2048), "bfloat16")
    w, _ = randn(rng, (1536, 2048), "bfloat16", 1 / 45)
    r, _ = randn(rng, (128, 1536), "bfloat16")
    y = cupy.empty((128, 1536), np.uint16)
    cupy.cuda.Device().synchronize()
    outs = []
    for _ in range(3):
        y[...] = r
        stream.synchronize()
        ops.linear(x, w, y, residual=y, stream=stream)
        stream.synchronize()
        outs.append(cupy.asnumpy(y))
    want = cupy.empty_like(y)
    ops.linear(x, w, want, residual=r, stream=stream)
    stream.synchronize()
    for got in outs:
        np.testing.assert_array_equal(got, cupy.asnumpy(want))


def test_gemm_split_k_rows_patched_in_a_graph(stream, rng):
    """Rows patched in a graph of a split GEMM (up to 128 decode rows through a 4096 x 4096
    weight: 32 tiles of 128 x 128, 3 blocks each on the H200): the grid follows m and replays
    give the eager launch's bits."""
    from rawgraph.ops.matmul import gemm_plan, hopper, split_slots

    if not hopper():
        pytest.skip("split k is the wgmma GEMM's (compute capability 9.0)")
    assert gemm_plan(128, 4096, 4096, split_slots())[1] > 1
    x, _ = randn(rng, (128, 4096), "float16")
    w, _ = randn(rng, (4096, 4096), "float16", 1 / 64)
    y, want = cupy.zeros((128, 4096), np.float16), cupy.zeros((128, 4096), np.float16)
    S = Symbols(m=Range(65, 128))
    S.set(m=128)
    cupy.cuda.Device().synchronize()
    with capture(stream) as cap:
        ops.linear(x, w, y, m=S.m, stream=stream, symbols=S)
    with cap.graph as g, g.instantiate() as ex:
        for m in (100, 65, 128, 77):
            y.fill(0)
            want.fill(0)
            ops.linear(x, w, want, m=m, m_max=128, stream=stream)
            ex.set(m=m)
            for _ in range(2):
                ex.launch(stream)
                stream.synchronize()
                np.testing.assert_array_equal(cupy.asnumpy(y), cupy.asnumpy(want))
            assert not cupy.asnumpy(y)[m:].any()
