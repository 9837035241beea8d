// cluster.cuh: thread-block cluster primitives in PTX (cooperative_groups needs libcu++
// headers that NVRTC does not see by default).
//   - cluster_sync: every thread of every block of the cluster arrives, then waits (release /
//     acquire: shared-memory writes before it are visible to the cluster after it)
//   - cluster_rank: this block's index in its cluster
//   - load_remote: a float of another block's shared memory (distributed shared memory)
#pragma once

namespace rg {

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;"
               ::: "memory");
}

__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// *p as seen in the shared memory of cluster block `rank`
__device__ __forceinline__ float load_remote(const float* p, unsigned rank) {
  const unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(p));
  unsigned remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

}  // namespace rg
