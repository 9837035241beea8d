// common.cuh: helpers shared by rawgraph's kernels.
//   - float <-> storage conversions for __half and __nv_bfloat16 (fp32 accumulation everywhere)
//   - Vec<T, N>: N elements loaded/stored as one aligned vector access (16 bytes for N = 8)
//   - block_sum: sum of one float per thread over the whole block (blockDim.x % 32 == 0)
//   - neg_inf: -infinity (NVRTC has no <cmath>)
//   - pdl_start: programmatic dependent launch; every kernel calls it before reading what
//     an earlier kernel wrote (a no-op unless launched with programmatic serialization)
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace rg {

template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <> __device__ __forceinline__ float to_float<float>(float x) { return x; }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }

// Programmatic dependent launch (PDL): let the next kernel in the stream launch now (its
// blocks run their independent prologue, then wait), then wait until the previous kernel
// has finished and its writes are visible. Both are no-ops for a normal launch.
__device__ __forceinline__ void pdl_trigger() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_start() {
  pdl_trigger();
  pdl_wait();
}

// -infinity without <cmath> (NVRTC has no INFINITY macro).
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
// 2^x in one MUFU.EX2, results under 2^-126 flushed to 0 (exp2f adds a range check and two
// predicated multiplies a call to keep them: three more instructions, in a softmax as many
// as its useful ones)
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Rounds through the storage type: what a framework computing in T would produce.
template <typename T> __device__ __forceinline__ float round_to(float x) {
  return to_float(from_float<T>(x));
}

// LLaMA's activation of a gate and an up projection (each already rounded to T), before its
// final rounding to T: T(silu(gate)) * up, silu(g) = g / (1 + e^-g). silu_mul.cu and the
// GEMV's and GEMM's fused epilogues all take it from here: the same bits on every path.
template <typename T> __device__ __forceinline__ float silu_mul(float gate, float up) {
  return round_to<T>(gate / (1.f + expf(-gate))) * up;
}

// RoPE: the angle of pair i at position pos (the product rounded to fp32, as Hugging Face
// computes it), and the rotation of the pair (a, b), rounded to T. Each rounding is pinned
// (no contraction left to the compiler), so every kernel that rotates gives the same bits.
__device__ __forceinline__ void rope_angle(int pos, float inv_freq, float& s, float& c) {
  sincosf(__fmul_rn(static_cast<float>(pos), inv_freq), &s, &c);
}
template <typename T>
__device__ __forceinline__ void rotate(float a, float b, float c, float s, T& x, T& y) {
  x = from_float<T>(__fmaf_rn(a, c, -__fmul_rn(b, s)));
  y = from_float<T>(__fmaf_rn(b, c, __fmul_rn(a, s)));
}

template <typename T, int N> struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <typename T, int N> __device__ __forceinline__ Vec<T, N> load(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}
template <typename T, int N> __device__ __forceinline__ void store(T* p, const Vec<T, N>& x) {
  *reinterpret_cast<Vec<T, N>*>(p) = x;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block; every thread gets the result. blockDim.x must be a multiple of 32.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : 0.f;
  return warp_sum(v);
}

// Two FP8 e4m3 values (the low byte first) as a half2's bits: exact, every e4m3 value being
// a half. Hopper's and Ada's cvt takes a pair an instruction (sm_89 on); older GPUs trap
// (rawgraph.ops.quantized launches no FP8 kernel there), their builds still compiling.
__device__ __forceinline__ unsigned e4m3x2_f16x2(unsigned short v) {
#if __CUDA_ARCH__ >= 890
  unsigned r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(v));
  return r;
#else
  __trap();
  return v;
#endif
}

}  // namespace rg
