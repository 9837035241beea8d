// fp8_quantize.cu: a 16-bit weight to FP8 e4m3 with one scale per output row (round to
// nearest even, saturating), what rawgraph.model.quant.quantize's "channel" strategy gives.
//
//   extern "C" fp8_quantize_{f16,bf16}(const T* w, unsigned char* codes, float* scale, int n,
//                                      int k)
//   w, codes (n, k); scale (n,): scale[r] = max(max_j |w[r][j]|, 1e-12) / 448 and
//   codes[r][j] = e4m3(w[r][j] / scale[r]), the division IEEE's (as NumPy's float32).
//   grid (n), block (256): a block a row, its largest magnitude by a fixed-order reduction.
//   sm_89 on (the conversion is Hopper's and Ada's cvt); older GPUs trap.
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

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads)
fp8_quantize_f16(const __half* w, unsigned char* codes, float* scale, int n, int k) {
  quantize_impl(w, codes, scale, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads)
fp8_quantize_bf16(const __nv_bfloat16* w, unsigned char* codes, float* scale, int n, int k) {
  quantize_impl(w, codes, scale, n, k);
}
