// add.cu: elementwise sum, out[i] = a[i] + b[i] (residual add), fp32 math, one rounding.
//
//   extern "C" add_f16 / add_bf16(const T* a, const T* b, T* out, int n)
//   grid  (cdiv(n, 8 * blockDim.x)), block (256): each thread owns 8 consecutive elements,
//   moved as one 16-byte vector when all three pointers are 16-byte aligned and the 8 are
//   in bounds; otherwise element by element (ragged tails, odd offsets).
//   Patchable: n and grid.x together (grid.x >= cdiv(n, 8 * blockDim.x)); n <= buffer length.
#include <common.cuh>

template <typename T>
__device__ void add_impl(const T* a, const T* b, T* out,
                         int n) {
  rg::pdl_start();
  const long long i = 8ll * (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const bool aligned =
      ((reinterpret_cast<unsigned long long>(a) | reinterpret_cast<unsigned long long>(b) |
        reinterpret_cast<unsigned long long>(out)) & 15) == 0;
  if (aligned && i + 8 <= n) {
    const rg::Vec<T, 8> x = rg::load<T, 8>(a + i), y = rg::load<T, 8>(b + i);
    rg::Vec<T, 8> z;
#pragma unroll
    for (int k = 0; k < 8; ++k) z.v[k] = rg::from_float<T>(rg::to_float(x.v[k]) + rg::to_float(y.v[k]));
    rg::store<T, 8>(out + i, z);
  } else {
    for (long long k = i; k < n && k < i + 8; ++k)
      out[k] = rg::from_float<T>(rg::to_float(a[k]) + rg::to_float(b[k]));
  }
}

extern "C" __global__ void add_f16(const __half* a, const __half* b, __half* out, int n) {
  add_impl(a, b, out, n);
}
extern "C" __global__ void add_bf16(const __nv_bfloat16* a, const __nv_bfloat16* b,
                                    __nv_bfloat16* out, int n) {
  add_impl(a, b, out, n);
}
