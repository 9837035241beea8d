// decode_loop.cu: the end of one decode step inside a WHILE-node loop: record each row's new
// token, stop rows that hit their stop id or budget, and tell the conditional node whether to
// run another step. The step's sampler has already handed each token on (sample.cu's
// advance: next input, position and cache length), so a row that goes on needs nothing here.
//
//   extern "C" decode_advance(
//       const int* next,        // (batch,) tokens sampled this step
//       int* slots,             // (batch,) cache slot; set to -1 when a row stops (padding
//                               //   from then on: nothing appended, attended or recorded)
//       const int* stop,        // (batch,) stop token id per row, -1: none
//       int* remaining,         // (batch,) tokens each row may still generate
//       int* out,               // (max_steps, batch) tokens, step-major
//       int* count,             // (batch,) tokens generated per row
//       int* step,              // (1,) steps run so far
//       int batch, int max_steps, unsigned long long handle)
//   grid (1), block (128): thread b owns row b (batch <= 128). The last step to see a live
//   row sets the condition to 1 while steps remain; otherwise 0, and the loop ends.
//   Nothing here depends on the host between launches: one graph launch runs the whole loop.
#include <common.cuh>

extern "C" __device__ void cudaGraphSetConditional(unsigned long long handle, unsigned int value);

extern "C" __global__ void __launch_bounds__(128) decode_advance(
    const int* next, int* slots, const int* stop, int* remaining, int* out, int* count,
    int* step, int batch, int max_steps, unsigned long long handle) {
  __shared__ int live;
  rg::pdl_start();
  const int b = threadIdx.x, s = step[0];
  if (b == 0) live = 0;
  __syncthreads();
  if (b < batch && slots[b] >= 0) {
    const int tok = next[b];
    out[s * batch + b] = tok;
    count[b] += 1;
    remaining[b] -= 1;
    if (tok == stop[b] || remaining[b] <= 0) {
      slots[b] = -1;
    } else {
      live = 1;  // a benign race: every writer writes 1
    }
  }
  __syncthreads();
  if (b == 0) {
    step[0] = s + 1;
    cudaGraphSetConditional(handle, live && s + 1 < max_steps ? 1u : 0u);
  }
}
