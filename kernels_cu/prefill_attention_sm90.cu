// prefill_attention_sm90.cu: prefill_attention.cu's kernels on Hopper's warpgroup MMA (wgmma),
// compiled for sm_90a; the contract (arguments, grid, patchable dimensions) is
// prefill_attention.cu's, and partial results go to its combine.
//
//   extern "C" prefill_attention_sm90_{f16,bf16}_d{64,128}_r{64,128}(as prefill_attention_...)
//   extern "C" prefill_attention_split_sm90_{f16,bf16}_d{64,128}_r{64,128}(as ..._split_...)
//   extern "C" prefill_attention{,_split}_tma_sm90_...(the same, then
//       const __grid_constant__ TensorMap k_map, v_map)  // K/V tiles by TMA (TmaKv)
//   block (2 R): R / 64 warpgroups of 64 query rows, all loading and computing (as
//   prefill_attention.cu). Per key tile of 64: S = Q K^T as D / 16 wgmma.m64n64k16 reading Q
//   and K from shared memory (K-major), the online softmax in registers (mma.sync's layout),
//   then O += P V as 4 wgmma.m64nDk16 with P from registers and V read MN-major. D = 128
//   tiles lie in two 64-column panels (the 128-byte swizzle's width). K/V tiles are gathered
//   through the block table with cp.async, double-buffered (prefill_loop, shared with
//   prefill_attention.cu); each thread fences its copies into the async proxy before the
//   block barrier that precedes the MMAs.
//   Dynamic shared memory: as prefill_attention.cu, (R + 4 * 64) * D * 2 bytes (the _tma
//   kernels 16 more: their two mbarriers).
//   (A producer warpgroup feeding a 3-slot mbarrier ring, with tile t's scores issued beside
//   t - 1's P V, measured no faster: the cp.async gathers bound both; NOTES.md.)
#include <prefill_attention.cuh>
#include <tma.cuh>
#include <wgmma.cuh>

namespace {

// K/V tiles by TMA: tile t's keys of w's kv head into the K and V tiles at buf, issued by
// one thread. k_map and v_map view a layer's cache as (num_blocks x block_size, kv_heads x
// D) rows read in 128-byte-swizzled boxes of gcd(block_size, 64) rows by 64 columns
// (ops.attention.kv_maps): a box per paged block the tile touches (x 2 panels at D = 128),
// for K and for V, all completing on `bar`; no thread computes a gather address. Boxes stop
// at the paged block holding the last key the block's rows see (kend): the tile's V rows
// from there on must be zeroed (zero_tail) before P V, since their P is 0 but 0 x NaN is
// not (the rest of that paged block holds other tokens or was never written). K rows there
// need nothing: their scores are masked.
template <int D>
__device__ __forceinline__ void tma_tile(char* buf, const TensorMap* k_map,
                                         const TensorMap* v_map, const Work& w, int t,
                                         int block_size, int max_blocks, int col,
                                         unsigned long long* bar) {
  // block_size is a power of two (ops.attention.prefill_tma), so keys map to paged blocks by
  // shifts: divided, they cost 8-15% of the kernel, as this thread's warpgroup waits for it
  // between its MMAs (NOTES.md)
  const int shift = __ffs(block_size) - 1, box_shift = min(shift, 6), key0 = t * kBC;
  const int boxes = (min(kBC, w.kend - key0) + (1 << box_shift) - 1) >> box_shift;
  rg::mbar_expect_tx(bar, (boxes << box_shift) * D * 2 * 2);  // K and V: D elements a row
  for (int j = 0; j < boxes; ++j) {
    const int key = key0 + (j << box_shift), tb = key >> shift;
    const int blk = tb < max_blocks ? w.table[tb] : -1;  // a bad table reads row 0, no hang
    const int row = (max(blk, 0) << shift) + (key & (block_size - 1));
#pragma unroll
    for (int p = 0; p < D / 64; ++p) {  // a 64-column panel a box
      const int at = p * kBC * 128 + (j << box_shift) * 128;
      rg::tma_load_2d(buf + at, k_map, col + p * 64, row, bar);
      rg::tma_load_2d(buf + kBC * D * 2 + at, v_map, col + p * 64, row, bar);
    }
  }
}

// V rows [valid, kBC) of the tile at vs set to zero by THREADS threads from tid, then fenced
// for the MMAs (the caller's barrier shows them to the other threads)
template <int D, int THREADS>
__device__ __forceinline__ void zero_tail(char* vs, int valid, int tid) {
  constexpr int RC = D / 8;
  for (int i = tid; i < (kBC - valid) * RC; i += THREADS)
    *reinterpret_cast<uint4*>(vs + swz<D, true, kBC>(valid + i / RC, i % RC)) =
        make_uint4(0, 0, 0, 0);
  rg::fence_proxy_async();  // generic stores, read by wgmma (the async proxy)
}

// prefill_loop's Kv for the _tma kernels: tma_tile into the buffer after the one being
// read, thread 0 issuing; an mbarrier per buffer.
struct TmaKv {
  unsigned long long* full;  // an mbarrier per buffer, past the tiles (prefill_smem)

