// argmax.cu: greedy decoding, the index of each row's largest logit, on the device.
//
//   extern "C" argmax_f16 / argmax_bf16(const T* logits, int* out, int rows, int vocab)
//   logits (rows, vocab), out (rows,): out[r] = the smallest j with logits[r][j] maximal
//   (numpy's tie rule); NaNs are skipped (a row of NaNs gives 0).
//   grid (rows, kParts), clusters (1, kParts, 1), block (1024): the cluster of row r splits
//   it in kParts slices, one per block (argmax.cuh's cluster_argmax): a row is read by
//   kParts SMs at once, each thread's pieces all in flight at LLaMA-3's 128256 tokens.
//   Patchable: rows with grid.x (grid.x == rows <= rows of logits).
#include "argmax.cuh"

constexpr int kParts = 8;  // the blocks (SMs) one row is split over: a portable cluster

template <typename T>
__device__ void argmax_impl(const T* logits, int* out, int rows, int vocab) {
  rg::pdl_start();
  const int r = blockIdx.x;  // the whole cluster's row
  if (r >= rows) return;
  const int j = rg::cluster_argmax(logits + static_cast<long long>(r) * vocab, vocab);
  if (blockIdx.y == 0 && threadIdx.x == 0) out[r] = j == rg::kNone ? 0 : j;
}

extern "C" __global__ void __cluster_dims__(1, kParts, 1) __launch_bounds__(1024)
argmax_f16(const __half* logits, int* out, int rows, int vocab) {
  argmax_impl(logits, out, rows, vocab);
}
extern "C" __global__ void __cluster_dims__(1, kParts, 1) __launch_bounds__(1024)
argmax_bf16(const __nv_bfloat16* logits, int* out, int rows, int vocab) {
  argmax_impl(logits, out, rows, vocab);
}
