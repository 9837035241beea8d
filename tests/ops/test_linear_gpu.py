"""The decode projections: linear on the GEMV and skinny-GEMM paths, gate_up_silu (also of
rmsnorm(x)), the residual in place and symbolic rows in a graph, refused input."""

import cupy
import numpy as np
import pytest

from rawgraph import Range, Symbols, capture, ops
from rawgraph.ops import matmul
from rawgraph.ops import reference as ref
from rawgraph.ops.matmul import path as linear_path
from tests.helpers import (
    DTYPES,
    POISON,
    ULP,
    bits,
    check_linear,
    gate_up_both,
    host,
    poisoned,
    randn,
)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 2048, 2048), (3, 3072, 2048), (8, 520, 8192),
                                           (16, 64, 264), (5, 1, 8), (4, 8208, 1024),
                                           (13, 2056, 8200), (32, 2048, 2048), (50, 520, 8192),
                                           (64, 3072, 2048), (64, 2056, 2048), (33, 1000, 520),
                                           (64, 16392, 256), (20, 136, 64),
                                           (40, 4224, 264), (12, 16400, 264),
                                           (2, 2200, 8192), (7, 2200, 1000), (6, 2200, 72),
                                           (2, 2200, 8200), (3, 4500, 1000), (8, 8208, 1000),
                                           (3, 2048, 8200), (12, 2200, 8192)])
@pytest.mark.parametrize("fused", [False, True])
def test_linear_gemv(stream, rng, dtype, m, n, k, fused):
    check_linear(stream, rng, dtype, m, n, k, fused, rows=m + 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "inter", "k"), [(1, 1024, 2048), (5, 512, 8192), (8, 8, 72),
                                               (3, 1096, 8192), (10, 1024, 8192),
                                               (13, 4104, 1024), (16, 8192, 264),
                                               (12, 8200, 264), (40, 1000, 520),
                                               (100, 264, 128), (2, 4104, 1000),
                                               (3, 2248, 4104), (12, 1096, 8192)])
def test_gate_up_silu(stream, rng, dtype, m, inter, k):
    # GEMV rows (the fused epilogue; long rows in 16-warp blocks at one block per SM, or
    # at two; 16-row tiles), wide weights at
    # 9-16 rows and 17-64 (skinny GEMM), prefill (GEMM): linear + silu_mul's exact bits,
    # the reference within 2 ulp of the projection, rows past m unwritten
    out_dev, gu, want_bits, (xh, gh, uh) = _gate_up(stream, rng, dtype, m, inter, k)
    out = bits(out_dev)
    np.testing.assert_array_equal(out[:m], want_bits[:m])
    assert (out[m:] == POISON[dtype]).all()
    if linear_path(m, 2 * inter) == "gemv":  # one kernel: the projection is not stored
        assert (gu == POISON[dtype]).all()
    gate, up = ref.linear(xh[:m], gh, dtype), ref.linear(xh[:m], uh, dtype)
    want = ref.silu_mul(np.stack([gate.reshape(m, -1, 8), up.reshape(m, -1, 8)], 2)
                        .reshape(m, 2 * inter), dtype)
    tol = 4 * ULP[dtype]  # the projection's 2 ulp, through silu and the product
    np.testing.assert_allclose(host(out_dev, dtype)[:m], want, rtol=tol, atol=tol)


def _gate_up(stream, rng, dtype, m, inter, k):
    """(the fused gate_up_silu's out (on the device), the bits of its gu and of linear +
    silu_mul's out; the host operands x, gate, up) on fresh operands of m + 1 rows, m used."""
    rows = m + 1
    x, xh = randn(rng, (rows, k), dtype)
    g, gh = randn(rng, (inter, k), dtype, k**-0.5)
    u, uh = randn(rng, (inter, k), dtype, k**-0.5)
    w = cupy.asarray(ops.stack_gate_up(cupy.asnumpy(g), cupy.asnumpy(u)))
    return (*gate_up_both(stream, x, w, m, dtype), (xh, gh, uh))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "inter", "k", "form"), [
    (12, 8200, 264, "_x32"), (20, 1096, 1000, "_x32_c2"), (40, 1000, 520, "_x64_c4"),
    (64, 72, 64, "_x64_d"), (64, 8200, 264, "_x64"), (30, 3072, 4096, "_x32_d"),
    (100, 520, 256, "_x128_c4")])
