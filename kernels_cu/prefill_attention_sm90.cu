// prefill_attention_sm90.cu: prefill_attention.cu's kernels on Hopper's warpgroup MMA (wgmma),
// compiled for sm_90a; the contract (arguments, grid, patchable dimensions) is
// prefill_attention.cu's, and partial results go to its combine.
//
//   extern "C" prefill_attention_sm90_{f16,bf16}_d{64,128}_r{64,128}(as prefill_attention_...)
//   extern "C" prefill_attention_split_sm90_{f16,bf16}_d{64,128}_r{64,128}(as ..._split_...)
//   block (128 (R / 64 + 1)): R / 64 consumer warpgroups of 64 query rows, then a producer
//   warpgroup that only loads (one warp cannot issue the gathers fast enough). The producer gathers Q, then each key tile's K and V through the
//   block table with cp.async into a ring of kStages slots; its copies complete an arrival on
//   the slot's `full` mbarrier (cp.async.mbarrier.arrive.noinc), and it refills a slot once
//   every consumer warp has arrived on its `empty` one. No block barrier after the start.
//   A consumer warpgroup per key tile of 64: S = Q K^T as D / 16 wgmma.m64n64k16 reading Q
//   and K from shared memory (K-major), the online softmax in registers (mma.sync's layout),
//   then O += P V as 4 wgmma.m64nDk16 with P from registers and V read MN-major; tile t's
//   S is issued with tile t - 1's P V, so one's softmax overlaps the other's MMAs. D = 128
//   tiles lie in two 64-column panels (the 128-byte swizzle's width). The producer's writes
//   are fenced into the async proxy by each consumer before its MMAs read them.
//   Dynamic shared memory: prefill90_smem(R, D) = (R + 2 kStages 64) D 2 + 16 kStages + 8.
#include "prefill_attention.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace {

constexpr int kStages = 3;  // K/V ring slots (rawgraph.ops.attention: PREFILL90_STAGES)

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
  constexpr int WG = BR / 64, kTile = kBC * D * 2, kSlot = 2 * kTile;
  extern __shared__ __align__(1024) char smem[];  // the swizzle's 1024-byte atoms
  char* qs = smem;
  char* ring = smem + BR * D * 2;  // [slot][K, V] tiles
  unsigned long long* full = reinterpret_cast<unsigned long long*>(ring + kStages * kSlot);
  unsigned long long* empty = full + kStages;
  unsigned long long* q_full = empty + kStages;
  Work w;
  if (!find_work<BR, SPLIT>(w, block_tables, seq_lens, cu_seqlens, seq_slots, num_seqs,
                            max_blocks, splits))
    return;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      rg::mbar_init(&full[s], 128);      // each producer thread's copies
      rg::mbar_init(&empty[s], 4 * WG);  // each consumer warp
    }
    rg::mbar_init(q_full, 128);
    rg::mbar_fence_init();
  }
  __syncthreads();
  const int wg = threadIdx.x >> 7;

  if (wg == WG) {  // the producer warpgroup
    const int tid = threadIdx.x - 128 * WG;
    const int row_stride = kv_heads * D, col = w.head / (q_heads / kv_heads) * D;
    load_q<T, D, true, BR, 128>(qs, q, w, q_stride, tid);
    rg::cp_async_arrive(q_full);
    for (int t = w.t0; t < w.t1; ++t) {
      const int i = t - w.t0, s = i % kStages;
      if (i >= kStages) rg::mbar_wait(&empty[s], (i / kStages - 1) & 1);
      char* ks = ring + s * kSlot;
      load_kv<T, D, true, 128>(ks, ks + kTile, k_cache, v_cache, w.table, t * kBC, w.kend,
                               block_size, max_blocks, row_stride, col, tid);
      rg::cp_async_arrive(&full[s]);
    }
    rg::cp_async_wait<0>();
    return;
  }

  // Consumers, software-pipelined: tile t's scores are issued with tile t - 1's P V, so the
  // softmax of t runs while the tensor cores finish t - 1's P V (o is rescaled after it; p
  // and the slot stay untouched until then).
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float o[D / 8][4] = {};
  float m[2] = {rg::neg_inf(), rg::neg_inf()}, l[2] = {0.f, 0.f};
  const float scale2 = scale * kLog2e;
  const int c2 = (lane & 3) * 2;
  const int qpos0 = w.past + w.r0 + warp * 16 + (lane >> 2);  // this thread's first row
  unsigned p[kBC / 16][4] = {};  // the previous tile's P
  rg::mbar_wait(q_full, 0);
  for (int t = w.t0; t < w.t1; ++t) {
    const int i = t - w.t0, s = i % kStages, prev = (i + kStages - 1) % kStages;
    rg::mbar_wait(&full[s], (i / kStages) & 1);
    rg::fence_proxy_async();  // the producer's cp.async writes, seen by the MMAs
    float sc[kBC / 8][4];
    issue_scores<T, D, BR>(sc, qs, ring + s * kSlot, wg);
    // t - 1's P V (the first tile's: a product of zeros, o = 0 and p = 0, on slot 0's V)
    issue_pv<T, D>(o, p, ring + (i > 0 ? prev : s) * kSlot + kTile);
    rg::wgmma_wait<1>();  // the scores (the older group)
    rg::fence_regs(reinterpret_cast<float(&)[kBC / 2]>(sc));
    const int key0 = t * kBC;
    float alpha[2];
    softmax_tile<SPLIT>(sc, m, l, alpha, key0, key0 + kBC - 1 > w.past + w.r0, qpos0, scale2,
                        c2);
    rg::wgmma_wait<0>();  // t - 1's P V: o final for now, p and its slot free
    rg::fence_regs(reinterpret_cast<float(&)[D / 2]>(o));
    rg::fence_regs(reinterpret_cast<unsigned(&)[kBC / 4]>(p));
    if (i > 0 && lane == 0) rg::mbar_arrive(&empty[prev]);
    rescale<D>(o, alpha);
    pack_p<T>(p, sc);
  }
  if (w.t0 < w.t1) {  // the last tile's P V
    issue_pv<T, D>(o, p, ring + (w.t1 - 1 - w.t0) % kStages * kSlot + kTile);
    rg::wgmma_wait<0>();
    rg::fence_regs(reinterpret_cast<float(&)[D / 2]>(o));
    rg::fence_regs(reinterpret_cast<unsigned(&)[kBC / 4]>(p));
  }
  store_rows<T, D, SPLIT>(o, m, l, out, partial, w, w.r0 + warp * 16 + (lane >> 2), q_heads,
                          splits, lane);
}

}  // namespace

