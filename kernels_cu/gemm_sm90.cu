// gemm_sm90.cu: y = x W^T (+ residual) for prefill-sized M on Hopper's warpgroup tensor cores
// (wgmma) fed by the tensor memory accelerator (TMA); compiled for sm_90a, the
// architecture-specific target that has both.
//
//   extern "C" gemm90_{f16,bf16}_{64x128,128x128,128x192,128x256}(
//   extern "C" gemm90_{f16,bf16}_{128x96,128x128,128x192,128x256}_c2 .. _c8(
//       const __grid_constant__ TensorMap xmap,  // x (rows >= m, k) row-major, box (BM, 64)
//       const __grid_constant__ TensorMap wmap,  // w (n, k), the checkpoint's [out, in]
//                                                // layout, box (BN, 64); both 128-byte swizzle
//       const __grid_constant__ TensorMap ymap,  // y (rows of x, n), box (64, 64), the same
//                                                // swizzle; zeros where tma_stores is false
//       const T* residual,   // (m, n) or NULL; may be y itself (in-place residual add)
//       T* y,                // (m, n)
//       int m, int n, int k) // k % 8 == 0, n % 2 == 0
//   y[i][r] = T(sum_j x[i][j] * w[r][j] (+ residual[i][r])), fp32 accumulation.
//
//   A block computes a BM x BN = (64 WG) x BN tile of y: WG consumer warpgroups (128
//   threads each; warpgroup g owns rows 64 g .. 64 g + 63 and issues one wgmma.m64nBNk16 a
//   16 of k, both operands read by the tensor cores straight from shared memory through
//   matrix descriptors), then one producer warp. The producer's lane 0 issues each k
//   tile's two TMA boxes (x rows, W rows; 64 elements = 128 bytes wide, in the 128-byte
//   swizzle the descriptors name: 16-byte chunk c of row r at chunk c ^ (r % 8)) into a ring
//   of S slots (4 on 128 x 128-256, 6 on 128 x 96, 8 on 64 x 128: one block an SM each);
//   each slot has a `full` barrier (the boxes' bytes landed) and an `empty` one (every
//   consumer warp has finished reading it). Consumers never load and never meet at a block
//   barrier: wait for a slot, issue its wgmma, and free the previous tile's slot once
//   its products are done (wait_group 1 keeps one tile's wgmma in flight). Boxes past m, n or
//   k are zero-filled by the TMA. A warpgroup's finished rows go out by TMA: staged a 64 x 64
//   box at a time in the boxes' swizzle, two boxes in turn, one thread issuing their stores,
//   which drain while the warpgroup stages the next box and goes on to its next tile (the
//   stores made directly from registers were 11-35% of the kernel's time: benchmarks/NOTES.md,
//   "Prefill"); rows past m (a warpgroup's rows that reach past it) are stored directly.
//   Split k (_cCS): when the tiles are too few to fill the GPU (decode's 65-128 rows, short
//   prefill chunks), a cluster of CS blocks shares a tile, block r taking the r-th of CS
//   contiguous runs of k tiles; each leaves its fp32 sums in its (now idle) ring and, after
//   a cluster barrier, finishes its BM / CS rows of the tile by adding every block's sums through
//   distributed shared memory in block order: the bits do not depend on which block ends
//   first, and no workspace, counter or second kernel is needed. Those remote reads are
//   the split's cost (about 28 GB/s an SM on the H200: 4 us of a 128 x 256 tile in 8), so
//   the narrower tiles (128 x 192, 128 x 128, and 128 x 96, split only), fewer sums, split
//   too.
//   grid (cdiv(m, BM) * cdiv(n, BN) * CS) split; unsplit any number of blocks up to the
//   tiles' (ops.matmul: at most one wave), block b taking tiles b, b + gridDim.x, ... with
//   its ring running on from tile to tile (the producer loads the next tile's k tiles while
//   the consumers store this one's outputs); block (128 WG + 32), dynamic shared memory
//   S * (BM + BN) * 128 (+ 16 KiB a warpgroup unsplit: its staging) + 16 S B. Tiles are
//   numbered in groups of kGroup row tiles, column by column: a wave's blocks share a few row
//   tiles of x and column tiles of W, so W comes from DRAM about cdiv(m, BM) / kGroup times,
//   not cdiv(m, BM) times.
//   extern "C" gemm90_{f16,bf16}_{64x128,128x128,128x192,128x256}_silu(the same arguments;
//       residual NULL, y and ymap (m, n / 2)): the MLP's gate_up projection finished in the
//       epilogue, y = T(T(silu(T(gate))) * T(up)) on the interleaved layout silu_mul.cu reads
//       (8 gate columns, then their 8 up columns): silu_mul.cu's bits without the (m, n)
//       projection written and read back. Unsplit tiles only.
//   Patchable: m with the grid (m <= rows of x); the descriptors fix x's, w's and y's
//   addresses, n and k.
#include <cluster.cuh>
#include <tma.cuh>
#include <wgmma.cuh>

