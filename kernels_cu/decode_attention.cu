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
//       int max_splits, int min_split, float scale, int q_stride)
//   grid (batch * kv_heads, n_splits), block (128), dynamic shared memory decode_smem(D).
//   Each row cuts its own context into splits whatever the other rows' lengths, each a
//   multiple of 64 tokens (a block's 4 warps x 16): up to kShortSplits * kLongSplit tokens
//   into at most kShortSplits splits (len / kShortSplits rounded up; short rows take
//   ceil(len / 64) splits of 64), longer rows into splits of at least kLongSplit tokens, as
//   many as max_splits allows (len / max_splits rounded up). A row on its own is bound by
//   latency up to a few thousand tokens (more splits there only add partials to combine);
//   past that, splits are what keeps the SMs busy. With max_splits <= kShortSplits every
//   row takes len / max_splits. No split is shorter than min_split tokens (0: no bound; with
//   max_splits fixed by the longest context, a split length that keeps a row's splits its
//   own and few at every batch: ops.attention.fixed_splits). n_splits
//   must cover every row's splits (ops.attention: grid_splits); blocks past a row's splits
//   write an empty result. Block (b, h, s) reads split s of sequence b (tokens
//   [s * split, min((s + 1) * split, len))) once for all G = q_heads / kv_heads query heads
//   of kv head h (G <= 16), on tensor cores: the G query rows (zero-padded to 16) are the A
//   operand of mma.m16n8k16.
//   The split is cut into chunks of 16 tokens; warp w takes chunks w, w + 4, ... and runs its
//   own flash-attention over them: S = Q K^T (K via ldmatrix), the running row max and sum in
//   base 2, P packed to T in registers as the A operand of O += P V (V via ldmatrix.trans).
//   Each warp streams its chunks through its own ring of kStages K/V buffers filled by
//   cp.async (gathered through the block table, 16-byte pieces, zero past the end; one table
//   lookup per chunk when block_size % 16 == 0, else one per token), so the
//   warps never wait for each other inside the loop and kStages - 1 chunks per warp are in
//   flight. At the end the 4 warps' (max, sum, accumulator) meet in shared memory in a fixed
//   order, and the block writes (m, l, unnormalised accumulator) per head; an empty split
//   writes m = -inf, l = 0.
//   Under PDL this kernel may start while the projection ahead of it still writes q and
//   the newest token's K/V: it reads the lengths, tables and slots (written before the
//   step's first kernel, which launches plainly) and requests the K/V of every older token
//   before its wait, q and the newest token's chunk after it, with coherent loads.
//
//   extern "C" decode_attention_combine_{f16,bf16}_d{64,128}(
//       const float* partial, T* out,   // out: (batch, q_heads, D)
//       const int* seq_slots, int batch, int q_heads, int n_splits, int max_splits)
//   grid (batch * q_heads), block (D), dynamic shared memory 4 * max_splits B:
//   out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s; the splits' maxima and weights are
//   read and computed in parallel, the sums run in split order. The kernel is a chain of
//   dependent loads, so each thread requests its column of 16 splits, their sums, one split's
//   max and the row's slot all at once, before looking at any of them: one round trip to L2
//   for up to 16 splits (the loop it replaced paid one per 4 splits, plus the slot's).
//   A sequence of length 0 gives zeros; padding rows are not written.
//
//   Graph use: lengths, tables and slots are read from device memory, and each row's split
//   length follows from its length and max_splits alone, so results do not depend on
//   n_splits (grid.y of both kernels, n_splits of the combine): it is patchable, from the
//   longest context, to keep short contexts on few blocks as sequences grow.
#include <mma.cuh>

