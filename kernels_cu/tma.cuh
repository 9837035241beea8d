// tma.cuh: Hopper's tensor memory accelerator (TMA) and the shared-memory barriers it signals.
//   - TensorMap: the 128-byte descriptor cuTensorMapEncodeTiled makes on the host, passed by
//     value as a `const __grid_constant__` kernel parameter (rawgraph.cuda.tensormap)
//   - mbar_*: mbarrier init / arrive / arrive.expect_tx / wait on a phase's parity
//   - tma_load_2d: one box of a 2-D tensor into shared memory, completing on an mbarrier
//     (bytes counted as they land: a box that reaches past the tensor is zero-filled, and its
//     full size still counts)
//   - tma_store_2d: one box from shared memory into a 2-D tensor (the part past its edges not
//     written), in the issuing thread's bulk group: bulk_commit closes a group, bulk_wait_read
//     waits until the groups but the last N have read their shared memory, bulk_wait until
//     their writes are done
// sm_90a (ARCH_SPECIFIC sources) only.
#pragma once
#include <mma.cuh>

struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};

namespace rg {

__device__ __forceinline__ void mbar_init(unsigned long long* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}
// the inits visible to the async proxy (TMA's complete_tx) before any use
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// one arrival, and `bytes` more transaction bytes the phase waits for
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// until the phase of parity `parity` has completed
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, int parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT;\n}\n" ::"r"(smem_addr(bar)), "r"(parity) : "memory");
}

__device__ __forceinline__ void tma_prefetch(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}
// the box at (c0 innermost, c1) of `map` into `dst` (aligned as the map's swizzle needs)
__device__ __forceinline__ void tma_load_2d(void* dst, const TensorMap* map, int c0, int c1,
                                            unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];"
      ::"r"(smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar)) : "memory");
}

// the box at (c0 innermost, c1) of `map` from `src` (aligned as the map's swizzle needs)
__device__ __forceinline__ void tma_store_2d(const TensorMap* map, const void* src, int c0,
                                             int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
               ::"l"(map), "r"(smem_addr(src)), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

// barrier ID (1-15; 0 is __syncthreads') among `threads` threads, whole warps; a constant, so
// ptxas reserves only the barriers used (a register id reserves all 16)
template <int ID> __device__ __forceinline__ void named_sync(int threads) {
  asm volatile("bar.sync %0, %1;" ::"n"(ID), "r"(threads) : "memory");
}

}  // namespace rg