namespace {

// k per tile: a TMA box row of 64 elements = 128 bytes, the 128-byte swizzle's width (the
// ring's slots, S, are each tile's: rawgraph.ops.matmul.GEMM90_STAGES)
constexpr int kBK = 64;

constexpr int kGroup = 8;  // row tiles a group of blocks shares (the grid's order)

// y[row0 + r][col0 + c] for the tile's rows [BM rank / CS, BM (rank + 1) / CS): the sum of
// every cluster block's part[r * kPitch + c] in block order (+ residual). Four columns a
// thread, two rounds' remote loads issued before any is added (each costs a round trip).
template <typename T, int BM, int BN, int CS, int kPitch, int kThreads>
__device__ __forceinline__ void store_split(const float* part, int rank, const T* residual, T* y,
                                            int m, int n, int row0, int col0) {
  constexpr int kQuads = BN / 4, kUnroll = 2;
  const int first = BM * rank / CS, share = (BM * (rank + 1) / CS - first) * kQuads;
  for (int i0 = threadIdx.x; i0 < share; i0 += kUnroll * kThreads) {
    float4 v[kUnroll][CS];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = min(i0 + u * kThreads, share - 1);  // past the share: loaded, not stored
      const float* at = part + (first + i / kQuads) * kPitch + i % kQuads * 4;
#pragma unroll
      for (int p = 0; p < CS; ++p)
        v[u][p] = p == rank ? *reinterpret_cast<const float4*>(at) : rg::load_remote4(at, p);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * kThreads;
      float4 sum = v[u][0];
#pragma unroll
      for (int p = 1; p < CS; ++p) {
        sum.x += v[u][p].x;
        sum.y += v[u][p].y;
        sum.z += v[u][p].z;
        sum.w += v[u][p].w;
      }
      const int r = row0 + first + i / kQuads, c = col0 + i % kQuads * 4;
      if (i >= share || r >= m) continue;
      const long long at = static_cast<long long>(r) * n + c;
      if (c < n) rg::store_pair(y, residual, at, sum.x, sum.y);  // n is even: pairs whole
      if (c + 2 < n) rg::store_pair(y, residual, at + 2, sum.z, sum.w);
    }
  }
}

// Where tile `tile` of an (m, n) output lies: groups of kGroup row tiles, column-major inside
// a group (a wave's blocks share a few row tiles of x and column tiles of W).
template <int BM, int BN>
__device__ __forceinline__ void place(int tile, int m, int n, int& row0, int& col0) {
  const int rows = (m + BM - 1) / BM, cols = (n + BN - 1) / BN;
  const int group = tile / (kGroup * cols), first = group * kGroup;
  const int height = min(rows - first, kGroup), in_group = tile % (kGroup * cols);
  row0 = (first + in_group % height) * BM;
  col0 = in_group / height * BN;
}