namespace {

constexpr int kThreads = 128, kWarps = kThreads / 32, kChunk = 16;
// the split rule (ops/attention.py SHORT_SPLITS, LONG_SPLIT): see the header
constexpr int kShortSplits = 16, kLongSplit = 256;
constexpr float kLog2e = 1.4426950408889634f;

// K/V chunks in flight per warp (+1 being used): 50 KB of shared memory per block for D = 64
// (4 blocks per SM), 100 KB for D = 128 (2 blocks per SM). At D = 64, 4 stages (3 blocks an
// SM) were slower at the best split count of every shape measured (benchmarks/NOTES.md,
// "Decode attention").
template <int D> constexpr __host__ __device__ int stages() { return 3; }

// rows of D * 2 bytes, 16-byte piece index XOR row % 8: the 8 rows of an ldmatrix phase hit
// 8 different bank groups
template <int D> __device__ __forceinline__ int swz(int row, int piece) {
  return row * (D * 2) + ((piece ^ (row & 7)) << 4);
}

template <typename T, int D>
__device__ void attend(const T* q, const T* k_cache, const T* v_cache, const int* block_tables,
                       const int* seq_lens, const int* seq_slots, float* partial, int batch,
                       int q_heads, int kv_heads, int block_size, int max_blocks,
                       int max_splits, int min_split, float scale, int q_stride) {
  rg::pdl_trigger();  // K/V of all but the newest token are requested before the wait (below)
  constexpr int RC = D / 8, S = stages<D>(), kBytes = kChunk * D * 2;  // one K or V chunk
  extern __shared__ __align__(128) char smem[];
  char* qs = smem;                // 16 x D: the group's query rows, zero-padded
  char* ring = smem + 16 * D * 2;  // [warp][stage][K | V]
  const int b = blockIdx.x / kv_heads, h = blockIdx.x % kv_heads, split = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (b >= batch) return;
  const int slot = seq_slots[b];
  if (slot < 0) return;
  const int G = q_heads / kv_heads;
  const int len = seq_lens[slot];
  const int per = max(max((len + max_splits - 1) / max_splits,  // this row's split length
                          min((len + kShortSplits - 1) / kShortSplits, kLongSplit)),
                      min_split);
  const int split_len = (per + kWarps * kChunk - 1) / (kWarps * kChunk) * (kWarps * kChunk);
  const int begin = min(split * split_len, len), end = min(begin + split_len, len);
  const int row_stride = kv_heads * D;
  const int* table = block_tables + static_cast<long long>(slot) * max_blocks;

  char* mine = ring + warp * S * 2 * kBytes;
  const int chunks = begin < end ? (end - begin + kChunk - 1) / kChunk : 0;
  const int n = chunks > warp ? (chunks - warp + kWarps - 1) / kWarps : 0;  // this warp's
  // element offset of token t's row of head h in the cache
  auto row_at = [&](int t) {
    return (static_cast<long long>(table[t / block_size]) * block_size + t % block_size) *
           row_stride + h * D;
  };
  // Chunks start at multiples of 16 (splits are 64-aligned), so when block_size is a
  // multiple of 16 a chunk's tokens share one cache block and one lookup places them all.
  // Looking the block up per 16-byte piece (a division, a load and a 64-bit multiply each)
  // left the kernel issue-bound: 78 -> 90% of the copy bandwidth at 8B heads, B=8 ctx 4096.
  const bool whole = block_size % kChunk == 0;
  // this lane's pieces of a chunk: 16-byte column pcol of rows prow, prow + kStep, ...
  constexpr int kPer = kChunk * RC / 32, kStep = 32 / RC;
  const int prow = lane / RC, pcol = lane % RC;
  auto load = [&](int i, int stage) {  // this warp's i-th chunk into `stage`
    char* ks = mine + stage * 2 * kBytes;
    const int t0 = begin + (warp + i * kWarps) * kChunk;
    long long at[kPer];
    if (whole) {
      const long long base = row_at(t0) + pcol * 8;
#pragma unroll
      for (int u = 0; u < kPer; ++u)
        at[u] = base + static_cast<long long>(prow + kStep * u) * row_stride;
    } else {
#pragma unroll
      for (int u = 0; u < kPer; ++u) {
        const int t = t0 + prow + kStep * u;
        at[u] = t < end ? row_at(t) + pcol * 8 : 0;
      }
    }
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int r = prow + kStep * u;
      const bool ok = t0 + r < end;
      rg::cp_async16(ks + swz<D>(r, pcol), k_cache + (ok ? at[u] : 0), ok);
      rg::cp_async16(ks + kBytes + swz<D>(r, pcol), v_cache + (ok ? at[u] : 0), ok);
    }
  };
  // Before the PDL wait: the lengths, tables and slots were written before this step's
  // first kernel started (it launches plainly), and every cached token but the newest
  // (len - 1, appended by the QKV projection this kernel follows) by earlier steps. So the
  // first S - 1 chunks are requested now, but the one holding the newest token, which
  // follows the wait in a group of its own (`late`): launched in the chain, attention's
  // first bytes are in flight while the projection ends.
  int late = -1;  // the warp's chunk (< S - 1) that holds token len - 1, if any
#pragma unroll
  for (int i = 0; i < S - 1; ++i) {
    if (i < n) {
      const int t0 = begin + (warp + i * kWarps) * kChunk;
      if (min(t0 + kChunk, end) < len) load(i, i);
      else late = i;
    }
    rg::cp_async_commit();
  }
  rg::pdl_wait();
  if (late >= 0) {
    load(late, late);
    rg::cp_async_commit();
  }
  for (int i = tid; i < 16 * RC; i += kThreads) {  // the group's query rows, zero-padded
    const int r = i / RC, c = i % RC;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < G)  // a plain (coherent) load: the projection wrote q
      v = *reinterpret_cast<const uint4*>(q + static_cast<long long>(b) * q_stride +
                                          (h * G + r) * D + c * 8);
    *reinterpret_cast<uint4*>(qs + swz<D>(r, c)) = v;
  }
  __syncthreads();
  unsigned qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    rg::ldmatrix_x4(qf[kk], qs + swz<D>((lane & 7) + ((lane >> 3) & 1) * 8, kk * 2 + (lane >> 4)));

  float o[D / 8][4] = {};
  float m[2] = {rg::neg_inf(), rg::neg_inf()}, l[2] = {0.f, 0.f};
  const float scale2 = scale * kLog2e;
  const int g = lane >> 2, c2 = (lane & 3) * 2;
  for (int i = 0; i < n; ++i) {
    if (i + S - 1 < n) load(i + S - 1, (i + S - 1) % S);  // the stage chunk i - 1 used
    rg::cp_async_commit();
    if (i == late)  // the newest token's chunk: its group came after the others
      rg::cp_async_wait<0>();
    else
      rg::cp_async_wait<S - 1>();  // chunk i landed (this lane's pieces) ...
    __syncwarp();                  // ... and every lane's
    const char* ks = mine + (i % S) * 2 * kBytes;
    const char* vs = ks + kBytes;

    float s[2][4] = {};  // S = Q K^T: 16 rows x 16 tokens
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      unsigned kb[4];
      rg::ldmatrix_x4(kb, ks + swz<D>((lane & 7) + (lane >> 4) * 8, kk * 2 + ((lane >> 3) & 1)));
      rg::mma_16816<T>(s[0], qf[kk], kb[0], kb[1]);
      rg::mma_16816<T>(s[1], qf[kk], kb[2], kb[3]);
    }
    const int t0 = begin + (warp + i * kWarps) * kChunk;
    const bool edge = t0 + kChunk > end;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {  // rows g and g + 8
      float mx = m[hh];
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float v = s[j][2 * hh + e] * scale2;
          if (edge && t0 + j * 8 + c2 + e >= end) v = rg::neg_inf();
          s[j][2 * hh + e] = v;
          mx = fmaxf(mx, v);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));  // finite: the chunk has a token
      const float alpha = exp2f(m[hh] - mx);                 // 0 on the first chunk
      m[hh] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = exp2f(s[j][2 * hh + e] - mx);
          s[j][2 * hh + e] = p;
          sum += p;
        }
      l[hh] = l[hh] * alpha + sum;  // this lane's columns; the quad's meet at the end
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        o[d][2 * hh] *= alpha;
        o[d][2 * hh + 1] *= alpha;
      }
    }
    const unsigned a[4] = {rg::pack2<T>(s[0][0], s[0][1]), rg::pack2<T>(s[0][2], s[0][3]),
                           rg::pack2<T>(s[1][0], s[1][1]), rg::pack2<T>(s[1][2], s[1][3])};
