// argmax.cuh: the greedy token of a row of logits, shared by argmax.cu and sample.cu.
//   - load8: tokens i0 .. i0 + 7 of a row as floats (one 16-byte load where the row allows)
//   - better: the (value, index) order of argmax: larger value, then smaller index
//   - block_argmax: the block's (max, smallest index of it) over a slice of a row
//   - key_of: a float's order-preserving 32-bit key (NaN: 0, below every number)
//   - greedy_key / greedy_token: (value, index) as one 64-bit key whose largest is argmax's
//     pick, so partial results merge with atomicMax in any order (gemv.cu's row_max)
// NaNs are skipped; a slice of NaNs alone gives index kNone.
#pragma once
#include <common.cuh>

namespace rg {

constexpr int kNone = 0x7fffffff;  // no token: every value NaN

// order-preserving key: larger float -> larger key; NaN -> 0 (below every number)
__device__ __forceinline__ unsigned key_of(float x) {
  if (x != x) return 0u;
  const unsigned b = __float_as_uint(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// value's key above, the complement of the index below: larger value first, then smaller
// index. 0 (no candidate) for NaN.
__device__ __forceinline__ unsigned long long greedy_key(float v, int j) {
  const unsigned k = key_of(v);
  return k == 0u ? 0ull : (static_cast<unsigned long long>(k) << 32) | (0xffffffffu - j);
}
// the index of a merged key; 0 when every value was NaN (argmax.cu's rule)
__device__ __forceinline__ int greedy_token(unsigned long long key) {
  return key == 0ull ? 0 : static_cast<int>(0xffffffffu - static_cast<unsigned>(key));
}

// tokens i0 .. i0 + 7 of `row` (one 16-byte load when the row allows it); past `end`: NaN
template <typename T>
__device__ __forceinline__ void load8(const T* row, int i0, int end, float (&x)[8]) {
  if (i0 + 8 <= end && (reinterpret_cast<unsigned long long>(row + i0) & 15) == 0) {
    const Vec<T, 8> p = load<T, 8>(row + i0);
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = to_float(p.v[e]);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = i0 + e < end ? to_float(row[i0 + e]) : __int_as_float(0x7fffffff);
  }
}

// (v, j) <- (v2, j2) when v2 is larger, or equal at a smaller index
__device__ __forceinline__ void better(float& v, int& j, float v2, int j2) {
  if (v2 > v || (v2 == v && j2 < j)) {
    v = v2;
    j = j2;
  }
}

// The largest value among tokens [lo, hi) of `row` (lo % 8 == 0) and its smallest index;
// every thread of the block gets them. One pass: 8 tokens a piece, kAhead pieces in flight
// per thread (the pass is a chain of memory latencies), indices looked at only where a
// piece's max beats the thread's (a thread's pieces come in index order).
template <typename T>
__device__ void block_argmax(const T* row, int lo, int hi, float& v, int& j) {
  constexpr int kAhead = 4;
  __shared__ float sv[32];
  __shared__ int sj[32];
  v = neg_inf();
  j = kNone;
  const int step = 8 * blockDim.x;
  for (int i0 = lo + 8 * threadIdx.x; i0 < hi; i0 += kAhead * step) {
    float x[kAhead][8];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) load8(row, i0 + u * step, hi, x[u]);
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      float cm = neg_inf();
#pragma unroll
      for (int e = 0; e < 8; ++e) cm = fmaxf(cm, x[u][e]);  // fmaxf skips NaN
      if (cm > v || (j == kNone && cm == v)) {
#pragma unroll
        for (int e = 7; e >= 0; --e)
          if (x[u][e] == cm) {
            v = cm;
            j = i0 + u * step + e;
          }
      }
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    better(v, j, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, j, o));
  __syncthreads();  // the slots may still be read by an earlier call
  if (lane == 0) {
    sv[warp] = v;
    sj[warp] = j;
  }
  __syncthreads();
  v = lane < (blockDim.x >> 5) ? sv[lane] : neg_inf();
  j = lane < (blockDim.x >> 5) ? sj[lane] : kNone;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    better(v, j, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, j, o));
}

}  // namespace rg
