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
//       int splits, int run_keys)
//   For short chunks over long contexts, which have too few query tiles to fill the GPU:
//   grid (cdiv(max_q_len, R / G), kv_heads * n, num_seqs), G = q_heads / kv_heads <= R. A
//   tile's rows are the G query heads of R / G tokens (one K/V tile serves the whole group:
//   a 16-token chunk of 4 heads a group fills a 64-row tile instead of a quarter of one per
//   head; rows past (R / G) G are padding), and each sequence cuts its query tiles' key
//   tiles into its own number of runs, len / run_keys (len: its keys, this chunk's
//   included), at least 1 and at most `splits`: its results depend on its length alone,
//   not on what else the chunk holds. Block (.., kv_head * n + s) takes run s (n must cover
//   every sequence's runs; blocks past a sequence's exit), and leaves per row its
//   unnormalised output, max (base 2) and sum, as decode attention's splits do (an empty
//   run: max -inf); a sequence of one run writes out, and the combine leaves it alone. So n
//   may be patched per chunk (from 1) as the longest context grows.
//   extern "C" prefill_attention_combine_{f16,bf16}_d{64,128}(
//       const float* partial, T* out, const int* cu_seqlens, const int* seq_slots,
//       const int* seq_lens, int num_seqs, int q_heads, int splits, int run_keys)
//   grid (cdiv(tokens * q_heads, 8)), block (256): out from the runs, in run order, a warp
//   per (token, head).
#include <prefill_attention.cuh>

namespace {

// mma.sync's products (prefill_loop's Mma): Q's fragments kept in registers from the first
// tile, K and V through ldmatrix (V transposed), m16n8k16 MMAs.
template <typename T, int D, int BR>
struct SyncMma {
  static constexpr bool kPanels = false, kSkipRescale = false;
  unsigned qf[D / 16][4];

  static __device__ __forceinline__ void landed() {}

  __device__ __forceinline__ void start(const char* qs, int warp, int lane) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      rg::ldmatrix_x4(qf[kk], qs + swz<D, false, BR>(warp * 16 + (lane & 7) +
                                                     ((lane >> 3) & 1) * 8,
                                                     kk * 2 + (lane >> 4)));
  }

  __device__ __forceinline__ void scores(float (&s)[kBC / 8][4], const char*, const char* ks,
                                         int, int lane) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int j = 0; j < kBC / 16; ++j) {
        unsigned kb[4];
        rg::ldmatrix_x4(kb, ks + swz<D, false, kBC>(j * 16 + (lane & 7) + (lane >> 4) * 8,
                                                    kk * 2 + ((lane >> 3) & 1)));
        rg::mma_16816<T>(s[2 * j], qf[kk], kb[0], kb[1]);
        rg::mma_16816<T>(s[2 * j + 1], qf[kk], kb[2], kb[3]);
      }
  }

  __device__ __forceinline__ void pv(float (&o)[D / 8][4], const float (&s)[kBC / 8][4],
                                     const char* vs, int, int lane) {
#pragma unroll
    for (int kk = 0; kk < kBC / 16; ++kk) {  // keys 16 kk .. 16 kk + 15
      const unsigned a[4] = {rg::pack2<T>(s[2 * kk][0], s[2 * kk][1]),
                             rg::pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                             rg::pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             rg::pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int d = 0; d < D / 16; ++d) {
        unsigned vb[4];
        rg::ldmatrix_x4_trans(vb, vs + swz<D, false, kBC>(kk * 16 + (lane & 7) +
                                                          ((lane >> 3) & 1) * 8,
                                                          d * 2 + (lane >> 4)));
        rg::mma_16816<T>(o[2 * d], a, vb[0], vb[1]);
        rg::mma_16816<T>(o[2 * d + 1], a, vb[2], vb[3]);
      }
    }
  }
};

// out[t][head] = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s over the token's sequence's
// runs (seq_runs), in run order (as decode_attention.cu's combine): a warp per (token,
// head), lane l holding columns 2 l + 64 i (float2 pairs), lane s run s's max and sum (runs
// <= 64: lanes s and s + 32), kCombineWarps pairs a block. Like decode's it is a chain of
// dependent loads, so each lane requests its columns of kAhead runs, its runs' (max, sum)
// and the sequence search at once (entries past the sequence's runs are read, never used).
// Tokens past the chunk's last sequence, those of a sequence whose slot is < 0 and those of
// a sequence of one run (which wrote out itself) are left alone.
constexpr int kCombineWarps = 8;

