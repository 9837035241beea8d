// rmsnorm.cu: RMSNorm of each row, optionally after a fused residual add (LLaMA's
// "h = x + residual; y = norm(h)" pair in one pass).
//
//   extern "C" rmsnorm_f16 / rmsnorm_bf16(
//       const T* x,            // (rows, dim), or (x_rows, dim) read through `gather`
//       const T* residual,     // (rows, dim) or NULL: no residual add
//       const T* w,            // (dim,) or NULL: no weight (it is folded into the next
//                              //   projection, fold_norm below)
//       T* out,                // (rows, dim)
//       T* residual_out,       // (rows, dim), written h = T(x + residual) when residual != NULL
//       int rows, int dim, float eps,
//       const int* gather,     // (rows,) or NULL: row r normalizes x row gather[r] (a prefill
//                              //   chunk's last row of each sequence); needs residual NULL
//       int x_rows)            // rows of x: a gathered index outside [0, x_rows) gives zeros
//   grid (rows), block (256): one block per row. dim % 8 == 0 and 16-byte aligned rows;
//   out must not alias x, residual_out may alias residual.
//   Math (as Hugging Face LLaMA does it): h = T(x + r); s = sum(h^2) in fp32;
//   out = T(float(w) * float(T(h * rsqrt(s / dim + eps)))), or T(h * rsqrt(...)) without w.
//   Patchable: rows and grid.x together (grid.x == rows); rows <= the buffers' row count.
//
//   extern "C" fold_norm_f16 / fold_norm_bf16(
//       T* w,                  // (rows, dim): a projection reading the norm's output
//       const T* g,            // (dim,): the norm's weight
//       long long count,       // rows * dim
//       int dim)
//   w[r][c] = T(float(w[r][c]) * float(g[c])): W (g * h) = (W diag(g)) h, so the norm's
//   weight can ride in the projection (done once, at load) and the norm itself shrinks to a
//   scale per row, which the decode GEMV applies to its sums (gemv.cu, norm_eps). The product
//   of two storage values is exact in fp32: one rounding, to nearest even.
//   grid (any), block (256): a grid-stride loop over 8-element pieces; dim % 8 == 0.
#include <common.cuh>

// Up to 8 * blockDim * kKeep elements of a row (8192 at 256 threads) stay in registers
// between the two passes; longer rows stream the rest twice.
constexpr int kKeep = 4;

template <typename T>
__device__ void rmsnorm_impl(const T* x, const T* residual, const T* __restrict__ w,
                             T* out, T* residual_out, int rows, int dim, float eps,
                             const int* gather, int x_rows) {
  // residual and residual_out may be the same buffer (in-place residual stream); each
  // element is read and then written by the same thread.
  const int row = blockIdx.x, step = 8 * blockDim.x, j0 = 8 * threadIdx.x;
  rg::pdl_trigger();
  rg::Vec<T, 8> g[kKeep];  // the weights are no earlier kernel's output: fetched before
#pragma unroll              // the wait
  for (int i = 0; i < kKeep; ++i)
    if (w != nullptr && j0 + i * step < dim) g[i] = rg::load<T, 8>(w + j0 + i * step);
  rg::pdl_wait();
  if (row >= rows) return;
  const long long base = static_cast<long long>(row) * dim;
  const int src = gather != nullptr ? gather[row] : row;  // the x row this block reads
  if (src < 0 || src >= x_rows) {  // a bad gathered index: zeros, never a read out of bounds
    rg::Vec<T, 8> z;
#pragma unroll
    for (int k = 0; k < 8; ++k) z.v[k] = rg::from_float<T>(0.f);
    for (int j = j0; j < dim; j += step) rg::store<T, 8>(out + base + j, z);
    return;
  }
  const T* xrow = x + static_cast<long long>(src) * dim;
  auto load_h = [&](int j) {  // x (+ residual, stored to residual_out)
    rg::Vec<T, 8> h = rg::load<T, 8>(xrow + j);
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
    for (int k = 0; k < 8; ++k) {
      const T normed = rg::from_float<T>(rg::to_float(h.v[k]) * inv);
      y.v[k] = w == nullptr ? normed : rg::from_float<T>(rg::to_float(gw.v[k]) * rg::to_float(normed));
    }
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
  const T* hsrc = residual != nullptr ? residual_out + base : xrow;
  for (int j = j0 + kKeep * step; j < dim; j += step)
    store_out(j, rg::load<T, 8>(hsrc + j), w != nullptr ? rg::load<T, 8>(w + j) : g[0], inv);
}

template <typename T>
__device__ void fold_norm_impl(T* w, const T* __restrict__ g, long long count, int dim) {
  for (long long i = 8 * (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x);
       i < count; i += 8LL * gridDim.x * blockDim.x) {
    rg::Vec<T, 8> v = rg::load<T, 8>(w + i);
    const rg::Vec<T, 8> s = rg::load<T, 8>(g + i % dim);
#pragma unroll
    for (int k = 0; k < 8; ++k) v.v[k] = rg::from_float<T>(rg::to_float(v.v[k]) * rg::to_float(s.v[k]));
    rg::store<T, 8>(w + i, v);
  }
}

extern "C" __global__ void rmsnorm_f16(const __half* x, const __half* residual, const __half* w,
                                       __half* out, __half* residual_out, int rows, int dim,
                                       float eps, const int* gather, int x_rows) {
  rmsnorm_impl(x, residual, w, out, residual_out, rows, dim, eps, gather, x_rows);
}
extern "C" __global__ void rmsnorm_bf16(const __nv_bfloat16* x, const __nv_bfloat16* residual,
                                        const __nv_bfloat16* w, __nv_bfloat16* out,
                                        __nv_bfloat16* residual_out, int rows, int dim,
                                        float eps, const int* gather, int x_rows) {
  rmsnorm_impl(x, residual, w, out, residual_out, rows, dim, eps, gather, x_rows);
}
extern "C" __global__ void fold_norm_f16(__half* w, const __half* g, long long count, int dim) {
  fold_norm_impl(w, g, count, dim);
}
extern "C" __global__ void fold_norm_bf16(__nv_bfloat16* w, const __nv_bfloat16* g,
                                          long long count, int dim) {
  fold_norm_impl(w, g, count, dim);
}
