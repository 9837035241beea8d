// prefill_attention.cuh: the body of causal prefill attention over the paged KV cache, shared
// by prefill_attention.cu (mma.sync, any GPU) and prefill_attention_sm90.cu (Hopper's
// warpgroup MMA, sm_90a): the same tiles, loads, masks, online softmax and stores; only the
// two products differ (template flag WG). The kernels' contract is prefill_attention.cu's.
#pragma once
#include "mma.cuh"
#include "wgmma.cuh"

namespace {

constexpr int kBC = 64;
constexpr float kLog2e = 1.4426950408889634f;

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of ROWS rows of D elements,
// chunk index XOR row % 8. For wgmma (WG) a D = 128 tile is two panels of ROWS 128-byte rows
// (columns 0-63, then 64-127): the 128-byte swizzle's layout, which the matrix descriptors
// name; mma.sync's tiles keep whole 2 D-byte rows.
template <int D, bool WG, int ROWS> __device__ __forceinline__ int swz(int row, int chunk) {
  if constexpr (WG && D == 128)
    return (chunk >> 3) * ROWS * 128 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
  return row * (D * 2) + ((chunk ^ (row & 7)) << 4);
}

template <typename T, int D, bool WG, int kThreads>
__device__ __forceinline__ void load_kv(char* ks, char* vs, const T* k_cache, const T* v_cache,
                                        const int* table, int key0, int kend, int block_size,
                                        int max_blocks, int row_stride, int col) {
  constexpr int RC = D / 8;
#pragma unroll
  for (int i = threadIdx.x; i < kBC * RC; i += kThreads) {
    const int r = i / RC, c = i % RC, key = key0 + r;
    const int tb = key / block_size;  // beyond the table: unmapped, never read
    const int blk = key < kend && tb < max_blocks ? table[tb] : -1;
    const bool ok = blk >= 0;
    const long long at = ok ? (static_cast<long long>(blk) * block_size + key % block_size) *
                                  row_stride + col + c * 8 : 0;
    rg::cp_async16(ks + swz<D, WG, kBC>(r, c), k_cache + at, ok);
    rg::cp_async16(vs + swz<D, WG, kBC>(r, c), v_cache + at, ok);
  }
}

// S (16 rows x 64 keys a warp, in mma.sync's accumulator layout, zeroed) = Q K^T for
// warpgroup wg's 64 query rows: D / 16 wgmma.m64n64k16 with Q and K both K-major (D
// contiguous) in shared memory; k step kk is 32 bytes into panel kk / 4's rows.
template <typename T, int D, int BR>
__device__ __forceinline__ void scores_wgmma(float (&s)[kBC / 8][4], const char* qs,
                                             const char* ks, int wg) {
  float(&acc)[kBC / 2] = reinterpret_cast<float(&)[kBC / 2]>(s);
  rg::fence_regs(acc);
  rg::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    rg::Wgmma<T, kBC>::run(
        acc, rg::desc128(qs + (kk >> 2) * BR * 128 + wg * 64 * 128 + (kk & 3) * 32),
        rg::desc128(ks + (kk >> 2) * kBC * 128 + (kk & 3) * 32));
  rg::wgmma_commit();
  rg::wgmma_wait<0>();
  rg::fence_regs(acc);
}

// O (16 rows x D a warp) += P V over a tile's 64 keys: wgmma.m64nDk16 with P from registers
// (S packed to T: mma.sync's A fragment is wgmma's) and V MN-major (D contiguous) in shared
// memory, 16 keys = 2048 bytes a step, its 64-column panels kBC * 128 bytes apart. Every A
// fragment is packed before the fence: no register is written while an MMA may read it.
template <typename T, int D>
__device__ __forceinline__ void pv_wgmma(float (&o)[D / 8][4], const float (&s)[kBC / 8][4],
                                         const char* vs) {
  float(&acc)[D / 2] = reinterpret_cast<float(&)[D / 2]>(o);
  unsigned a[kBC / 16][4];
#pragma unroll
  for (int kk = 0; kk < kBC / 16; ++kk) {
    a[kk][0] = rg::pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    a[kk][1] = rg::pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    a[kk][2] = rg::pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[kk][3] = rg::pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
  rg::fence_regs(acc);
  rg::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBC / 16; ++kk)
    rg::WgmmaRS<T, D>::run(acc, a[kk], rg::desc128_mn(vs + kk * 16 * 128, kBC * 128));
  rg::wgmma_commit();
  rg::wgmma_wait<0>();
  rg::fence_regs(acc);
}

// BR query rows per block, 16 per warp. SPLIT: the block takes split blockIdx.y % splits of
// its query tile's key tiles and leaves (unnormalised output, max, sum) in `partial` for
// combine(); else it writes out. WG: Hopper's warpgroup MMA (sm_90a) with both operands of
// S = Q K^T and V read from shared memory through descriptors, P from registers; the
// accumulators' layout is mma.sync's (warp w: rows 16 w .. 16 w + 15), so everything else is
// shared.
template <typename T, int D, int BR, bool SPLIT, bool WG>
__device__ void prefill_impl(const T* q, const T* k_cache,
                             const T* v_cache, const int* block_tables,
                             const int* seq_lens, const int* cu_seqlens,
                             const int* seq_slots, T* out, int num_seqs,
                             int q_heads, int kv_heads, int block_size, int max_blocks,
                             float scale, int q_stride, float* partial, int splits) {
  rg::pdl_start();
  constexpr int RC = D / 8, kTile = kBC * D * 2, kThreads = BR * 2;
  extern __shared__ __align__(1024) char smem[];  // wgmma's swizzle: 1024-byte atoms
  char* qs = smem;
  char* kvs = smem + BR * D * 2;  // [buffer][K, V] tiles
  const int seq = blockIdx.z, head = SPLIT ? blockIdx.y / splits : blockIdx.y;
  if (seq >= num_seqs) return;
  const int q_begin = cu_seqlens[seq], q_len = cu_seqlens[seq + 1] - q_begin;
  const int r0 = (gridDim.x - 1 - blockIdx.x) * BR;
  const int slot = seq_slots[seq];
  if (r0 >= q_len || slot < 0) return;
  const int past = seq_lens[slot] - q_len;  // keys before this chunk
  const int kend = past + min(r0 + BR, q_len);
  const int tiles = (kend + kBC - 1) / kBC;
  int t0 = 0, t1 = tiles;  // this block's key tiles
  if constexpr (SPLIT) {
    const int per = (tiles + splits - 1) / splits;
    t0 = min(static_cast<int>(blockIdx.y % splits) * per, tiles);
    t1 = min(t0 + per, tiles);
  }
  const int* table = block_tables + static_cast<long long>(slot) * max_blocks;
  const int row_stride = kv_heads * D, col = head / (q_heads / kv_heads) * D;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const long long o_stride = static_cast<long long>(q_heads) * D;

  for (int i = tid; i < BR * RC; i += kThreads) {
    const int r = i / RC, c = i % RC;
    const bool ok = r0 + r < q_len;
    const T* src = ok ? q + static_cast<long long>(q_begin + r0 + r) * q_stride + head * D + c * 8
                      : q;
    rg::cp_async16(qs + swz<D, WG, BR>(r, c), src, ok);
  }
  if (!SPLIT || t0 < t1) {  // unsplit, tile 0 always has keys
    char* first = kvs + (t0 & 1) * 2 * kTile;
    load_kv<T, D, WG, kThreads>(first, first + kTile, k_cache, v_cache, table, t0 * kBC, kend,
                            block_size, max_blocks, row_stride, col);
  }
  rg::cp_async_commit();

  unsigned qf[D / 16][4];
  float o[D / 8][4] = {};
  float m[2] = {rg::neg_inf(), rg::neg_inf()}, l[2] = {0.f, 0.f};
  const float scale2 = scale * kLog2e;
  const int g = lane >> 2, c2 = (lane & 3) * 2;
  const int qpos0 = past + r0 + warp * 16 + g;  // position of this thread's first row

  for (int t = t0; t < t1; ++t) {
    if (t + 1 < t1) {
      char* nb = kvs + ((t + 1) & 1) * 2 * kTile;
      load_kv<T, D, WG, kThreads>(nb, nb + kTile, k_cache, v_cache, table, (t + 1) * kBC, kend, block_size,
                    max_blocks, row_stride, col);
    }
    rg::cp_async_commit();
    rg::cp_async_wait<1>();
    if constexpr (WG) rg::fence_proxy_async();  // cp.async's writes, seen by the wgmma
    __syncthreads();
    if (!WG && t == t0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        rg::ldmatrix_x4(qf[kk], qs + swz<D, WG, BR>(warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                            kk * 2 + (lane >> 4)));
    }
    const char* ks = kvs + (t & 1) * 2 * kTile;
    const char* vs = ks + kTile;

    float s[kBC / 8][4] = {};  // S = Q K^T: 16 rows x 64 keys per warp
    if constexpr (WG) {
      scores_wgmma<T, D, BR>(s, qs, ks, warp >> 2);
    } else {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int j = 0; j < kBC / 16; ++j) {
        unsigned kb[4];
        rg::ldmatrix_x4(kb, ks + swz<D, WG, kBC>(j * 16 + (lane & 7) + (lane >> 4) * 8,
                                        kk * 2 + ((lane >> 3) & 1)));
        rg::mma_16816<T>(s[2 * j], qf[kk], kb[0], kb[1]);
        rg::mma_16816<T>(s[2 * j + 1], qf[kk], kb[2], kb[3]);
      }
    }

    const int key0 = t * kBC;
    const bool edge = key0 + kBC - 1 > past + r0;  // some key may lie past some row
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = m[h];
#pragma unroll
      for (int j = 0; j < kBC / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float v = s[j][2 * h + e] * scale2;
          if (edge && key0 + j * 8 + c2 + e > qpos0 + 8 * h) v = rg::neg_inf();
          s[j][2 * h + e] = v;
          mx = fmaxf(mx, v);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // a split may start with a tile whose keys all lie past this row (mx = -inf): then
      // alpha and every p are 0, not NaN (the whole tile 0 of an unsplit row is never masked)
      const float ref = SPLIT && mx == rg::neg_inf() ? 0.f : mx;
      const float alpha = exp2f(m[h] - ref);  // 0 on the first tile (m = -inf)
      m[h] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kBC / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = exp2f(s[j][2 * h + e] - ref);
          s[j][2 * h + e] = p;
          sum += p;
        }
      l[h] = l[h] * alpha + sum;
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        o[d][2 * h] *= alpha;
        o[d][2 * h + 1] *= alpha;
      }
    }

    if constexpr (WG) {
      pv_wgmma<T, D>(o, s, vs);
    } else {
#pragma unroll
    for (int kk = 0; kk < kBC / 16; ++kk) {  // O += P V, keys 16 kk .. 16 kk + 15
      const unsigned a[4] = {rg::pack2<T>(s[2 * kk][0], s[2 * kk][1]),
                             rg::pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                             rg::pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             rg::pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int d = 0; d < D / 16; ++d) {
        unsigned vb[4];
        rg::ldmatrix_x4_trans(vb, vs + swz<D, WG, kBC>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                              d * 2 + (lane >> 4)));
        rg::mma_16816<T>(o[2 * d], a, vb[0], vb[1]);
        rg::mma_16816<T>(o[2 * d + 1], a, vb[2], vb[3]);
      }
    }
    }
    __syncthreads();  // this buffer is refilled by the next iteration's prefetch
  }

  if constexpr (SPLIT) rg::cp_async_wait<0>();  // an empty split's query tile
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = l[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int r = r0 + warp * 16 + g + 8 * h;
    if (r >= q_len) continue;
    if constexpr (SPLIT) {  // (output columns..., max in base 2, sum): as decode attention's
      float* dst = partial + ((static_cast<long long>(q_begin + r) * q_heads + head) * splits +
                              blockIdx.y % splits) * (D + 2);
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        dst[d * 8 + c2] = o[d][2 * h];
        dst[d * 8 + c2 + 1] = o[d][2 * h + 1];
      }
      if ((lane & 3) == 0) {
        dst[D] = m[h];
        dst[D + 1] = sum;
      }
      continue;
    }
    const float inv = 1.f / sum;
    T* dst = out + (q_begin + r) * o_stride + head * D + c2;
#pragma unroll
    for (int d = 0; d < D / 8; ++d)
      *reinterpret_cast<unsigned*>(dst + d * 8) =
          rg::pack2<T>(o[d][2 * h] * inv, o[d][2 * h + 1] * inv);
  }
}

}  // namespace
