// prefill_attention.cuh: the prefill attention kernel both families run (prefill_attention.cu
// on mma.sync, prefill_attention_sm90.cu on wgmma): prefill_loop, and its parts (the key
// tile, the shared-memory layout, the block's work, the Q and K/V gathers, the online softmax
// of one key tile, the stores). A family supplies its tensor-core products (`Mma`), and may
// bring K/V tiles another way (`Kv`: GatherKv here, TmaKv in prefill_attention_sm90.cu).
// Both keep mma.sync's accumulator layout: warp w owns query rows 16 w .. 16 w + 15 of the
// block's tile, and thread (g = lane / 4, c2 = lane % 4 * 2) rows g and g + 8, columns
// 8 j + c2 and 8 j + c2 + 1 of each group of 8 (S: keys; O: head dims).
#pragma once
#include <mma.cuh>

struct TensorMap;  // tma.cuh: kernels that bring K/V tiles by TMA take one for K and for V

namespace {

constexpr int kBC = 64;  // keys per tile
constexpr float kLog2e = 1.4426950408889634f;

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of ROWS rows of D elements,
// chunk index XOR row % 8. PANELS (wgmma): a D = 128 tile is two panels of ROWS 128-byte rows
// (columns 0-63, then 64-127), the 128-byte swizzle's layout that matrix descriptors name;
// mma.sync's tiles keep whole 2 D-byte rows.
template <int D, bool PANELS, int ROWS> __device__ __forceinline__ int swz(int row, int chunk) {
  if constexpr (PANELS && D == 128)
    return (chunk >> 3) * ROWS * 128 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
  return row * (D * 2) + ((chunk ^ (row & 7)) << 4);
}

// A block's share: tile rows [0, tr g) hold `g` query heads of each of the tile's tr = BR / g
// query tokens (row r: token r0 + r / g, head h0 + r % g; the rows past tr g, if g does not
// divide BR, are padding; g = 1 but in SPLIT kernels, whose tiles hold a GQA group's heads
// so one K/V tile serves them all) of sequence blockIdx.z (q_len query tokens from q_begin;
// `past` keys cached before them); kv head `kv`; key tiles [t0, t1) of the kend keys its
// rows see (SPLIT: one run of them, `run_of`); the sequence's block table.
struct Work {
  int q_begin, q_len, r0, past, kend, t0, t1, g, tr, h0, kv;
  const int* table;
};

// Key runs of a sequence of `len` keys (this chunk's included): its own count whatever else
// the chunk holds (ops.attention.row_runs), len / run_keys, at least 1 and at most `splits`
// (the partials' stride). The combine counts them the same way.
__device__ __forceinline__ int seq_runs(int len, int splits, int run_keys) {
  return max(1, min(splits, len / run_keys));
}

// The run a SPLIT block takes: blockIdx.y % (runs launched per kv head). Recomputed where
// needed rather than kept in Work (registers: the d = 64 tiles of 128 rows sit at 128).
__device__ __forceinline__ int run_of(int kv_heads) {
  return static_cast<int>(blockIdx.y % (gridDim.y / kv_heads));
}

// The block's Work; false when it has none (a block-uniform answer).
template <int BR, bool SPLIT>
__device__ __forceinline__ bool find_work(Work& w, const int* block_tables, const int* seq_lens,
                                          const int* cu_seqlens, const int* seq_slots,
                                          int num_seqs, int q_heads, int kv_heads,
                                          int max_blocks, int splits, int run_keys) {
  const int seq = blockIdx.z, group = q_heads / kv_heads;
  // SPLIT: a kv head (gridDim.y / kv_heads runs launched for each); else a head
  const int unit = SPLIT ? blockIdx.y / (gridDim.y / kv_heads) : blockIdx.y;
  w.g = SPLIT ? group : 1;
  w.tr = BR / w.g;
  w.h0 = SPLIT ? unit * group : unit;
  w.kv = SPLIT ? unit : unit / group;
  if (seq >= num_seqs) return false;
  w.q_begin = cu_seqlens[seq];
  w.q_len = cu_seqlens[seq + 1] - w.q_begin;
  w.r0 = (gridDim.x - 1 - blockIdx.x) * w.tr;  // query tiles last-first: the longest first
  const int slot = seq_slots[seq];
  if (w.r0 >= w.q_len || slot < 0) return false;
  const int len = seq_lens[slot];
  const int runs = SPLIT ? seq_runs(len, splits, run_keys) : 1;
  if (SPLIT && run_of(kv_heads) >= runs) return false;  // past this sequence's runs
  w.past = len - w.q_len;
  w.kend = w.past + min(w.r0 + w.tr, w.q_len);
  const int tiles = (w.kend + kBC - 1) / kBC;
  w.t0 = 0;
  w.t1 = tiles;
  if constexpr (SPLIT) {  // run run_of() of the tiles
    const int per = (tiles + runs - 1) / runs;
    w.t0 = min(run_of(kv_heads) * per, tiles);
    w.t1 = min(w.t0 + per, tiles);
  }
  w.table = block_tables + static_cast<long long>(slot) * max_blocks;
  return true;
}

// The block's BR query rows (zeros past q_len) into qs, by THREADS threads from `tid`.
template <typename T, int D, bool PANELS, int BR, int THREADS>
__device__ __forceinline__ void load_q(char* qs, const T* q, const Work& w, int q_stride,
                                       int tid) {
  constexpr int RC = D / 8;
  for (int i = tid; i < BR * RC; i += THREADS) {
    const int r = i / RC, c = i % RC, token = w.r0 + r / w.g;
    const bool ok = r < w.tr * w.g && token < w.q_len;
    const T* src = ok ? q + static_cast<long long>(w.q_begin + token) * q_stride +
                            (w.h0 + r % w.g) * D + c * 8
                      : q;
    rg::cp_async16(qs + swz<D, PANELS, BR>(r, c), src, ok);
  }
}

// Keys [key0, key0 + kBC) of one kv head (columns col.., rows row_stride apart) gathered
// through the block table into the K and V tiles, by THREADS threads from `tid`; keys at or
// past kend (or past the table) are zero-filled.
template <typename T, int D, bool PANELS, int THREADS>
__device__ __forceinline__ void load_kv(char* ks, char* vs, const T* k_cache, const T* v_cache,
                                        const int* table, int key0, int kend, int block_size,
                                        int max_blocks, int row_stride, int col, int tid) {
  constexpr int RC = D / 8;
#pragma unroll
  for (int i = tid; i < kBC * RC; i += THREADS) {
    const int r = i / RC, c = i % RC, key = key0 + r;
    const int tb = key / block_size;  // beyond the table: unmapped, never read
    const int blk = key < kend && tb < max_blocks ? table[tb] : -1;
    const bool ok = blk >= 0;
    const long long at = ok ? (static_cast<long long>(blk) * block_size + key % block_size) *
                                  row_stride + col + c * 8 : 0;
    rg::cp_async16(ks + swz<D, PANELS, kBC>(r, c), k_cache + at, ok);
    rg::cp_async16(vs + swz<D, PANELS, kBC>(r, c), v_cache + at, ok);
  }
}

// How K/V tiles reach shared memory (prefill_loop's `Kv`): gathered by every thread with
// cp.async through the block table, into the buffer after the one being read; ready() waits
// for the tile (and, on the first, the Q tile) and makes it visible to the whole block.
struct GatherKv {
  __device__ __forceinline__ GatherKv(char*, int) {}

