// stream_read.cu: the read-only bandwidth ceiling. A kernel that only reads (the decode GEMV
// streams its weight once; decode attention its K/V) cannot beat a plain streaming read of
// the same bytes, which starts and drains the same way. `bench kernels` times this one next
// to each row with a target, since short transfers reach neither the 1 GiB copy's rate nor
// each other's (H200, graph replays: 32 MiB read ~84% of the 1 GiB copy, 48 MiB ~91%).
//
//   extern "C" stream_read(const uint4* p, long long n, unsigned* out)
//   *out ^= the XOR of every 32-bit word of p[0, n) (16-byte words): a result that depends
//   on every byte read, the same in any order, so the reads cannot be optimized away.
//   grid: any (the bench launches 4 blocks of 256 per SM, the best of 40 shapes measured at
//   32 and 48 MiB), block: a multiple of 32. Each thread keeps 8 loads of 16 bytes in
//   flight, striding over the grid so that the whole GPU sweeps the buffer front to back.
//
//   extern "C" stream_read_chained(const uint4* p, long long n, const uint4* q,
//                                  long long m, unsigned* out)
//   The same over p[0, n) then q[0, m), as a link of the decode step's ceiling (`bench
//   decode`'s read chain: a chain of these moving each projection's weight and each
//   layer's K and V). Launched programmatically it lets the next kernel launch at once and
//   requests its first 8 loads a thread before waiting for the kernel ahead, as the decode
//   GEMV requests its first weights: none of what it reads depends on that kernel.
#include <common.cuh>

namespace {

constexpr int kInFlight = 8;

__device__ __forceinline__ unsigned fold(const uint4& v) { return v.x ^ v.y ^ v.z ^ v.w; }

}  // namespace

extern "C" __global__ void stream_read(const uint4* p, long long n, unsigned* out) {
  rg::pdl_start();
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  unsigned acc = 0;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += stride * kInFlight) {
    uint4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {  // every load before any use
      const long long j = i + u * stride;
      v[u] = j < n ? __ldg(p + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) acc ^= fold(v[u]);
  }
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, s);
  if ((threadIdx.x & 31) == 0 && acc != 0) atomicXor(out, acc);
}

extern "C" __global__ void stream_read_chained(const uint4* p, long long n, const uint4* q,
                                               long long m, unsigned* out) {
  rg::pdl_trigger();
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long total = n + m;
  unsigned acc = 0;
  bool waited = false;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
       i += stride * kInFlight) {
    uint4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {  // every load before any use
      const long long j = i + u * stride;
      const uint4* at = j < n ? p + j : q + (j - n);  // a select, not a branch a load
      v[u] = j < total ? __ldg(at) : make_uint4(0, 0, 0, 0);
    }
    if (!waited) {  // the first loads are on their way: now the kernel ahead must be done
      rg::pdl_wait();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) acc ^= fold(v[u]);
  }
  if (!waited) rg::pdl_wait();
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, s);
  if ((threadIdx.x & 31) == 0 && acc != 0) atomicXor(out, acc);
}
