// prefill_attention_sm90.cu: prefill_attention.cu's kernels on Hopper's warpgroup MMA (wgmma),
// compiled for sm_90a; the contract (arguments, grid, patchable dimensions) is
// prefill_attention.cu's, and partial results go to its combine.
//
//   extern "C" prefill_attention_sm90_{f16,bf16}_d{64,128}_r{64,128}(as prefill_attention_...)
//   extern "C" prefill_attention_split_sm90_{f16,bf16}_d{64,128}_r{64,128}(as ..._split_...)
//   block (2 R): R / 64 warpgroups of 64 query rows, all loading and computing (as
//   prefill_attention.cu). Per key tile of 64: S = Q K^T as D / 16 wgmma.m64n64k16 reading Q
//   and K from shared memory (K-major), the online softmax in registers (mma.sync's layout),
//   then O += P V as 4 wgmma.m64nDk16 with P from registers and V read MN-major. D = 128
//   tiles lie in two 64-column panels (the 128-byte swizzle's width). K/V tiles are gathered
//   through the block table with cp.async, double-buffered; each thread fences its copies
//   into the async proxy before the block barrier that precedes the MMAs.
//   Dynamic shared memory: as prefill_attention.cu, (R + 4 * 64) * D * 2 bytes.
//   (A producer warpgroup feeding a 3-slot mbarrier ring, with tile t's scores issued beside
//   t - 1's P V, measured no faster: the cp.async gathers bound both; NOTES.md.)
#include "prefill_attention.cuh"
#include "wgmma.cuh"

