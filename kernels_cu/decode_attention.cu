// decode_attention.cu: one new query token per sequence attending to its paged KV cache
// (GQA), split along the context (flash-decoding), then a combine pass.
//
//   extern "C" decode_attention_{f16,bf16}_d{64,128}(
//       const T* q,               // (batch, q_heads, D); row b at q + b * q_stride
//       const T* k_cache, const T* v_cache,  // one layer: (num_blocks, block_size, kv_heads * D)
//       const int* block_tables,  // (max_seqs, max_blocks)
//       const int* seq_lens,      // (max_seqs,) tokens in the cache, the new one included
//       const int* seq_slots,     // (batch,) cache slot of each row; < 0: padding row
//       float* partial,           // (batch, q_heads, max_splits, D + 2) workspace
//       int batch, int q_heads, int kv_heads, int block_size, int max_blocks,
//       int split_tokens, int max_splits, float scale, int q_stride)
//   grid (batch * kv_heads, n_splits), block (128), dynamic shared memory 4 * 64 * D * 2 B.
//   Block (b, h, s) reads tokens [s * split_tokens, min((s + 1) * split_tokens, len)) of
//   sequence b once for all G = q_heads / kv_heads query heads of kv head h (G <= 8), 64
//   tokens per tile, K and V tiles gathered through the block table with cp.async into
//   double-buffered shared memory (the next tile loads while this one is used):
//     scores: D/8 lanes per token, each with 8 columns of K and of every group head's q (in
//     registers), a token's dot product summed across its lanes by shuffles;
//     softmax: one warp per head updates the running max m and sum l (base-2 exponentials);
//     values: thread i owns 8 output columns (one 16-byte shared load of V per token) for every
//     (128 / (D / 8))-th token of the tile; the token groups meet in shared memory at the end.
//   It writes (m, l, unnormalised accumulator) for its heads; an empty split writes m = -inf.
//
//   extern "C" decode_attention_combine_{f16,bf16}_d{64,128}(
//       const float* partial, T* out,   // out: (batch, q_heads, D)
//       const int* seq_slots, int batch, int q_heads, int n_splits, int max_splits)
//   grid (batch * q_heads), block (D), dynamic shared memory 4 * max_splits B:
//   out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s; the splits' maxima and weights are
//   read and computed in parallel, the sums run in split order.
//   A sequence of length 0 gives zeros; padding rows are not written.
//
//   Graph use: lengths, tables and slots are read from device memory; the number of splits
//   (grid.y of both kernels, n_splits of the combine) is patchable from the longest context,
//   which keeps the grid proportional to the work as sequences grow.
#include "mma.cuh"  // cp.async

namespace {

constexpr int kThreads = 128, kTile = 64, kMaxGroup = 8;

template <typename T, int D>
__device__ void attend(const T* __restrict__ q, const T* __restrict__ k_cache,
                       const T* __restrict__ v_cache, const int* __restrict__ block_tables,
                       const int* __restrict__ seq_lens, const int* __restrict__ seq_slots,
                       float* __restrict__ partial, int batch, int q_heads, int kv_heads,
                       int block_size, int max_blocks, int split_tokens, int max_splits,
                       float scale, int q_stride) {
  rg::pdl_start();
  constexpr int kColThreads = D / 8;                // threads across one V row
  constexpr int kGroups = kThreads / kColThreads;   // token groups (16 for D = 64, 8 for 128)
  const int b = blockIdx.x / kv_heads, h = blockIdx.x % kv_heads, split = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (b >= batch) return;
  const int slot = seq_slots[b];
  if (slot < 0) return;
  const int G = q_heads / kv_heads;
  const int len = seq_lens[slot];
  const int begin = split * split_tokens, end = min(begin + split_tokens, len);
  const long long row = static_cast<long long>(kv_heads) * D;  // cache row stride
  const float qscale = scale * 1.4426950408889634f;            // scores in base 2

  __shared__ float qs[kMaxGroup][D];
  __shared__ float ps[kMaxGroup][kTile];
  __shared__ float m_s[kMaxGroup], l_s[kMaxGroup], alpha_s[kMaxGroup];
  // dynamic: K and V tiles, double-buffered [buf][K|V][token][D]; after the loop, the token
  // groups' partial sums (the same bytes)
  extern __shared__ __align__(16) unsigned char smem[];
  T* kv_s = reinterpret_cast<T*>(smem);
  for (int i = tid; i < G * D; i += kThreads)
    qs[i / D][i % D] =
        rg::to_float(q[static_cast<long long>(b) * q_stride + (h * G + i / D) * D + i % D]) *
        qscale;
  if (tid < kMaxGroup) {
    m_s[tid] = rg::neg_inf();
    l_s[tid] = 0.f;
  }
  float acc[kMaxGroup][8];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
  const int c8 = 8 * (tid % kColThreads), tg = tid / kColThreads;
  const int* table = block_tables + static_cast<long long>(slot) * max_blocks;

  // K and V of tokens [t0, t0 + kTile) into buffer `buf`: 16-byte cp.async chunks, a chunk
  // per (token, 8 columns); tokens past `end` are zero-filled
  auto prefetch = [&](int t0, int buf) {
    T* ks = kv_s + buf * 2 * kTile * D;
    for (int i = tid; i < kTile * kColThreads; i += kThreads) {
      const int j = i / kColThreads, c = 8 * (i % kColThreads), t = t0 + j;
      const bool ok = t < end;
      const long long p = ok ? static_cast<long long>(table[t / block_size]) * block_size +
                                   t % block_size : 0;
      const long long at = p * row + static_cast<long long>(h) * D + c;
      rg::cp_async16(ks + j * D + c, k_cache + at, ok);
      rg::cp_async16(ks + (kTile + j) * D + c, v_cache + at, ok);
    }
    rg::cp_async_commit();
  };

  // scores: lanes sub = lane % kColThreads of a token hold 8 columns of q (every head of the
  // group) and of K; the token's dot product meets across those lanes by shuffles
  constexpr int kTokPerWarp = 32 / kColThreads;
  const int sub = lane % kColThreads, tok = lane / kColThreads;
  float qv[kMaxGroup][8];
  __syncthreads();  // qs written
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e) qv[g][e] = g < G ? qs[g][8 * sub + e] : 0.f;

