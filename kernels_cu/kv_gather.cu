// kv_gather.cu: one sequence of a paged cache layer, copied out densely (inspection, tests,
// and the reference path of paged attention).
//
//   extern "C" kv_gather_f16 / kv_gather_bf16(
//       const T* cache,            // (num_blocks, block_size, row): one layer of K or V
//       const int* block_tables,   // (max_seqs, max_blocks)
//       const int* seq_lens,       // (max_seqs,)
//       int seq, T* out,           // out: (max_tokens, row)
//       int max_tokens, int row, int block_size, int max_blocks)
//   out[t] = cache[block_tables[seq][t / block_size]][t % block_size] for t < seq_lens[seq];
//   rows at or past the length are not written.
//   grid (max_tokens), block (128); row % 8 == 0. The length comes from device memory, so the
//   graph needs no patch as the sequence grows; `seq` is patchable.
#include <common.cuh>

template <typename T>
__device__ void kv_gather_impl(const T* cache, const int* block_tables,
                               const int* seq_lens, int seq, T* out,
                               int max_tokens, int row, int block_size, int max_blocks) {
  rg::pdl_start();
  const int t = blockIdx.x;
  const int len = seq_lens[seq];
  if (t >= max_tokens || t >= len || t >= block_size * max_blocks) return;
  const int block = block_tables[static_cast<long long>(seq) * max_blocks + t / block_size];
  if (block < 0) return;
  const long long src = (static_cast<long long>(block) * block_size + t % block_size) * row;
  for (int j = 8 * threadIdx.x; j < row; j += 8 * blockDim.x)
    rg::store<T, 8>(out + static_cast<long long>(t) * row + j, rg::load<T, 8>(cache + src + j));
}

extern "C" __global__ void kv_gather_f16(const __half* cache, const int* block_tables,
                                         const int* seq_lens, int seq, __half* out,
                                         int max_tokens, int row, int block_size,
                                         int max_blocks) {
  kv_gather_impl(cache, block_tables, seq_lens, seq, out, max_tokens, row, block_size,
                 max_blocks);
}
extern "C" __global__ void kv_gather_bf16(const __nv_bfloat16* cache, const int* block_tables,
                                          const int* seq_lens, int seq, __nv_bfloat16* out,
                                          int max_tokens, int row, int block_size,
                                          int max_blocks) {
  kv_gather_impl(cache, block_tables, seq_lens, seq, out, max_tokens, row, block_size,
                 max_blocks);
}
