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
//       int block_size, int max_blocks)
//   q is rotated as rope.cu does it; k is rotated the same way into the cache (k_new itself
//   is left as it was), v copied: token t lands in block block_tables[seq_slots[t]]
//   [positions[t] / block_size], offset positions[t] % block_size, as kv_append.cu places it.
//   Padding tokens (slot < 0) and unmapped blocks (< 0) write nothing to the cache.
//   grid (n), block (256): thread (g, i) computes the angle of pair i once and rotates it in
//   heads g, g + 256 / (D/2), ... of q and k; then 16-byte pieces of v. D <= 512, D % 8 == 0.
//   Patchable: n with grid.x (grid.x == n <= rows of q); positions, slots and tables come from
//   device memory.
#include <common.cuh>

template <typename T>
__device__ void rope_append_impl(T* q, const T* k_new, const T* v_new, T* k_cache, T* v_cache,
                                 const int* block_tables, const int* seq_slots,
                                 const int* positions, const float* __restrict__ inv_freq,
                                 int n, int q_heads, int kv_heads, int head_dim, int q_stride,
                                 int kv_stride, int block_size, int max_blocks) {
  rg::pdl_start();
  const int t = blockIdx.x;
  if (t >= n) return;
  const int seq = seq_slots[t], pos = positions[t];
  int block = -1;  // the cache block this token lands in; < 0: none
  if (seq >= 0 && pos >= 0 && pos < block_size * max_blocks)
    block = block_tables[static_cast<long long>(seq) * max_blocks + pos / block_size];
  const int row = kv_heads * head_dim;
  const long long dst = (static_cast<long long>(block) * block_size + pos % block_size) * row;
  const long long src = static_cast<long long>(t) * kv_stride;

  const int half = head_dim / 2;
  const int groups = blockDim.x / half;  // threads (g, i): pair i of heads g, g + groups, ...
  const int g = threadIdx.x / half, i = threadIdx.x % half;
  if (g < groups) {
    float s, c;  // one angle per thread, shared by all the heads it rotates
    rg::rope_angle(pos, inv_freq[i], s, c);
    for (int head = g; head < q_heads + kv_heads; head += groups) {
      if (head < q_heads) {
        T* x = q + static_cast<long long>(t) * q_stride + head * head_dim;
        rg::rotate(rg::to_float(x[i]), rg::to_float(x[i + half]), c, s, x[i], x[i + half]);
      } else if (block >= 0) {
        const int off = (head - q_heads) * head_dim;
        rg::rotate(rg::to_float(k_new[src + off + i]), rg::to_float(k_new[src + off + i + half]),
                   c, s, k_cache[dst + off + i], k_cache[dst + off + i + half]);
      }
    }
  }
  if (block < 0) return;
  for (int j = 8 * threadIdx.x; j < row; j += 8 * blockDim.x)
    rg::store<T, 8>(v_cache + dst + j, rg::load<T, 8>(v_new + src + j));
}

extern "C" __global__ void rope_append_f16(__half* q, const __half* k_new, const __half* v_new,
                                           __half* k_cache, __half* v_cache,
                                           const int* block_tables, const int* seq_slots,
                                           const int* positions, const float* inv_freq, int n,
                                           int q_heads, int kv_heads, int head_dim,
                                           int q_stride, int kv_stride, int block_size,
                                           int max_blocks) {
  rope_append_impl(q, k_new, v_new, k_cache, v_cache, block_tables, seq_slots, positions,
                   inv_freq, n, q_heads, kv_heads, head_dim, q_stride, kv_stride, block_size,
                   max_blocks);
}
extern "C" __global__ void rope_append_bf16(__nv_bfloat16* q, const __nv_bfloat16* k_new,
                                            const __nv_bfloat16* v_new,
                                            __nv_bfloat16* k_cache, __nv_bfloat16* v_cache,
                                            const int* block_tables, const int* seq_slots,
                                            const int* positions, const float* inv_freq, int n,
                                            int q_heads, int kv_heads, int head_dim,
                                            int q_stride, int kv_stride, int block_size,
                                            int max_blocks) {
  rope_append_impl(q, k_new, v_new, k_cache, v_cache, block_tables, seq_slots, positions,
                   inv_freq, n, q_heads, kv_heads, head_dim, q_stride, kv_stride, block_size,
                   max_blocks);
}
