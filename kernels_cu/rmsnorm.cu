// rmsnorm.cu: RMSNorm of each row, optionally after a fused residual add (LLaMA's
// "h = x + residual; y = norm(h)" pair in one pass).
//
//   extern "C" rmsnorm_f16 / rmsnorm_bf16, rmsnorm_rows_f16 / rmsnorm_rows_bf16(
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
//   rmsnorm_*: grid (rows), block (256), a block per row; rmsnorm_rows_*: grid
//   (cdiv(rows, 4)), block (128), a warp per row. Both add a row's squares in one order,
//   so they give the same bits (a row count may pick either: ops.norm). dim % 8 == 0 and 16-byte aligned rows; out
//   must not alias x, residual_out may alias residual.
//   Math (as Hugging Face LLaMA does it): h = T(x + r); s = sum(h^2) in fp32;
//   out = T(float(w) * float(T(h * rsqrt(s / dim + eps)))), or T(h * rsqrt(...)) without w.
//   Patchable: rows and grid.x together (grid.x as above); rows <= the buffers' rows.
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

// Two forms. A block per row (`rmsnorm_*`, 256 threads): a row's 16-byte pieces spread
// over the whole block, so a few rows (decode's final norm) finish in one load's latency. A
// warp per row (`rmsnorm_rows_*`, four rows a block of 128): a block per row holds one
// piece a thread in flight (32 KB an SM at 8 blocks) and puts a block-wide sum's barriers
// between load and store. Alone: 8,192 x 2,048 (prefill) 29.1 us a block, 18.3 a warp; one
// row of 4,096: 1.9 a block, 5.3 a warp. Each thread keeps kKeep pieces in registers
// between the two passes (the row's first 8 * kKeep * threads-a-row elements) and streams
// the rest twice.
constexpr int kBlockThreads = 256;  // rmsnorm_*'s block (ops.norm.BLOCK)

// The row's sum of squares from each thread's partial sums (a block per row: one a thread;
// a warp per row: the eight of the block threads each lane stands for), added in block_sum's
// order: within each warp by warp_sum's butterfly, then the warps' sums as warp_sum adds
// eight lanes and 24 zeros (lanes 4 apart, then 2, then 1; adding the zeros is exact).
template <bool kWarpRow>
__device__ __forceinline__ float row_sum(float (&ss)[kWarpRow ? kBlockThreads / 32 : 1]) {
  if constexpr (!kWarpRow) {
    return rg::block_sum(ss[0]);
  } else {
#pragma unroll
    for (int v = 0; v < kBlockThreads / 32; ++v) ss[v] = rg::warp_sum(ss[v]);
#pragma unroll
    for (int o = kBlockThreads / 64; o > 0; o >>= 1)
#pragma unroll
      for (int v = 0; v < o; ++v) ss[v] = ss[v] + ss[v + o];
    return ss[0];
  }
}