#pragma unroll
    for (int d = 0; d < D / 16; ++d) {  // O += P V
      unsigned vb[4];
      rg::ldmatrix_x4_trans(vb, vs + swz<D>((lane & 7) + ((lane >> 3) & 1) * 8, d * 2 + (lane >> 4)));
      rg::mma_16816<T>(o[2 * d], a, vb[0], vb[1]);
      rg::mma_16816<T>(o[2 * d + 1], a, vb[2], vb[3]);
    }
    __syncwarp();  // a later iteration refills this stage
  }

  // the warps meet in shared memory (the rings' bytes), in warp order
  __syncthreads();
  float* red_o = reinterpret_cast<float*>(ring);  // [warp][16][D]
  float* red_m = red_o + kWarps * 16 * D;         // [warp][16]
  float* red_l = red_m + kWarps * 16;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = g + 8 * hh;
    float sum = l[hh];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if ((lane & 3) == 0) {
      red_m[warp * 16 + r] = m[hh];
      red_l[warp * 16 + r] = sum;
    }
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      red_o[(warp * 16 + r) * D + d * 8 + c2] = o[d][2 * hh];
      red_o[(warp * 16 + r) * D + d * 8 + c2 + 1] = o[d][2 * hh + 1];
    }
  }
  __syncthreads();
  for (int i = tid; i < G * D; i += kThreads) {
    const int r = i / D, col = i % D;
    float mx = rg::neg_inf();
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, red_m[w * 16 + r]);
    float acc = 0.f, sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = red_m[w * 16 + r];
      const float f = mw == rg::neg_inf() ? 0.f : exp2f(mw - mx);  // a warp with no chunk
      acc = fmaf(f, red_o[(w * 16 + r) * D + col], acc);
      sum = fmaf(f, red_l[w * 16 + r], sum);
    }
    float* out = partial + ((static_cast<long long>(b) * q_heads + h * G + r) * max_splits +
                            split) * (D + 2);
    out[col] = acc;
    if (col == 0) {
      out[D] = mx;  // -inf for an empty split
      out[D + 1] = sum;
    }
  }
}

