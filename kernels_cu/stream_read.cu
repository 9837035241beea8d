// stream_read.cu: the read-only bandwidth ceiling. A kernel that only reads (the decode GEMV
// streams its weight once; decode attention its K/V) cannot beat a plain streaming read of
// the same bytes, which starts and drains the same way. `bench kernels` times this one next
// to each row with a target, since short transfers reach neither the 1 GiB copy's rate nor
// each other's (H200, graph replays: 32 MiB read ~84% of the 1 GiB copy, 48 MiB ~91%).
//
//   extern "C" stream_read(const uint4* p, long long n, unsigned* out)
//   *out ^= the XOR of every 32-bit word of p[0, n) (16-byte words): a result that depends
//   on every byte read, the same in any order, so the reads cannot be optimized away.
//   grid: any (the bench launches 4 blocks of 256 per SM), block: a multiple of 32.
//   The buffer is cut into tiles of 4 KB (32 lanes x 8 loads of 16 bytes); the warps of the
//   grid take tiles in turn, each tile's 8 loads in flight before any is used. A tile's loads
//   sit at fixed offsets from one address (immediates): no 64-bit index or bounds check per
//   load, which would cost ~10 instructions each and leave the read slower than the decode
//   attention it is to bound.
//
//   extern "C" stream_read_chained(const uint4* p, long long n, const uint4* q,
//                                  long long m, unsigned* out)
//   The same over p[0, n) then q[0, m), as a link of the decode step's ceiling (`bench
//   decode`'s read chain: a chain of these moving each projection's weight and each
//   layer's K and V). Launched programmatically it lets the next kernel launch at once and
//   requests its first tile before waiting for the kernel ahead, as the decode GEMV requests
//   its first weights: none of what it reads depends on that kernel.
#include <common.cuh>

namespace {

constexpr int kInFlight = 8;
constexpr int kTile = 32 * kInFlight;  // 16-byte words a warp reads per turn: 4 KB

__device__ __forceinline__ unsigned fold(const uint4& v) { return v.x ^ v.y ^ v.z ^ v.w; }

// The XOR of this lane's share of p[0, n). `waiting`: wait for the kernel ahead (PDL) once this
// warp's first tile is requested; cleared then (a warp without a tile waits in its caller).
// The wait stays inside the loop, under the flag: with the first turn peeled off (the flag
// known there) ptxas hoisted it above that turn's loads (seen in the SASS), which it may,
// since waiting earlier is always correct; in the loop the SASS keeps the loads first.
__device__ __forceinline__ unsigned read_tiles(const uint4* p, long long n, bool& waiting) {
  const int lane = threadIdx.x & 31;
  const long long warps = static_cast<long long>(gridDim.x) * (blockDim.x >> 5);
  const long long full = n / kTile;
  long long t = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  unsigned acc = 0;
#pragma unroll 1
  for (; t < full; t += warps) {
    const uint4* a = p + t * kTile + lane;
    uint4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) v[u] = __ldg(a + u * 32);  // every load before any use
    if (waiting) {
      rg::pdl_wait();
      waiting = false;
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) acc ^= fold(v[u]);
  }
  if (t == full) {  // the one warp whose turn comes at the partial tile, if there is one
    for (long long j = full * kTile + lane; j < n; j += 32) acc ^= fold(__ldg(p + j));
  }
  return acc;
}

__device__ __forceinline__ void xor_out(unsigned acc, unsigned* out) {
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, s);
  if ((threadIdx.x & 31) == 0 && acc != 0) atomicXor(out, acc);
}

}  // namespace

extern "C" __global__ void stream_read(const uint4* p, long long n, unsigned* out) {
  rg::pdl_start();
  bool waiting = false;
  xor_out(read_tiles(p, n, waiting), out);
}

extern "C" __global__ void stream_read_chained(const uint4* p, long long n, const uint4* q,
                                               long long m, unsigned* out) {
  rg::pdl_trigger();
  bool waiting = true;
  unsigned acc = read_tiles(p, n, waiting);
  acc ^= read_tiles(q, m, waiting);
  if (waiting) rg::pdl_wait();
  xor_out(acc, out);
}
