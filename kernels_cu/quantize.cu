// quantize.cu: a 16-bit weight to the formats of rawgraph.ops.quantized, on the GPU, with the
// bits of rawgraph.ops.reference's quantize_fp8 / quantize_int4 (float32 math, IEEE division,
// round to nearest even).
//
//   extern "C" fp8_quantize_{f16,bf16}(const T* w, unsigned char* codes, float* scale, int n,
//                                      int k)
//   FP8 e4m3 with one scale per output row: w, codes (n, k); scale (n,): scale[r] =
//   max(max_j |w[r][j]|, 1e-12) / 448 and codes[r][j] = e4m3(w[r][j] / scale[r]), saturating.
//   grid (n), block (256): a block a row, its largest magnitude by a fixed-order reduction.
//   sm_89 on (the conversion is Hopper's and Ada's cvt); older GPUs trap.
//
//   extern "C" int4_quantize_{f16,bf16}(const T* w, unsigned char* packed, T* scales,
//                                       unsigned char* zeros, int n, int k, int group)
//   4-bit, asymmetric, a scale and a zero point per group of `group` values of a row: over
//   the group's values with 0 among them, lo = min, hi = max; scale = T((hi - lo) / 15) (1
//   where that is 0); zero = clamp(rint(-lo / scale), 0, 15); q = clamp(rint(w / scale) +
//   zero, 0, 15), packed 8 a 32-bit word in the nibble order of ops.quantized.pack_int4
//   (values 0 2 4 6 1 3 5 7, bits 0-3 first). packed (n, k / 2), scales and zeros
//   (n, k / group). grid (n), block (256): a thread a group (a one-time pass at load).
//
//   extern "C" fp8_dequantize_{f16,bf16}(const unsigned char* codes, const float* scale, T* w,
//                                        int n, int k)
//   extern "C" int4_dequantize_{f16,bf16}(const unsigned char* packed, const T* scales,
//                                         const unsigned char* zeros, T* w, int n, int k,
//                                         int group)
//   The other way, for the paths with no quantized kernel (a model that keeps no 16-bit
//   weights dequantizes a projection into a scratch buffer before the GEMM reads it):
//   w[r][j] = T(e4m3(codes[r][j]) * scale[r]), or T((q - zero) * scale) (the GEMV's values).
//   grid (cdiv(n k / 8, 256)), block (256): a thread 8 values of a row (k % 16 == 0).
#include <common.cuh>

namespace {

constexpr int kThreads = 256;

// two floats to e4m3 codes: a in the low byte, b in the high byte
__device__ __forceinline__ unsigned short e4m3x2(float a, float b) {
#if __CUDA_ARCH__ >= 890
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
  return r;
#else
  __trap();
  return 0;
#endif
}

template <typename T>
__device__ void quantize_impl(const T* w, unsigned char* codes, float* scale, int n, int k) {
  const int row = blockIdx.x;
  const T* in = w + static_cast<long long>(row) * k;
  unsigned char* out = codes + static_cast<long long>(row) * k;
  float big = 0.f;
  for (int j = threadIdx.x; j < k; j += kThreads) big = fmaxf(big, fabsf(rg::to_float(in[j])));
  __shared__ float part[kThreads];
  part[threadIdx.x] = big;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] = fmaxf(part[threadIdx.x], part[threadIdx.x + s]);
    __syncthreads();
  }
  const float sc = fmaxf(part[0], 1e-12f) / 448.f;
  if (threadIdx.x == 0) scale[row] = sc;
  for (int j = 2 * threadIdx.x; j < k; j += 2 * kThreads) {  // k is even
    const unsigned short pair = e4m3x2(rg::to_float(in[j]) / sc, rg::to_float(in[j + 1]) / sc);
    out[j] = static_cast<unsigned char>(pair & 0xff);
    out[j + 1] = static_cast<unsigned char>(pair >> 8);
  }
}

// the nibble value v of a word's 8 goes to (ops.quantized.I4_NIBBLE)
__device__ __forceinline__ int nibble(int v) { return (v & 1) ? 4 + (v >> 1) : v >> 1; }

