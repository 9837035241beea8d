// kv_append.cu: write new tokens' K and V into the paged KV cache of one layer.
//
//   extern "C" kv_append_f16 / kv_append_bf16(
//       const T* k_new, const T* v_new,   // (n, row), row = kv_heads * head_dim; token t at
//                                         // k_new + t * src_stride (a fused QKV row's view)
//       T* k_cache, T* v_cache,           // (num_blocks, block_size, row): one layer
//       const int* block_tables,          // (max_seqs, max_blocks)
//       const int* seq_slots,             // (n,) sequence slot of each token; < 0: padding
//       const int* positions,             // (n,) position of each token in its sequence
//       int n, int row, int block_size, int max_blocks, int src_stride)
//   Token t goes to block block_tables[seq_slots[t]][positions[t] / block_size], offset
//   positions[t] % block_size. Padding tokens (slot < 0) and unmapped blocks (< 0) write nothing.
//   grid (n), block (128): each thread moves 8 elements (16 bytes) at a time; row % 8 == 0.
//   Patchable: n with grid.x (grid.x == n <= rows of k_new); everything per token is read
//   from device memory, so block tables and positions change between replays without patches.
#include <common.cuh>

template <typename T>
__device__ void kv_append_impl(const T* k_new, const T* v_new,
                               T* k_cache, T* v_cache,
                               const int* block_tables,
                               const int* seq_slots,
                               const int* positions, int n, int row,
                               int block_size, int max_blocks, int src_stride) {
  rg::pdl_start();
  const int t = blockIdx.x;
  if (t >= n) return;
  const int seq = seq_slots[t], pos = positions[t];
  if (seq < 0 || pos < 0 || pos >= block_size * max_blocks) return;
  const int block = block_tables[static_cast<long long>(seq) * max_blocks + pos / block_size];
  if (block < 0) return;
  const long long dst = (static_cast<long long>(block) * block_size + pos % block_size) * row;
  const long long src = static_cast<long long>(t) * src_stride;
  for (int j = 8 * threadIdx.x; j < row; j += 8 * blockDim.x) {
    rg::store<T, 8>(k_cache + dst + j, rg::load<T, 8>(k_new + src + j));
    rg::store<T, 8>(v_cache + dst + j, rg::load<T, 8>(v_new + src + j));
  }
}

extern "C" __global__ void kv_append_f16(const __half* k_new, const __half* v_new,
                                         __half* k_cache, __half* v_cache,
                                         const int* block_tables, const int* seq_slots,
                                         const int* positions, int n, int row, int block_size,
                                         int max_blocks, int src_stride) {
  kv_append_impl(k_new, v_new, k_cache, v_cache, block_tables, seq_slots, positions, n, row,
                 block_size, max_blocks, src_stride);
}
extern "C" __global__ void kv_append_bf16(const __nv_bfloat16* k_new,
                                          const __nv_bfloat16* v_new, __nv_bfloat16* k_cache,
                                          __nv_bfloat16* v_cache, const int* block_tables,
                                          const int* seq_slots, const int* positions, int n,
                                          int row, int block_size, int max_blocks,
                                          int src_stride) {
  kv_append_impl(k_new, v_new, k_cache, v_cache, block_tables, seq_slots, positions, n, row,
                 block_size, max_blocks, src_stride);
}