// A consumer thread's share of a finished unsplit tile into y: pairs of outputs (+ residual),
// or with SILU the activation of gate_up's interleaved columns (8-column group j, even, holds
// 8 gates and j + 1 their ups, in the same thread's registers; output column c / 16 * 8 +
// c % 16 of (m, n / 2)). From the tile's column group J0 on.
template <typename T, int BN, bool SILU, int J0 = 0>
__device__ __forceinline__ void store_tile(const float (&acc)[BN / 2], const T* residual, T* y,
                                           int m, int n, int row0, int col0) {
  const int lane = threadIdx.x & 31, wq = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int j = J0; j < BN / 8; j += SILU ? 2 : 1)  // the tile's groups of 8 columns
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      // warp wq of warpgroup wq / 4: rows 16 wq + g (+ 8)
      const int r = row0 + wq * 16 + g + 8 * hi, c = col0 + j * 8 + 2 * tq;
      const float* v = acc + 4 * j + 2 * hi;
      if (r >= m || c >= n) continue;
      if constexpr (SILU) {
        rg::store_pair(y, static_cast<const T*>(nullptr),
                       static_cast<long long>(r) * (n / 2) + c / 16 * 8 + c % 16,
                       rg::silu_mul<T>(rg::round_to<T>(v[0]), rg::round_to<T>(v[4])),
                       rg::silu_mul<T>(rg::round_to<T>(v[1]), rg::round_to<T>(v[5])));
      } else {
        rg::store_pair(y, residual, static_cast<long long>(r) * n + c, v[0], v[1]);
      }
    }
}

// An unsplit warpgroup's staging for its stores by TMA: two 64 x 64 boxes, filled in turn
// (ops.matmul: GEMM_STAGING)
constexpr int kBox = 64 * 64 * 2, kStaging = 2 * kBox;

// Whether y's rows (`cols` of them a row) go out by TMA: whole 16-byte units, as a descriptor
// needs (ops.matmul.tma_stores, which passes a zeroed ymap where not)
template <typename T>
__device__ __forceinline__ bool tma_stores(const T* y, int cols) {
  return cols % 8 == 0 && (reinterpret_cast<unsigned long long>(y) & 15) == 0;
}

// a barrier among warpgroup wg's 128 threads (wg < 2)
__device__ __forceinline__ void warpgroup_sync(int wg) {
  if (wg == 0)
    rg::named_sync<1>(128);
  else
    rg::named_sync<2>(128);
}