template <typename T, int D>
__device__ void combine(const float* partial, T* out, const int* seq_slots, int batch,
                        int q_heads, int n_splits, int max_splits) {
  constexpr int kAhead = 16;  // splits whose values each thread requests at once
  rg::pdl_start();
  extern __shared__ float w[];  // (max_splits,): each split's weight 2^(m_s - M)
  __shared__ float red[D / 32];
  const int b = blockIdx.x / q_heads, head = blockIdx.x % q_heads, d = threadIdx.x;
  if (b >= batch) return;
  const float* p = partial + (static_cast<long long>(b) * q_heads + head) * max_splits * (D + 2);
  // every load in flight at once: the row's slot, this thread's column and the sums of the
  // first kAhead splits, and split d's max (one round trip, not one per split and the slot's)
  const bool padding = seq_slots[b] < 0;  // its partials are stale: read, never used
  float acc[kAhead], sum[kAhead];
#pragma unroll
  for (int j = 0; j < kAhead; ++j) {
    acc[j] = j < n_splits ? p[j * (D + 2) + d] : 0.f;
    sum[j] = j < n_splits ? p[j * (D + 2) + D + 1] : 0.f;
  }
  const float mine = d < n_splits ? p[d * (D + 2) + D] : rg::neg_inf();
  if (padding) return;
  float m = mine;
  for (int s = d + D; s < n_splits; s += D) m = fmaxf(m, p[s * (D + 2) + D]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((d & 31) == 0) red[d >> 5] = m;
  __syncthreads();
  m = red[0];
#pragma unroll
  for (int i = 1; i < D / 32; ++i) m = fmaxf(m, red[i]);
  for (int s = d; s < n_splits; s += D)  // 0 for empty splits (m_s = -inf)
    w[s] = m == rg::neg_inf() ? 0.f : exp2f((s == d ? mine : p[s * (D + 2) + D]) - m);
  __syncthreads();
  float num = 0.f, den = 0.f;  // in split order: deterministic
#pragma unroll
  for (int j = 0; j < kAhead; ++j)
    if (j < n_splits) {
      num = fmaf(w[j], acc[j], num);
      den = fmaf(w[j], sum[j], den);
    }
  for (int s0 = kAhead; s0 < n_splits; s0 += kAhead) {
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const int s = s0 + j;
      acc[j] = s < n_splits ? p[s * (D + 2) + d] : 0.f;
      sum[j] = s < n_splits ? p[s * (D + 2) + D + 1] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j)
      if (s0 + j < n_splits) {
        num = fmaf(w[s0 + j], acc[j], num);
        den = fmaf(w[s0 + j], sum[j], den);
      }
  }
  out[(static_cast<long long>(b) * q_heads + head) * D + d] =
      rg::from_float<T>(den > 0.f ? num / den : 0.f);
}

}  // namespace

