// skinny.cu: y = x W^T (+ residual) for up to 64 rows of x (decode batches of 17 to 64, and
// of 9 to 16 through weights of 16384 rows or more), on tensor cores, streaming W once
// through a cp.async ring.
//
//   extern "C" skinny_{f16,bf16}[_c2|_c4](
//       const T* x,          // (m, k)
//       const T* w,          // (n, k): the checkpoint's [out, in] layout
//       const T* residual,   // (m, n) or NULL; may be y itself (in-place residual add)
//       T* y,                // (m, n)
//       int m, int n, int k) // m <= 64; k % 8 == 0; 16-byte aligned rows
//   y[i][r] = T(sum_j x[i][j] * w[r][j] (+ residual[i][r])), fp32 accumulation.
//
//   A block owns 64 rows of W and all (up to 64) rows of x: D = W x^T, W the M side of
//   mma.m16n8k16 and x its N side, both k-contiguous in shared memory so plain ldmatrix gives
//   both fragments. k goes by in tiles of 64 through a 5-stage cp.async ring of W and x tiles
//   (rows of eight 16-byte chunks, chunk index XOR-swizzled by the row: ldmatrix is conflict
//   free); loads past m, n or k are zero-filled. The first stages of W are requested before
//   griddepcontrol.wait (under PDL they stream while the kernel writing x still runs).
//   8 warps: 2 x 2 warp tiles of 32 W rows x 32 x rows, each tile split between two warps
//   taking alternate 16-wide k steps (one ldmatrix per two mma); they meet in shared memory.
//   _c2, _c4: a cluster of 2 or 4 blocks shares the 64 W rows, block r taking k tiles r,
//   r + C, ...; each block then finishes a 1/C share of the outputs, adding the blocks' sums
//   (distributed shared memory) in block order. Deterministic: no atomics anywhere.
//   grid (cdiv(n, 64) * C), block (256), dynamic shared memory 5 * 16 KiB.
//   Patchable: m (<= 64) and the pointers; n, k and the grid are fixed by the weight.
#include <cluster.cuh>
#include <mma.cuh>

