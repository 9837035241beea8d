// rope_append.cu: RoPE and the KV-cache append of new tokens in one pass (rope.cu followed by
// kv_append.cu, without the second kernel's launch, wait and reload of k).
//
//   extern "C" rope_append_f16 / rope_append_bf16(
//       T* q,                             // (n, q_heads, D), rotated in place; token t's
//                                         // heads at q + t * q_stride
//       const T* k_new, const T* v_new,   // (n, kv_heads * D), token t at + t * kv_stride
//       T* k_cache, T* v_cache,           // (num_blocks, block_size, kv_heads * D): one layer
//       const int* block_tables,          // (max_seqs, max_blocks)
//       const int* seq_slots,             // (n,) sequence slot of each token; < 0: padding
//       const int* positions,             // (n,) position of each token in its sequence
//       const float* inv_freq,            // (D / 2,)
//       int n, int q_heads, int kv_heads, int head_dim, int q_stride, int kv_stride,
//       int block_size, int max_blocks,
//       const T* bias,                    // (q_heads * D + 2 kv_heads * D): q, k, v's; or null
//       const T* qk_norm,                 // (2 D): q's then k's head norm weights; or null
//       float norm_eps)
//   With a bias, each value of q, k and v is first rounded(value + bias) (the projection
//   rounded to T, then its bias: Qwen2); with qk_norm each head of q and k is then RMS-
//   normalized over its D values as Hugging Face's RMSNorm does it (fp32 sum of squares,
//   x * rsqrt(mean + eps) rounded to T, times the weight, rounded: Qwen3), before RoPE.
//   q is rotated as rope.cu does it; k is rotated the same way into the cache (k_new itself
//   is left as it was), v copied: token t lands in block block_tables[seq_slots[t]]
//   [positions[t] / block_size], offset positions[t] % block_size, as kv_append.cu places it.
//   Padding tokens (slot < 0) and unmapped blocks (< 0) write nothing to the cache.
//   grid (n), block (256): the block's token's angles once (a thread a pair, into shared
//   memory), then a thread per piece of P pairs of one head of q or k (P = 8 where D % 16 == 0,
//   else 4: 16- or 8-byte loads of both halves), then 16-byte pieces of v. D <= 512, D % 8 == 0.
//   With a bias or norm a second path runs: a pass over the pieces adds the bias and sums
//   each piece's squares into shared memory, then each head's sum is taken in piece order
//   (the same bits every launch), then the pieces are loaded again, finished and rotated;
//   (q_heads + kv_heads) * D / (2 P) <= 1024 pieces.
//   Patchable: n with grid.x (grid.x == n <= rows of q); positions, slots and tables come from
//   device memory.
#include <common.cuh>