  // tile t's keys of w's kv head into the K and V tiles at buf
  template <typename T, int D, bool P, int THREADS>
  __device__ __forceinline__ void fetch(char* buf, const T* k_cache, const T* v_cache,
                                        const TensorMap*, const TensorMap*, const Work& w, int t,
                                        int block_size, int max_blocks, int row_stride, int col,
                                        int tid) {
    load_kv<T, D, P, THREADS>(buf, buf + kBC * D * 2, k_cache, v_cache, w.table, t * kBC,
                              w.kend, block_size, max_blocks, row_stride, col, tid);
  }

  template <class Mma, int D, bool P, int THREADS>
  __device__ __forceinline__ void ready(char*, const Work&, int, int) {
    rg::cp_async_commit();
    rg::cp_async_wait<1>();
    Mma::landed();
    __syncthreads();
  }
};

// The online softmax over one key tile: s (scores of this thread's two rows, at positions
// qpos) scaled to base 2, keys past a row masked (`edge`: some may be), row max m and sum l
// updated, s left holding P and alpha the factor the rows' output so far must take
// (rescale()). Written for latency, not instruction count: a warp's softmax sits between its
// two MMAs with nothing of its own to overlap, so its dependent chains are what the tile
// waits for; the row max and sum each run as four chains of 4, not one of 16 (2-5% of the
// kernel, NOTES.md), and the two rows' exps issue together.
template <bool SPLIT>
__device__ __forceinline__ void softmax_tile(float (&s)[kBC / 8][4], float (&m)[2],
                                             float (&l)[2], float (&alpha)[2], int key0,
                                             bool edge, const int (&qpos)[2], float scale2,
                                             int c2) {
  constexpr int N = kBC / 8;
  float ref[2], t[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (edge) {  // keys past the row: -inf, so their p is ex2(-inf) = 0
#pragma unroll
      for (int j = 0; j < N; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (key0 + j * 8 + c2 + e > qpos[h]) s[j][2 * h + e] = rg::neg_inf();
    }
    // the max of the raw scores, scaled once: scale2 > 0, so it is the max of the scaled
    // ones to the bit (rounding is monotonic; a max is exact in any order)
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float x = fmaxf(s[j][2 * h], s[j][2 * h + 1]);
      t[h][j % 4] = j < 4 ? x : fmaxf(t[h][j % 4], x);
    }
    float raw = fmaxf(fmaxf(t[h][0], t[h][1]), fmaxf(t[h][2], t[h][3]));
    raw = fmaxf(raw, __shfl_xor_sync(0xffffffffu, raw, 1));
    raw = fmaxf(raw, __shfl_xor_sync(0xffffffffu, raw, 2));
    const float mx = fmaxf(m[h], raw * scale2);
    // a split may start with a tile whose keys all lie past this row (mx = -inf): then
    // alpha and every p are 0, not NaN (the whole tile 0 of an unsplit row is never masked)
    ref[h] = SPLIT && mx == rg::neg_inf() ? 0.f : mx;
    alpha[h] = rg::ex2(m[h] - ref[h]);  // 0 on the first tile (m = -inf)
    m[h] = mx;
  }
#pragma unroll
  for (int j = 0; j < N; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i)  // an FFMA and an EX2 a score
      s[j][i] = rg::ex2(fmaf(s[j][i], scale2, -ref[i >> 1]));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float x = s[j][2 * h] + s[j][2 * h + 1];
      t[h][j % 4] = j < 4 ? x : t[h][j % 4] + x;
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h)
    l[h] = l[h] * alpha[h] + ((t[h][0] + t[h][1]) + (t[h][2] + t[h][3]));
}