namespace {

constexpr int kRows = 64, kBK = 64, kStages = 5, kThreads = 256;  // rows of rg::swz128 tiles
constexpr int kTile = kRows * kBK * 2;  // bytes of one operand's tile in a stage
constexpr int kPart = kRows + 1;        // part[] row stride (floats): a bank per lane group

template <typename T, int CS>
__device__ void skinny_impl(const T* x, const T* __restrict__ w, const T* residual, T* y, int m,
                            int n, int k) {
  extern __shared__ __align__(128) char ring[];  // stage s: W tile, then x tile
  __shared__ float part[kRows * kPart];          // this block's sums: part[x row][W row]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wr = (warp & 1) * 32, xc = ((warp >> 1) & 1) * 32, kh = warp >> 2;
  const int rank = CS > 1 ? static_cast<int>(rg::cluster_rank()) : 0;
  const int r0 = (blockIdx.x / CS) * kRows;
  const int ktiles = (k + kBK - 1) / kBK;
  const int mine = (ktiles - rank + CS - 1) / CS;  // k tiles rank, rank + CS, ...
  auto k0_of = [&](int t) { return (rank + t * CS) * kBK; };
  auto load = [&](char* tile, const T* src, int rows, int row0, int t) {  // 64 rows, k tile t
    rg::load_tile128<T, kRows, kThreads>(tile, src, rows, k, row0, k0_of(t));
  };

  // Group accounting: the prologue's W tiles all join group 0 (issued before the wait);
  // group t then holds stage t's x tile (and, from the loop, stage t's W tile).
  for (int t = 0; t < kStages - 1 && t < mine; ++t)
    load(ring + t * 2 * kTile, w, n, r0, t);
  rg::pdl_trigger();
  rg::pdl_wait();  // x and the residual come from earlier kernels
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < mine) load(ring + t * 2 * kTile + kTile, x, m, 0, t);
    rg::cp_async_commit();
  }

  float acc[2][4][4] = {};
  for (int t = 0; t < mine; ++t) {
    rg::cp_async_wait<kStages - 2>();
    __syncthreads();  // stage t landed for everyone; stage t - 1's slot is free to refill
    const int next = t + kStages - 1;
    if (next < mine) {
      char* s = ring + (next % kStages) * 2 * kTile;
      load(s, w, n, r0, next);
      load(s + kTile, x, m, 0, next);
    }
    rg::cp_async_commit();
    const char* a = ring + (t % kStages) * 2 * kTile;
    const char* b = a + kTile;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int kk = 2 * h + kh;  // this warp's 16-wide k steps: kh, kh + 2
      unsigned af[2][4], bf[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i)  // W rows 0-7 / 8-15 x k 0-7 / 8-15
        rg::ldmatrix_x4(af[i], a + rg::swz128(wr + i * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                              kk * 2 + (lane >> 4)));
#pragma unroll
      for (int j = 0; j < 2; ++j)  // (x rows 0-7, k lo), (0-7, k hi), (8-15, k lo), (8-15, hi)
        rg::ldmatrix_x4(bf[j], b + rg::swz128(xc + j * 16 + (lane & 7) + (lane >> 4) * 8,
                                              kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          rg::mma_16816<T>(acc[i][j], af[i], bf[j / 2][(j & 1) * 2], bf[j / 2][(j & 1) * 2 + 1]);
    }
  }
  rg::cp_async_wait<0>();

  // The two k halves of each warp tile meet in part[] (the upper half's sums first), then
  // the cluster's blocks in block 0; fixed orders throughout.
  // fragment (i, j, e) of lane (g, t): W row wr + 16 i + g (+8 for e >= 2), x row
  // xc + 8 j + 2 t (+1 for odd e)
  const int g = lane >> 2, tq = lane & 3;
  auto at = [&](int i, int j, int e) {
    return (xc + 8 * j + 2 * tq + (e & 1)) * kPart + wr + 16 * i + g + (e >= 2 ? 8 : 0);
  };
  if (kh == 1) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[at(i, j, e)] = acc[i][j][e];
  }
  __syncthreads();
  if (kh == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[at(i, j, e)] = acc[i][j][e] + part[at(i, j, e)];
  }
  if constexpr (CS > 1) rg::cluster_sync();  // every block's part[] is ready
  else __syncthreads();
  rg::store_cluster_sums<T, kRows, kRows, CS, kThreads>(part, rank, y, residual, m, n, r0);
  if constexpr (CS > 1) rg::cluster_sync();  // part[] stays alive until every block has read it
}

}  // namespace

// ---- generated by rawgraph/ops/generate.py (python -m rawgraph.ops.generate); do not edit
extern "C" __global__ void __launch_bounds__(kThreads, 2)
skinny_f16(
    const __half* x, const __half* w, const __half* residual, __half* y, int m, int n, int k) {
  skinny_impl<__half, 1>(x, w, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 2)
skinny_f16_c2(
    const __half* x, const __half* w, const __half* residual, __half* y, int m, int n, int k) {
  skinny_impl<__half, 2>(x, w, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(kThreads, 2)
skinny_f16_c4(
    const __half* x, const __half* w, const __half* residual, __half* y, int m, int n, int k) {
  skinny_impl<__half, 4>(x, w, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 2)
skinny_bf16(
    const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* residual, __nv_bfloat16* y,
    int m, int n, int k) {
  skinny_impl<__nv_bfloat16, 1>(x, w, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 2)
skinny_bf16_c2(
    const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* residual, __nv_bfloat16* y,
    int m, int n, int k) {
  skinny_impl<__nv_bfloat16, 2>(x, w, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(kThreads, 2)
skinny_bf16_c4(
    const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* residual, __nv_bfloat16* y,
    int m, int n, int k) {
  skinny_impl<__nv_bfloat16, 4>(x, w, residual, y, m, n, k);
}