// Warpgroup wg's 64 rows of a finished unsplit tile (all below m) into y by TMA: store_tile's
// values, a 64 x 64 box of outputs at a time (BN / 64 boxes; with SILU BN / 128, each 128
// columns' gates and ups making 64 outputs; the columns past the last whole box, a 192-wide
// SiLU tile's last 64 (or a tile's last 32 where BN % 64 = 32), are the caller's to store
// directly, as half a box would overwrite the next tile's) staged in the box's 128-byte
// swizzle (16-byte chunk c of row r at c ^ (r % 8): a warp's 8 rows x 4 pairs fall in 32
// banks), then issued by the warpgroup's first thread. The staging's two boxes take turns: a
// box waits only until the TMA has read the one before last (a tile's first, where its boxes
// are odd in number, until it has read all: the tile before ended in the same buffer), so
// the stores drain beside the next box's staging and the next tile's products. The residual
// (in place or not: nothing else writes these rows) is requested for a whole box before any
// of it is used; prefetch_residual has asked the L2 for it as the tile began.
template <typename T, int BN, bool SILU>
__device__ __forceinline__ void store_tile_tma(const float (&acc)[BN / 2], const T* residual,
                                               char* staging, const TensorMap* ymap, int n,
                                               int row0, int col0) {
  const int t = threadIdx.x & 127, wg = threadIdx.x >> 7, g = (t & 31) >> 2, tq = t & 3;
  const int row = row0 + 64 * wg, ocol = SILU ? col0 / 2 : col0, ocols = SILU ? n / 2 : n;
  constexpr int kBoxes = SILU ? BN / 128 : BN / 64;
#pragma unroll
  for (int b = 0; b < kBoxes; ++b) {
    unsigned res[8][2] = {};  // the box's residual pairs
    if (!SILU && residual != nullptr) {
#pragma unroll
      for (int cc = 0; cc < 8; ++cc)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          const int r = row + (t >> 5) * 16 + g + 8 * hi, c = col0 + 64 * b + 8 * cc + 2 * tq;
          if (c < n)
            res[cc][hi] = *reinterpret_cast<const unsigned*>(
                residual + static_cast<long long>(r) * n + c);
        }
    }
    char* box = staging + (b & 1) * kBox;
    if (t == 0) {  // this box's buffer, last filled by the box before last, has been read
      if (kBoxes % 2 == 1 && b == 0)
        rg::bulk_wait_read<0>();
      else
        rg::bulk_wait_read<1>();
    }
    warpgroup_sync(wg);
#pragma unroll
    for (int cc = 0; cc < 8; ++cc)  // the box's 16-byte chunks: 8 output columns each
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        unsigned out;
        if constexpr (SILU) {  // gates at panel b's columns 16 cc.., their ups 8 further
          const float* v = acc + 64 * b + 8 * cc + 2 * hi;
          out = rg::pack2<T>(rg::silu_mul<T>(rg::round_to<T>(v[0]), rg::round_to<T>(v[4])),
                             rg::silu_mul<T>(rg::round_to<T>(v[1]), rg::round_to<T>(v[5])));
        } else {  // columns 64 b + 8 cc.. of the tile
          const float* v = acc + 32 * b + 4 * cc + 2 * hi;
          float lo = v[0], up = v[1];
          if (residual != nullptr) {  // as store_pair (no + 0: it would make -0 + 0)
            const float2 rv = rg::unpack2<T>(res[cc][hi]);
            lo += rv.x;
            up += rv.y;
          }
          out = rg::pack2<T>(lo, up);
        }
        const int r = (t >> 5) * 16 + g + 8 * hi;
        *reinterpret_cast<unsigned*>(box + r * 128 + ((cc ^ g) << 4) + tq * 4) = out;
      }
    rg::fence_proxy_async();  // the staging's generic writes, seen by the TMA (async proxy)
    warpgroup_sync(wg);
    if (t == 0) {
      if (ocol + 64 * b < ocols) rg::tma_store_2d(ymap, box, ocol + 64 * b, row);
      rg::bulk_commit();  // (empty past y's columns: the groups stay one a box)
    }
  }
}

// Warpgroup wg's 64 rows x BN columns of the residual from row0, col0 (an (m, n) array) asked
// into the L2, a 128-byte line a request: made as the tile's products start, so that its
// epilogue's loads (store_tile_tma) find them there rather than in DRAM (the epilogue's
// latency is the warpgroup's: its next tile's products wait for it)
template <typename T, int BN>
__device__ __forceinline__ void prefetch_residual(const T* residual, int n, int row0, int col0) {
  constexpr int kLines = (BN * 2 + 127) / 128;  // a row's lines
  const int t = threadIdx.x & 127, row = row0 + 64 * (threadIdx.x >> 7);
  for (int i = t; i < 64 * kLines; i += 128) {
    const int c = col0 + i % kLines * 64;
    if (c < n)
      asm volatile("prefetch.global.L2 [%0];"
                   ::"l"(residual + static_cast<long long>(row + i / kLines) * n + c));
  }
}