  if (begin < end) prefetch(begin, 0);
  for (int t0 = begin, it = 0; t0 < end; t0 += kTile, ++it) {
    rg::cp_async_wait<0>();
    __syncthreads();  // tile `it` landed; the previous tile's buffers, ps and alpha are free
    if (t0 + kTile < end) prefetch(t0 + kTile, (it + 1) & 1);
    const T* ks = kv_s + (it & 1) * 2 * kTile * D;
    const T* vs = ks + kTile * D;
    for (int j = warp * kTokPerWarp + tok; j < kTile; j += (kThreads / 32) * kTokPerWarp) {
      const rg::Vec<T, 8> kv = rg::load<T, 8>(ks + j * D + 8 * sub);
      float kf[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) kf[e] = rg::to_float(kv.v[e]);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= G) break;
        float d = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) d = fmaf(qv[g][e], kf[e], d);
#pragma unroll
        for (int o = kColThreads / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        if (sub == 0) ps[g][j] = t0 + j < end ? d : rg::neg_inf();
      }
    }
    __syncthreads();
    for (int g = warp; g < G; g += kThreads / 32) {  // online softmax, one warp per head
      const float a = ps[g][lane], c = ps[g][lane + 32];
      float mx = fmaxf(a, c);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = fmaxf(m_s[g], mx);  // finite: the tile has at least one token
      const float ea = exp2f(a - m_new), ec = exp2f(c - m_new);
      ps[g][lane] = ea;
      ps[g][lane + 32] = ec;
      const float sum = rg::warp_sum(ea + ec);
      if (lane == 0) {
        const float alpha = exp2f(m_s[g] - m_new);
        alpha_s[g] = alpha;
        l_s[g] = l_s[g] * alpha + sum;
        m_s[g] = m_new;
      }
    }
    __syncthreads();
    {  // values: columns c8..c8+7, tokens tg, tg + kGroups, ... (zero-filled past the end)
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g)
        if (g < G) {
          const float a = alpha_s[g];
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[g][e] *= a;
        }
      const int live = min(kTile, end - t0);
      for (int j = tg; j < live; j += kGroups) {
        const rg::Vec<T, 8> v = rg::load<T, 8>(vs + j * D + c8);
        float vf[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) vf[e] = rg::to_float(v.v[e]);
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g)
          if (g < G) {
            const float pj = ps[g][j];
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(pj, vf[e], acc[g][e]);
          }
      }
    }
  }
  // the token groups' sums meet in shared memory (the K/V buffers' bytes), fixed order
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);  // [kGroups][kMaxGroup][D]
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
    if (g < G) {
#pragma unroll
      for (int e = 0; e < 8; ++e) red[(tg * kMaxGroup + g) * D + c8 + e] = acc[g][e];
    }
  __syncthreads();
  for (int i = tid; i < G * D; i += kThreads) {
    const int g = i / D, col = i % D;
    float v = 0.f;
#pragma unroll
    for (int q = 0; q < kGroups; ++q) v += red[(q * kMaxGroup + g) * D + col];
    float* out = partial + ((static_cast<long long>(b) * q_heads + h * G + g) * max_splits +
                            split) * (D + 2);
    out[col] = v;
    if (col == 0) {
      out[D] = begin < end ? m_s[g] : rg::neg_inf();
      out[D + 1] = begin < end ? l_s[g] : 0.f;
    }
  }
}