// O's rows times their alpha. SKIP: a tile that moves none of the warp's row maxes (every
// alpha exactly 1, ex2(0)) skips the multiplies, to the same bits: the common case deep into
// a sequence, and in trained models from the first tile on (the first token tends to hold a
// row's largest score). (Not in mma.sync's kernels: at d = 64, r = 128 the branch spills.)
template <int D, bool SKIP = false>
__device__ __forceinline__ void rescale(float (&o)[D / 8][4], const float (&alpha)[2]) {
  if (SKIP && !__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) return;
#pragma unroll
  for (int d = 0; d < D / 8; ++d) {
    o[d][0] *= alpha[0];
    o[d][1] *= alpha[0];
    o[d][2] *= alpha[1];
    o[d][3] *= alpha[1];
  }
}

// This thread's two rows (tile rows row0 and row0 + 8): normalised into out, or (SPLIT, a
// sequence of more than one run) as its run's (unnormalised output, max in base 2, sum) in
// partial.
template <typename T, int D, bool SPLIT>
__device__ __forceinline__ void store_rows(const float (&o)[D / 8][4], const float (&m)[2],
                                           const float (&l)[2], T* out, float* partial,
                                           const Work& w, int row0, int q_heads, int kv_heads,
                                           int splits, int run_keys, int lane) {
  const int c2 = (lane & 3) * 2;
  // SPLIT: its sequence's runs (its length is past + q_len); one run writes out
  const bool runs = SPLIT && seq_runs(w.past + w.q_len, splits, run_keys) > 1;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = l[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int r = row0 + 8 * h, token = w.r0 + r / w.g;
    if (r >= w.tr * w.g || token >= w.q_len) continue;
    const long long at = (w.q_begin + token) * static_cast<long long>(q_heads) + w.h0 + r % w.g;
    if (runs) {  // as decode attention's splits
      float* dst = partial + (at * splits + run_of(kv_heads)) * (D + 2);
#pragma unroll
      for (int d = 0; d < D / 8; ++d)  // 8-byte aligned: D + 2 and c2 are even
        *reinterpret_cast<float2*>(dst + d * 8 + c2) = make_float2(o[d][2 * h], o[d][2 * h + 1]);
      if ((lane & 3) == 0) *reinterpret_cast<float2*>(dst + D) = make_float2(m[h], sum);
      continue;
    }
    const float inv = 1.f / sum;
    T* dst = out + at * D + c2;
#pragma unroll
    for (int d = 0; d < D / 8; ++d)
      *reinterpret_cast<unsigned*>(dst + d * 8) =
          rg::pack2<T>(o[d][2 * h] * inv, o[d][2 * h + 1] * inv);
  }
}