// ---- generated by rawgraph/ops/generate.py (python -m rawgraph.ops.generate); do not edit
extern "C" __global__ void __launch_bounds__(128)
decode_attention_f16_d64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* seq_slots, float* partial, int batch, int q_heads, int kv_heads,
    int block_size, int max_blocks, int max_splits, int min_split, float scale, int q_stride) {
  attend<__half, 64>(q, k_cache, v_cache, block_tables, seq_lens, seq_slots, partial, batch,
      q_heads, kv_heads, block_size, max_blocks, max_splits, min_split, scale, q_stride);
}
extern "C" __global__ void
decode_attention_combine_f16_d64(
    const float* partial, __half* out, const int* seq_slots, int batch, int q_heads, int n_splits,
    int max_splits) {
  combine<__half, 64>(partial, out, seq_slots, batch, q_heads, n_splits, max_splits);
}
extern "C" __global__ void __launch_bounds__(128)
decode_attention_f16_d128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* seq_slots, float* partial, int batch, int q_heads, int kv_heads,
    int block_size, int max_blocks, int max_splits, int min_split, float scale, int q_stride) {
  attend<__half, 128>(q, k_cache, v_cache, block_tables, seq_lens, seq_slots, partial, batch,
      q_heads, kv_heads, block_size, max_blocks, max_splits, min_split, scale, q_stride);
}
extern "C" __global__ void
decode_attention_combine_f16_d128(
    const float* partial, __half* out, const int* seq_slots, int batch, int q_heads, int n_splits,
    int max_splits) {
  combine<__half, 128>(partial, out, seq_slots, batch, q_heads, n_splits, max_splits);
}
extern "C" __global__ void __launch_bounds__(128)
decode_attention_bf16_d64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* seq_slots, float* partial, int batch,
    int q_heads, int kv_heads, int block_size, int max_blocks, int max_splits, int min_split,
    float scale, int q_stride) {
  attend<__nv_bfloat16, 64>(q, k_cache, v_cache, block_tables, seq_lens, seq_slots, partial, batch,
      q_heads, kv_heads, block_size, max_blocks, max_splits, min_split, scale, q_stride);
}
extern "C" __global__ void
decode_attention_combine_bf16_d64(
    const float* partial, __nv_bfloat16* out, const int* seq_slots, int batch, int q_heads,
    int n_splits, int max_splits) {
  combine<__nv_bfloat16, 64>(partial, out, seq_slots, batch, q_heads, n_splits, max_splits);
}
extern "C" __global__ void __launch_bounds__(128)
decode_attention_bf16_d128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* seq_slots, float* partial, int batch,
    int q_heads, int kv_heads, int block_size, int max_blocks, int max_splits, int min_split,
    float scale, int q_stride) {
  attend<__nv_bfloat16, 128>(q, k_cache, v_cache, block_tables, seq_lens, seq_slots, partial, batch,
      q_heads, kv_heads, block_size, max_blocks, max_splits, min_split, scale, q_stride);
}
extern "C" __global__ void
decode_attention_combine_bf16_d128(
    const float* partial, __nv_bfloat16* out, const int* seq_slots, int batch, int q_heads,
    int n_splits, int max_splits) {
  combine<__nv_bfloat16, 128>(partial, out, seq_slots, batch, q_heads, n_splits, max_splits);
}