template <typename T, bool kWarpRow>
__device__ void rmsnorm_impl(const T* x, const T* residual, const T* __restrict__ w,
                             T* out, T* residual_out, int rows, int dim, float eps,
                             const int* gather, int x_rows) {
  // residual and residual_out may be the same buffer (in-place residual stream); each
  // element is read and then written by the same thread.
  // a warp keeps 4,096 elements, a block 8,192; the weights of a block's kept pieces are
  // fetched before the wait (few rows: latency), a warp's at the store (registers: warps
  // serve many rows, where loads in flight matter, and their norms take no weight)
  constexpr int kKeep = kWarpRow ? 16 : 4, kKeepW = kWarpRow ? 1 : kKeep;
  const int row = kWarpRow ? blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32 : blockIdx.x;
  const int lane = kWarpRow ? threadIdx.x % 32 : threadIdx.x;
  const int step = 8 * (kWarpRow ? 32 : blockDim.x), j0 = 8 * lane;
  rg::pdl_trigger();
  rg::Vec<T, 8> g[kKeepW];
#pragma unroll
  for (int i = 0; i < (kWarpRow ? 0 : kKeepW); ++i)
    if (w != nullptr && j0 + i * step < dim) g[i] = rg::load<T, 8>(w + j0 + i * step);
  rg::pdl_wait();
  if (row >= rows) return;  // all the threads of the row: the block, or the warp
  const long long base = static_cast<long long>(row) * dim;
  const int src = gather != nullptr ? gather[row] : row;  // the x row these threads read
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
  // ss[v]: the sum of squares of the pieces a block-per-row thread would take, so that both
  // forms add in one order (the same bits whichever form a row count picks): a block's
  // thread t sums pieces t, t + 256, ... in turn, then block_sum adds the threads; a warp's
  // lane l takes pieces l + 32 i, whose i % 8 names the block thread l + 32 (i % 8) that
  // would have taken it, and sums the eight like block_sum does (row_sum)
  constexpr int kSums = kWarpRow ? kBlockThreads / 32 : 1;
  float ss[kSums];
#pragma unroll
  for (int v = 0; v < kSums; ++v) ss[v] = 0.f;
  rg::Vec<T, 8> keep[kKeep];
  if (residual == nullptr) {  // every kept piece's load in flight at once
#pragma unroll
    for (int i = 0; i < kKeep; ++i)
      if (j0 + i * step < dim) keep[i] = rg::load<T, 8>(xrow + j0 + i * step);
  } else {  // residual_out may alias residual: each piece's store before the next's loads
#pragma unroll
    for (int i = 0; i < kKeep; ++i)
      if (j0 + i * step < dim) keep[i] = load_h(j0 + i * step);
  }
#pragma unroll
  for (int i = 0; i < kKeep; ++i)
    if (j0 + i * step < dim) add_squares(keep[i], ss[i % kSums]);
  for (int j = j0 + kKeep * step; j < dim; j += kSums * step) {
#pragma unroll
    for (int v = 0; v < kSums; ++v)
      if (j + v * step < dim) add_squares(load_h(j + v * step), ss[v]);
  }
  const float inv = rsqrtf(row_sum<kWarpRow>(ss) / dim + eps);
  // the kept pieces stay packed until their store: left to itself the compiler keeps each
  // bf16 element's float from the sum, a register an element
#pragma unroll
  for (int i = 0; i < kKeep; ++i) {
    uint4& u = reinterpret_cast<uint4&>(keep[i]);
    asm volatile("" : "+r"(u.x), "+r"(u.y), "+r"(u.z), "+r"(u.w));
  }
#pragma unroll
  for (int i = 0; i < kKeep; ++i)
    if (j0 + i * step < dim) {
      const int j = j0 + i * step;
      const bool late_w = kWarpRow && w != nullptr;  // a warp's weights: fetched here
      store_out(j, keep[i], late_w ? rg::load<T, 8>(w + j) : g[i % kKeepW], inv);
    }
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

extern "C" __global__ void fold_norm_f16(__half* w, const __half* g, long long count, int dim) {
  fold_norm_impl(w, g, count, dim);
}
extern "C" __global__ void fold_norm_bf16(__nv_bfloat16* w, const __nv_bfloat16* g,
                                          long long count, int dim) {
  fold_norm_impl(w, g, count, dim);
}

// ---- generated by rawgraph/ops/generate.py (python -m rawgraph.ops.generate); do not edit
extern "C" __global__ void
rmsnorm_f16(
    const __half* x, const __half* residual, const __half* w, __half* out, __half* residual_out,
    int rows, int dim, float eps, const int* gather, int x_rows) {
  rmsnorm_impl<__half, false>(x, residual, w, out, residual_out, rows, dim, eps, gather, x_rows);
}
extern "C" __global__ void
rmsnorm_bf16(
    const __nv_bfloat16* x, const __nv_bfloat16* residual, const __nv_bfloat16* w,
    __nv_bfloat16* out, __nv_bfloat16* residual_out, int rows, int dim, float eps,
    const int* gather, int x_rows) {
  rmsnorm_impl<__nv_bfloat16, false>(x, residual, w, out, residual_out, rows, dim, eps, gather,
      x_rows);
}
extern "C" __global__ void
rmsnorm_rows_f16(
    const __half* x, const __half* residual, const __half* w, __half* out, __half* residual_out,
    int rows, int dim, float eps, const int* gather, int x_rows) {
  rmsnorm_impl<__half, true>(x, residual, w, out, residual_out, rows, dim, eps, gather, x_rows);
}
extern "C" __global__ void
rmsnorm_rows_bf16(
    const __nv_bfloat16* x, const __nv_bfloat16* residual, const __nv_bfloat16* w,
    __nv_bfloat16* out, __nv_bfloat16* residual_out, int rows, int dim, float eps,
    const int* gather, int x_rows) {
  rmsnorm_impl<__nv_bfloat16, true>(x, residual, w, out, residual_out, rows, dim, eps, gather,
      x_rows);
}
