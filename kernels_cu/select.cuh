// select.cuh: block-wide pieces of sample.cu and logits.cu (one block of kThreads per row).
//   - Shared: the block's shared scratch (the radix histogram, scan and reduce slots)
//   - block_reduce / block_scan: a reduction and an exclusive prefix sum over the block
//   - Row: a row of logits and the fixed-point mass exp(x - max) of its tokens
//   - radix_select: the largest key threshold whose count (or mass) reaches a need, in four
//     passes of 8 bits over the row's order-preserving keys (exact, no float atomics)
// Every result is the same bits for the same row, whatever the launch.
#pragma once
#include <argmax.cuh>

namespace rg {

constexpr int kThreads = 1024, kWarps = kThreads / 32;
using u64 = unsigned long long;
constexpr int kHistBytes = kWarps * 2 * 256 * 4;  // radix_select's per-warp histograms

struct Shared {
  u64 hist[256];
  u64 scan[kWarps];
  float fval[kWarps];
  unsigned prefix;
  u64 need;
  int token;  // the drawn token, for the thread that emits it
};

// op over the block (one value per thread, 32 warps); every thread gets the result.
// `slots`: kWarps values of shared memory.
template <typename V, typename Op> __device__ V block_reduce(V v, V* slots, Op op) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // slots may still be read by a previous call
  if (lane == 0) slots[warp] = v;
  __syncthreads();
  v = slots[lane];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// exclusive prefix sum over the block; every thread also gets the total
__device__ u64 block_scan(u64 v, u64& total, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  u64 inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u64 up = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += up;
  }
  __syncthreads();
  if (lane == 31) sh.scan[warp] = inc;
  __syncthreads();
  u64 w = sh.scan[lane], winc = w;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u64 up = __shfl_up_sync(0xffffffffu, winc, o);
    if (lane >= o) winc += up;
  }
  total = __shfl_sync(0xffffffffu, winc, 31);
  const u64 before = __shfl_sync(0xffffffffu, winc - w, warp);
  return before + inc - v;
}

// weight of a token for a radix pass: 1 (counting) or its fixed-point mass
template <typename T> struct Row {
  const T* x;
  int vocab;
  float m, scale2;  // max logit; log2(e) / temperature
  // tokens i0 .. i0 + 7 (one 16-byte load when the row allows it); past the end: NaN
  __device__ void load8(int i0, float (&v)[8]) const { rg::load8(x, i0, vocab, v); }
  __device__ int chunks() const { return (vocab + 7) / 8; }
  __device__ u64 mass(float v) const {  // exp(x - max) in [0, 1] as 32-bit fixed point
    return static_cast<u64>(exp2f((v - m) * scale2) * 4294967296.0f);
  }
};

// The largest key threshold t such that the weight of keys >= t (among keys >= floor)
// reaches `need`. Four passes of 8 bits, most significant first.
template <typename T>
__device__ unsigned radix_select(const Row<T>& row, unsigned floor, bool by_mass, u64 need,
                                 Shared& sh, unsigned* whist) {
  const int lane = threadIdx.x & 31;
  unsigned prefix = 0, mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    // Each warp fills its own histogram with 32-bit shared atomics (conflicts only among its
    // own lanes; one histogram for all warps made the first pass, which sees mostly one
    // exponent byte, crawl). Masses go in as two 16-bit halves so 32 bits never overflow:
    // a warp sees at most vocab / 32 tokens, each half < 2^16 (high half <= 2^16).
    unsigned* lo_h = whist + (threadIdx.x >> 5) * 512;
    unsigned* hi_h = lo_h + 256;
    for (int b = lane; b < 512; b += 32) lo_h[b] = 0;
    __syncwarp();
    for (int j = threadIdx.x; j < row.chunks(); j += kThreads) {
      float v[8];
      row.load8(8 * j, v);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const unsigned k = key_of(v[e]);  // NaN and past-the-end: 0, below any floor
        if (k < floor || ((k ^ prefix) & mask)) continue;
        const unsigned bin = (k >> shift) & 255;
        if (!by_mass) {
          atomicAdd(&lo_h[bin], 1u);
          continue;
        }
        const u64 w = row.mass(v[e]);
        if (w == 0) continue;
        atomicAdd(&lo_h[bin], static_cast<unsigned>(w & 0xffff));
        atomicAdd(&hi_h[bin], static_cast<unsigned>(w >> 16));
      }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += kThreads) {
      u64 sum = 0;
      for (int w = 0; w < kWarps; ++w)
        sum += whist[w * 512 + b] + (static_cast<u64>(whist[w * 512 + 256 + b]) << 16);
      sh.hist[b] = sum;
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // lane l scans bins 255 - 8l .. 248 - 8l, from the top down
      u64 part = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) part += sh.hist[255 - 8 * lane - j];
      u64 inc = part;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const u64 up = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += up;
      }
      u64 before = inc - part;
      // the lane whose bins cross `need` (or the last lane, when rounding left it short)
      const bool mine = (before < need && need <= inc) || (lane == 31 && inc < need);
      if (mine) {
        int bin = 248 - 8 * lane;
        for (int j = 0; j < 8; ++j) {
          const u64 h = sh.hist[255 - 8 * lane - j];
          if (before + h >= need || j == 7) {
            bin = 255 - 8 * lane - j;
            break;
          }
          before += h;
        }
        sh.prefix = prefix | (static_cast<unsigned>(bin) << shift);
        sh.need = need > before ? need - before : 1;
      }
    }
    __syncthreads();
    prefix = sh.prefix;
    need = sh.need;
    mask |= 255u << shift;
    __syncthreads();
  }
  return prefix;
}

}  // namespace rg
