// gemv.cu: y = x W^T (+ residual) for decode-sized M, streaming W at memory bandwidth.
//
//   extern "C" gemv_{f16,bf16}_m{1,2,4,8,16}(
//       const T* x,          // (m, k)
//       const T* w,          // (n, k): the checkpoint's [out, in] layout
//       const T* residual,   // (m, n) or NULL; may be y itself (in-place residual add)
//       T* y,                // (m, n)
//       int m, int n, int k) // m <= the kernel's M tile; k % 8 == 0, rows 16-byte aligned
//   y[i][r] = T(sum_j x[i][j] * w[r][j] (+ residual[i][r])), fp32 accumulation.
//   grid (cdiv(n, 8)), block (256): one warp per output row r, all m rows of x at once, so W
//   is read exactly once; each lane keeps 4 16-byte loads of W in flight and reads x through
//   L1. Lane partial sums meet in a warp shuffle reduction.
//   Patchable: m (<= the tile) and the pointers; n and k are fixed by the weight.
#include "common.cuh"

namespace {

constexpr int kWarps = 8, kUnroll = 4, kStep = 32 * 8;  // elements a warp covers per load

template <typename T>
__device__ __forceinline__ float dot8(const rg::Vec<T, 8>& a, const rg::Vec<T, 8>& b) {
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < 8; ++e) s = fmaf(rg::to_float(a.v[e]), rg::to_float(b.v[e]), s);
  return s;
}

template <typename T, int M>
__device__ void gemv_impl(const T* __restrict__ x, const T* __restrict__ w, const T* residual,
                          T* y, int m, int n, int k) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (row >= n) return;
  const T* wr = w + static_cast<long long>(row) * k;
  float acc[M];
#pragma unroll
  for (int i = 0; i < M; ++i) acc[i] = 0.f;
  for (int k0 = lane * 8; k0 < k; k0 += kStep * kUnroll) {
    rg::Vec<T, 8> wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)  // issue every weight load before using any
      if (k0 + u * kStep < k) wv[u] = rg::load<T, 8>(wr + k0 + u * kStep);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (k0 + u * kStep >= k) break;
#pragma unroll
      for (int i = 0; i < M; ++i)
        if (i < m) acc[i] += dot8(wv[u], rg::load<T, 8>(x + static_cast<long long>(i) * k + k0 + u * kStep));
    }
  }
#pragma unroll
  for (int i = 0; i < M; ++i) acc[i] = rg::warp_sum(acc[i]);
  if (lane < M && lane < m) {
    float v = 0.f;
#pragma unroll
    for (int i = 0; i < M; ++i)
      if (i == lane) v = acc[i];
    const long long o = static_cast<long long>(lane) * n + row;
    if (residual != nullptr) v += rg::to_float(residual[o]);
    y[o] = rg::from_float<T>(v);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(256) gemv_f16_m1(const __half* x, const __half* w,
    const __half* residual, __half* y, int m, int n, int k) {
  gemv_impl<__half, 1>(x, w, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(256) gemv_f16_m2(const __half* x, const __half* w,
    const __half* residual, __half* y, int m, int n, int k) {
  gemv_impl<__half, 2>(x, w, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(256) gemv_f16_m4(const __half* x, const __half* w,
    const __half* residual, __half* y, int m, int n, int k) {
  gemv_impl<__half, 4>(x, w, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(256) gemv_f16_m8(const __half* x, const __half* w,
    const __half* residual, __half* y, int m, int n, int k) {
  gemv_impl<__half, 8>(x, w, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(256) gemv_f16_m16(const __half* x, const __half* w,
    const __half* residual, __half* y, int m, int n, int k) {
  gemv_impl<__half, 16>(x, w, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(256) gemv_bf16_m1(const __nv_bfloat16* x, const __nv_bfloat16* w,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  gemv_impl<__nv_bfloat16, 1>(x, w, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(256) gemv_bf16_m2(const __nv_bfloat16* x, const __nv_bfloat16* w,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  gemv_impl<__nv_bfloat16, 2>(x, w, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(256) gemv_bf16_m4(const __nv_bfloat16* x, const __nv_bfloat16* w,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  gemv_impl<__nv_bfloat16, 4>(x, w, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(256) gemv_bf16_m8(const __nv_bfloat16* x, const __nv_bfloat16* w,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  gemv_impl<__nv_bfloat16, 8>(x, w, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(256) gemv_bf16_m16(const __nv_bfloat16* x, const __nv_bfloat16* w,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  gemv_impl<__nv_bfloat16, 16>(x, w, residual, y, m, n, k);
}
