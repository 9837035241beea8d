// prefill_attention.cu: causal attention of a prefill chunk's queries over their sequences'
// paged KV cache (FlashAttention-2 style: query tiles, key tiles, online softmax, tensor cores).
//
//   extern "C" prefill_attention_{f16,bf16}_d{64,128}_r{64,128}(
//       const T* q,               // (tokens, q_heads, D): the chunk's queries, RoPE applied;
//                                 // token t at q + t * q_stride
//       const T* k_cache, const T* v_cache,  // one layer: (num_blocks, block_size, kv_heads * D)
//       const int* block_tables,  // (max_seqs, max_blocks)
//       const int* seq_lens,      // (max_seqs,) tokens in the cache, this chunk's included
//       const int* cu_seqlens,    // (num_seqs + 1,) sequence i's queries: rows [cu[i], cu[i+1])
//       const int* seq_slots,     // (num_seqs,) cache slot of sequence i; < 0: skipped
//       T* out,                   // (tokens, q_heads, D)
//       int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks, float scale,
//       int q_stride)
//   Query row j of sequence i (q_len = cu[i + 1] - cu[i] rows) is the token at position
//   p = seq_lens[slot] - q_len + j and attends to cached keys 0..p (causal): earlier chunks of
//   the prompt are in the cache already, and this chunk's K/V were appended before the call.
//   out = softmax(q K^T * scale) V per query head; kv head = head / (q_heads / kv_heads) (GQA).
//
//   grid (cdiv(max_q_len, R), q_heads, num_seqs), block (2 R): R / 16 warps of 16 query rows
//   (R = 64 or 128: a larger tile shares each K/V tile among more rows, a smaller one wastes
//   less on short chunks).
//   Query tiles run last-first (the causal tiles with the most keys start first). Per key tile
//   of 64: S = Q K^T (Q fragments kept in registers, K via ldmatrix), row max and sum updated
//   with exp2, P packed to T in registers as the A operand of O += P V (V via ldmatrix.trans).
//   K/V tiles are gathered through the block table with cp.async, double-buffered; keys past
//   the causal bound or the cache are zero-filled and masked. Rows of 2 D bytes in shared
//   memory, 16-byte chunk index XOR row % 8. Dynamic shared memory: (R + 4 * 64) * D * 2 bytes.
//   Patchable: grid.x (from the longest query run) and grid.z == num_seqs; lengths, offsets,
//   slots and tables are read from device memory.
//
//   extern "C" prefill_attention_split_{f16,bf16}_d{64,128}_r{64,128}(the same...,
//       float* partial,           // (tokens, q_heads, splits, D + 2) workspace
//       int splits)
//   grid (cdiv(max_q_len, R), q_heads * splits, num_seqs): the key tiles of each query tile
//   cut into `splits` runs (a short chunk over a long context has too few query tiles to fill
//   the GPU), block (.., head * splits + s) taking run s; it leaves per row its unnormalised
//   output, max (base 2) and sum, as decode attention's splits do (an empty run: max -inf).
//   extern "C" prefill_attention_combine_{f16,bf16}_d{64,128}(
//       const float* partial, T* out, const int* cu_seqlens, const int* seq_slots,
//       int num_seqs, int q_heads, int splits)
//   grid (tokens * q_heads), block (D): out from the runs, in split order.
#include "mma.cuh"

namespace {

constexpr int kBC = 64;
constexpr float kLog2e = 1.4426950408889634f;

template <int D> __device__ __forceinline__ int swz(int row, int chunk) {
  return row * (D * 2) + ((chunk ^ (row & 7)) << 4);
}

template <typename T, int D, int kThreads>
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
    rg::cp_async16(ks + swz<D>(r, c), k_cache + at, ok);
    rg::cp_async16(vs + swz<D>(r, c), v_cache + at, ok);
  }
}