def test_gate_up_silu_in_the_skinny_epilogue(stream, rng, variants, dtype, m, inter, k, form):
    # the wgmma skinny GEMM's _silu forms: x tiles of 32, 64 and 128 rows (m below the tile),
    # clusters of 1, 2 and 4 splitting k (each block finishing whole x rows of the pairs),
    # the deep ring of grids of at most one block an SM (_d; 64 k tiles through 18 slots),
    # n past the last 64-row block; linear + silu_mul's bits, no row past m, gu untouched
    if not matmul.hopper():
        pytest.skip("skinny_sm90.cu needs compute capability 9.0")
    variants(wgmma_skinny_to=128, fused_silu=True)
    assert linear_path(m, 2 * inter) == "skinny"
    kernel = matmul.skinny_launch(dtype, m, 2 * inter, k, True, True)[0]
    assert kernel.name.endswith(form + "_silu")
    out, gu, want, _ = _gate_up(stream, rng, dtype, m, inter, k)
    out = bits(out)
    np.testing.assert_array_equal(out[:m], want[:m])
    assert (out[m:] == POISON[dtype]).all() and (gu == POISON[dtype]).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tile", [(128, 256), (128, 192), (128, 128), (64, 128)])
@pytest.mark.parametrize(("m", "inter", "k"), [(300, 1000, 520), (129, 4104, 2048),
                                               (64 + 65, 72, 64)])
def test_gate_up_silu_in_the_gemm_epilogue(stream, rng, variants, dtype, tile, m, inter, k):
    # every wgmma tile's _silu form (ragged m and n, a single k tile) gives linear + silu_mul's
    # bits, writes no row past m and leaves gu untouched
    if not matmul.hopper():
        pytest.skip("the wgmma GEMM needs compute capability 9.0")
    variants(gemm_tiles=(tile,), split_k=False, fused_silu=True)
    out, gu, want, _ = _gate_up(stream, rng, dtype, m, inter, k)
    out = bits(out)
    np.testing.assert_array_equal(out[:m], want[:m])
    assert (out[m:] == POISON[dtype]).all() and (gu == POISON[dtype]).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_gate_up_silu_split_k_writes_the_projection_first(stream, rng, dtype):
    # a plan that splits k (few tiles, long k) takes the projection and silu_mul: the same bits
    m, inter, k = 128, 2048, 14336
    if not matmul.hopper() or matmul.device_plan(m, 2 * inter, k)[1] == 1:
        pytest.skip("needs the wgmma GEMM's split k")
    out, gu, want, _ = _gate_up(stream, rng, dtype, m, inter, k)
    np.testing.assert_array_equal(bits(out)[:m], want[:m])
    assert not (gu[:m] == POISON[dtype]).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "inter", "k"), [(1, 1024, 2048), (8, 8, 72), (16, 8192, 264),
                                               (5, 512, 8192), (3, 1096, 8192),
                                               (12, 1096, 8192), (40, 1000, 520)])
def test_gate_up_silu_of_normalized_x(stream, rng, dtype, m, inter, k):
    # norm_eps: silu(gate) * up of rmsnorm(x) (its weight folded into w); the GEMV scales its
    # sums per row (12 x 1096 x 8192: the 16-row tile in segments),
    # 40 rows normalize into `normed` first (rounded there: 6 ulp, not 4)
    rows, eps = m + 1, 1e-5
    x, xh = randn(rng, (rows, k), dtype, 3.0)
    g, gh = randn(rng, (inter, k), dtype, k**-0.5)
    u, uh = randn(rng, (inter, k), dtype, k**-0.5)
    w = cupy.asarray(ops.stack_gate_up(cupy.asnumpy(g), cupy.asnumpy(u)))
    gu, out = poisoned((rows, 2 * inter), dtype), poisoned((rows, inter), dtype)
    normed = poisoned((rows, k), dtype)
    cupy.cuda.Device().synchronize()
    ops.gate_up_silu(x, w, gu, out, m=m, norm_eps=eps, normed=normed, stream=stream)
    stream.synchronize()
    gate = ref.linear(xh[:m], gh, dtype, norm_eps=eps)
    up = ref.linear(xh[:m], uh, dtype, norm_eps=eps)
    want = ref.silu_mul(np.stack([gate.reshape(m, -1, 8), up.reshape(m, -1, 8)], 2)
                        .reshape(m, 2 * inter), dtype)
    tol = 6 * ULP[dtype]
    np.testing.assert_allclose(host(out, dtype)[:m], want, rtol=tol, atol=tol)
    assert (cupy.asnumpy(out.view(np.uint16))[m:] == POISON[dtype]).all()
    gemv = linear_path(m, 2 * inter) == "gemv"
    assert (cupy.asnumpy(normed.view(np.uint16)) == POISON[dtype]).all() == gemv


