// embedding.cu: token embedding lookup with the token ids on the device.
//
//   extern "C" embedding_f16 / embedding_bf16(const int* ids, const T* table, T* out,
//                                            int n, int dim, int vocab)
//   ids (n,), table (vocab, dim), out (n, dim): out[t] = table[ids[t]]; an id outside
//   [0, vocab) gives a zero row (the host checks ids it knows; this keeps a bad device id from
//   reading out of bounds).
//   grid (n), block (128): 8 elements (16 bytes) per thread per step; dim % 8 == 0.
//   Patchable: n with grid.x (grid.x == n <= rows of out); ids change in device memory.
#include <common.cuh>

template <typename T>
__device__ void embedding_impl(const int* ids, const T* __restrict__ table,
                               T* out, int n, int dim, int vocab) {
  rg::pdl_start();
  const int t = blockIdx.x;
  if (t >= n) return;
  const int id = ids[t];
  T* dst = out + static_cast<long long>(t) * dim;
  if (id < 0 || id >= vocab) {
    rg::Vec<T, 8> z;
#pragma unroll
    for (int k = 0; k < 8; ++k) z.v[k] = rg::from_float<T>(0.f);
    for (int j = 8 * threadIdx.x; j < dim; j += 8 * blockDim.x) rg::store<T, 8>(dst + j, z);
    return;
  }
  const T* src = table + static_cast<long long>(id) * dim;
  for (int j = 8 * threadIdx.x; j < dim; j += 8 * blockDim.x)
    rg::store<T, 8>(dst + j, rg::load<T, 8>(src + j));
}

extern "C" __global__ void embedding_f16(const int* ids, const __half* table, __half* out, int n,
                                         int dim, int vocab) {
  embedding_impl(ids, table, out, n, dim, vocab);
}
extern "C" __global__ void embedding_bf16(const int* ids, const __nv_bfloat16* table,
                                          __nv_bfloat16* out, int n, int dim, int vocab) {
  embedding_impl(ids, table, out, n, dim, vocab);
}
