// decode_attention.cu: one new query token per sequence attending to its paged KV cache
// (GQA), split along the context (flash-decoding), then a combine pass.
//
//   extern "C" decode_attention_{f16,bf16}_d{64,128}(
//       const T* q,               // (batch, q_heads, D)
//       const T* k_cache, const T* v_cache,  // one layer: (num_blocks, block_size, kv_heads * D)
//       const int* block_tables,  // (max_seqs, max_blocks)
//       const int* seq_lens,      // (max_seqs,) tokens in the cache, the new one included
//       const int* seq_slots,     // (batch,) cache slot of each row; < 0: padding row
//       float* partial,           // (batch, q_heads, max_splits, D + 2) workspace
//       int batch, int q_heads, int kv_heads, int block_size, int max_blocks,
//       int split_tokens, int max_splits, float scale)
//   grid (batch * kv_heads, n_splits), block (128). Block (b, h, s) reads tokens
//   [s * split_tokens, min((s + 1) * split_tokens, len)) of sequence b once for all G =
//   q_heads / kv_heads query heads of kv head h (G <= 8), 64 tokens per tile:
//     scores: thread i takes token i % 64 and every other group head, q from shared memory;
//     softmax: one warp per head updates the running max m and sum l (base-2 exponentials);
//     values: thread i owns 8 output columns (one 16-byte load of V per token) for every
//     (128 / (D / 8))-th token of the tile; the token groups meet in shared memory at the end.
//   It writes (m, l, unnormalised accumulator) for its heads; an empty split writes m = -inf.
//
//   extern "C" decode_attention_combine_{f16,bf16}_d{64,128}(
//       const float* partial, T* out,   // out: (batch, q_heads, D)
//       const int* seq_slots, int batch, int q_heads, int n_splits, int max_splits)
//   grid (batch * q_heads), block (D): out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s.
//   A sequence of length 0 gives zeros; padding rows are not written.
//
//   Graph use: lengths, tables and slots are read from device memory; the number of splits
//   (grid.y of both kernels, n_splits of the combine) is patchable from the longest context,
//   which keeps the grid proportional to the work as sequences grow.
#include "common.cuh"