template <typename T, int D>
__device__ void combine(const float* partial, T* out, const int* cu_seqlens,
                        const int* seq_slots, const int* seq_lens, int num_seqs, int q_heads,
                        int splits, int run_keys) {
  constexpr int kAhead = 16, kPairs = D / 64;  // float2 columns per lane
  rg::pdl_start();
  const int lane = threadIdx.x & 31;
  const long long pair = static_cast<long long>(blockIdx.x) * kCombineWarps + (threadIdx.x >> 5);
  const int token = static_cast<int>(pair / q_heads);
  if (splits == 1 || token >= cu_seqlens[num_seqs]) return;
  const float* p = partial + pair * splits * (D + 2);
  float2 acc[kAhead][kPairs];
#pragma unroll
  for (int j = 0; j < kAhead; ++j)
#pragma unroll
    for (int i = 0; i < kPairs; ++i)
      acc[j][i] = j < splits ? *reinterpret_cast<const float2*>(p + j * (D + 2) + 2 * lane + 64 * i)
                             : make_float2(0.f, 0.f);
  float2 ml[2];  // (max, sum) of splits lane and lane + 32
#pragma unroll
  for (int h = 0; h < 2; ++h)
    ml[h] = lane + 32 * h < splits
                ? *reinterpret_cast<const float2*>(p + (lane + 32 * h) * (D + 2) + D)
                : make_float2(rg::neg_inf(), 0.f);
  int lo = 0, hi = num_seqs - 1;  // the sequence of `token`: the last with cu[seq] <= token
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu_seqlens[mid] <= token) lo = mid;
    else hi = mid - 1;
  }
  const int slot = seq_slots[lo];
  if (slot < 0) return;
  const int runs = seq_runs(seq_lens[slot], splits, run_keys);
  if (runs == 1) return;
  float m = rg::neg_inf();
#pragma unroll
  for (int h = 0; h < 2; ++h)
    if (lane + 32 * h < runs) m = fmaxf(m, ml[h].x);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float w[2];  // the weights 2^(m_s - M) of runs lane and lane + 32 (an empty run: 0)
#pragma unroll
  for (int h = 0; h < 2; ++h)
    w[h] = lane + 32 * h < runs && m != rg::neg_inf() ? exp2f(ml[h].x - m) : 0.f;
  float num[kPairs][2] = {}, den = 0.f;  // in run order: deterministic
  for (int s0 = 0; s0 < runs; s0 += kAhead) {
    if (s0 > 0) {
#pragma unroll
      for (int j = 0; j < kAhead; ++j)
#pragma unroll
        for (int i = 0; i < kPairs; ++i)
          acc[j][i] = s0 + j < runs
                          ? *reinterpret_cast<const float2*>(p + (s0 + j) * (D + 2) + 2 * lane +
                                                             64 * i)
                          : make_float2(0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const int sp = s0 + j;  // run sp's weight and sum live in lane sp % 32
      const float ws = __shfl_sync(0xffffffffu, sp < 32 ? w[0] : w[1], sp & 31);
      const float ls = __shfl_sync(0xffffffffu, sp < 32 ? ml[0].y : ml[1].y, sp & 31);
      if (sp < runs) {
#pragma unroll
        for (int i = 0; i < kPairs; ++i) {
          num[i][0] = fmaf(ws, acc[j][i].x, num[i][0]);
          num[i][1] = fmaf(ws, acc[j][i].y, num[i][1]);
        }
        den = fmaf(ws, ls, den);
      }
    }
  }
  const float inv = den > 0.f ? 1.f / den : 0.f;
  T* dst = out + pair * D + 2 * lane;
#pragma unroll
  for (int i = 0; i < kPairs; ++i)
    *reinterpret_cast<unsigned*>(dst + 64 * i) = rg::pack2<T>(num[i][0] * inv, num[i][1] * inv);
}

}  // namespace

