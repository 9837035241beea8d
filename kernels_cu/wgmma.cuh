// wgmma.cuh: what Hopper's warpgroup MMA (wgmma) kernels share (gemm_sm90.cu, skinny_sm90.cu)
//   - desc128: the matrix descriptor of a K-major operand tile in shared memory with the
//     128-byte swizzle
//   - wgmma_fence / wgmma_commit / wgmma_wait<N>: order register accesses before the MMAs,
//     close a group of MMAs, wait until at most N groups are in flight
// sm_90a (ARCH_SPECIFIC sources) only.
#pragma once
#include "mma.cuh"

namespace rg {

// start address, leading byte offset (unused for this layout: 1), stride byte offset (8 rows
// of 128 bytes: 1024), swizzle mode 1 (128 B) in bits 62-63; addresses in 16-byte units
__device__ __forceinline__ unsigned long long desc128(const void* p) {
  const unsigned long long addr = smem_addr(p);
  return ((addr & 0x3ffff) >> 4) | (1ull << 16) | ((1024ull >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait() {  // at most N groups in flight
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

}  // namespace rg