// BR query rows per block, 16 per warp, BR / 16 warps loading and computing alike; K/V tiles
// gathered with cp.async, double-buffered. SPLIT: the tile's rows are a GQA group's heads of
// BR / group tokens (Work), and the block takes run blockIdx.y % (gridDim.y / kv_heads) of
// its query tile's key tiles (seq_runs of them; blocks past those exit) and leaves
// (unnormalised output, max, sum) in `partial` for the combine, or (one run) writes out;
// else a head's BR tokens, written to out. Mma, the products (an object, for state it keeps
// across tiles): kPanels (its tile layout, swz), kSkipRescale (rescale's SKIP), landed()
// (after this thread's copies have landed, before the block barrier), start(qs, warp, lane)
// (on the first tile), scores(s, qs, ks, warp, lane) (s += Q K^T, s zeroed), pv(o, s, vs,
// warp, lane) (o += P V, s holding P). Kv: how K/V tiles arrive (GatherKv;
// prefill_attention_sm90.cu's TmaKv, which takes k_map and v_map).
template <typename T, int D, int BR, bool SPLIT, class Mma, class Kv = GatherKv>
__device__ void prefill_loop(const T* q, const T* k_cache, const T* v_cache,
                             const int* block_tables, const int* seq_lens, const int* cu_seqlens,
                             const int* seq_slots, T* out, int num_seqs, int q_heads,
                             int kv_heads, int block_size, int max_blocks, float scale,
                             int q_stride, float* partial, int splits, int run_keys,
                             const TensorMap* k_map = nullptr,
                             const TensorMap* v_map = nullptr) {
  rg::pdl_start();
  constexpr int kTile = kBC * D * 2, kThreads = BR * 2;
  constexpr bool P = Mma::kPanels;
  extern __shared__ __align__(1024) char smem[];  // wgmma's swizzle: 1024-byte atoms
  char* qs = smem;
  char* kvs = smem + BR * D * 2;  // [buffer][K, V] tiles
  Work w;
  if (!find_work<BR, SPLIT>(w, block_tables, seq_lens, cu_seqlens, seq_slots, num_seqs,
                            q_heads, kv_heads, max_blocks, splits, run_keys))
    return;
  const int row_stride = kv_heads * D, col = w.kv * D;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  Kv kv(kvs + 4 * kTile, tid);
  load_q<T, D, P, BR, kThreads>(qs, q, w, q_stride, tid);
  if (w.t0 < w.t1)  // an empty run (SPLIT) loads no keys
    kv.template fetch<T, D, P, kThreads>(kvs + (w.t0 & 1) * 2 * kTile, k_cache, v_cache, k_map,
                                         v_map, w, w.t0, block_size, max_blocks, row_stride,
                                         col, tid);
  rg::cp_async_commit();

  Mma mma;
  float o[D / 8][4] = {};
  float m[2] = {rg::neg_inf(), rg::neg_inf()}, l[2] = {0.f, 0.f};
  const float scale2 = scale * kLog2e;
  const int c2 = (lane & 3) * 2;
  const int row0 = warp * 16 + (lane >> 2);  // this thread's rows: row0, row0 + 8
  const int qpos[2] = {w.past + w.r0 + row0 / w.g, w.past + w.r0 + (row0 + 8) / w.g};
  for (int t = w.t0; t < w.t1; ++t) {
    if (t + 1 < w.t1)
      kv.template fetch<T, D, P, kThreads>(kvs + ((t + 1) & 1) * 2 * kTile, k_cache, v_cache,
                                           k_map, v_map, w, t + 1, block_size, max_blocks,
                                           row_stride, col, tid);
    char* ks = kvs + (t & 1) * 2 * kTile;
    kv.template ready<Mma, D, P, kThreads>(ks + kTile, w, t, tid);
    if (t == w.t0) mma.start(qs, warp, lane);

    float s[kBC / 8][4] = {};  // S = Q K^T: 16 rows x 64 keys per warp
    mma.scores(s, qs, ks, warp, lane);
    const int key0 = t * kBC;
    float alpha[2];
    softmax_tile<SPLIT>(s, m, l, alpha, key0, key0 + kBC - 1 > w.past + w.r0, qpos, scale2,
                        c2);
    rescale<D, Mma::kSkipRescale>(o, alpha);
    mma.pv(o, s, ks + kTile, warp, lane);
    __syncthreads();  // this buffer is refilled by the next iteration's prefetch
  }

  if constexpr (SPLIT) rg::cp_async_wait<0>();  // an empty split's query tile
  store_rows<T, D, SPLIT>(o, m, l, out, partial, w, row0, q_heads, kv_heads, splits, run_keys,
                          lane);
}

}  // namespace
