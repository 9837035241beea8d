// gemm.cu: y = x W^T (+ residual) for prefill-sized M on tensor cores (mma.sync m16n8k16).
//
//   extern "C" gemm_{f16,bf16}_{64x128,128x128,128x256}(
//       const T* x,          // (m, k) row-major
//       const T* w,          // (n, k): the checkpoint's [out, in] layout
//       const T* residual,   // (m, n) or NULL; may be y itself (in-place residual add)
//       T* y,                // (m, n)
//       int m, int n, int k) // k % 8 == 0, n % 2 == 0, rows 16-byte aligned
//   y[i][r] = T(sum_j x[i][j] * w[r][j] (+ residual[i][r])), fp32 accumulation.
//
//   Tiles: a block of 8 warps computes BM x BN of y (warps 2 x 4, each BM/2 x BN/4: the
//   larger the warp tile, the more mma per ldmatrix), walking k in steps of 32 through a
//   4-stage cp.async pipeline of shared
//   tiles (rows of four 16-byte chunks, chunk index XOR-swizzled by row bits 1..2 so
//   ldmatrix is conflict-free). Both operands are k-contiguous, so plain ldmatrix gives the
//   A (row) and B (col) fragments. Edges: loads past m, n or k are zero-filled, stores masked.
//   grid (cdiv(n, BN), cdiv(m, BM)), block (256), dynamic shared memory 4 * (BM + BN) * 64 B.
//   Patchable: m with grid.y (grid.y == cdiv(m, BM), m <= rows of x and y) and the pointers;
//   n and k are fixed by the weight.
#include <mma.cuh>

namespace {

constexpr int kBK = 32, kStages = 4, kThreads = 256;
constexpr int kChunks = kBK / 8;  // 16-byte chunks per tile row

// byte offset of (row, chunk) in a tile of kBK-wide rows
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * (kBK * 2) + ((chunk ^ ((row >> 1) & 3)) << 4);
}

template <typename T, int BM, int BN>
__device__ __forceinline__ void load_stage(char* a, char* b, const T* x, const T* w, int m,
                                           int n, int k, int row0, int col0, int k0) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = tid; i < BM * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks, kk = k0 + c * 8;
    const bool ok = row0 + r < m && kk < k;
    const T* src = ok ? x + static_cast<long long>(row0 + r) * k + kk : x;
    rg::cp_async16(a + swz(r, c), src, ok);
  }
#pragma unroll
  for (int i = tid; i < BN * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks, kk = k0 + c * 8;
    const bool ok = col0 + r < n && kk < k;
    const T* src = ok ? w + static_cast<long long>(col0 + r) * k + kk : w;
    rg::cp_async16(b + swz(r, c), src, ok);
  }
}

template <typename T, int BM, int BN>
__device__ void gemm_impl(const T* x, const T* __restrict__ w, const T* residual,
                          T* y, int m, int n, int k) {
  rg::pdl_start();
  constexpr int MT = BM / 2 / 16;  // m16 tiles per warp
  constexpr int NT = BN / 4 / 8;   // n8 tiles per warp
  constexpr int kA = BM * kBK * 2, kB = BN * kBK * 2;
  extern __shared__ __align__(128) char smem[];
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
  if (row0 >= m) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = (warp >> 2) * (BM / 2), wn = (warp & 3) * (BN / 4);
  float acc[MT][NT][4] = {};
  const int tiles = (k + kBK - 1) / kBK;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) {
      char* base = smem + s * (kA + kB);
      load_stage<T, BM, BN>(base, base + kA, x, w, m, n, k, row0, col0, s * kBK);
    }
    rg::cp_async_commit();
  }
  for (int t = 0; t < tiles; ++t) {
    rg::cp_async_wait<kStages - 2>();
    __syncthreads();  // tile t landed for everyone; tile t - 1's stage is free to refill
    const int next = t + kStages - 1;
    if (next < tiles) {
      char* base = smem + (next % kStages) * (kA + kB);
      load_stage<T, BM, BN>(base, base + kA, x, w, m, n, k, row0, col0, next * kBK);
    }
    rg::cp_async_commit();
    const char* a = smem + (t % kStages) * (kA + kB);
    const char* b = a + kA;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      unsigned af[MT][4], bf[NT / 2][4];
#pragma unroll
      for (int i = 0; i < MT; ++i) {  // matrices: rows 0-7 / 8-15 x k 0-7 / 8-15
        const int r = wm + i * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        rg::ldmatrix_x4(af[i], a + swz(r, kk * 2 + (lane >> 4)));
      }
#pragma unroll
      for (int j = 0; j < NT / 2; ++j) {  // matrices: (n 0-7, k lo), (n 0-7, k hi), (n 8-15, ..)
        const int r = wn + j * 16 + (lane & 7) + (lane >> 4) * 8;
        rg::ldmatrix_x4(bf[j], b + swz(r, kk * 2 + ((lane >> 3) & 1)));
      }
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
          rg::mma_16816<T>(acc[i][j], af[i], bf[j / 2][(j & 1) * 2], bf[j / 2][(j & 1) * 2 + 1]);
    }
  }
  rg::cp_async_wait<0>();

  const int g = lane >> 2, c2 = (lane & 3) * 2;
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row0 + wm + i * 16 + g + h * 8, c = col0 + wn + j * 8 + c2;
        if (r >= m || c >= n) continue;
        rg::store_pair(y, residual, static_cast<long long>(r) * n + c, acc[i][j][2 * h],
                       acc[i][j][2 * h + 1]);
      }
}

}  // namespace

// ---- generated by rawgraph/ops/generate.py (python -m rawgraph.ops.generate); do not edit
extern "C" __global__ void __launch_bounds__(kThreads)
gemm_f16_128x256(
    const __half* x, const __half* w, const __half* residual, __half* y, int m, int n, int k) {
  gemm_impl<__half, 128, 256>(x, w, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads)
gemm_f16_128x128(
    const __half* x, const __half* w, const __half* residual, __half* y, int m, int n, int k) {
  gemm_impl<__half, 128, 128>(x, w, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads)
gemm_f16_64x128(
    const __half* x, const __half* w, const __half* residual, __half* y, int m, int n, int k) {
  gemm_impl<__half, 64, 128>(x, w, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads)
gemm_bf16_128x256(
    const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* residual, __nv_bfloat16* y,
    int m, int n, int k) {
  gemm_impl<__nv_bfloat16, 128, 256>(x, w, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads)
gemm_bf16_128x128(
    const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* residual, __nv_bfloat16* y,
    int m, int n, int k) {
  gemm_impl<__nv_bfloat16, 128, 128>(x, w, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads)
gemm_bf16_64x128(
    const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* residual, __nv_bfloat16* y,
    int m, int n, int k) {
  gemm_impl<__nv_bfloat16, 64, 128>(x, w, residual, y, m, n, k);
}