@pytest.fixture(params=["wgmma", "mma.sync"])
def skinny_kernel(request, variants):
    """Both skinny GEMMs: Hopper's on wgmma and TMA (skinny_sm90.cu), and skinny.cu
    (mma.sync), which other GPUs take."""
    wgmma = request.param == "wgmma"
    if wgmma and not matmul.hopper():
        pytest.skip("skinny_sm90.cu needs compute capability 9.0")
    variants(wgmma_skinny_from=1 if wgmma else matmul.SKINNY_MAX + 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k"), [(17, 2048, 2048), (32, 6144, 4096), (50, 520, 8192),
                                           (64, 3072, 2048), (33, 1000, 520), (20, 136, 64),
                                           (12, 16400, 264), (64, 16392, 256),
                                           (24, 4096, 14336), (40, 4096, 4096),
                                           (64, 6144, 4096)])
@pytest.mark.parametrize("fused", [False, True])
def test_linear_skinny(stream, rng, skinny_kernel, dtype, m, n, k, fused):
    # x tiles of 32 and 64 rows (m below the tile: its other rows are not stored), clusters
    # of 1, 2 and 4 splitting k (a rank with fewer k tiles than the others), n and k past
    # whole boxes (zero-filled by the TMA); the deep rings (clusters of 2, and unclustered
    # grids of at most one block an SM: 6144 rows) going round several times (8B down_proj
    # at 24 rows: 112 k tiles a rank through 18 slots)
    assert linear_path(m, n) == "skinny"
    check_linear(stream, rng, dtype, m, n, k, fused, rows=m + 1)


@pytest.fixture
def skinny_128(variants):
    """65 to 128 rows through the wgmma skinny GEMM's 128-row x tile (wgmma_skinny_to)."""
    if not matmul.hopper():
        pytest.skip("skinny_sm90.cu needs compute capability 9.0")
    variants(wgmma_skinny_to=128)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k"), [(65, 2048, 2048), (128, 6144, 4096), (100, 520, 8192),
                                           (128, 3072, 2048), (97, 1000, 520), (77, 136, 64),
                                           (128, 16392, 256)])
@pytest.mark.parametrize("fused", [False, True])
def test_linear_skinny_to_128_rows(stream, rng, skinny_128, dtype, m, n, k, fused):
    # the x tile of 128 rows (m below it: its other rows are not stored), clusters of 1, 2
    # and 4, n and k past whole boxes
    assert linear_path(m, n) == "skinny"
    check_linear(stream, rng, dtype, m, n, k, fused, rows=m + 1)


@pytest.mark.parametrize(("n", "k", "rows"), [(512, 256, 8), (1024, 8192, 8), (1024, 8192, 16),
                                              (4224, 264, 40), (2048, 2048, 64)])
def test_linear_in_place_residual_and_symbolic_rows(stream, rng, n, k, rows):
    # captured for 3 rows, patched to all: the eager launch's bits (y = residual, in place);
    # GEMV blocks of 8 warps, and of 16 (gemv.cu _w16) for 8 and 16 rows; the skinny GEMM.
    # The graph holds a node per variant [1, rows] reaches (ops.variant): the patch sets
    # each one's m, and switches 3's off and rows' on where they differ; one then runs
    x, xh = randn(rng, (rows, k), "float16")
    w, wh = randn(rng, (n, k), "float16", k**-0.5)
    r, rh = randn(rng, (rows, n), "float16")
    eager = r.copy()
    S = Symbols(b=Range(1, rows))
    S.set(b=3)
    with capture(stream) as cap:
        ops.linear(x, w, r, residual=r, m=S.b, stream=stream, symbols=S)
    cupy.cuda.Device().synchronize()
    ops.linear(x, w, eager, residual=eager, stream=stream)
    with cap.graph as g, g.instantiate() as ex:
        variants = len(ex.plan.nodes)
        assert ex.set(b=rows) == variants + (2 if variants > 1 else 0)
        assert len(ex.launches()) == 1
        ex.launch(stream)
        stream.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(r.view(np.uint16)),
                                  cupy.asnumpy(eager.view(np.uint16)))
    np.testing.assert_allclose(host(r, "float16"), ref.linear(xh, wh, "float16", rh),
                               rtol=2 * ULP["float16"], atol=2 * ULP["float16"])


