// argmax.cu: greedy decoding, the index of each row's largest logit, on the device.
//
//   extern "C" argmax_f16 / argmax_bf16(const T* logits, int* out, int rows, int vocab)
//   logits (rows, vocab), out (rows,): out[r] = the smallest j with logits[r][j] maximal
//   (numpy's tie rule); NaNs are skipped.
//   grid (rows), block (1024): threads stride the row 8 tokens a piece (16-byte loads where
//   aligned), 4 pieces in flight, then a (value, index) tree reduction.
//   Patchable: rows with grid.x (grid.x == rows <= rows of logits).
#include "common.cuh"

__device__ __forceinline__ void better(float& v, int& j, float v2, int j2) {
  if (v2 > v || (v2 == v && j2 < j)) {
    v = v2;
    j = j2;
  }
}

template <typename T>
__device__ void argmax_impl(const T* logits, int* out, int rows,
                            int vocab) {
  rg::pdl_start();
  const int r = blockIdx.x;
  if (r >= rows) return;
  const T* row = logits + static_cast<long long>(r) * vocab;
  float v = rg::neg_inf();
  int j = 0x7fffffff;
  // 8 tokens a piece (one 16-byte load where the row's alignment allows it), 4 pieces in
  // flight per thread: one block's pass over a row is a chain of memory latencies
  constexpr int kAhead = 4;
  auto load8 = [&](int i0, float (&x)[8]) {
    if (i0 + 8 <= vocab && (reinterpret_cast<unsigned long long>(row + i0) & 15) == 0) {
      const rg::Vec<T, 8> p = rg::load<T, 8>(row + i0);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = rg::to_float(p.v[e]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        x[e] = i0 + e < vocab ? rg::to_float(row[i0 + e]) : __int_as_float(0x7fffffff);
    }
  };
  const int step = 8 * blockDim.x;
  for (int i0 = 8 * threadIdx.x; i0 < vocab; i0 += kAhead * step) {
    float x[kAhead][8];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) load8(i0 + u * step, x[u]);
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      float cm = rg::neg_inf();
#pragma unroll
      for (int e = 0; e < 8; ++e) cm = fmaxf(cm, x[u][e]);  // fmaxf skips NaN
      // a thread's pieces come in index order: only a larger value (or the first) moves j
      if (cm > v || (j == 0x7fffffff && cm == v)) {
#pragma unroll
        for (int e = 7; e >= 0; --e)
          if (x[u][e] == cm) {
            v = cm;
            j = i0 + u * step + e;
          }
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    better(v, j, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, j, o));
  __shared__ float sv[32];
  __shared__ int sj[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sv[warp] = v;
    sj[warp] = j;
  }
  __syncthreads();
  if (warp == 0) {
    v = lane < (blockDim.x >> 5) ? sv[lane] : rg::neg_inf();
    j = lane < (blockDim.x >> 5) ? sj[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      better(v, j, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, j, o));
    if (lane == 0) out[r] = j == 0x7fffffff ? 0 : j;
  }
}

extern "C" __global__ void argmax_f16(const __half* logits, int* out, int rows, int vocab) {
  argmax_impl(logits, out, rows, vocab);
}
extern "C" __global__ void argmax_bf16(const __nv_bfloat16* logits, int* out, int rows,
                                       int vocab) {
  argmax_impl(logits, out, rows, vocab);
}
