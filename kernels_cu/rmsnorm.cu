// rmsnorm.cu: RMSNorm of each row, optionally after a fused residual add (LLaMA's
// "h = x + residual; y = norm(h)" pair in one pass).
//
//   extern "C" rmsnorm_f16 / rmsnorm_bf16(
//       const T* x,            // (rows, dim)
//       const T* residual,     // (rows, dim) or NULL: no residual add
//       const T* w,            // (dim,)
//       T* out,                // (rows, dim)
//       T* residual_out,       // (rows, dim), written h = T(x + residual) when residual != NULL
//       int rows, int dim, float eps)
//   grid (rows), block (256): one block per row. dim % 8 == 0 and 16-byte aligned rows;
//   out must not alias x, residual_out may alias residual.
//   Math (as Hugging Face LLaMA does it): h = T(x + r); s = sum(h^2) in fp32;
//   out = T(float(w) * float(T(h * rsqrt(s / dim + eps)))).
//   Patchable: rows and grid.x together (grid.x == rows); rows <= the buffers' row count.
#include "common.cuh"

// Up to 8 * blockDim * kKeep elements of a row (8192 at 256 threads) stay in registers
// between the two passes; longer rows stream the rest twice.
constexpr int kKeep = 4;

template <typename T>
__device__ void rmsnorm_impl(const T* x, const T* residual, const T* __restrict__ w,
                             T* out, T* residual_out, int rows, int dim, float eps) {
  // residual and residual_out may be the same buffer (in-place residual stream); each
  // element is read and then written by the same thread.
  const int row = blockIdx.x, step = 8 * blockDim.x, j0 = 8 * threadIdx.x;
  rg::pdl_trigger();
  rg::Vec<T, 8> g[kKeep];  // the weights are no earlier kernel's output: fetched before
#pragma unroll              // the wait
  for (int i = 0; i < kKeep; ++i)
    if (j0 + i * step < dim) g[i] = rg::load<T, 8>(w + j0 + i * step);
  rg::pdl_wait();
  if (row >= rows) return;
  const long long base = static_cast<long long>(row) * dim;
  auto load_h = [&](int j) {  // x (+ residual, stored to residual_out)
    rg::Vec<T, 8> h = rg::load<T, 8>(x + base + j);
    if (residual != nullptr) {
      const rg::Vec<T, 8> r = rg::load<T, 8>(residual + base + j);
#pragma unroll
      for (int k = 0; k < 8; ++k) h.v[k] = rg::from_float<T>(rg::to_float(h.v[k]) + rg::to_float(r.v[k]));
      rg::store<T, 8>(residual_out + base + j, h);
    }
    return h;
  };
  auto add_squares = [](const rg::Vec<T, 8>& h, float& ss) {
#pragma unroll
    for (int k = 0; k < 8; ++k) ss += rg::to_float(h.v[k]) * rg::to_float(h.v[k]);
  };
  auto store_out = [&](int j, const rg::Vec<T, 8>& h, const rg::Vec<T, 8>& gw, float inv) {
    rg::Vec<T, 8> y;
#pragma unroll
    for (int k = 0; k < 8; ++k)
      y.v[k] = rg::from_float<T>(rg::to_float(gw.v[k]) * rg::round_to<T>(rg::to_float(h.v[k]) * inv));
    rg::store<T, 8>(out + base + j, y);
  };
  float ss = 0.f;
  rg::Vec<T, 8> keep[kKeep];
#pragma unroll
  for (int i = 0; i < kKeep; ++i)
    if (j0 + i * step < dim) {
      keep[i] = load_h(j0 + i * step);
      add_squares(keep[i], ss);
    }
  for (int j = j0 + kKeep * step; j < dim; j += step) add_squares(load_h(j), ss);
  const float inv = rsqrtf(rg::block_sum(ss) / dim + eps);
#pragma unroll
  for (int i = 0; i < kKeep; ++i)
    if (j0 + i * step < dim) store_out(j0 + i * step, keep[i], g[i], inv);
  // the streamed rest: h again from residual_out (this thread wrote it) or from x
  const T* hsrc = (residual != nullptr ? residual_out : x) + base;
  for (int j = j0 + kKeep * step; j < dim; j += step)
    store_out(j, rg::load<T, 8>(hsrc + j), rg::load<T, 8>(w + j), inv);
}

extern "C" __global__ void rmsnorm_f16(const __half* x, const __half* residual, const __half* w,
                                       __half* out, __half* residual_out, int rows, int dim,
                                       float eps) {
  rmsnorm_impl(x, residual, w, out, residual_out, rows, dim, eps);
}
extern "C" __global__ void rmsnorm_bf16(const __nv_bfloat16* x, const __nv_bfloat16* residual,
                                        const __nv_bfloat16* w, __nv_bfloat16* out,
                                        __nv_bfloat16* residual_out, int rows, int dim,
                                        float eps) {
  rmsnorm_impl(x, residual, w, out, residual_out, rows, dim, eps);
}
