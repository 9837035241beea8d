// argmax.cu: greedy decoding, the index of each row's largest logit, on the device.
//
//   extern "C" argmax_f16 / argmax_bf16(const T* logits, int* out, int rows, int vocab)
//   logits (rows, vocab), out (rows,): out[r] = the smallest j with logits[r][j] maximal
//   (numpy's tie rule); NaNs are skipped (a row of NaNs gives 0).
//   grid (rows), block (1024): one pass over the row (argmax.cuh's block_argmax, which
//   sample.cu's greedy rows share).
//   Patchable: rows with grid.x (grid.x == rows <= rows of logits).
#include <argmax.cuh>

template <typename T>
__device__ void argmax_impl(const T* logits, int* out, int rows, int vocab) {
  rg::pdl_start();
  const int r = blockIdx.x;
  if (r >= rows) return;
  float v;
  int j;
  rg::block_argmax(logits + static_cast<long long>(r) * vocab, 0, vocab, v, j);
  if (threadIdx.x == 0) out[r] = j == rg::kNone ? 0 : j;
}

extern "C" __global__ void __launch_bounds__(1024) argmax_f16(const __half* logits, int* out,
                                                              int rows, int vocab) {
  argmax_impl(logits, out, rows, vocab);
}
extern "C" __global__ void __launch_bounds__(1024) argmax_bf16(const __nv_bfloat16* logits,
                                                               int* out, int rows, int vocab) {
  argmax_impl(logits, out, rows, vocab);
}