// A thread a piece of P pairs of one head: 16-byte accesses, and a thread's loads wait on no
// store of another head (a thread a pair, walking heads, had each head's loads behind the
// last head's stores, which may alias them: 2.0-2.4 TB/s on prefill's 8,192-token appends).
// A thread's first piece of q or k and its piece of v are loaded before anything else: they
// need neither the token's slot nor its position. The math per element is rg::rope_angle's
// and rg::rotate's, as on every path: the same bits.
template <typename T, int P>
__device__ void rope_append_pieces(T* q, const T* k_new, const T* v_new, T* k_cache,
                                   T* v_cache, const int* block_tables, const int* seq_slots,
                                   const int* positions, const float* inv_freq,
                                   float* angles_s, float* angles_c, int t,
                                   int q_heads, int kv_heads, int head_dim, int q_stride,
                                   int kv_stride, int block_size, int max_blocks) {
  const int half = head_dim / 2, per_head = half / P, units = (q_heads + kv_heads) * per_head;
  const int row = kv_heads * head_dim;
  const long long src = static_cast<long long>(t) * kv_stride;
  T* q_row = q + static_cast<long long>(t) * q_stride;
  // unit u: pairs [i, i + P) of head u / per_head, q's heads first, then k's
  auto from = [&](int u) -> const T* {
    const int head = u / per_head, i = (u % per_head) * P;
    const T* h = head < q_heads ? q_row + head * head_dim
                                : k_new + src + (head - q_heads) * head_dim;
    return h + i;
  };
  int u = threadIdx.x;
  const int j = 8 * threadIdx.x;
  rg::Vec<T, P> a, b;
  rg::Vec<T, 8> v;
  if (u < units) {
    a = rg::load<T, P>(from(u));
    b = rg::load<T, P>(from(u) + half);
  }
  if (j < row) v = rg::load<T, 8>(v_new + src + j);

  const int seq = seq_slots[t], pos = positions[t];
  int block = -1;  // the cache block this token lands in; < 0: none
  if (seq >= 0 && pos >= 0 && pos < block_size * max_blocks)
    block = block_tables[static_cast<long long>(seq) * max_blocks + pos / block_size];
  const long long dst = (static_cast<long long>(block) * block_size + pos % block_size) * row;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float sin_i, cos_i;
    rg::rope_angle(pos, inv_freq[i], sin_i, cos_i);
    angles_s[i] = sin_i;
    angles_c[i] = cos_i;
  }
  __syncthreads();

  for (; u < units; u += blockDim.x) {
    const int head = u / per_head, i = (u % per_head) * P;
    if (head >= q_heads && block < 0) break;  // k heads come last; this token has no cache
    if (u != static_cast<int>(threadIdx.x)) {
      a = rg::load<T, P>(from(u));
      b = rg::load<T, P>(from(u) + half);
    }
    rg::Vec<T, P> x, y;
#pragma unroll
    for (int k = 0; k < P; ++k)
      rg::rotate(rg::to_float(a.v[k]), rg::to_float(b.v[k]), angles_c[i + k], angles_s[i + k],
                 x.v[k], y.v[k]);
    T* to = (head < q_heads ? q_row + head * head_dim
                            : k_cache + dst + (head - q_heads) * head_dim) + i;
    rg::store<T, P>(to, x);
    rg::store<T, P>(to + half, y);
  }
  if (block < 0) return;
  if (j < row) rg::store<T, 8>(v_cache + dst + j, v);
  for (int jj = j + 8 * blockDim.x; jj < row; jj += 8 * blockDim.x)
    rg::store<T, 8>(v_cache + dst + jj, rg::load<T, 8>(v_new + src + jj));
}

// a piece's pairs plus their biases (at: the first pair's index in the bias), rounded to T
template <typename T, int P>
__device__ __forceinline__ void add_bias(rg::Vec<T, P>& a, rg::Vec<T, P>& b, const T* bias,
                                       int at, int half) {
#pragma unroll
  for (int k = 0; k < P; ++k) {
    a.v[k] = rg::from_float<T>(rg::to_float(a.v[k]) + rg::to_float(bias[at + k]));
    b.v[k] = rg::from_float<T>(rg::to_float(b.v[k]) + rg::to_float(bias[at + half + k]));
  }
}

