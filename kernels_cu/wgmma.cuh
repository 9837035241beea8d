// wgmma.cuh: what Hopper's warpgroup MMA (wgmma) kernels share (gemm_sm90.cu, skinny_sm90.cu,
// prefill_attention_sm90.cu)
//   - desc128: the matrix descriptor of a K-major operand tile in shared memory with the
//     128-byte swizzle
//   - desc128_mn: the same for an MN-major B operand (N contiguous: rows of 64 N-elements, one
//     row per k), its 64-wide N panels `panel` bytes apart
//   - Wgmma<T, N>::run: D (64 x N fp32: N / 2 registers a thread) += A (64 x 16) B (16 x N),
//     both K-major in shared memory (N = 32, 64, 96, 128, 192, 256)
//   - WgmmaRS<T, N>::run: the same with A from registers (mma.sync's m16n8k16 A fragment per
//     warp) and B MN-major (N = 64, 128)
//   - wgmma_fence / wgmma_commit / wgmma_wait<N>: order register accesses before the MMAs,
//     close a group of MMAs, wait until at most N groups are in flight
//   - fence_regs: keep the compiler from moving accumulator (or A fragment) accesses across a
//     wait
//   - fence_proxy_async: order the shared-memory writes this thread has seen (st, cp.async;
//     its own or acquired through a barrier) before its MMAs' reads (the async proxy)
// sm_90a (ARCH_SPECIFIC sources) only.
#pragma once
#include <mma.cuh>

namespace rg {

// start address, leading byte offset (unused for this layout: 1), stride byte offset (8 rows
// of 128 bytes: 1024), swizzle mode 1 (128 B) in bits 62-63; addresses in 16-byte units
__device__ __forceinline__ unsigned long long desc128(const void* p) {
  const unsigned long long addr = smem_addr(p);
  return ((addr & 0x3ffff) >> 4) | (1ull << 16) | ((1024ull >> 4) << 32) | (1ull << 62);
}

// MN-major with the 128-byte swizzle: 8 k-rows of 128 bytes make a 1024-byte atom (stride
// byte offset: the next 8 k), `panel` bytes to the next 64 N-elements (leading byte offset)
__device__ __forceinline__ unsigned long long desc128_mn(const void* p, unsigned panel) {
  const unsigned long long addr = smem_addr(p);
  return ((addr & 0x3ffff) >> 4) | (static_cast<unsigned long long>((panel >> 4) & 0x3fff) << 16) |
         ((1024ull >> 4) << 32) | (1ull << 62);
}

// Inline PTX has no register arrays: each N's operand list is spelled out, once.
#define RG_D16(o) "+f"(d[o]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), \
  "+f"(d[o + 5]), "+f"(d[o + 6]), "+f"(d[o + 7]), "+f"(d[o + 8]), "+f"(d[o + 9]), \
  "+f"(d[o + 10]), "+f"(d[o + 11]), "+f"(d[o + 12]), "+f"(d[o + 13]), "+f"(d[o + 14]), \
  "+f"(d[o + 15])
#define RG_R16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define RG_R32 RG_R16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, " \
  "%29, %30, %31"
#define RG_R48 RG_R32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, " \
  "%45, %46, %47"
#define RG_R64 RG_R32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, " \
  "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define RG_R96 RG_R64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, " \
  "%77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define RG_R128 RG_R64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, " \
  "%77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, " \
  "%95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, " \
  "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, " \
  "%126, %127"
// N, the type's PTX name, the accumulators' operand list, then its outputs; a, b, the scale-d
// predicate follow them
#define RG_WGMMA(N, TYPE, REGS, A, B, P, ...) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " {" REGS \
               "}, %" A ", %" B ", p, 1, 1, 0, 0;\n}\n" \
               : __VA_ARGS__ : "l"(a), "l"(b), "r"(1))

