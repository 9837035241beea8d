// conditional.cu: kernels that set a conditional node's condition on the device.
//
//   extern "C" set_condition_any(
//       const int* flags,              // (n,) written by an earlier copy or kernel
//       int n,                         // patchable (a symbol in a graph)
//       unsigned long long handle)     // the IF / WHILE node's conditional handle
//   grid (1), block (32): condition = 1 if any flags[i] != 0 for i < n, else 0.
#include <common.cuh>

extern "C" __device__ void cudaGraphSetConditional(unsigned long long handle, unsigned int value);

extern "C" __global__ void __launch_bounds__(32) set_condition_any(const int* flags, int n,
                                                                   unsigned long long handle) {
  rg::pdl_start();
  int any = 0;
  for (int i = threadIdx.x; i < n; i += 32) any |= flags[i] != 0;
  any = __any_sync(0xffffffffu, any);
  if (threadIdx.x == 0) cudaGraphSetConditional(handle, any ? 1u : 0u);
}
