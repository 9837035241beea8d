// rope.cu: rotary position embedding (LLaMA's rotate-half form), in place on q and k.
//
//   extern "C" rope_f16 / rope_bf16(T* q, T* k, const int* positions, const float* inv_freq,
//                                  int n, int q_heads, int kv_heads, int head_dim,
//                                  int q_stride, int k_stride)
//   q (n, q_heads, head_dim), k (n, kv_heads, head_dim), positions (n,), inv_freq (head_dim/2,);
//   token t's heads start at q + t * q_stride and k + t * k_stride (views into a fused QKV row)
//   For each head vector x and i < head_dim/2, with a = positions[t] * inv_freq[i] (fp32):
//     x[i]      <- x[i] cos a - x[i + d/2] sin a
//     x[i + d/2] <- x[i + d/2] cos a + x[i] sin a          (fp32 math, one rounding)
//   LLaMA-3 frequency scaling lives in inv_freq, computed on the host (rawgraph.ops.rope).
//   grid (n), block (256): thread (g, i) computes the angle of pair i once and rotates it in
//   heads g, g + 256 / (d/2), ... (head_dim <= 512).
//   Patchable: n with grid.x (grid.x == n <= rows of q and k); positions come from device memory.
#include <common.cuh>

template <typename T>
__device__ void rope_impl(T* q, T* k, const int* positions,
                          const float* __restrict__ inv_freq, int n, int q_heads, int kv_heads,
                          int head_dim, int q_stride, int k_stride) {
  rg::pdl_start();
  const int t = blockIdx.x;
  if (t >= n) return;
  const int half = head_dim / 2;
  const int groups = blockDim.x / half;  // threads (g, i): pair i of heads g, g + groups, ...
  const int g = threadIdx.x / half, i = threadIdx.x % half;
  if (g >= groups) return;
  float s, c;  // one angle per thread, shared by all the heads it rotates
  rg::rope_angle(positions[t], inv_freq[i], s, c);
  for (int head = g; head < q_heads + kv_heads; head += groups) {
    T* x = head < q_heads
               ? q + static_cast<long long>(t) * q_stride + head * head_dim
               : k + static_cast<long long>(t) * k_stride + (head - q_heads) * head_dim;
    rg::rotate(rg::to_float(x[i]), rg::to_float(x[i + half]), c, s, x[i], x[i + half]);
  }
}

extern "C" __global__ void rope_f16(__half* q, __half* k, const int* positions,
                                    const float* inv_freq, int n, int q_heads, int kv_heads,
                                    int head_dim, int q_stride, int k_stride) {
  rope_impl(q, k, positions, inv_freq, n, q_heads, kv_heads, head_dim, q_stride, k_stride);
}
extern "C" __global__ void rope_bf16(__nv_bfloat16* q, __nv_bfloat16* k, const int* positions,
                                     const float* inv_freq, int n, int q_heads, int kv_heads,
                                     int head_dim, int q_stride, int k_stride) {
  rope_impl(q, k, positions, inv_freq, n, q_heads, kv_heads, head_dim, q_stride, k_stride);
}