template <typename T, int N> struct Wgmma;
#define RG_WGMMA_TYPE(T, NAME) \
  template <> struct Wgmma<T, 32> { \
    static __device__ __forceinline__ void run(float (&d)[16], unsigned long long a, \
                                               unsigned long long b) { \
      RG_WGMMA(32, NAME, RG_R16, "16", "17", "18", RG_D16(0)); \
    } \
  }; \
  template <> struct Wgmma<T, 64> { \
    static __device__ __forceinline__ void run(float (&d)[32], unsigned long long a, \
                                               unsigned long long b) { \
      RG_WGMMA(64, NAME, RG_R32, "32", "33", "34", RG_D16(0), RG_D16(16)); \
    } \
  }; \
  template <> struct Wgmma<T, 96> { \
    static __device__ __forceinline__ void run(float (&d)[48], unsigned long long a, \
                                               unsigned long long b) { \
      RG_WGMMA(96, NAME, RG_R48, "48", "49", "50", RG_D16(0), RG_D16(16), RG_D16(32)); \
    } \
  }; \
  template <> struct Wgmma<T, 128> { \
    static __device__ __forceinline__ void run(float (&d)[64], unsigned long long a, \
                                               unsigned long long b) { \
      RG_WGMMA(128, NAME, RG_R64, "64", "65", "66", RG_D16(0), RG_D16(16), RG_D16(32), \
               RG_D16(48)); \
    } \
  }; \
  template <> struct Wgmma<T, 192> { \
    static __device__ __forceinline__ void run(float (&d)[96], unsigned long long a, \
                                               unsigned long long b) { \
      RG_WGMMA(192, NAME, RG_R96, "96", "97", "98", RG_D16(0), RG_D16(16), RG_D16(32), \
               RG_D16(48), RG_D16(64), RG_D16(80)); \
    } \
  }; \
  template <> struct Wgmma<T, 256> { \
    static __device__ __forceinline__ void run(float (&d)[128], unsigned long long a, \
                                               unsigned long long b) { \
      RG_WGMMA(256, NAME, RG_R128, "128", "129", "130", RG_D16(0), RG_D16(16), RG_D16(32), \
               RG_D16(48), RG_D16(64), RG_D16(80), RG_D16(96), RG_D16(112)); \
    } \
  };
RG_WGMMA_TYPE(__half, "f16")
RG_WGMMA_TYPE(__nv_bfloat16, "bf16")
#undef RG_WGMMA_TYPE
#undef RG_WGMMA

// A from four registers, B transposed (MN-major): trans-b = 1
#define RG_WGMMA_RS(N, TYPE, REGS, A, B, P, ...) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " {" REGS \
               "}, " A ", %" B ", p, 1, 1, 1;\n}\n" \
               : __VA_ARGS__ : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))
template <typename T, int N> struct WgmmaRS;
#define RG_WGMMA_RS_TYPE(T, NAME) \
  template <> struct WgmmaRS<T, 64> { \
    static __device__ __forceinline__ void run(float (&d)[32], const unsigned (&a)[4], \
                                               unsigned long long b) { \
      RG_WGMMA_RS(64, NAME, RG_R32, "{%32, %33, %34, %35}", "36", "37", RG_D16(0), RG_D16(16)); \
    } \
  }; \
  template <> struct WgmmaRS<T, 128> { \
    static __device__ __forceinline__ void run(float (&d)[64], const unsigned (&a)[4], \
                                               unsigned long long b) { \
      RG_WGMMA_RS(128, NAME, RG_R64, "{%64, %65, %66, %67}", "68", "69", RG_D16(0), \
                  RG_D16(16), RG_D16(32), RG_D16(48)); \
    } \
  };
RG_WGMMA_RS_TYPE(__half, "f16")
RG_WGMMA_RS_TYPE(__nv_bfloat16, "bf16")
#undef RG_WGMMA_RS_TYPE
#undef RG_WGMMA_RS
#undef RG_R128
#undef RG_R96
#undef RG_R64
#undef RG_R48
#undef RG_R32
#undef RG_R16
#undef RG_D16

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait() {  // at most N groups in flight
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// The MMAs write accumulators behind the compiler's back: pin each register at this point
template <int N> __device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// ... and A fragments in registers: live, unmoved, until the MMAs reading them are waited on
template <int N> __device__ __forceinline__ void fence_regs(unsigned (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

}  // namespace rg