namespace {

constexpr int kThreads = 128, kTile = 64, kMaxGroup = 8;

template <typename T, int D>
__device__ void attend(const T* __restrict__ q, const T* __restrict__ k_cache,
                       const T* __restrict__ v_cache, const int* __restrict__ block_tables,
                       const int* __restrict__ seq_lens, const int* __restrict__ seq_slots,
                       float* __restrict__ partial, int batch, int q_heads, int kv_heads,
                       int block_size, int max_blocks, int split_tokens, int max_splits,
                       float scale) {
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
  __shared__ int phys[kTile];
  for (int i = tid; i < G * D; i += kThreads)
    qs[i / D][i % D] =
        rg::to_float(q[(static_cast<long long>(b) * q_heads + h * G + i / D) * D + i % D]) * qscale;
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

  for (int t0 = begin; t0 < end; t0 += kTile) {
    __syncthreads();  // qs ready / previous tile's ps and phys consumed
    if (tid < kTile) {
      const int t = t0 + tid;
      phys[tid] = t < end ? (block_tables[static_cast<long long>(slot) * max_blocks +
                                          t / block_size] * block_size + t % block_size)
                          : -1;
    }
    __syncthreads();
    {  // scores: token j, heads g = half, half + 2, ...
      const int j = tid % kTile, half = tid / kTile;
      const int p = phys[j];
      float s[kMaxGroup / 2];
#pragma unroll
      for (int r = 0; r < kMaxGroup / 2; ++r) s[r] = 0.f;
      if (p >= 0) {
        const T* kr = k_cache + p * row + static_cast<long long>(h) * D;
#pragma unroll 4
        for (int d = 0; d < D; d += 8) {
          const rg::Vec<T, 8> kv = rg::load<T, 8>(kr + d);
#pragma unroll
          for (int r = 0; r < kMaxGroup / 2; ++r) {
            const int g = half + 2 * r;
            if (g < G) {
#pragma unroll
              for (int e = 0; e < 8; ++e) s[r] = fmaf(qs[g][d + e], rg::to_float(kv.v[e]), s[r]);
            }
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kMaxGroup / 2; ++r) {
        const int g = half + 2 * r;
        if (g < G) ps[g][j] = p >= 0 ? s[r] : rg::neg_inf();
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
    {  // values: columns c8..c8+7, tokens tg, tg + kGroups, ...
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g)
        if (g < G) {
          const float a = alpha_s[g];
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[g][e] *= a;
        }
      for (int j = tg; j < kTile; j += kGroups) {
        const int p = phys[j];
        if (p < 0) break;  // tokens past the end come last
        const rg::Vec<T, 8> v =
            rg::load<T, 8>(v_cache + p * row + static_cast<long long>(h) * D + c8);
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
  // the token groups' sums meet in shared memory, added in a fixed order
  __shared__ float red[kGroups][kMaxGroup][D];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
    if (g < G) {
#pragma unroll
      for (int e = 0; e < 8; ++e) red[tg][g][c8 + e] = acc[g][e];
    }
  __syncthreads();
  for (int i = tid; i < G * D; i += kThreads) {
    const int g = i / D, col = i % D;
    float v = 0.f;
#pragma unroll
    for (int q = 0; q < kGroups; ++q) v += red[q][g][col];
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
  const int b = blockIdx.x / q_heads, head = blockIdx.x % q_heads, d = threadIdx.x;
  if (b >= batch || seq_slots[b] < 0 || d >= D) return;
  const float* p = partial + (static_cast<long long>(b) * q_heads + head) * max_splits * (D + 2);
  float m = rg::neg_inf();
  for (int s = 0; s < n_splits; ++s) m = fmaxf(m, p[s * (D + 2) + D]);
  float num = 0.f, den = 0.f;
  if (m != rg::neg_inf()) {
    for (int s = 0; s < n_splits; ++s) {
      const float w = exp2f(p[s * (D + 2) + D] - m);  // 0 for empty splits
      num += w * p[s * (D + 2) + d];
      den += w * p[s * (D + 2) + D + 1];
    }
  }
  out[(static_cast<long long>(b) * q_heads + head) * D + d] =
      rg::from_float<T>(den > 0.f ? num / den : 0.f);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(128) decode_attention_f16_d64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* seq_slots, float* partial, int batch, int q_heads,
    int kv_heads, int block_size, int max_blocks, int split_tokens, int max_splits,
    float scale) {
  attend<__half, 64>(q, k_cache, v_cache, block_tables, seq_lens, seq_slots, partial, batch,
                   q_heads, kv_heads, block_size, max_blocks, split_tokens, max_splits, scale);
}
extern "C" __global__ void decode_attention_combine_f16_d64(const float* partial, __half* out,
    const int* seq_slots, int batch, int q_heads, int n_splits, int max_splits) {
  combine<__half, 64>(partial, out, seq_slots, batch, q_heads, n_splits, max_splits);
}
extern "C" __global__ void __launch_bounds__(128) decode_attention_f16_d128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* seq_slots, float* partial, int batch, int q_heads,
    int kv_heads, int block_size, int max_blocks, int split_tokens, int max_splits,
    float scale) {
  attend<__half, 128>(q, k_cache, v_cache, block_tables, seq_lens, seq_slots, partial, batch,
                   q_heads, kv_heads, block_size, max_blocks, split_tokens, max_splits, scale);
}
extern "C" __global__ void decode_attention_combine_f16_d128(const float* partial, __half* out,
    const int* seq_slots, int batch, int q_heads, int n_splits, int max_splits) {
  combine<__half, 128>(partial, out, seq_slots, batch, q_heads, n_splits, max_splits);
}
extern "C" __global__ void __launch_bounds__(128) decode_attention_bf16_d64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache, const int* block_tables,
    const int* seq_lens, const int* seq_slots, float* partial, int batch, int q_heads,
    int kv_heads, int block_size, int max_blocks, int split_tokens, int max_splits,
    float scale) {
  attend<__nv_bfloat16, 64>(q, k_cache, v_cache, block_tables, seq_lens, seq_slots, partial, batch,
                   q_heads, kv_heads, block_size, max_blocks, split_tokens, max_splits, scale);
}
extern "C" __global__ void decode_attention_combine_bf16_d64(const float* partial, __nv_bfloat16* out,
    const int* seq_slots, int batch, int q_heads, int n_splits, int max_splits) {
  combine<__nv_bfloat16, 64>(partial, out, seq_slots, batch, q_heads, n_splits, max_splits);
}
extern "C" __global__ void __launch_bounds__(128) decode_attention_bf16_d128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache, const int* block_tables,
    const int* seq_lens, const int* seq_slots, float* partial, int batch, int q_heads,
    int kv_heads, int block_size, int max_blocks, int split_tokens, int max_splits,
    float scale) {
  attend<__nv_bfloat16, 128>(q, k_cache, v_cache, block_tables, seq_lens, seq_slots, partial, batch,
                   q_heads, kv_heads, block_size, max_blocks, split_tokens, max_splits, scale);
}
extern "C" __global__ void decode_attention_combine_bf16_d128(const float* partial, __nv_bfloat16* out,
    const int* seq_slots, int batch, int q_heads, int n_splits, int max_splits) {
  combine<__nv_bfloat16, 128>(partial, out, seq_slots, batch, q_heads, n_splits, max_splits);
}
