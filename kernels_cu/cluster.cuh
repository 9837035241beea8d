// cluster.cuh: thread-block cluster primitives in PTX (cooperative_groups needs libcu++
// headers that NVRTC does not see by default).
//   - cluster_sync: every thread of every block of the cluster arrives, then waits (release /
//     acquire: shared-memory writes before it are visible to the cluster after it)
//   - cluster_rank: this block's index in its cluster
//   - load_remote, load_remote4: a float (four) of another block's shared memory (distributed
//     shared memory)
//   - store_cluster_sums: a tile of fp32 sums that every block of the cluster holds a share
//     of (split k), added in block order and stored, or gate_up's finished with SiLU (the
//     skinny GEMMs' epilogue)
#pragma once
#include <common.cuh>

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

// the 16-byte-aligned p[0..3] as seen in the shared memory of cluster block `rank`
__device__ __forceinline__ float4 load_remote4(const float* p, unsigned rank) {
  const unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(p));
  unsigned remote;
  float4 v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(remote) : "memory");
  return v;
}

// y[c][r0 + r] = T(sum over the cluster's blocks p of part_p[c * kPart + r] (+ residual)) for
// the tile's MX x rows c (< m) and ROWS W rows r (r0 + r < n), kPart = ROWS + 1. Block `rank`
// finishes outputs [rank, rank + 1) * ROWS MX / CS; all its loads of the other blocks' sums
// are issued before any is needed (each costs a round trip). The caller has made every
// block's part[] visible to the cluster (cluster_sync; __syncthreads when CS == 1) and keeps
// it alive until every block has read it (a second cluster_sync).
// SILU (residual NULL): W's rows are gate_up's, interleaved in groups of 8 (8 gate rows, then
// their 8 up rows; ROWS % 16 == 0), and y (m, n / 2) gets T(silu_mul(T(gate), T(up))), the
// bits silu_mul.cu gives from the stored projection; the thread of a gate row finishes its
// output, the thread of its up row none.
template <typename T, int ROWS, int MX, int CS, int THREADS, bool SILU = false>
__device__ __forceinline__ void store_cluster_sums(const float* part, int rank, T* y,
                                                   const T* residual, int m, int n, int r0) {
  constexpr int kPart = ROWS + 1, kShare = ROWS * MX / CS;
  static_assert(!SILU || ROWS % 16 == 0, "a tile holds whole gate/up groups");
  auto total = [&](int at) {  // part[at] summed over the cluster's blocks, in block order
    float v[CS];
#pragma unroll
    for (int p = 0; p < CS; ++p) v[p] = p == rank ? part[at] : load_remote(&part[at], p);
    float sum = v[0];
#pragma unroll
    for (int p = 1; p < CS; ++p) sum += v[p];
    return sum;
  };
  auto finish = [&](int i) {
    const int col = i / ROWS, row = i % ROWS;  // x row, W row: y's rows are contiguous
    if constexpr (SILU) {
      if (row & 8) return;  // an up row: its gate row's thread finishes the pair
      const float gate = total(col * kPart + row), up = total(col * kPart + row + 8);
      if (col < m && r0 + row < n)
        y[static_cast<long long>(col) * (n / 2) + (r0 + row) / 16 * 8 + row % 8] =
            from_float<T>(silu_mul<T>(round_to<T>(gate), round_to<T>(up)));
    } else {
      float sum = total(col * kPart + row);
      if (col < m && r0 + row < n) {
        const long long o = static_cast<long long>(col) * n + r0 + row;
        if (residual != nullptr) sum += to_float(residual[o]);
        y[o] = from_float<T>(sum);
      }
    }
  };
  if constexpr (kShare % THREADS == 0) {  // whole rounds of the block: unrolled
#pragma unroll
    for (int u = 0; u < kShare / THREADS; ++u)
      finish((rank * (kShare / THREADS) + u) * THREADS + threadIdx.x);
  } else {
    for (int i = rank * kShare + threadIdx.x; i < (rank + 1) * kShare; i += THREADS) finish(i);
  }
}

}  // namespace rg