template <typename T>
__device__ void int4_impl(const T* w, unsigned char* packed, T* scales, unsigned char* zeros,
                          int k, int group) {
  const int row = blockIdx.x, groups = k / group;
  const T* in = w + static_cast<long long>(row) * k;
  unsigned* out = reinterpret_cast<unsigned*>(packed + static_cast<long long>(row) * (k / 2));
  for (int gi = threadIdx.x; gi < groups; gi += kThreads) {
    const T* g = in + static_cast<long long>(gi) * group;
    float lo = 0.f, hi = 0.f;
    for (int j = 0; j < group; ++j) {
      const float v = rg::to_float(g[j]);
      lo = fminf(lo, v);
      hi = fmaxf(hi, v);
    }
    T st = rg::from_float<T>((hi - lo) / 15.f);
    if (rg::to_float(st) == 0.f) st = rg::from_float<T>(1.f);
    const float s = rg::to_float(st);
    const float z = fminf(fmaxf(rintf(-lo / s), 0.f), 15.f);
    const long long at = static_cast<long long>(row) * groups + gi;
    scales[at] = st;
    zeros[at] = static_cast<unsigned char>(z);
    for (int j = 0; j < group; j += 8) {
      unsigned word = 0;
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        const float q = fminf(fmaxf(rintf(rg::to_float(g[j + v]) / s) + z, 0.f), 15.f);
        word |= static_cast<unsigned>(q) << (4 * nibble(v));
      }
      out[(static_cast<long long>(gi) * group + j) / 8] = word;
    }
  }
}

// 8 values of row r from value j on: FP8's, or 4-bit's (one 32-bit word)
template <typename T>
__device__ void fp8_dequantize_impl(const unsigned char* codes, const float* scale, T* w, int n,
                                    int k) {
  const long long i = 8ll * (static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x);
  if (i >= static_cast<long long>(n) * k) return;
  const float s = scale[i / k];
  const uint2 c = *reinterpret_cast<const uint2*>(codes + i);
  const unsigned words[2] = {c.x, c.y};
  T out[8];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const unsigned pair =
          rg::e4m3x2_f16x2(static_cast<unsigned short>(words[h] >> (16 * p)));
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&pair));
      out[4 * h + 2 * p] = rg::from_float<T>(f.x * s);
      out[4 * h + 2 * p + 1] = rg::from_float<T>(f.y * s);
    }
  *reinterpret_cast<uint4*>(w + i) = *reinterpret_cast<const uint4*>(out);
}

template <typename T>
__device__ void int4_dequantize_impl(const unsigned char* packed, const T* scales,
                                     const unsigned char* zeros, T* w, int n, int k,
                                     int group) {
  const long long i = 8ll * (static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x);
  if (i >= static_cast<long long>(n) * k) return;
  const long long at = i / k * (k / group) + i % k / group;  // the 8 values' group
  const float s = rg::to_float(scales[at]), z = zeros[at];
  const unsigned word = *reinterpret_cast<const unsigned*>(packed + i / 2);
  T out[8];
#pragma unroll
  for (int v = 0; v < 8; ++v)
    out[v] = rg::from_float<T>((static_cast<float>(word >> (4 * nibble(v)) & 0xf) - z) * s);
  *reinterpret_cast<uint4*>(w + i) = *reinterpret_cast<const uint4*>(out);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads)
fp8_quantize_f16(const __half* w, unsigned char* codes, float* scale, int n, int k) {
  quantize_impl(w, codes, scale, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads)
fp8_quantize_bf16(const __nv_bfloat16* w, unsigned char* codes, float* scale, int n, int k) {
  quantize_impl(w, codes, scale, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads)
int4_quantize_f16(const __half* w, unsigned char* packed, __half* scales, unsigned char* zeros,
                  int n, int k, int group) {
  int4_impl(w, packed, scales, zeros, k, group);
}
extern "C" __global__ void __launch_bounds__(kThreads)
int4_quantize_bf16(const __nv_bfloat16* w, unsigned char* packed, __nv_bfloat16* scales,
                   unsigned char* zeros, int n, int k, int group) {
  int4_impl(w, packed, scales, zeros, k, group);
}
extern "C" __global__ void __launch_bounds__(kThreads)
fp8_dequantize_f16(const unsigned char* codes, const float* scale, __half* w, int n, int k) {
  fp8_dequantize_impl(codes, scale, w, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads)
fp8_dequantize_bf16(const unsigned char* codes, const float* scale, __nv_bfloat16* w, int n,
                    int k) {
  fp8_dequantize_impl(codes, scale, w, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads)
int4_dequantize_f16(const unsigned char* packed, const __half* scales,
                    const unsigned char* zeros, __half* w, int n, int k, int group) {
  int4_dequantize_impl(packed, scales, zeros, w, n, k, group);
}
extern "C" __global__ void __launch_bounds__(kThreads)
int4_dequantize_bf16(const unsigned char* packed, const __nv_bfloat16* scales,
                     const unsigned char* zeros, __nv_bfloat16* w, int n, int k, int group) {
  int4_dequantize_impl(packed, scales, zeros, w, n, k, group);
}