// BR query rows per block, 16 per warp. SPLIT: the block takes split blockIdx.y % splits of
// its query tile's key tiles and leaves (unnormalised output, max, sum) in `partial` for
// combine(); else it writes out.
template <typename T, int D, int BR, bool SPLIT>
__device__ void prefill_impl(const T* q, const T* k_cache,
                             const T* v_cache, const int* block_tables,
                             const int* seq_lens, const int* cu_seqlens,
                             const int* seq_slots, T* out, int num_seqs,
                             int q_heads, int kv_heads, int block_size, int max_blocks,
                             float scale, int q_stride, float* partial, int splits) {
  rg::pdl_start();
  constexpr int RC = D / 8, kTile = kBC * D * 2, kThreads = BR * 2;
  extern __shared__ __align__(128) char smem[];
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
    rg::cp_async16(qs + swz<D>(r, c), src, ok);
  }
  if (!SPLIT || t0 < t1) {  // unsplit, tile 0 always has keys
    char* first = kvs + (t0 & 1) * 2 * kTile;
    load_kv<T, D, kThreads>(first, first + kTile, k_cache, v_cache, table, t0 * kBC, kend,
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
      load_kv<T, D, kThreads>(nb, nb + kTile, k_cache, v_cache, table, (t + 1) * kBC, kend, block_size,
                    max_blocks, row_stride, col);
    }
    rg::cp_async_commit();
    rg::cp_async_wait<1>();
    __syncthreads();
    if (t == t0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        rg::ldmatrix_x4(qf[kk], qs + swz<D>(warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                            kk * 2 + (lane >> 4)));
    }
    const char* ks = kvs + (t & 1) * 2 * kTile;
    const char* vs = ks + kTile;

    float s[kBC / 8][4] = {};  // S = Q K^T: 16 rows x 64 keys per warp
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int j = 0; j < kBC / 16; ++j) {
        unsigned kb[4];
        rg::ldmatrix_x4(kb, ks + swz<D>(j * 16 + (lane & 7) + (lane >> 4) * 8,
                                        kk * 2 + ((lane >> 3) & 1)));
        rg::mma_16816<T>(s[2 * j], qf[kk], kb[0], kb[1]);
        rg::mma_16816<T>(s[2 * j + 1], qf[kk], kb[2], kb[3]);
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

#pragma unroll
    for (int kk = 0; kk < kBC / 16; ++kk) {  // O += P V, keys 16 kk .. 16 kk + 15
      const unsigned a[4] = {rg::pack2<T>(s[2 * kk][0], s[2 * kk][1]),
                             rg::pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                             rg::pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             rg::pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int d = 0; d < D / 16; ++d) {
        unsigned vb[4];
        rg::ldmatrix_x4_trans(vb, vs + swz<D>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                              d * 2 + (lane >> 4)));
        rg::mma_16816<T>(o[2 * d], a, vb[0], vb[1]);
        rg::mma_16816<T>(o[2 * d + 1], a, vb[2], vb[3]);
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

// out[t][head] = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s over the token's splits, in
// split order (as decode_attention.cu's combine): block token * q_heads + head, D threads.
// Tokens past the chunk's last sequence, and those of a sequence whose slot is < 0, are
// left alone.
template <typename T, int D>
__device__ void combine(const float* partial, T* out, const int* cu_seqlens,
                        const int* seq_slots, int num_seqs, int q_heads, int splits) {
  rg::pdl_start();
  const int token = blockIdx.x / q_heads, head = blockIdx.x % q_heads, d = threadIdx.x;
  if (token >= cu_seqlens[num_seqs]) return;
  int lo = 0, hi = num_seqs - 1;  // the sequence of `token`: the last with cu[seq] <= token
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu_seqlens[mid] <= token) lo = mid;
    else hi = mid - 1;
  }
  if (seq_slots[lo] < 0) return;
  const float* p = partial + (static_cast<long long>(token) * q_heads + head) * splits * (D + 2);
  float m = rg::neg_inf();
  for (int s = 0; s < splits; ++s) m = fmaxf(m, p[s * (D + 2) + D]);
  float num = 0.f, den = 0.f;
  for (int s = 0; s < splits; ++s) {  // an empty split (m_s = -inf) weighs 0
    const float w = m == rg::neg_inf() ? 0.f : exp2f(p[s * (D + 2) + D] - m);
    num = fmaf(w, p[s * (D + 2) + d], num);
    den = fmaf(w, p[s * (D + 2) + D + 1], den);
  }
  out[(static_cast<long long>(token) * q_heads + head) * D + d] =
      rg::from_float<T>(den > 0.f ? num / den : 0.f);
}

}  // namespace