namespace {

// Issue S (16 rows x 64 keys a warp, zeroed) = Q K^T for warpgroup wg's 64 query rows: D / 16
// wgmma.m64n64k16 with Q and K both K-major (D contiguous); k step kk is 32 bytes into panel
// kk / 4's rows. One commit group; the caller waits.
template <typename T, int D, int BR>
__device__ __forceinline__ void issue_scores(float (&s)[kBC / 8][4], const char* qs,
                                             const char* ks, int wg) {
  float(&acc)[kBC / 2] = reinterpret_cast<float(&)[kBC / 2]>(s);
#pragma unroll
  for (int i = 0; i < kBC / 2; ++i) acc[i] = 0.f;
  rg::fence_regs(acc);
  rg::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    rg::Wgmma<T, kBC>::run(
        acc, rg::desc128(qs + (kk >> 2) * BR * 128 + wg * 64 * 128 + (kk & 3) * 32),
        rg::desc128(ks + (kk >> 2) * kBC * 128 + (kk & 3) * 32));
  rg::wgmma_commit();
}

// P (softmax_tile's s) packed to T: per 16 keys, mma.sync's A fragment, which is wgmma's
template <typename T>
__device__ __forceinline__ void pack_p(unsigned (&a)[kBC / 16][4], const float (&s)[kBC / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < kBC / 16; ++kk) {
    a[kk][0] = rg::pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    a[kk][1] = rg::pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    a[kk][2] = rg::pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[kk][3] = rg::pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// Issue O (16 rows x D a warp) += P V over a tile's 64 keys: wgmma.m64nDk16 with P from
// registers and V MN-major (D contiguous), 16 keys = 2048 bytes a step, its 64-column panels
// kBC * 128 bytes apart. One commit group; neither o nor a may be touched until it is done.
template <typename T, int D>
__device__ __forceinline__ void issue_pv(float (&o)[D / 8][4], const unsigned (&a)[kBC / 16][4],
                                         const char* vs) {
  float(&acc)[D / 2] = reinterpret_cast<float(&)[D / 2]>(o);
  rg::fence_regs(acc);
  rg::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBC / 16; ++kk)
    rg::WgmmaRS<T, D>::run(acc, a[kk], rg::desc128_mn(vs + kk * 16 * 128, kBC * 128));
  rg::wgmma_commit();
}

template <typename T, int D, int BR, bool SPLIT>
__device__ void prefill90_impl(const T* q, const T* k_cache, const T* v_cache,
                               const int* block_tables, const int* seq_lens,
                               const int* cu_seqlens, const int* seq_slots, T* out,
                               int num_seqs, int q_heads, int kv_heads, int block_size,
                               int max_blocks, float scale, int q_stride, float* partial,
                               int splits) {
  rg::pdl_start();
  constexpr int kTile = kBC * D * 2, kThreads = BR * 2;
  extern __shared__ __align__(1024) char smem[];  // the swizzle's 1024-byte atoms
  char* qs = smem;
  char* kvs = smem + BR * D * 2;  // [buffer][K, V] tiles
  Work w;
  if (!find_work<BR, SPLIT>(w, block_tables, seq_lens, cu_seqlens, seq_slots, num_seqs,
                            max_blocks, splits))
    return;
  const int row_stride = kv_heads * D, col = w.head / (q_heads / kv_heads) * D;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  load_q<T, D, true, BR, kThreads>(qs, q, w, q_stride, tid);
  if (w.t0 < w.t1) {  // an empty run (SPLIT) loads no keys
    char* first = kvs + (w.t0 & 1) * 2 * kTile;
    load_kv<T, D, true, kThreads>(first, first + kTile, k_cache, v_cache, w.table, w.t0 * kBC,
                                  w.kend, block_size, max_blocks, row_stride, col, tid);
  }
  rg::cp_async_commit();

  float o[D / 8][4] = {};
  float m[2] = {rg::neg_inf(), rg::neg_inf()}, l[2] = {0.f, 0.f};
  const float scale2 = scale * kLog2e;
  const int c2 = (lane & 3) * 2;
  const int qpos0 = w.past + w.r0 + warp * 16 + (lane >> 2);  // this thread's first row
  for (int t = w.t0; t < w.t1; ++t) {
    if (t + 1 < w.t1) {
      char* nb = kvs + ((t + 1) & 1) * 2 * kTile;
      load_kv<T, D, true, kThreads>(nb, nb + kTile, k_cache, v_cache, w.table, (t + 1) * kBC,
                                    w.kend, block_size, max_blocks, row_stride, col, tid);
    }
    rg::cp_async_commit();
    rg::cp_async_wait<1>();
    rg::fence_proxy_async();  // this thread's cp.async writes, seen by the MMAs
    __syncthreads();
    const char* ks = kvs + (t & 1) * 2 * kTile;
    float sc[kBC / 8][4];
    issue_scores<T, D, BR>(sc, qs, ks, warp >> 2);
    rg::wgmma_wait<0>();
    rg::fence_regs(reinterpret_cast<float(&)[kBC / 2]>(sc));
    const int key0 = t * kBC;
    float alpha[2];
    softmax_tile<SPLIT>(sc, m, l, alpha, key0, key0 + kBC - 1 > w.past + w.r0, qpos0, scale2,
                        c2);
    rescale<D>(o, alpha);
    unsigned p[kBC / 16][4];
    pack_p<T>(p, sc);
    issue_pv<T, D>(o, p, ks + kTile);
    rg::wgmma_wait<0>();
    rg::fence_regs(reinterpret_cast<float(&)[D / 2]>(o));
    rg::fence_regs(reinterpret_cast<unsigned(&)[kBC / 4]>(p));
    __syncthreads();  // this buffer is refilled by the next iteration's prefetch
  }

  if constexpr (SPLIT) rg::cp_async_wait<0>();  // an empty split's query tile
  store_rows<T, D, SPLIT>(o, m, l, out, partial, w, w.r0 + warp * 16 + (lane >> 2), q_heads,
                          splits, lane);
}

}  // namespace

// ---- generated by rawgraph/ops/generate.py (python -m rawgraph.ops.generate); do not edit
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_sm90_f16_d64_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill90_impl<__half, 64, 64, false>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, nullptr,
      1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_sm90_f16_d64_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill90_impl<__half, 64, 128, false>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, nullptr,
      1);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_sm90_f16_d128_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill90_impl<__half, 128, 64, false>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, nullptr,
      1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_sm90_f16_d128_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill90_impl<__half, 128, 128, false>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, nullptr,
      1);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_sm90_bf16_d64_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill90_impl<__nv_bfloat16, 64, 64, false>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, nullptr, 1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_sm90_bf16_d64_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill90_impl<__nv_bfloat16, 64, 128, false>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, nullptr, 1);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_sm90_bf16_d128_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill90_impl<__nv_bfloat16, 128, 64, false>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, nullptr, 1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_sm90_bf16_d128_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill90_impl<__nv_bfloat16, 128, 128, false>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, nullptr, 1);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_split_sm90_f16_d64_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits) {
  prefill90_impl<__half, 64, 64, true>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, partial,
      splits);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_sm90_f16_d64_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits) {
  prefill90_impl<__half, 64, 128, true>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, partial,
      splits);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_split_sm90_f16_d128_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits) {
  prefill90_impl<__half, 128, 64, true>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, partial,
      splits);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_sm90_f16_d128_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits) {
  prefill90_impl<__half, 128, 128, true>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, partial,
      splits);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_split_sm90_bf16_d64_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits) {
  prefill90_impl<__nv_bfloat16, 64, 64, true>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, partial, splits);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_sm90_bf16_d64_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits) {
  prefill90_impl<__nv_bfloat16, 64, 128, true>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, partial, splits);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_split_sm90_bf16_d128_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits) {
  prefill90_impl<__nv_bfloat16, 128, 64, true>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, partial, splits);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_sm90_bf16_d128_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits) {
  prefill90_impl<__nv_bfloat16, 128, 128, true>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, partial, splits);
}
