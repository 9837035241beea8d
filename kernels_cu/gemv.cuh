// gemv.cuh: y = x W^T (+ residual) for decode-sized M (<= 16 rows), streaming W once at
// memory bandwidth, the products on tensor cores. The kernels are gemv.cu's (16-bit W) and
// gemv_quant.cu's (quantized W), each an instantiation of gemv_impl below.
//
//   Quantized W (gemv_quant.cu, the template's Wf): gemv_{f16,bf16}_e4m3_... take
//   `const unsigned char* w, const float* w_scale` in place of w: e4m3 codes (n, k) and a
//   scale a row, y = T(w_scale[r] * sum_j x[i][j] e4m3(w[r][j]) (+ residual)); and
//   gemv_{f16,bf16}_i4_... `const unsigned char* w, const T* w_scales,
//   const unsigned char* w_zeros, int group`: 4-bit values (n, k / 2 bytes, the nibble order
//   of rawgraph.ops.quantized.pack_int4) with a scale and zero point a group, y = T(sum_j
//   x[i][j] T((q - zero) scale) (+ residual)); k % 16 and group % 32 == 0. A lane's 16 bytes
//   of W are then 16 or 32 values, widened in registers (Wf below); the rest is the same.
//
//   extern "C" gemv_{f16,bf16}_n{8,16}[_w16]_uU[_t](  (the variants below)
//       const T* x,          // (m, k)
//       const T* w,          // (n, k): the checkpoint's [out, in] layout
//       const T* residual,   // (m, n) or NULL; may be y itself (in-place residual add)
//       T* y,                // (m, n)
//       int m, int n, int k, // m <= 8, 16 (_nM); k % 8 == 0; 16-byte aligned rows
//       unsigned long long* row_max)  // (m,) or NULL: see below
//   y[i][r] = T(sum_j x[i][j] * w[r][j] (+ residual[i][r])), fp32 accumulation.
//   row_max (the LM head's): each block merges, per row i, the greedy key (argmax.cuh) of its
//   largest stored y[i][r] into row_max[i] with atomicMax: once the grid is done it holds
//   argmax's pick of the row (largest value, smallest index, NaN skipped), in any block order.
//   It must start at 0 or a key of the same row; sample.cu reads it and sets it back to 0.
//
//   Layout: the roles are swapped (D = W x^T): a block owns 16 rows of W, the M side of
//   mma.m16n8k16, and the rows of x are its N side, so the tensor core does in one
//   instruction what SIMT code would spend M x-loads, 8M conversions and 8M FMAs on. Each
//   lane loads 16 contiguous bytes of W rows g and g+8 and of x row g per 32-wide k step
//   (g = lane / 4): since a dot product may sum its k in any order, the fragment's k slots
//   are simply mapped to those contiguous bytes, the same way for both operands. (17 to 64
//   rows, and 9 to 16 through wide weights, take the skinny GEMM, which stages both operands
//   in shared memory: every GEMV block reads all of x, which at 32 rows costs more than W.)
//   The block's 8 warps (_w16: 16) split k (chunk c goes to warp c % warps), U chunks in
//   flight per lane, and meet in a fixed-order shared-memory sum: deterministic (row_max's
//   atomicMax is too: a maximum does not depend on the order it is taken in).
//   _t: W in 128-byte row segments (chunk pairs: segment s to warp s % warps). A fragment
//   load reads 8 rows x 64 bytes per instruction; DRAM streams faster at 4 rows x 128 bytes
//   (a read of 6144 x 4096 with the fragments' pattern reached 80% of the copy bandwidth,
//   with segments 91%). So each lane loads 16 bytes of a 128-byte segment (8 lanes a row)
//   and the warp turns the 16 x 128 bytes into the mma fragments through shared memory (one
//   16-byte store and load a lane per piece). The transpose costs each warp time that only
//   other warps hide: rawgraph takes _t from two blocks per SM on (at two, for rows of 4096
//   and longer), and at one block per SM with 16 warps for rows of 8192 and longer; the
//   16-row tile always (ops.gemv.gemv_variant).
//   Summing chunk pairs, _t rounds differently from the fragment loads.
//   Variants: rawgraph/ops/gemv.py's table (x tile, chunks in flight, segments, warps, and
//   the launch bounds' blocks per SM of each form) generates the wrappers at the end of this
//   file; its comments say what each variant's register budget buys.
//   Weights are read through the read-only cache (they never change); x with coherent loads
//   (under PDL the kernel that writes x may still be running when this one starts).
//   grid (cdiv(n, 16)), block (256; _w16: 512).
//   Patchable: m (<= the tile) and the pointers; n and k are fixed by the weight.
//
//   extern "C" gemv_{f16,bf16}_n{8,16}[_w16]_uU[_t]_silu(const T* x, const T* w, T* y, int m,
//                                                       int n, int k, float norm_eps)
//   The MLP's gate_up projection with SiLU(gate) * up in the epilogue: w's rows interleaved
//   in groups of 8 (gate rows 8i..8i+7, then the matching up rows; ops.elementwise
//   GATE_UP_GROUP), so a block's W rows g and g + 8 are the gate and up of one output and
//   the lane holding both sums finishes it: y (m, n / 2) = T(T(silu(T(gate))) * T(up)), the
//   bits silu_mul.cu gives from the stored projection. n % 16 == 0.
//
//   extern "C" gemv_{f16,bf16}_n{8,16}[_w16]_uU[_t]_rope(const T* x, const T* w, T* y, int m,
//       int n, int k, T* k_cache, T* v_cache, const int* block_tables, const int* seq_slots,
//       const int* positions, const float* inv_freq, int q_size, int kv_size, int head_dim,
//       int block_size, int max_blocks, float norm_eps, const T* bias)
//   The attention's QKV projection (w: q, k then v rows) with rope_append.cu in the epilogue:
//   q rotated in y, k rotated into the cache (y keeps it unrotated), v copied to the cache,
//   the same bits as the GEMV then rope_append (both rotate the T-rounded projection with
//   common.cuh's rotate; bias, if not null: (n,), added to the T-rounded projection and
//   rounded again first, as rope_append.cu adds it; y keeps k and v with their bias).
//   The blocks of q and k rows take RoPE's pairs: 8 rows i of one head
//   and their partners i + D/2, so lane group g holds both sums of its pair. x row c is token
//   c: its slot and position pick the cache row as kv_append.cu does (slot < 0 or an
//   unmapped block: nothing cached). head_dim % 16 == 0. The slots, positions, block table
//   and frequencies are read before the PDL wait (their round trips overlap it): they must
//   be written before the previous kernel on the stream starts (the step's metadata copy, or
//   the last step's sampler before a step whose first kernel launches plainly).
//
//   norm_eps (the _silu and _rope forms): >= 0: x's rows are RMS-normalized first, the
//   projection being of x / sqrt(mean(x^2) + norm_eps) (RMSNorm without its weight, which
//   belongs folded into w's columns: rmsnorm.cu's fold_norm). The norm is one scale per row,
//   so it multiplies the finished sums: each lane sums the squares of the x it loads, the
//   sums meet in the block's reduction, and no pass over x comes first. < 0: x as it is
//   (the scale is exactly 1).
#pragma once
#include <argmax.cuh>
#include <common.cuh>
#include <mma.cuh>