template <typename T, int WG, int BN, int S, int CS, bool SILU = false>
__device__ void gemm90_impl(const TensorMap* xmap, const TensorMap* wmap, const TensorMap* ymap,
                            const T* residual, T* y, int m, int n, int k) {
  constexpr int BM = 64 * WG, kA = BM * kBK * 2, kStage = (BM + BN) * kBK * 2;
  static_assert(BN % 32 == 0 && BN <= 256, "one wgmma; 64 x 64 output boxes, and 32 columns");
  constexpr int kThreads = 128 * WG + 32;
  // split k: a row of fp32 sums every kPitch floats (8 past BN: the float2 writes of a
  // half-warp, 4 rows x 4 column pairs, fall in 32 different banks), in the ring
  constexpr int kPitch = BN + 8;
  static_assert(CS == 1 || BM * kPitch * 4 <= S * kStage, "the sums must fit in the ring");
  static_assert(CS <= 8, "clusters of more than 8 blocks are not portable");
  static_assert(!SILU || CS == 1, "the SiLU epilogue is the unsplit tiles'");
  constexpr int kStaged = CS == 1 ? WG * kStaging : 0;  // the warpgroups' staging, unsplit
  // the tile's columns that store_tile_tma stores, in whole 64 x 64 boxes of outputs (with
  // SILU 128 columns a box); half a box would overwrite the next tile's
  constexpr int kBoxed = SILU ? BN / 128 * 128 : BN / 64 * 64;
  // S slots, the staging, then S full and S empty barriers
  extern __shared__ __align__(1024) char ring[];
  unsigned long long* full = reinterpret_cast<unsigned long long*>(ring + S * kStage + kStaged);
  unsigned long long* empty = full + S;
  // Unsplit, a block takes tiles blockIdx.x, + gridDim.x, ... (a grid of at most one wave:
  // the ring runs on across tiles, so the next tile's loads overlap this one's stores); a
  // split block takes the rank-th of CS contiguous runs of tile blockIdx.x / CS's k tiles.
  const int ntiles = (m + BM - 1) / BM * ((n + BN - 1) / BN);
  const int first = CS == 1 ? blockIdx.x : blockIdx.x / CS, step = CS == 1 ? gridDim.x : ntiles;
  const int wg = threadIdx.x >> 7;
  const int rank = CS > 1 ? static_cast<int>(rg::cluster_rank()) : 0;
  const int ktiles = (k + kBK - 1) / kBK, t0 = ktiles * rank / CS;
  const int tiles = ktiles * (rank + 1) / CS - t0;  // k tiles of this block's share
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      rg::mbar_init(&full[s], 1);
      rg::mbar_init(&empty[s], 4 * WG);  // one arrival per consumer warp
    }
    rg::mbar_fence_init();
  } else if (threadIdx.x == 128 * WG) {
    rg::tma_prefetch(xmap);
    rg::tma_prefetch(wmap);
  } else if (CS == 1 && threadIdx.x == 32 && tma_stores(y, SILU ? n / 2 : n)) {
    rg::tma_prefetch(ymap);
  }
  __syncthreads();
  rg::pdl_start();

  float acc[BN / 2];  // wgmma.m64nBN's layout: columns 8 j.. at acc[4 j ..]
  int row0 = 0, col0 = 0;
  if (wg == WG) {  // the producer warp; one lane issues
    if ((threadIdx.x & 31) == 0) {
      int it = 0;  // k tiles issued, over all of this block's tiles: the ring's position
      for (int tile = first; tile < ntiles; tile += step) {
        place<BM, BN>(tile, m, n, row0, col0);
        for (int t = 0; t < tiles; ++t, ++it) {
          const int s = it % S;
          if (it >= S) rg::mbar_wait(&empty[s], (it / S - 1) & 1);
          rg::mbar_expect_tx(&full[s], kStage);
          rg::tma_load_2d(ring + s * kStage, xmap, (t0 + t) * kBK, row0, &full[s]);
          rg::tma_load_2d(ring + s * kStage + kA, wmap, (t0 + t) * kBK, col0, &full[s]);
        }
      }
    }
    if constexpr (CS == 1) return;
    __syncwarp();  // the warp's lanes together again (block and cluster barriers below)
    place<BM, BN>(first, m, n, row0, col0);
  } else {
    const bool signals = (threadIdx.x & 31) == 0;
    const bool by_tma = tma_stores(y, SILU ? n / 2 : n);
    int it = 0;  // k tiles consumed, as the producer counts them
    for (int tile = first; tile < ntiles; tile += step) {
      place<BM, BN>(tile, m, n, row0, col0);
      const bool tma_rows = by_tma && row0 + 64 * (wg + 1) <= m;  // warpgroup-uniform
      if (CS == 1 && tma_rows && residual != nullptr)
        prefetch_residual<T, BN>(residual, n, row0, col0);
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
      for (int t = 0; t < tiles; ++t, ++it) {
        const int s = it % S;
        rg::mbar_wait(&full[s], (it / S) & 1);
        const char* a = ring + s * kStage + wg * 64 * kBK * 2;
        const char* b = ring + s * kStage + kA;
        rg::wgmma_fence();
        // one m64nBNk16 a 16 of k: the W tile's BN rows are one K-major operand (8-row
        // atoms 1024 bytes apart), and A is read from shared memory once for all its columns
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk)
          rg::Wgmma<T, BN>::run(acc, rg::desc128(a + kk * 32), rg::desc128(b + kk * 32));
        rg::wgmma_commit();
        rg::wgmma_wait<1>();  // k tile it - 1's products are done: its slot may be refilled
        if (t > 0 && signals) rg::mbar_arrive(&empty[(it - 1) % S]);
      }
      rg::wgmma_wait<0>();
      if constexpr (CS == 1) {
        if (tiles > 0 && signals) rg::mbar_arrive(&empty[(it - 1) % S]);  // the tile's last
        if (tma_rows) {
          store_tile_tma<T, BN, SILU>(acc, residual, ring + S * kStage + wg * kStaging, ymap, n,
                                      row0, col0);
          if constexpr (kBoxed < BN)  // the columns past the last whole box: directly
            store_tile<T, BN, SILU, kBoxed / 8>(acc, residual, y, m, n, row0, col0);
        } else
          store_tile<T, BN, SILU>(acc, residual, y, m, n, row0, col0);
      }
    }
    if (CS == 1 && (threadIdx.x & 127) == 0) rg::bulk_wait<0>();  // its stores done, then exit
  }

  if constexpr (CS > 1) {
    const int lane = threadIdx.x & 31, q = (threadIdx.x >> 5) & 3, g = lane >> 2, tq = lane & 3;
    float* part = reinterpret_cast<float*>(ring);
    __syncthreads();  // every wgmma has read its last slot: the ring is free
    if (wg < WG) {
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          const int r = wg * 64 + q * 16 + g + 8 * hi, c = j * 8 + 2 * tq;
          *reinterpret_cast<float2*>(part + r * kPitch + c) =
              make_float2(acc[4 * j + 2 * hi], acc[4 * j + 2 * hi + 1]);
        }
    }
    rg::cluster_sync();  // every block's sums are visible to the cluster
    store_split<T, BM, BN, CS, kPitch, kThreads>(part, rank, residual, y, m, n, row0, col0);
    rg::cluster_sync();  // part[] stays alive until every block has read it
  }
}

}  // namespace