template <typename T, int P>
__device__ void rope_append_finished(T* q, const T* k_new, const T* v_new, T* k_cache,
                                     T* v_cache, const int* block_tables, const int* seq_slots,
                                     const int* positions, const float* inv_freq,
                                     float* angles_s, float* angles_c, int t, int q_heads,
                                     int kv_heads, int head_dim, int q_stride, int kv_stride,
                                     int block_size, int max_blocks, const T* bias,
                                     const T* qk_norm, float norm_eps) {
  __shared__ float squares[1024], inv_rms[256];  // per piece, then per head
  const int half = head_dim / 2, per_head = half / P, units = (q_heads + kv_heads) * per_head;
  const int row = kv_heads * head_dim, q_size = q_heads * head_dim;
  const long long src = static_cast<long long>(t) * kv_stride;
  T* q_row = q + static_cast<long long>(t) * q_stride;
  auto piece = [&](int u, rg::Vec<T, P>& a, rg::Vec<T, P>& b) {  // loaded, bias added
    const int head = u / per_head, i = (u % per_head) * P;
    const T* h = head < q_heads ? q_row + head * head_dim
                                : k_new + src + (head - q_heads) * head_dim;
    a = rg::load<T, P>(h + i);
    b = rg::load<T, P>(h + i + half);
    if (bias != nullptr) add_bias(a, b, bias, head * head_dim + i, half);
  };
  const int seq = seq_slots[t], pos = positions[t];
  int block = -1;
  if (seq >= 0 && pos >= 0 && pos < block_size * max_blocks)
    block = block_tables[static_cast<long long>(seq) * max_blocks + pos / block_size];
  const long long dst = (static_cast<long long>(block) * block_size + pos % block_size) * row;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float sin_i, cos_i;
    rg::rope_angle(pos, inv_freq[i], sin_i, cos_i);
    angles_s[i] = sin_i;
    angles_c[i] = cos_i;
  }
  if (qk_norm != nullptr) {
    for (int u = threadIdx.x; u < units; u += blockDim.x) {
      rg::Vec<T, P> a, b;
      piece(u, a, b);
      float s = 0.f;
#pragma unroll
      for (int k = 0; k < P; ++k) s = fmaf(rg::to_float(a.v[k]), rg::to_float(a.v[k]), s);
#pragma unroll
      for (int k = 0; k < P; ++k) s = fmaf(rg::to_float(b.v[k]), rg::to_float(b.v[k]), s);
      squares[u] = s;
    }
    __syncthreads();
    for (int h = threadIdx.x; h < q_heads + kv_heads; h += blockDim.x) {
      float s = 0.f;
      for (int j = 0; j < per_head; ++j) s += squares[h * per_head + j];
      inv_rms[h] = rsqrtf(s / static_cast<float>(head_dim) + norm_eps);
    }
  }
  __syncthreads();  // every piece read before any is written back (q is rotated in place)

  for (int u = threadIdx.x; u < units; u += blockDim.x) {
    const int head = u / per_head, i = (u % per_head) * P;
    if (head >= q_heads && block < 0) break;  // k heads come last; this token has no cache
    rg::Vec<T, P> a, b;
    piece(u, a, b);
    if (qk_norm != nullptr) {
      const T* wt = qk_norm + (head < q_heads ? 0 : head_dim) + i;
      const float r = inv_rms[head];
#pragma unroll
      for (int k = 0; k < P; ++k) {
        a.v[k] = rg::from_float<T>(rg::to_float(rg::from_float<T>(rg::to_float(a.v[k]) * r)) *
                                   rg::to_float(wt[k]));
        b.v[k] = rg::from_float<T>(rg::to_float(rg::from_float<T>(rg::to_float(b.v[k]) * r)) *
                                   rg::to_float(wt[half + k]));
      }
    }
    rg::Vec<T, P> x, y;
#pragma unroll
    for (int k = 0; k < P; ++k)
      rg::rotate(rg::to_float(a.v[k]), rg::to_float(b.v[k]), angles_c[i + k], angles_s[i + k],
                 x.v[k], y.v[k]);
    T* to = (head < q_heads ? q_row + head * head_dim
                            : k_cache + dst + (head - q_heads) * head_dim) + i;
    rg::store<T, P>(to, x);
    rg::store<T, P>(to + half, y);
  }
  if (block < 0) return;
  for (int j = 8 * threadIdx.x; j < row; j += 8 * blockDim.x) {
    rg::Vec<T, 8> v = rg::load<T, 8>(v_new + src + j);
    if (bias != nullptr) {
#pragma unroll
      for (int k = 0; k < 8; ++k)
        v.v[k] = rg::from_float<T>(rg::to_float(v.v[k]) +
                                   rg::to_float(bias[q_size + row + j + k]));
    }
    rg::store<T, 8>(v_cache + dst + j, v);
  }
}