namespace {

__device__ __forceinline__ uint4 load_w16(const void* p, bool ok) {
  return ok ? __ldg(reinterpret_cast<const uint4*>(p)) : make_uint4(0, 0, 0, 0);
}
__device__ __forceinline__ uint4 load_x16(const void* p, bool ok) {
  return ok ? *reinterpret_cast<const uint4*>(p) : make_uint4(0, 0, 0, 0);
}

// The two values in a 4-byte word, as floats (bf16 to float is a shift). Not mma.cuh's
// rg::unpack2, whose bf16 form goes through __bfloat1622float2: the two compile to different
// code here, and this one is what the decode GEMV was measured with.
template <typename T> __device__ __forceinline__ float2 unpack2(unsigned word);
template <> __device__ __forceinline__ float2 unpack2<__half>(unsigned word) {
  return __half22float2(*reinterpret_cast<const __half2*>(&word));
}
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(unsigned word) {
  return make_float2(__uint_as_float(word << 16), __uint_as_float(word & 0xffff0000u));
}
template <typename T> __device__ __forceinline__ void add_squares(unsigned word, float& s) {
  const float2 f = unpack2<T>(word);
  s = fmaf(f.x, f.x, s);
  s = fmaf(f.y, f.y, s);
}
// s += the squares of the 8 values in 16 bytes
template <typename T> __device__ __forceinline__ void add_squares(const uint4& v, float& s) {
  add_squares<T>(v.x, s);
  add_squares<T>(v.y, s);
  add_squares<T>(v.z, s);
  add_squares<T>(v.w, s);
}

// A 16-byte piece of an FP8 W row (16 e4m3 values) as two 16-byte pieces of T, in order
// (bfloat16 through float: exact too).
template <typename T> __device__ __forceinline__ unsigned e4m3x2_to(unsigned short v);
template <> __device__ __forceinline__ unsigned e4m3x2_to<__half>(unsigned short v) {
  return rg::e4m3x2_f16x2(v);
}
template <> __device__ __forceinline__ unsigned e4m3x2_to<__nv_bfloat16>(unsigned short v) {
  const unsigned h = rg::e4m3x2_f16x2(v);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const __nv_bfloat162 b = __float22bfloat162_rn(f);
  return *reinterpret_cast<const unsigned*>(&b);
}
template <typename T> __device__ __forceinline__ void e4m3x16(const uint4& v, uint4 (&out)[2]) {
  const unsigned words[4] = {v.x, v.y, v.z, v.w};
  unsigned o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = e4m3x2_to<T>(static_cast<unsigned short>(words[i] & 0xffffu));
    o[2 * i + 1] = e4m3x2_to<T>(static_cast<unsigned short>(words[i] >> 16));
  }
  out[0] = make_uint4(o[0], o[1], o[2], o[3]);
  out[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

// 4-bit W (rawgraph.ops.quantized): a 32-bit word holds 8 values in the nibble order
// v0 v2 v4 v6 v1 v3 v5 v7 (bits 0-3 first), so that masking nibbles i and i + 4 leaves the
// pair (v 2i, v 2i+1) in a half2's or bfloat162's low mantissa bits: OR'd into MAGIC (1024
// and 128: a unit in the last place of 1) each is MAGIC + q exactly, and less MAGIC + z,
// times the group's scale, it is T((q - z) scale), one rounding. A lane's 16 bytes are 32
// values of one group (a group is a multiple of 32).
template <typename T> struct I4Magic;
template <> struct I4Magic<__half> { static constexpr unsigned kBits = 0x64006400u, kOne = 1024; };
template <> struct I4Magic<__nv_bfloat16> {
  static constexpr unsigned kBits = 0x43004300u, kOne = 128;
};
template <typename T> struct Pair2 { using type = __half2; };
template <> struct Pair2<__nv_bfloat16> { using type = __nv_bfloat162; };
template <typename T> __device__ __forceinline__ unsigned pair2(float v) {
  return rg::pack2<T>(v, v);
}
// (MAGIC + z, scale) of a row's group, each as a pair of T; zeros for a row or group past W
template <typename T> __device__ __forceinline__ uint2 i4_group(const T* scales,
                                                               const unsigned char* zeros,
                                                               long long at, bool in) {
  if (!in) return make_uint2(pair2<T>(0.f), pair2<T>(0.f));
  return make_uint2(pair2<T>(static_cast<float>(I4Magic<T>::kOne + zeros[at])),
                    pair2<T>(rg::to_float(scales[at])));
}
template <typename T> __device__ __forceinline__ void i4x32(const uint4& v, uint2 group,
                                                            uint4 (&out)[4]) {
  using T2 = typename Pair2<T>::type;
  const T2 bias = *reinterpret_cast<const T2*>(&group.x);
  const T2 sc = *reinterpret_cast<const T2*>(&group.y);
  const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int wd = 0; wd < 4; ++wd) {
    unsigned o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned q = ((words[wd] >> (4 * i)) & 0x000f000fu) | I4Magic<T>::kBits;
      const T2 d = __hmul2(__hsub2(*reinterpret_cast<const T2*>(&q), bias), sc);
      o[i] = *reinterpret_cast<const unsigned*>(&d);
    }
    out[wd] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

// The rope epilogue's arguments (see the header)
template <typename T> struct Rope {
  T* k_cache;
  T* v_cache;
  const int* block_tables;
  const int* seq_slots;
  const int* positions;
  const float* inv_freq;
  int q_size, kv_size, head_dim, block_size, max_blocks;
  const T* bias;  // q, k, v biases (q_size + 2 kv_size), added to the rounded projection; or null
};

enum class Epi { kPlain, kSilu, kRope };

// Token c's cache row (as kv_append.cu finds it; -1: none) and position, into shared memory.
template <typename T>
__device__ void rope_meta(const Rope<T>& r, int c, int m, long long* cache_row, int* pos) {
  long long dst = -1;
  int p = 0;
  if (c < m) {
    const int seq = r.seq_slots[c];
    p = r.positions[c];
    if (seq >= 0 && p >= 0 && p < r.block_size * r.max_blocks) {
      const int block = r.block_tables[static_cast<long long>(seq) * r.max_blocks +
                                       p / r.block_size];
      if (block >= 0) dst = (static_cast<long long>(block) * r.block_size + p % r.block_size) *
                            r.kv_size;
    }
  }
  cache_row[c] = dst;
  pos[c] = p;
}

// One token's projected pair (rows lo, lo + gap of y_row, values a, b) through rope_append's
// math: a RoPE pair of q is rotated in place, of k stored as it is and rotated into the
// cache; v rows stored and copied to the cache.
template <typename T>
__device__ void rope_store(const Rope<T>& r, T* y_row, int lo, int gap, bool pairs, T a, T b,
                           float inv_freq, long long cache_row, int pos) {
  const int hi = lo + gap;
  if (!pairs) {
    y_row[lo] = a;
    y_row[hi] = b;
    if (cache_row >= 0) {
      const int off = r.q_size + r.kv_size;
      r.v_cache[cache_row + lo - off] = a;
      r.v_cache[cache_row + hi - off] = b;
    }
    return;
  }
  float s, c;
  rg::rope_angle(pos, inv_freq, s, c);
  T ra, rb;
  rg::rotate(rg::to_float(a), rg::to_float(b), c, s, ra, rb);
  if (lo < r.q_size) {
    y_row[lo] = ra;
    y_row[hi] = rb;
    return;
  }
  y_row[lo] = a;
  y_row[hi] = b;
  if (cache_row >= 0) {
    r.k_cache[cache_row + lo - r.q_size] = ra;
    r.k_cache[cache_row + hi - r.q_size] = rb;
  }
}

// NT: tiles of 8 rows of x (m <= 8 NT); U: k chunks in flight per lane (registers: 8 (NT + 2)
// each); ST: W read in 128-byte row segments through the warp's transpose buffer (U even); E:
// the epilogue (kSilu: gate_up's, y is (m, n / 2); kRope: QKV's; both without residual); NW:
// warps (k is split between them); F: W's storage (Wf), its scales (and zeros) in `quant`
// (WT: W's element, T or a byte)
enum class Wf { k16, kF8, kI4 };  // T; FP8 e4m3, a float scale a row; 4-bit, a group's scale, zero
template <Wf F, typename T> struct WElem { using type = unsigned char; };
template <typename T> struct WElem<Wf::k16, T> { using type = T; };
template <typename T> struct Quant {
  const float* row_scale;     // kF8: (n,)
  const T* scales;            // kI4: (n, k / group)
  const unsigned char* zeros; // kI4: (n, k / group), 0-15
  int group;                  // kI4: values a scale and a zero cover, a multiple of 32
};
template <typename T, int NT, int U, bool ST, Epi E = Epi::kPlain, int NW = 8, Wf F = Wf::k16,
          typename WT = typename WElem<F, T>::type>
__device__ void gemv_impl(const T* x, const WT* __restrict__ w, const T* residual, T* y,
                          int m, int n, int k, float norm_eps = -1.f,
                          unsigned long long* row_max = nullptr, Rope<T> rope = {},
                          Quant<T> quant = {}) {
  constexpr bool kNorm = E != Epi::kPlain;  // x's sums of squares kept (see the header)
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int warp = threadIdx.x >> 5;  // this warp's share of k
  const int tile = blockIdx.x;
  // W rows of lane group g: rows g and g + 8 of the block's 16, or in a rope block (q and k
  // rows) the pair i = 8 (tile % (D / 16)) + g, i + D / 2 of head tile / (D / 16)
  const bool pairs = E == Epi::kRope && tile * 16 < rope.q_size + rope.kv_size;
  const int gap = pairs ? rope.head_dim / 2 : 8;
  auto row_of = [&](int group) {
    if (!pairs) return tile * 16 + group;
    const int per_head = rope.head_dim / 16;
    return (tile / per_head) * rope.head_dim + 8 * (tile % per_head) + group;
  };
  // The lane's first W row and column: with ST lane (r, j) loads 16 bytes j of a 128-byte
  // segment of MMA rows 4q + r, q = 0..3; else lane (g, t) 16 bytes t of a 64-byte chunk
  // of rows g (q = 0) and g + 8 (q = 2). MMA row 8 + i is W row row_of(i) + gap. W is
  // walked in its elements (EL in 16 bytes, of VPE values each: a W row is kw of them);
  // 16 bytes hold P values: 8 of T, 16 of FP8, 32 of 4-bit, matched by XB 16-byte pieces of x.
  constexpr int VPE = F == Wf::kI4 ? 2 : 1, EL = 16 / sizeof(WT), P = EL * VPE, XB = P / 8;
  const int kw = k / VPE;
  const int r = lane >> 3, j = lane & 7;
  const int row0 = ST ? row_of(0) + r : row_of(g);
  unsigned ok = 0;  // bit q: row q is inside W
#pragma unroll
  for (int q = 0; q < 4; ++q) ok |= (row0 + 4 * (q & 1) + (q >> 1) * gap < n) << q;
  // Rows q = 0 and 2 (q = 1, 3: 4 rows on); rows past W are never read. The 8-row tile
  // without ST points them at row 0: ptxas then keeps all of a step's loads in flight
  // (124 registers, as before ST; 104 from wlo + gap k, and 1B down_proj ran 5% slower).
  constexpr bool kClamp = !ST && NT == 1;
  const WT* wlo = kClamp ? w + static_cast<long long>(ok & 1 ? row0 : 0) * kw + EL * t
                         : w + static_cast<long long>(row0) * kw + EL * (ST ? j : t);
  const WT* whi = kClamp ? w + static_cast<long long>(ok >> 2 & 1 ? row0 + gap : 0) * kw + EL * t
                         : wlo + static_cast<long long>(gap) * kw;
  const int chunks = (kw + 4 * EL - 1) / (4 * EL), segs = (kw + 8 * EL - 1) / (8 * EL);
  __shared__ long long cache_row[8 * NT];
  __shared__ int token_pos[8 * NT];
  __shared__ float freq[8];
  float acc[NT][4];
  float sq[NT];  // kNorm: this lane's share of the sum of squares of x row 8 j + g
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = sq[j] = 0.f;

  // kRope: each token's cache row and position and the block's frequencies, looked up
  // before the wait for the previous kernel: the step's metadata, written before that
  // kernel was launched (a host copy), so these round trips overlap the wait.
  auto meta = [&] {
    if constexpr (E == Epi::kRope) {
      if (threadIdx.x < 8 * NT) rope_meta(rope, threadIdx.x, m, cache_row, token_pos);
      if (pairs && threadIdx.x >= 32 && threadIdx.x < 40)
        freq[threadIdx.x - 32] = rope.inv_freq[row_of(threadIdx.x - 32) % rope.head_dim];
    }
  };
  rg::pdl_trigger();
  // A warp's transpose buffer (ST): a segment's 16 rows x 128 bytes in, the mma fragments
  // of its two chunks out. Slot (2h + hi) 32 + lane holds lane (g, t)'s 16 bytes of chunk h,
  // row g (hi = 0) or g + 8; bit 2 of the slot flips for h = 1, so that the 8 lanes of each
  // store phase meet all 32 banks. After the loop it holds the warp's sums (so without ST
  // only their size: more shared memory per block would keep the next kernel's blocks from
  // starting beside this one's under programmatic launch).
  __shared__ uint4 xpose[NW][ST ? 128 : NT * 32];
  uint4* const put =  // lane (r, j)'s slot for q = 0; q adds 32 (q / 2) + 16 (q % 2)
      xpose[threadIdx.x >> 5] + 64 * (j >> 2) + ((4 * r + (j & 3)) ^ (j >> 2 << 2));
  const uint4* const get = xpose[threadIdx.x >> 5] + lane;  // fragments of chunk 0
  const uint4* const get1 = xpose[threadIdx.x >> 5] + (lane ^ 4) + 64;  // of chunk 1
  // A step: U chunks a lane, chunk u's W fragments in a[u] (rows g, g + 8), its x in b[][u].
  // Without ST warp w takes chunks w, w + NW, ...; with ST segments (chunk pairs) so.
  static_assert(!ST || U % 2 == 0, "a segment is two chunks");
  constexpr int S = U / 2, kStride = NW;
  auto seg_of = [&](int st, int i) { return warp + (st * S + i) * kStride; };
  auto chunk_of = [&](int st, int u) {
    return ST ? 2 * seg_of(st, u / 2) + u % 2 : warp + (st * U + u) * kStride;
  };
  uint4 a[U][2], b[NT][U][XB];
  uint2 grp[F == Wf::kI4 ? U : 1][2];  // kI4: chunk u's groups of rows g, g + 8 (i4_group)
  auto load_w = [&](int st) {  // every load of the step before any mma
    if constexpr (ST) {
#pragma unroll
      for (int i = 0; i < S; ++i) {  // segment i's row 4q + r into a[2i + q / 2][q % 2]
        const int seg = seg_of(st, i);
        const bool in = seg * 8 * EL + EL * j < kw;
#pragma unroll
        for (int q = 0; q < 4; ++q)
          a[2 * i + q / 2][q % 2] = load_w16((q < 2 ? wlo : whi) + (q & 1) * 4 * kw + seg * 8 * EL,
                                             in && (ok >> q & 1));
      }
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = chunk_of(st, u);
        const bool in = c * 4 * EL + EL * t < kw;
        a[u][0] = load_w16(wlo + c * 4 * EL, in && (ok & 1));
        a[u][1] = load_w16(whi + c * 4 * EL, in && (ok >> 2 & 1));
      }
    }
    if constexpr (F == Wf::kI4) {  // the groups of the lane's fragments: rows g, g + 8
      const int groups = k / quant.group, lo = row_of(g);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int col = chunk_of(st, u) * 4 * P + P * t;  // the lane's first value
        const bool in = col < k;
        const int gi = in ? col / quant.group : 0;
        grp[u][0] = i4_group(quant.scales, quant.zeros, static_cast<long long>(lo) * groups + gi,
                             in && lo < n);
        grp[u][1] = i4_group(quant.scales, quant.zeros,
                             static_cast<long long>(lo + gap) * groups + gi, in && lo + gap < n);
      }
    }
  };
  auto transpose = [&] {  // ST: each segment's rows in, fragments out, in place
#pragma unroll
    for (int i = 0; i < S; ++i) {
#pragma unroll
      for (int q = 0; q < 4; ++q) put[32 * (q >> 1) + 16 * (q & 1)] = a[2 * i + q / 2][q % 2];
      __syncwarp();
      a[2 * i][0] = get[0];
      a[2 * i][1] = get[32];
      a[2 * i + 1][0] = get1[0];
      a[2 * i + 1][1] = get1[32];
      __syncwarp();
    }
  };
  auto load_x = [&](int st) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = chunk_of(st, u);
#pragma unroll
      for (int jj = 0; jj < NT; ++jj) {
        const int row = 8 * jj + g;
#pragma unroll
        for (int h = 0; h < XB; ++h)  // (one expression: a named column moved ptxas' choices)
          b[jj][u][h] = load_x16(x + static_cast<long long>(row) * k + c * 32 * XB + 8 * XB * t +
                                     8 * h,
                                 c * 32 * XB + 8 * XB * t + 8 * h < k && row < m);
      }
    }
  };
  auto mma = [&] {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      uint4 lo[XB], hi[XB];  // rows g and g + 8 as T: the loads themselves, or widened
      if constexpr (F == Wf::kF8) {
        e4m3x16<T>(a[u][0], lo);
        e4m3x16<T>(a[u][1], hi);
      } else if constexpr (F == Wf::kI4) {
        i4x32<T>(a[u][0], grp[u][0], lo);
        i4x32<T>(a[u][1], grp[u][1], hi);
      } else {
        lo[0] = a[u][0];
        hi[0] = a[u][1];
      }
#pragma unroll
      for (int jj = 0; jj < NT; ++jj)
#pragma unroll
        for (int h = 0; h < XB; ++h) {
          const uint4& bx = b[jj][u][h];
          rg::mma_16816<T>(acc[jj], {lo[h].x, hi[h].x, lo[h].y, hi[h].y}, bx.x, bx.y);
          rg::mma_16816<T>(acc[jj], {lo[h].z, hi[h].z, lo[h].w, hi[h].w}, bx.z, bx.w);
          if constexpr (kNorm) add_squares<T>(bx, sq[jj]);
        }
    }
  };
  // The first step's weights are requested (with ST, also transposed) before the wait for
  // the previous kernel, whose output x is, so that after it only x's round trip is left.
  // Later steps of the plain ST GEMV request x first, its round trip under W's and the
  // transpose; the epilogue forms hold more state through the loop and request it after
  // the transpose, which keeps them within 128 registers (80 for _u4_t_rope).
  constexpr bool kEarlyX = ST && E == Epi::kPlain;
  auto live = [&](int st) { return ST ? seg_of(st, 0) < segs : chunk_of(st, 0) < chunks; };
  for (int st = 0; live(st); ++st) {
    const bool first = st == 0;
    if (kEarlyX && !first) load_x(st);
    load_w(st);
    if (first) meta();
    if constexpr (ST) transpose();
    if (first) rg::pdl_wait();
    if (first || !kEarlyX) load_x(st);
    mma();
  }
  if (!live(0)) {  // a warp with no chunks still reads the residual below
    meta();
    rg::pdl_wait();
  }

  // The warps' sums meet in shared memory in a fixed order, so the result is deterministic.
  // Each warp leaves its sums in its own transpose buffer, which no other warp touches.
  constexpr int kVals = NT * 4 * 32;  // the block's outputs: fragment slot i, lane
  static_assert(kVals * sizeof(float) <= sizeof(xpose[0]), "a warp's sums fit its buffer");
  auto red = [&](int p) { return reinterpret_cast<float*>(xpose[p]); };
  __shared__ float part[kVals];  // this block's sum over its warps
  const int wid = threadIdx.x >> 5;  // this warp in the block
  __shared__ float sq_red[NW][8 * NT], sq_part[8 * NT];  // x row's sum of squares
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) red(wid)[(4 * j + e) * 32 + lane] = acc[j][e];
  if constexpr (kNorm) {  // x row 8 j + g's, over the lanes t of group g
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      float v = sq[j] + __shfl_xor_sync(0xffffffffu, sq[j], 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if (t == 0) sq_red[wid][8 * j + g] = v;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kVals; i += blockDim.x) {
    float v = 0.f;
#pragma unroll
    for (int p = 0; p < NW; ++p) v += red(p)[i];
    part[i] = v;
  }
  if (kNorm && threadIdx.x < 8 * NT) {
    float v = 0.f;
#pragma unroll
    for (int p = 0; p < NW; ++p) v += sq_red[p][threadIdx.x];
    sq_part[threadIdx.x] = v;
  }
  __syncthreads();
  auto scale = [&](int col) {  // x row col's 1 / rms (norm_eps >= 0), else 1
    return !kNorm || norm_eps < 0.f ? 1.f : rsqrtf(sq_part[col] / k + norm_eps);
  };
  // a sum of W row `row` as the row's dot product: FP8's, of its codes, times its scale
  auto dot = [&](float sum, int row) {
    if constexpr (F == Wf::kF8) return sum * quant.row_scale[row];
    return sum;
  };
  // slot 4 j + e of lane (g, t): e = 0, 1: W row g, x rows 8 j + 2t, 2t + 1;
  // e = 2, 3: W row g + 8, the same x rows
  if constexpr (E == Epi::kPlain) {
    for (int i = threadIdx.x; i < kVals; i += blockDim.x) {  // whole warps: see row_max
      const int j = i / 128, e = (i / 32) % 4, ln = i % 32;
      const int row = row_of(ln >> 2) + (e >= 2 ? 8 : 0);
      const int col = 8 * j + 2 * (ln & 3) + (e & 1);
      unsigned long long key = 0;
      if (row < n && col < m) {
        const long long o = static_cast<long long>(col) * n + row;
        float v = dot(part[i], row);
        if (residual != nullptr) v += rg::to_float(residual[o]);
        const T out = rg::from_float<T>(v);
        y[o] = out;
        key = rg::greedy_key(rg::to_float(out), row);
      }
      if (row_max != nullptr) {  // x row col's 8 values in this warp: lanes ln % 4 alike
#pragma unroll
        for (int s = 4; s < 32; s <<= 1) key = max(key, __shfl_xor_sync(0xffffffffu, key, s));
        if (ln < 4 && key != 0) atomicMax(&row_max[col], key);
      }
    }
  } else if constexpr (E == Epi::kRope) {  // lane group g's two rows: a pair or two rows
    for (int i = threadIdx.x; i < kVals / 2; i += blockDim.x) {
      const int j = i / 64, e = (i / 32) % 2, ln = i % 32;
      const int r = row_of(ln >> 2), col = 8 * j + 2 * (ln & 3) + e;
      if (r + gap >= n || col >= m) continue;
      const float sc = scale(col);
      T a = rg::from_float<T>(dot(part[(4 * j + e) * 32 + ln], r) * sc);
      T b = rg::from_float<T>(dot(part[(4 * j + e + 2) * 32 + ln], r + gap) * sc);
      if (rope.bias != nullptr) {  // rope_append.cu's: the rounded projection, then the bias
        a = rg::from_float<T>(rg::to_float(a) + rg::to_float(rope.bias[r]));
        b = rg::from_float<T>(rg::to_float(b) + rg::to_float(rope.bias[r + gap]));
      }
      rope_store(rope, y + static_cast<long long>(col) * n, r, gap, pairs, a, b,
                 pairs ? freq[ln >> 2] : 0.f, cache_row[col], token_pos[col]);
    }
  } else {  // W rows g and g + 8 are gate and up of output tile * 8 + g: silu_mul.cu's math
    for (int i = threadIdx.x; i < kVals / 2; i += blockDim.x) {
      const int j = i / 64, e = (i / 32) % 2, ln = i % 32;
      const int out = tile * 8 + (ln >> 2), half = n / 2;
      const int col = 8 * j + 2 * (ln & 3) + e;
      if (out < half && col < m) {
        const float sc = scale(col);
        const int gate = tile * 16 + (ln >> 2);  // its W row (up's: 8 on)
        const float a =
            rg::to_float(rg::from_float<T>(dot(part[(4 * j + e) * 32 + ln], gate) * sc));
        const float up =
            rg::to_float(rg::from_float<T>(dot(part[(4 * j + e + 2) * 32 + ln], gate + 8) * sc));
        y[static_cast<long long>(col) * half + out] =
            rg::from_float<T>(rg::silu_mul<T>(a, up));
      }
    }
  }
}

}  // namespace