template <typename T, int D>
__device__ void combine(const float* __restrict__ partial, T* __restrict__ out,
                        const int* __restrict__ seq_slots, int batch, int q_heads, int n_splits,
                        int max_splits) {
  rg::pdl_start();
  extern __shared__ float w[];  // (max_splits,): each split's weight 2^(m_s - M)
  __shared__ float red[D / 32];
  const int b = blockIdx.x / q_heads, head = blockIdx.x % q_heads, d = threadIdx.x;
  if (b >= batch || seq_slots[b] < 0) return;
  const float* p = partial + (static_cast<long long>(b) * q_heads + head) * max_splits * (D + 2);
  // the splits' maxima, read in parallel (one split per thread at a time), then M
  float m = rg::neg_inf();
  for (int s = d; s < n_splits; s += D) m = fmaxf(m, p[s * (D + 2) + D]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((d & 31) == 0) red[d >> 5] = m;
  __syncthreads();
  m = red[0];
#pragma unroll
  for (int i = 1; i < D / 32; ++i) m = fmaxf(m, red[i]);
  for (int s = d; s < n_splits; s += D)  // 0 for empty splits (m_s = -inf)
    w[s] = m == rg::neg_inf() ? 0.f : exp2f(p[s * (D + 2) + D] - m);
  __syncthreads();
  float num = 0.f, den = 0.f;
#pragma unroll 4
  for (int s = 0; s < n_splits; ++s) {  // fixed order: deterministic
    num = fmaf(w[s], p[s * (D + 2) + d], num);
    den = fmaf(w[s], p[s * (D + 2) + D + 1], den);
  }
  out[(static_cast<long long>(b) * q_heads + head) * D + d] =
      rg::from_float<T>(den > 0.f ? num / den : 0.f);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(128) decode_attention_f16_d64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* seq_slots, float* partial, int batch, int q_heads,
    int kv_heads, int block_size, int max_blocks, int split_tokens, int max_splits,
    float scale, int q_stride) {
  attend<__half, 64>(q, k_cache, v_cache, block_tables, seq_lens, seq_slots, partial, batch,
                   q_heads, kv_heads, block_size, max_blocks, split_tokens, max_splits, scale,
                   q_stride);
}
extern "C" __global__ void decode_attention_combine_f16_d64(const float* partial, __half* out,
    const int* seq_slots, int batch, int q_heads, int n_splits, int max_splits) {
  combine<__half, 64>(partial, out, seq_slots, batch, q_heads, n_splits, max_splits);
}
extern "C" __global__ void __launch_bounds__(128) decode_attention_f16_d128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* seq_slots, float* partial, int batch, int q_heads,
    int kv_heads, int block_size, int max_blocks, int split_tokens, int max_splits,
    float scale, int q_stride) {
  attend<__half, 128>(q, k_cache, v_cache, block_tables, seq_lens, seq_slots, partial, batch,
                   q_heads, kv_heads, block_size, max_blocks, split_tokens, max_splits, scale,
                   q_stride);
}
extern "C" __global__ void decode_attention_combine_f16_d128(const float* partial, __half* out,
    const int* seq_slots, int batch, int q_heads, int n_splits, int max_splits) {
  combine<__half, 128>(partial, out, seq_slots, batch, q_heads, n_splits, max_splits);
}
extern "C" __global__ void __launch_bounds__(128) decode_attention_bf16_d64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache, const int* block_tables,
    const int* seq_lens, const int* seq_slots, float* partial, int batch, int q_heads,
    int kv_heads, int block_size, int max_blocks, int split_tokens, int max_splits,
    float scale, int q_stride) {
  attend<__nv_bfloat16, 64>(q, k_cache, v_cache, block_tables, seq_lens, seq_slots, partial, batch,
                   q_heads, kv_heads, block_size, max_blocks, split_tokens, max_splits, scale,
                   q_stride);
}
extern "C" __global__ void decode_attention_combine_bf16_d64(const float* partial, __nv_bfloat16* out,
    const int* seq_slots, int batch, int q_heads, int n_splits, int max_splits) {
  combine<__nv_bfloat16, 64>(partial, out, seq_slots, batch, q_heads, n_splits, max_splits);
}
extern "C" __global__ void __launch_bounds__(128) decode_attention_bf16_d128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache, const int* block_tables,
    const int* seq_lens, const int* seq_slots, float* partial, int batch, int q_heads,
    int kv_heads, int block_size, int max_blocks, int split_tokens, int max_splits,
    float scale, int q_stride) {
  attend<__nv_bfloat16, 128>(q, k_cache, v_cache, block_tables, seq_lens, seq_slots, partial, batch,
                   q_heads, kv_heads, block_size, max_blocks, split_tokens, max_splits, scale,
                   q_stride);
}
extern "C" __global__ void decode_attention_combine_bf16_d128(const float* partial, __nv_bfloat16* out,
    const int* seq_slots, int batch, int q_heads, int n_splits, int max_splits) {
  combine<__nv_bfloat16, 128>(partial, out, seq_slots, batch, q_heads, n_splits, max_splits);
}