def test_skinny_replays_the_eager_bits_with_rows_patched(stream, rng, skinny_kernel):
    test_linear_in_place_residual_and_symbolic_rows(stream, rng, 4224, 264, 40)
    test_linear_in_place_residual_and_symbolic_rows(stream, rng, 2048, 2048, 64)


def test_skinny_128_replays_the_eager_bits_with_rows_patched(stream, rng, skinny_128):
    test_linear_in_place_residual_and_symbolic_rows(stream, rng, 4224, 264, 100)
    test_linear_in_place_residual_and_symbolic_rows(stream, rng, 2048, 2048, 128)


@pytest.fixture
def skinny_always(variants):
    """Every count through the wgmma skinny GEMM, past 128 rows in tiles of 128
    (`Variants.skinny_always`, the batch-invariant mode's candidate decode path)."""
    if not matmul.hopper():
        pytest.skip("skinny_sm90.cu needs compute capability 9.0")
    variants(skinny_always=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 2048, 2048), (129, 6144, 4096), (256, 520, 8192),
                                           (200, 16392, 256), (255, 3072, 2048)])
@pytest.mark.parametrize("fused", [False, True])
def test_linear_skinny_always(stream, rng, skinny_always, dtype, m, n, k, fused):
    # one row, and 129-256 rows in two x tiles of 128 (the second partly empty), clusters of
    # 1, 2 and 4
    assert linear_path(m, n) == "skinny"
    check_linear(stream, rng, dtype, m, n, k, fused, rows=m + 1)


def test_skinny_always_replays_the_eager_bits_with_rows_patched(stream, rng, skinny_always):
    # captured at 3 rows, patched to 256: grid.y follows the rows
    test_linear_in_place_residual_and_symbolic_rows(stream, rng, 2048, 2048, 256)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k"), [(3072, 2048), (2048, 2048), (16392, 2048), (2048, 8192)])
def test_skinny_always_gives_a_row_the_same_bits_at_every_count(stream, rng, skinny_always,
                                                                 dtype, n, k):
    # what the batch-invariant mode needs of its decode path: row r's output is the same whether
    # it runs alone or among 1-256 rows, at any place (x tiles of 32, 64, 128, two of 128)
    x, _ = randn(rng, (256, k), dtype)
    w, _ = randn(rng, (n, k), dtype, k**-0.5)
    y, alone = cupy.empty((256, n), x.dtype), cupy.empty((1, n), x.dtype)
    cupy.cuda.Device().synchronize()
    for m in (2, 31, 33, 64, 100, 128, 129, 256):
        ops.linear(x, w, y, m=m, stream=stream)
        for r in sorted({0, m // 2, m - 1}):
            ops.linear(x[r:r + 1], w, alone, stream=stream)
            stream.synchronize()
            assert bits(alone)[0].tobytes() == bits(y)[r].tobytes(), (m, r)


def test_linear_rejects_bad_input(rng):
    x = cupy.ones((4, 64), np.float16)
    with pytest.raises(ValueError, match="w must be"):
        ops.linear(x, cupy.ones((64, 32), np.float16), cupy.ones((4, 64), np.float16))
    with pytest.raises(ValueError, match="n = 9 must be a multiple of 2"):
        ops.linear(cupy.ones((100, 64), np.float16), cupy.ones((9, 64), np.float16),
                   cupy.ones((100, 9), np.float16))
    with pytest.raises(ValueError, match="must not overlap x"):
        ops.linear(x, cupy.ones((64, 64), np.float16), x)
    with pytest.raises(ValueError, match="y has shape"):
        ops.linear(x, cupy.ones((8, 64), np.float16), cupy.ones((4, 9), np.float16))
