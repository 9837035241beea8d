// silu_mul.cu: LLaMA's MLP activation on the fused gate+up projection.
//
//   extern "C" silu_mul_f16 / silu_mul_bf16(const T* gate_up, T* out, int rows, int inter)
//   gate_up (rows, 2 * inter): groups of 8 gate columns, each followed by its 8 up columns
//   (gate j at 16 (j / 8) + j % 8, up j 8 further: the gate_up weight's rows are stacked
//   that way at load, so the GEMV can finish an output in its epilogue, gemv.cu _silu)
//   out     (rows, inter):     out = T(float(T(silu(gate))) * float(up)), silu(g) = g / (1 + e^-g)
//   grid (cdiv(inter, 8 * blockDim.x), rows), block (128); inter % 8 == 0, 16-byte aligned.
//   Patchable: rows and grid.y together (grid.y == rows <= the buffers' row count).
#include <common.cuh>

template <typename T>
__device__ void silu_mul_impl(const T* gate_up, T* out, int rows,
                              int inter) {
  rg::pdl_start();
  const int row = blockIdx.y;
  const int j = 8 * (blockIdx.x * blockDim.x + threadIdx.x);
  if (row >= rows || j >= inter) return;
  const T* g = gate_up + static_cast<long long>(row) * 2 * inter + 2 * j;  // j % 8 == 0
  const rg::Vec<T, 8> gv = rg::load<T, 8>(g), uv = rg::load<T, 8>(g + 8);
  rg::Vec<T, 8> y;
#pragma unroll
  for (int k = 0; k < 8; ++k)
    y.v[k] = rg::from_float<T>(rg::silu_mul<T>(rg::to_float(gv.v[k]), rg::to_float(uv.v[k])));
  rg::store<T, 8>(out + static_cast<long long>(row) * inter + j, y);
}

extern "C" __global__ void silu_mul_f16(const __half* gate_up, __half* out, int rows, int inter) {
  silu_mul_impl(gate_up, out, rows, inter);
}
extern "C" __global__ void silu_mul_bf16(const __nv_bfloat16* gate_up, __nv_bfloat16* out,
                                         int rows, int inter) {
  silu_mul_impl(gate_up, out, rows, inter);
}