// ---- generated by rawgraph/ops/generate.py (python -m rawgraph.ops.generate); do not edit
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_f16_d64_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill_loop<__half, 64, 64, false, SyncMma<__half, 64, 64>>(q, k_cache, v_cache, block_tables,
      seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks,
      scale, q_stride, nullptr, 1, 1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_f16_d64_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill_loop<__half, 64, 128, false, SyncMma<__half, 64, 128>>(q, k_cache, v_cache, block_tables,
      seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks,
      scale, q_stride, nullptr, 1, 1);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_f16_d128_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill_loop<__half, 128, 64, false, SyncMma<__half, 128, 64>>(q, k_cache, v_cache, block_tables,
      seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks,
      scale, q_stride, nullptr, 1, 1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_f16_d128_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill_loop<__half, 128, 128, false, SyncMma<__half, 128, 128>>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, nullptr, 1, 1);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_bf16_d64_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill_loop<__nv_bfloat16, 64, 64, false, SyncMma<__nv_bfloat16, 64, 64>>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, nullptr, 1, 1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_bf16_d64_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill_loop<__nv_bfloat16, 64, 128, false, SyncMma<__nv_bfloat16, 64, 128>>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, nullptr, 1, 1);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_bf16_d128_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill_loop<__nv_bfloat16, 128, 64, false, SyncMma<__nv_bfloat16, 128, 64>>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, nullptr, 1, 1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_bf16_d128_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill_loop<__nv_bfloat16, 128, 128, false, SyncMma<__nv_bfloat16, 128, 128>>(q, k_cache,
      v_cache, block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads,
      block_size, max_blocks, scale, q_stride, nullptr, 1, 1);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_split_f16_d64_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits, int run_keys) {
  prefill_loop<__half, 64, 64, true, SyncMma<__half, 64, 64>>(q, k_cache, v_cache, block_tables,
      seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks,
      scale, q_stride, partial, splits, run_keys);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_f16_d64_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits, int run_keys) {
  prefill_loop<__half, 64, 128, true, SyncMma<__half, 64, 128>>(q, k_cache, v_cache, block_tables,
      seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks,
      scale, q_stride, partial, splits, run_keys);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_split_f16_d128_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits, int run_keys) {
  prefill_loop<__half, 128, 64, true, SyncMma<__half, 128, 64>>(q, k_cache, v_cache, block_tables,
      seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks,
      scale, q_stride, partial, splits, run_keys);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_f16_d128_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits, int run_keys) {
  prefill_loop<__half, 128, 128, true, SyncMma<__half, 128, 128>>(q, k_cache, v_cache, block_tables,
      seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks,
      scale, q_stride, partial, splits, run_keys);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_split_bf16_d64_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits, int run_keys) {
  prefill_loop<__nv_bfloat16, 64, 64, true, SyncMma<__nv_bfloat16, 64, 64>>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, partial, splits, run_keys);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_bf16_d64_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits, int run_keys) {
  prefill_loop<__nv_bfloat16, 64, 128, true, SyncMma<__nv_bfloat16, 64, 128>>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, partial, splits, run_keys);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_split_bf16_d128_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits, int run_keys) {
  prefill_loop<__nv_bfloat16, 128, 64, true, SyncMma<__nv_bfloat16, 128, 64>>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, partial, splits, run_keys);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_bf16_d128_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits, int run_keys) {
  prefill_loop<__nv_bfloat16, 128, 128, true, SyncMma<__nv_bfloat16, 128, 128>>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, partial, splits, run_keys);
}
extern "C" __global__ void
prefill_attention_combine_f16_d64(
    const float* partial, __half* out, const int* cu_seqlens, const int* seq_slots,
    const int* seq_lens, int num_seqs, int q_heads, int splits, int run_keys) {
  combine<__half, 64>(partial, out, cu_seqlens, seq_slots, seq_lens, num_seqs, q_heads, splits,
      run_keys);
}
extern "C" __global__ void
prefill_attention_combine_f16_d128(
    const float* partial, __half* out, const int* cu_seqlens, const int* seq_slots,
    const int* seq_lens, int num_seqs, int q_heads, int splits, int run_keys) {
  combine<__half, 128>(partial, out, cu_seqlens, seq_slots, seq_lens, num_seqs, q_heads, splits,
      run_keys);
}
extern "C" __global__ void
prefill_attention_combine_bf16_d64(
    const float* partial, __nv_bfloat16* out, const int* cu_seqlens, const int* seq_slots,
    const int* seq_lens, int num_seqs, int q_heads, int splits, int run_keys) {
  combine<__nv_bfloat16, 64>(partial, out, cu_seqlens, seq_slots, seq_lens, num_seqs, q_heads,
      splits, run_keys);
}
extern "C" __global__ void
prefill_attention_combine_bf16_d128(
    const float* partial, __nv_bfloat16* out, const int* cu_seqlens, const int* seq_slots,
    const int* seq_lens, int num_seqs, int q_heads, int splits, int run_keys) {
  combine<__nv_bfloat16, 128>(partial, out, cu_seqlens, seq_slots, seq_lens, num_seqs, q_heads,
      splits, run_keys);
}