// ---- generated by rawgraph/ops/generate.py (python -m rawgraph.ops.generate); do not edit
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_sm90_f16_d64_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill90_impl<__half, 64, 64, false>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, nullptr,
      1);
}
extern "C" __global__ void __launch_bounds__(384)
prefill_attention_sm90_f16_d64_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill90_impl<__half, 64, 128, false>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, nullptr,
      1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_sm90_f16_d128_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill90_impl<__half, 128, 64, false>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, nullptr,
      1);
}
extern "C" __global__ void __launch_bounds__(384)
prefill_attention_sm90_f16_d128_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill90_impl<__half, 128, 128, false>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, nullptr,
      1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_sm90_bf16_d64_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill90_impl<__nv_bfloat16, 64, 64, false>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, nullptr, 1);
}
extern "C" __global__ void __launch_bounds__(384)
prefill_attention_sm90_bf16_d64_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill90_impl<__nv_bfloat16, 64, 128, false>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, nullptr, 1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_sm90_bf16_d128_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill90_impl<__nv_bfloat16, 128, 64, false>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, nullptr, 1);
}
extern "C" __global__ void __launch_bounds__(384)
prefill_attention_sm90_bf16_d128_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill90_impl<__nv_bfloat16, 128, 128, false>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, nullptr, 1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_sm90_f16_d64_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits) {
  prefill90_impl<__half, 64, 64, true>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, partial,
      splits);
}
extern "C" __global__ void __launch_bounds__(384)
prefill_attention_split_sm90_f16_d64_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits) {
  prefill90_impl<__half, 64, 128, true>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, partial,
      splits);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_sm90_f16_d128_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits) {
  prefill90_impl<__half, 128, 64, true>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, partial,
      splits);
}
extern "C" __global__ void __launch_bounds__(384)
prefill_attention_split_sm90_f16_d128_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits) {
  prefill90_impl<__half, 128, 128, true>(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens,
      seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale, q_stride, partial,
      splits);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_sm90_bf16_d64_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits) {
  prefill90_impl<__nv_bfloat16, 64, 64, true>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, partial, splits);
}
extern "C" __global__ void __launch_bounds__(384)
prefill_attention_split_sm90_bf16_d64_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits) {
  prefill90_impl<__nv_bfloat16, 64, 128, true>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, partial, splits);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_sm90_bf16_d128_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits) {
  prefill90_impl<__nv_bfloat16, 128, 64, true>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, partial, splits);
}
extern "C" __global__ void __launch_bounds__(384)
prefill_attention_split_sm90_bf16_d128_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits) {
  prefill90_impl<__nv_bfloat16, 128, 128, true>(q, k_cache, v_cache, block_tables, seq_lens,
      cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks, scale,
      q_stride, partial, splits);
}