// ---- generated by rawgraph/ops/generate.py (python -m rawgraph.ops.generate); do not edit
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_f16_d64_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill_impl<__half, 64, 64, false>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, nullptr,
      1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_f16_d64_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill_impl<__half, 64, 128, false>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, nullptr,
      1);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_f16_d128_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill_impl<__half, 128, 64, false>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, nullptr,
      1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_f16_d128_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill_impl<__half, 128, 128, false>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, nullptr,
      1);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_bf16_d64_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill_impl<__nv_bfloat16, 64, 64, false>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, nullptr, 1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_bf16_d64_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill_impl<__nv_bfloat16, 64, 128, false>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, nullptr, 1);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_bf16_d128_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill_impl<__nv_bfloat16, 128, 64, false>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, nullptr, 1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_bf16_d128_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill_impl<__nv_bfloat16, 128, 128, false>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, nullptr, 1);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_split_f16_d64_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits) {
  prefill_impl<__half, 64, 64, true>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, partial,
      splits);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_f16_d64_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits) {
  prefill_impl<__half, 64, 128, true>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, partial,
      splits);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_split_f16_d128_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits) {
  prefill_impl<__half, 128, 64, true>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, partial,
      splits);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_f16_d128_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits) {
  prefill_impl<__half, 128, 128, true>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, partial,
      splits);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_split_bf16_d64_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits) {
  prefill_impl<__nv_bfloat16, 64, 64, true>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, partial,
      splits);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_bf16_d64_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits) {
  prefill_impl<__nv_bfloat16, 64, 128, true>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, partial, splits);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_split_bf16_d128_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits) {
  prefill_impl<__nv_bfloat16, 128, 64, true>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, partial, splits);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_bf16_d128_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits) {
  prefill_impl<__nv_bfloat16, 128, 128, true>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, partial, splits);
}
extern "C" __global__ void
prefill_attention_combine_f16_d64(
    const float* partial, __half* out, const int* cu_seqlens, const int* seq_slots, int num_seqs,
    int q_heads, int splits) {
  combine<__half, 64>(partial, out, cu_seqlens, seq_slots, num_seqs, q_heads, splits);
}
extern "C" __global__ void
prefill_attention_combine_f16_d128(
    const float* partial, __half* out, const int* cu_seqlens, const int* seq_slots, int num_seqs,
    int q_heads, int splits) {
  combine<__half, 128>(partial, out, cu_seqlens, seq_slots, num_seqs, q_heads, splits);
}
extern "C" __global__ void
prefill_attention_combine_bf16_d64(
    const float* partial, __nv_bfloat16* out, const int* cu_seqlens, const int* seq_slots,
    int num_seqs, int q_heads, int splits) {
  combine<__nv_bfloat16, 64>(partial, out, cu_seqlens, seq_slots, num_seqs, q_heads, splits);
}
extern "C" __global__ void
prefill_attention_combine_bf16_d128(
    const float* partial, __nv_bfloat16* out, const int* cu_seqlens, const int* seq_slots,
    int num_seqs, int q_heads, int splits) {
  combine<__nv_bfloat16, 128>(partial, out, cu_seqlens, seq_slots, num_seqs, q_heads, splits);
}