  // made after find_work and before any thread waits: prefill_loop's first ready() has the
  // block barrier that shows the inits to every thread
  __device__ __forceinline__ TmaKv(char* at, int tid)
      : full(reinterpret_cast<unsigned long long*>(at)) {
    if (tid == 0) {
      rg::mbar_init(full, 1);
      rg::mbar_init(full + 1, 1);
      rg::mbar_fence_init();
    }
  }

  template <typename T, int D, bool P, int THREADS>
  __device__ __forceinline__ void fetch(char* buf, const T*, const T*, const TensorMap* k_map,
                                        const TensorMap* v_map, const Work& w, int t,
                                        int block_size, int max_blocks, int, int col, int tid) {
    if (tid == 0)
      tma_tile<D>(buf, k_map, v_map, w, t, block_size, max_blocks, col, full + (t & 1));
  }

  template <class Mma, int D, bool P, int THREADS>
  __device__ __forceinline__ void ready(char* vs, const Work& w, int t, int tid) {
    if (t == w.t0) {  // the Q tile (cp.async) and the barriers' inits, seen by all
      rg::cp_async_wait<0>();
      Mma::landed();
      __syncthreads();
    }
    rg::mbar_wait(full + (t & 1), ((t - w.t0) >> 1) & 1);
    const int valid = w.kend - t * kBC;
    if (valid < kBC) {  // block-uniform: the last tile of the keys these rows see
      zero_tail<D, THREADS>(vs, valid, tid);
      __syncthreads();
    }
  }
};

// The products on wgmma; warpgroup warp / 4 owns 64 query rows.
// issue_scores: S (zeroed by the caller) += Q K^T as D / 16 wgmma.m64n64k16 with Q and K both
// K-major (D contiguous); k step kk is 32 bytes into panel kk / 4's rows. One commit group.
template <typename T, int D, int BR>
__device__ __forceinline__ void issue_scores(float (&s)[kBC / 8][4], const char* qs,
                                             const char* ks, int warp) {
  float(&acc)[kBC / 2] = reinterpret_cast<float(&)[kBC / 2]>(s);
  const char* q_rows = qs + (warp >> 2) * 64 * 128;
  rg::fence_regs(acc);
  rg::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    rg::Wgmma<T, kBC>::run(acc, rg::desc128(q_rows + (kk >> 2) * BR * 128 + (kk & 3) * 32),
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

// issue_pv: O += P V as 4 wgmma.m64nDk16 with P from registers (every fragment packed before
// the fence) and V MN-major (D contiguous), 16 keys = 2048 bytes a step, its 64-column panels
// kBC * 128 bytes apart. One commit group; neither o nor a is touched until it is done.
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

// prefill_loop's Mma: the products above, each waited for before returning.
template <typename T, int D, int BR>
struct Wgmma90 {
  static constexpr bool kPanels = true, kSkipRescale = true;

  // this thread's cp.async writes, seen by the MMAs (the async proxy)
  static __device__ __forceinline__ void landed() { rg::fence_proxy_async(); }

  __device__ __forceinline__ void start(const char*, int, int) {}

  __device__ __forceinline__ void scores(float (&s)[kBC / 8][4], const char* qs, const char* ks,
                                         int warp, int) {
    issue_scores<T, D, BR>(s, qs, ks, warp);
    rg::wgmma_wait<0>();
    rg::fence_regs(reinterpret_cast<float(&)[kBC / 2]>(s));
  }

  __device__ __forceinline__ void pv(float (&o)[D / 8][4], const float (&s)[kBC / 8][4],
                                     const char* vs, int, int) {
    unsigned a[kBC / 16][4];
    pack_p<T>(a, s);
    issue_pv<T, D>(o, a, vs);
    rg::wgmma_wait<0>();
    rg::fence_regs(reinterpret_cast<float(&)[D / 2]>(o));
    rg::fence_regs(reinterpret_cast<unsigned(&)[kBC / 4]>(a));
  }
};

}  // namespace

// ---- generated by rawgraph/ops/generate.py (python -m rawgraph.ops.generate); do not edit
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_sm90_f16_d64_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill_loop<__half, 64, 64, false, Wgmma90<__half, 64, 64>>(q, k_cache, v_cache, block_tables,
      seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks,
      scale, q_stride, nullptr, 1, 1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_sm90_f16_d64_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill_loop<__half, 64, 128, false, Wgmma90<__half, 64, 128>>(q, k_cache, v_cache, block_tables,
      seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks,
      scale, q_stride, nullptr, 1, 1);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_sm90_f16_d128_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill_loop<__half, 128, 64, false, Wgmma90<__half, 128, 64>>(q, k_cache, v_cache, block_tables,
      seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks,
      scale, q_stride, nullptr, 1, 1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_sm90_f16_d128_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride) {
  prefill_loop<__half, 128, 128, false, Wgmma90<__half, 128, 128>>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, nullptr, 1, 1);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_sm90_bf16_d64_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill_loop<__nv_bfloat16, 64, 64, false, Wgmma90<__nv_bfloat16, 64, 64>>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, nullptr, 1, 1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_sm90_bf16_d64_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill_loop<__nv_bfloat16, 64, 128, false, Wgmma90<__nv_bfloat16, 64, 128>>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, nullptr, 1, 1);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_sm90_bf16_d128_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill_loop<__nv_bfloat16, 128, 64, false, Wgmma90<__nv_bfloat16, 128, 64>>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, nullptr, 1, 1);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_sm90_bf16_d128_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride) {
  prefill_loop<__nv_bfloat16, 128, 128, false, Wgmma90<__nv_bfloat16, 128, 128>>(q, k_cache,
      v_cache, block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads,
      block_size, max_blocks, scale, q_stride, nullptr, 1, 1);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_split_sm90_f16_d64_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits, int run_keys) {
  prefill_loop<__half, 64, 64, true, Wgmma90<__half, 64, 64>>(q, k_cache, v_cache, block_tables,
      seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks,
      scale, q_stride, partial, splits, run_keys);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_sm90_f16_d64_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits, int run_keys) {
  prefill_loop<__half, 64, 128, true, Wgmma90<__half, 64, 128>>(q, k_cache, v_cache, block_tables,
      seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks,
      scale, q_stride, partial, splits, run_keys);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_split_sm90_f16_d128_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits, int run_keys) {
  prefill_loop<__half, 128, 64, true, Wgmma90<__half, 128, 64>>(q, k_cache, v_cache, block_tables,
      seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks,
      scale, q_stride, partial, splits, run_keys);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_sm90_f16_d128_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits, int run_keys) {
  prefill_loop<__half, 128, 128, true, Wgmma90<__half, 128, 128>>(q, k_cache, v_cache, block_tables,
      seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size, max_blocks,
      scale, q_stride, partial, splits, run_keys);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_split_sm90_bf16_d64_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits, int run_keys) {
  prefill_loop<__nv_bfloat16, 64, 64, true, Wgmma90<__nv_bfloat16, 64, 64>>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, partial, splits, run_keys);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_sm90_bf16_d64_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits, int run_keys) {
  prefill_loop<__nv_bfloat16, 64, 128, true, Wgmma90<__nv_bfloat16, 64, 128>>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, partial, splits, run_keys);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_split_sm90_bf16_d128_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits, int run_keys) {
  prefill_loop<__nv_bfloat16, 128, 64, true, Wgmma90<__nv_bfloat16, 128, 64>>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, partial, splits, run_keys);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_sm90_bf16_d128_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits, int run_keys) {
  prefill_loop<__nv_bfloat16, 128, 128, true, Wgmma90<__nv_bfloat16, 128, 128>>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, partial, splits, run_keys);
}
extern "C" __global__ void __launch_bounds__(128, 5)
prefill_attention_tma_sm90_f16_d64_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    const __grid_constant__ TensorMap k_map, const __grid_constant__ TensorMap v_map) {
  prefill_loop<__half, 64, 64, false, Wgmma90<__half, 64, 64>, TmaKv>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, nullptr, 1, 1, &k_map, &v_map);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_tma_sm90_f16_d64_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    const __grid_constant__ TensorMap k_map, const __grid_constant__ TensorMap v_map) {
  prefill_loop<__half, 64, 128, false, Wgmma90<__half, 64, 128>, TmaKv>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, nullptr, 1, 1, &k_map, &v_map);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_tma_sm90_f16_d128_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    const __grid_constant__ TensorMap k_map, const __grid_constant__ TensorMap v_map) {
  prefill_loop<__half, 128, 64, false, Wgmma90<__half, 128, 64>, TmaKv>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, nullptr, 1, 1, &k_map, &v_map);
}
extern "C" __global__ void __launch_bounds__(256, 2)
prefill_attention_tma_sm90_f16_d128_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    const __grid_constant__ TensorMap k_map, const __grid_constant__ TensorMap v_map) {
  prefill_loop<__half, 128, 128, false, Wgmma90<__half, 128, 128>, TmaKv>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, nullptr, 1, 1, &k_map, &v_map);
}
extern "C" __global__ void __launch_bounds__(128, 5)
prefill_attention_tma_sm90_bf16_d64_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, const __grid_constant__ TensorMap k_map,
    const __grid_constant__ TensorMap v_map) {
  prefill_loop<__nv_bfloat16, 64, 64, false, Wgmma90<__nv_bfloat16, 64, 64>, TmaKv>(q, k_cache,
      v_cache, block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads,
      block_size, max_blocks, scale, q_stride, nullptr, 1, 1, &k_map, &v_map);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_tma_sm90_bf16_d64_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, const __grid_constant__ TensorMap k_map,
    const __grid_constant__ TensorMap v_map) {
  prefill_loop<__nv_bfloat16, 64, 128, false, Wgmma90<__nv_bfloat16, 64, 128>, TmaKv>(q, k_cache,
      v_cache, block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads,
      block_size, max_blocks, scale, q_stride, nullptr, 1, 1, &k_map, &v_map);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_tma_sm90_bf16_d128_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, const __grid_constant__ TensorMap k_map,
    const __grid_constant__ TensorMap v_map) {
  prefill_loop<__nv_bfloat16, 128, 64, false, Wgmma90<__nv_bfloat16, 128, 64>, TmaKv>(q, k_cache,
      v_cache, block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads,
      block_size, max_blocks, scale, q_stride, nullptr, 1, 1, &k_map, &v_map);
}
extern "C" __global__ void __launch_bounds__(256, 2)
prefill_attention_tma_sm90_bf16_d128_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, const __grid_constant__ TensorMap k_map,
    const __grid_constant__ TensorMap v_map) {
  prefill_loop<__nv_bfloat16, 128, 128, false, Wgmma90<__nv_bfloat16, 128, 128>, TmaKv>(q, k_cache,
      v_cache, block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads,
      block_size, max_blocks, scale, q_stride, nullptr, 1, 1, &k_map, &v_map);
}
extern "C" __global__ void __launch_bounds__(128, 5)
prefill_attention_split_tma_sm90_f16_d64_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits, int run_keys, const __grid_constant__ TensorMap k_map,
    const __grid_constant__ TensorMap v_map) {
  prefill_loop<__half, 64, 64, true, Wgmma90<__half, 64, 64>, TmaKv>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, partial, splits, run_keys, &k_map, &v_map);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_tma_sm90_f16_d64_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits, int run_keys, const __grid_constant__ TensorMap k_map,
    const __grid_constant__ TensorMap v_map) {
  prefill_loop<__half, 64, 128, true, Wgmma90<__half, 64, 128>, TmaKv>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, partial, splits, run_keys, &k_map, &v_map);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_split_tma_sm90_f16_d128_r64(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits, int run_keys, const __grid_constant__ TensorMap k_map,
    const __grid_constant__ TensorMap v_map) {
  prefill_loop<__half, 128, 64, true, Wgmma90<__half, 128, 64>, TmaKv>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, partial, splits, run_keys, &k_map, &v_map);
}
extern "C" __global__ void __launch_bounds__(256, 2)
prefill_attention_split_tma_sm90_f16_d128_r128(
    const __half* q, const __half* k_cache, const __half* v_cache, const int* block_tables,
    const int* seq_lens, const int* cu_seqlens, const int* seq_slots, __half* out, int num_seqs,
    int q_heads, int kv_heads, int block_size, int max_blocks, float scale, int q_stride,
    float* partial, int splits, int run_keys, const __grid_constant__ TensorMap k_map,
    const __grid_constant__ TensorMap v_map) {
  prefill_loop<__half, 128, 128, true, Wgmma90<__half, 128, 128>, TmaKv>(q, k_cache, v_cache,
      block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads, block_size,
      max_blocks, scale, q_stride, partial, splits, run_keys, &k_map, &v_map);
}
extern "C" __global__ void __launch_bounds__(128, 5)
prefill_attention_split_tma_sm90_bf16_d64_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits, int run_keys,
    const __grid_constant__ TensorMap k_map, const __grid_constant__ TensorMap v_map) {
  prefill_loop<__nv_bfloat16, 64, 64, true, Wgmma90<__nv_bfloat16, 64, 64>, TmaKv>(q, k_cache,
      v_cache, block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads,
      block_size, max_blocks, scale, q_stride, partial, splits, run_keys, &k_map, &v_map);
}
extern "C" __global__ void __launch_bounds__(256)
prefill_attention_split_tma_sm90_bf16_d64_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits, int run_keys,
    const __grid_constant__ TensorMap k_map, const __grid_constant__ TensorMap v_map) {
  prefill_loop<__nv_bfloat16, 64, 128, true, Wgmma90<__nv_bfloat16, 64, 128>, TmaKv>(q, k_cache,
      v_cache, block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads,
      block_size, max_blocks, scale, q_stride, partial, splits, run_keys, &k_map, &v_map);
}
extern "C" __global__ void __launch_bounds__(128)
prefill_attention_split_tma_sm90_bf16_d128_r64(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits, int run_keys,
    const __grid_constant__ TensorMap k_map, const __grid_constant__ TensorMap v_map) {
  prefill_loop<__nv_bfloat16, 128, 64, true, Wgmma90<__nv_bfloat16, 128, 64>, TmaKv>(q, k_cache,
      v_cache, block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads,
      block_size, max_blocks, scale, q_stride, partial, splits, run_keys, &k_map, &v_map);
}
extern "C" __global__ void __launch_bounds__(256, 2)
prefill_attention_split_tma_sm90_bf16_d128_r128(
    const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
    const int* block_tables, const int* seq_lens, const int* cu_seqlens, const int* seq_slots,
    __nv_bfloat16* out, int num_seqs, int q_heads, int kv_heads, int block_size, int max_blocks,
    float scale, int q_stride, float* partial, int splits, int run_keys,
    const __grid_constant__ TensorMap k_map, const __grid_constant__ TensorMap v_map) {
  prefill_loop<__nv_bfloat16, 128, 128, true, Wgmma90<__nv_bfloat16, 128, 128>, TmaKv>(q, k_cache,
      v_cache, block_tables, seq_lens, cu_seqlens, seq_slots, out, num_seqs, q_heads, kv_heads,
      block_size, max_blocks, scale, q_stride, partial, splits, run_keys, &k_map, &v_map);
}