// ---- generated by rawgraph/ops/generate.py (python -m rawgraph.ops.generate); do not edit
extern "C" __global__ void __launch_bounds__(288, 1)
gemm90_f16_128x256(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 256, 4, 1>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(288, 1)
gemm90_f16_128x192(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 192, 4, 1>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(288, 1)
gemm90_f16_128x128(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 128, 4, 1>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(160, 1)
gemm90_f16_64x128(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 1, 128, 8, 1>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x256_c2(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 256, 4, 2>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(3, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x256_c3(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 256, 4, 3>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x256_c4(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 256, 4, 4>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(5, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x256_c5(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 256, 4, 5>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(6, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x256_c6(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 256, 4, 6>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(7, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x256_c7(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 256, 4, 7>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x256_c8(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 256, 4, 8>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x192_c2(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 192, 4, 2>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(3, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x192_c3(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 192, 4, 3>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x192_c4(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 192, 4, 4>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(5, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x192_c5(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 192, 4, 5>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(6, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x192_c6(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 192, 4, 6>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(7, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x192_c7(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 192, 4, 7>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x192_c8(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 192, 4, 8>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x128_c2(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 128, 4, 2>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(3, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x128_c3(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 128, 4, 3>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x128_c4(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 128, 4, 4>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(5, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x128_c5(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 128, 4, 5>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(6, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x128_c6(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 128, 4, 6>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(7, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x128_c7(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 128, 4, 7>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x128_c8(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 128, 4, 8>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x96_c2(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 96, 6, 2>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(3, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x96_c3(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 96, 6, 3>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x96_c4(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 96, 6, 4>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(5, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x96_c5(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 96, 6, 5>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(6, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x96_c6(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 96, 6, 6>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(7, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x96_c7(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 96, 6, 7>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(288, 1)
gemm90_f16_128x96_c8(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 96, 6, 8>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(288, 1)
gemm90_bf16_128x256(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 256, 4, 1>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(288, 1)
gemm90_bf16_128x192(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 192, 4, 1>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(288, 1)
gemm90_bf16_128x128(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 128, 4, 1>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(160, 1)
gemm90_bf16_64x128(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 1, 128, 8, 1>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x256_c2(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 256, 4, 2>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(3, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x256_c3(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 256, 4, 3>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x256_c4(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 256, 4, 4>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(5, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x256_c5(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 256, 4, 5>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(6, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x256_c6(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 256, 4, 6>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(7, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x256_c7(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 256, 4, 7>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x256_c8(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 256, 4, 8>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x192_c2(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 192, 4, 2>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(3, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x192_c3(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 192, 4, 3>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x192_c4(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 192, 4, 4>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(5, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x192_c5(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 192, 4, 5>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(6, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x192_c6(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 192, 4, 6>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(7, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x192_c7(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 192, 4, 7>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x192_c8(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 192, 4, 8>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x128_c2(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 128, 4, 2>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(3, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x128_c3(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 128, 4, 3>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x128_c4(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 128, 4, 4>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(5, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x128_c5(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 128, 4, 5>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(6, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x128_c6(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 128, 4, 6>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(7, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x128_c7(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 128, 4, 7>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x128_c8(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 128, 4, 8>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x96_c2(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 96, 6, 2>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(3, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x96_c3(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 96, 6, 3>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x96_c4(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 96, 6, 4>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(5, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x96_c5(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 96, 6, 5>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(6, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x96_c6(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 96, 6, 6>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(7, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x96_c7(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 96, 6, 7>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(288, 1)
gemm90_bf16_128x96_c8(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 96, 6, 8>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(288, 1)
gemm90_f16_128x256_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 256, 4, 1, true>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(288, 1)
gemm90_f16_128x192_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 192, 4, 1, true>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(288, 1)
gemm90_f16_128x128_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 2, 128, 4, 1, true>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(160, 1)
gemm90_f16_64x128_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __half* residual, __half* y, int m, int n,
    int k) {
  gemm90_impl<__half, 1, 128, 8, 1, true>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(288, 1)
gemm90_bf16_128x256_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 256, 4, 1, true>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(288, 1)
gemm90_bf16_128x192_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 192, 4, 1, true>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(288, 1)
gemm90_bf16_128x128_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 2, 128, 4, 1, true>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(160, 1)
gemm90_bf16_64x128_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __grid_constant__ TensorMap ymap, const __nv_bfloat16* residual, __nv_bfloat16* y, int m,
    int n, int k) {
  gemm90_impl<__nv_bfloat16, 1, 128, 8, 1, true>(&xmap, &wmap, &ymap, residual, y, m, n, k);
}