template <typename T>
__device__ void rope_append_impl(T* q, const T* k_new, const T* v_new, T* k_cache, T* v_cache,
                                 const int* block_tables, const int* seq_slots,
                                 const int* positions, const float* __restrict__ inv_freq,
                                 int n, int q_heads, int kv_heads, int head_dim, int q_stride,
                                 int kv_stride, int block_size, int max_blocks, const T* bias,
                                 const T* qk_norm, float norm_eps) {
  __shared__ float angles_s[256], angles_c[256];  // the token's angle of each pair
  rg::pdl_start();
  const int t = blockIdx.x;
  if (t >= n) return;  // the whole block: no barrier follows
  if (bias != nullptr || qk_norm != nullptr) {
    if (head_dim % 16 == 0)
      rope_append_finished<T, 8>(q, k_new, v_new, k_cache, v_cache, block_tables, seq_slots,
                                 positions, inv_freq, angles_s, angles_c, t, q_heads,
                                 kv_heads, head_dim, q_stride, kv_stride, block_size,
                                 max_blocks, bias, qk_norm, norm_eps);
    else
      rope_append_finished<T, 4>(q, k_new, v_new, k_cache, v_cache, block_tables, seq_slots,
                                 positions, inv_freq, angles_s, angles_c, t, q_heads,
                                 kv_heads, head_dim, q_stride, kv_stride, block_size,
                                 max_blocks, bias, qk_norm, norm_eps);
  } else if (head_dim % 16 == 0)
    rope_append_pieces<T, 8>(q, k_new, v_new, k_cache, v_cache, block_tables, seq_slots,
                             positions, inv_freq, angles_s, angles_c, t, q_heads, kv_heads,
                             head_dim, q_stride, kv_stride, block_size, max_blocks);
  else
    rope_append_pieces<T, 4>(q, k_new, v_new, k_cache, v_cache, block_tables, seq_slots,
                             positions, inv_freq, angles_s, angles_c, t, q_heads, kv_heads,
                             head_dim, q_stride, kv_stride, block_size, max_blocks);
}

extern "C" __global__ void rope_append_f16(__half* q, const __half* k_new, const __half* v_new,
                                           __half* k_cache, __half* v_cache,
                                           const int* block_tables, const int* seq_slots,
                                           const int* positions, const float* inv_freq, int n,
                                           int q_heads, int kv_heads, int head_dim,
                                           int q_stride, int kv_stride, int block_size,
                                           int max_blocks, const __half* bias,
                                           const __half* qk_norm, float norm_eps) {
  rope_append_impl(q, k_new, v_new, k_cache, v_cache, block_tables, seq_slots, positions,
                   inv_freq, n, q_heads, kv_heads, head_dim, q_stride, kv_stride, block_size,
                   max_blocks, bias, qk_norm, norm_eps);
}
extern "C" __global__ void rope_append_bf16(__nv_bfloat16* q, const __nv_bfloat16* k_new,
                                            const __nv_bfloat16* v_new,
                                            __nv_bfloat16* k_cache, __nv_bfloat16* v_cache,
                                            const int* block_tables, const int* seq_slots,
                                            const int* positions, const float* inv_freq, int n,
                                            int q_heads, int kv_heads, int head_dim,
                                            int q_stride, int kv_stride, int block_size,
                                            int max_blocks, const __nv_bfloat16* bias,
                                            const __nv_bfloat16* qk_norm, float norm_eps) {
  rope_append_impl(q, k_new, v_new, k_cache, v_cache, block_tables, seq_slots, positions,
                   inv_freq, n, q_heads, kv_heads, head_dim, q_stride, kv_stride, block_size,
                   max_blocks, bias, qk_norm, norm_eps);
}
