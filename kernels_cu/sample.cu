// sample.cu: one token per row from temperature / top-k / top-p sampling, seeded, on the device.
//
//   extern "C" sample_{f16,bf16}(
//       const T* logits,                 // (rows, vocab)
//       const float* temperature,        // (rows,) <= 1e-6: greedy (argmax, smallest index)
//       const int* top_k,                // (rows,) <= 0 or >= vocab: no top-k cut
//       const float* top_p,              // (rows,) >= 1: no top-p cut
//       const unsigned long long* seeds, // (rows,) the request's seed
//       int* positions,                  // (rows,) the token's position: mixed into the seed
//       int* out, int rows, int vocab,
//       unsigned long long* row_max,     // (rows,) or NULL: each row's greedy key, merged by
//                                        //   the LM head's GEMV (gemv.cu); reset to 0 here
//       int* host_out,                   // (rows, 2) or NULL: the tokens again, in mapped
//                                        //   pinned host memory (the host reads them, no
//                                        //   copy), row r's at [r][positions[r] & 1]: a step
//                                        //   and the step continuing it write different
//                                        //   halves, so one may be read while the other runs
//       int advance,                     // nonzero: hand each token on to the next decode
//       int* ids,                        //   step: ids[r] = token, positions[r] += 1 and
//       const int* seq_slots,            //   seq_lens[seq_slots[r]] += 1 for every row with a
//       int* seq_lens)                   //   sequence (seq_slots[r] >= 0); NULL if advance = 0
//   Semantics (as Hugging Face's warpers): x = logits / temperature; top-k keeps tokens whose
//   logit is >= the k-th largest (ties kept); top-p then keeps the fewest largest tokens whose
//   probability mass reaches top_p (ties at the cut kept); one token is drawn from what is left
//   with probability proportional to exp(x - max x). NaN logits are never drawn.
//   Exact and deterministic: the cuts are radix selects (4 passes of 256 bins over the logits'
//   order-preserving 32-bit keys; one histogram per warp, 32-bit shared atomics), counts and
//   masses are integers (mass = exp(x - max) in 32-bit fixed point, 64-bit sums), so no
//   float atomics reorder anything. The draw is
//   r = hash(seed, position) * total mass; thread t owns a contiguous slice of the vocabulary,
//   a block scan of slice masses finds the slice holding r, and that thread walks it.
//   Greedy rows (temperature <= 1e-6, or no finite logit) take argmax.cu's pass
//   (argmax.cuh's block_argmax), or with row_max the token its key holds: no pass at all.
//   Every row's key is set back to 0 (read and reset by one thread), ready for the next head.
//   With `advance`, a decode step leaves the device ready for a step that continues it, with
//   nothing copied from the host in between (the engine's overlapped decode); the position
//   each row draws with is read by all its threads before one thread moves it on.
//   grid (rows), block (1024), dynamic shared memory 32 * 512 * 4 bytes. Patchable: rows
//   with grid.x; everything per row is read from device memory, so requests with their own
//   parameters share one graph node.
#include <argmax.cuh>

namespace {

constexpr int kThreads = 1024, kWarps = kThreads / 32;
using u64 = unsigned long long;

using rg::key_of;

__device__ __forceinline__ u64 mix64(u64 z) {  // splitmix64's finalizer
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct Shared {
  u64 hist[256];
  u64 scan[kWarps];
  float fval[kWarps];
  unsigned prefix;
  u64 need;
  int token;  // the drawn token, for the thread that emits it
};

// op over the block (one value per thread, 32 warps); every thread gets the result.
// `slots`: kWarps values of shared memory.
template <typename V, typename Op> __device__ V block_reduce(V v, V* slots, Op op) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // slots may still be read by a previous call
  if (lane == 0) slots[warp] = v;
  __syncthreads();
  v = slots[lane];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// exclusive prefix sum over the block; every thread also gets the total
__device__ u64 block_scan(u64 v, u64& total, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  u64 inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u64 up = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += up;
  }
  __syncthreads();
  if (lane == 31) sh.scan[warp] = inc;
  __syncthreads();
  u64 w = sh.scan[lane], winc = w;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u64 up = __shfl_up_sync(0xffffffffu, winc, o);
    if (lane >= o) winc += up;
  }
  total = __shfl_sync(0xffffffffu, winc, 31);
  const u64 before = __shfl_sync(0xffffffffu, winc - w, warp);
  return before + inc - v;
}

// weight of a token for a radix pass: 1 (counting) or its fixed-point mass
template <typename T> struct Row {
  const T* x;
  int vocab;
  float m, scale2;  // max logit; log2(e) / temperature
  // tokens i0 .. i0 + 7 (one 16-byte load when the row allows it); past the end: NaN
  __device__ void load8(int i0, float (&v)[8]) const { rg::load8(x, i0, vocab, v); }
  __device__ int chunks() const { return (vocab + 7) / 8; }
  __device__ u64 mass(float v) const {  // exp(x - max) in [0, 1] as 32-bit fixed point
    return static_cast<u64>(exp2f((v - m) * scale2) * 4294967296.0f);
  }
};

// The largest key threshold t such that the weight of keys >= t (among keys >= floor)
// reaches `need`. Four passes of 8 bits, most significant first.
template <typename T>
__device__ unsigned radix_select(const Row<T>& row, unsigned floor, bool by_mass, u64 need,
                                 Shared& sh, unsigned* whist) {
  const int lane = threadIdx.x & 31;
  unsigned prefix = 0, mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    // Each warp fills its own histogram with 32-bit shared atomics (conflicts only among its
    // own lanes; one histogram for all warps made the first pass, which sees mostly one
    // exponent byte, crawl). Masses go in as two 16-bit halves so 32 bits never overflow:
    // a warp sees at most vocab / 32 tokens, each half < 2^16 (high half <= 2^16).
    unsigned* lo_h = whist + (threadIdx.x >> 5) * 512;
    unsigned* hi_h = lo_h + 256;
    for (int b = lane; b < 512; b += 32) lo_h[b] = 0;
    __syncwarp();
    for (int j = threadIdx.x; j < row.chunks(); j += kThreads) {
      float v[8];
      row.load8(8 * j, v);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const unsigned k = key_of(v[e]);  // NaN and past-the-end: 0, below any floor
        if (k < floor || ((k ^ prefix) & mask)) continue;
        const unsigned bin = (k >> shift) & 255;
        if (!by_mass) {
          atomicAdd(&lo_h[bin], 1u);
          continue;
        }
        const u64 w = row.mass(v[e]);
        if (w == 0) continue;
        atomicAdd(&lo_h[bin], static_cast<unsigned>(w & 0xffff));
        atomicAdd(&hi_h[bin], static_cast<unsigned>(w >> 16));
      }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += kThreads) {
      u64 sum = 0;
      for (int w = 0; w < kWarps; ++w)
        sum += whist[w * 512 + b] + (static_cast<u64>(whist[w * 512 + 256 + b]) << 16);
      sh.hist[b] = sum;
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // lane l scans bins 255 - 8l .. 248 - 8l, from the top down
      u64 part = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) part += sh.hist[255 - 8 * lane - j];
      u64 inc = part;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const u64 up = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += up;
      }
      u64 before = inc - part;
      // the lane whose bins cross `need` (or the last lane, when rounding left it short)
      const bool mine = (before < need && need <= inc) || (lane == 31 && inc < need);
      if (mine) {
        int bin = 248 - 8 * lane;
        for (int j = 0; j < 8; ++j) {
          const u64 h = sh.hist[255 - 8 * lane - j];
          if (before + h >= need || j == 7) {
            bin = 255 - 8 * lane - j;
            break;
          }
          before += h;
        }
        sh.prefix = prefix | (static_cast<unsigned>(bin) << shift);
        sh.need = need > before ? need - before : 1;
      }
    }
    __syncthreads();
    prefix = sh.prefix;
    need = sh.need;
    mask |= 255u << shift;
    __syncthreads();
  }
  return prefix;
}

// Where a row's token goes: `out`, the host's mapped copy, and with `advance` the inputs of
// the decode step that continues this one. Called by one thread per row, after every thread
// of the row has read positions[r].
struct Emit {
  int* out;
  int* host_out;
  int advance;
  int* ids;
  int* positions;
  const int* seq_slots;
  int* seq_lens;

  __device__ void operator()(int r, int token) const {
    out[r] = token;
    if (host_out != nullptr) host_out[2 * r + (positions[r] & 1)] = token;
    if (advance == 0) return;
    const int seq = seq_slots[r];
    if (seq < 0) return;  // a padding row
    ids[r] = token;
    positions[r] += 1;
    seq_lens[seq] += 1;
  }
};

template <typename T>
__device__ void sample_impl(const T* logits, const float* temperature,
                            const int* top_k, const float* top_p,
                            const u64* seeds, const int* positions,
                            int rows, int vocab, u64* row_max, const Emit& emit) {
  rg::pdl_start();
  __shared__ Shared sh;
  extern __shared__ unsigned whist[];  // (warps, 2, 256): per-warp radix histograms
  const int r = blockIdx.x;
  if (r >= rows) return;
  u64 key = 0;  // thread 0's: the row's merged greedy key
  if (row_max != nullptr && threadIdx.x == 0) {
    key = row_max[r];
    row_max[r] = 0;
  }
  Row<T> row{logits + static_cast<long long>(r) * vocab, vocab, 0.f, 0.f};
  const int tid = threadIdx.x, chunks = row.chunks();
  const float temp = temperature[r];
  float m = rg::neg_inf();
  if (temp > 1e-6f) {
    for (int j = tid; j < chunks; j += kThreads) {
      float v[8];
      row.load8(8 * j, v);
#pragma unroll
      for (int e = 0; e < 8; ++e) m = fmaxf(m, v[e]);  // fmaxf skips NaN
    }
    m = block_reduce(m, sh.fval, MaxOp());
  }
  if (!(temp > 1e-6f) || m == rg::neg_inf()) {  // greedy: smallest index of the maximum
    if (row_max != nullptr) {
      if (tid == 0) emit(r, rg::greedy_token(key));
      return;
    }
    float v;
    int best;
    rg::block_argmax(row.x, 0, vocab, v, best);
    if (tid == 0) emit(r, best == rg::kNone ? 0 : best);
    return;
  }
  row.m = m;
  row.scale2 = 1.4426950408889634f / temp;

  unsigned cut = 1;  // keys >= cut stay in; 0 is NaN
  const int k = top_k[r];
  if (k > 0 && k < vocab) cut = max(cut, radix_select(row, cut, false, k, sh, whist));
  const float p = top_p[r];
  if (p < 1.f) {
    u64 part = 0, z;
    for (int j = tid; j < chunks; j += kThreads) {
      float v[8];
      row.load8(8 * j, v);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (key_of(v[e]) >= cut) part += row.mass(v[e]);
    }
    block_scan(part, z, sh);
    const u64 need = max(1ull, static_cast<u64>(ceil(static_cast<double>(z) * fmaxf(p, 0.f))));
    cut = max(cut, radix_select(row, cut, true, need, sh, whist));
  }

  // draw: thread t owns the 8-token chunks [t * span, (t + 1) * span)
  const int span = (chunks + kThreads - 1) / kThreads;
  const int lo = min(chunks, tid * span), hi = min(chunks, lo + span);
  u64 mine = 0, total;
  for (int j = lo; j < hi; ++j) {
    float v[8];
    row.load8(8 * j, v);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (key_of(v[e]) >= cut) mine += row.mass(v[e]);
  }
  if (tid == 0) sh.token = 0;  // block_scan's barriers order this before the walk's write
  const u64 before = block_scan(mine, total, sh);
  const u64 draw = __umul64hi(mix64(seeds[r] ^ mix64(static_cast<u64>(positions[r]))), total);
  if (before <= draw && draw < before + mine) {  // exactly one thread's slice holds the draw
    u64 acc = before;
    for (int j = lo; j < hi && acc <= draw; ++j) {
      float v[8];
      row.load8(8 * j, v);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (key_of(v[e]) < cut || acc > draw) continue;
        acc += row.mass(v[e]);
        if (draw < acc) sh.token = 8 * j + e;
      }
    }
  }
  __syncthreads();  // every thread has read positions[r] and the token is in
  if (tid == 0) emit(r, sh.token);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1)
sample_f16(const __half* logits, const float* temperature, const int* top_k, const float* top_p,
           const unsigned long long* seeds, int* positions, int* out, int rows, int vocab,
           unsigned long long* row_max, int* host_out, int advance, int* ids,
           const int* seq_slots, int* seq_lens) {
  sample_impl(logits, temperature, top_k, top_p, seeds, positions, rows, vocab, row_max,
              Emit{out, host_out, advance, ids, positions, seq_slots, seq_lens});
}

extern "C" __global__ void __launch_bounds__(kThreads, 1)
sample_bf16(const __nv_bfloat16* logits, const float* temperature, const int* top_k,
            const float* top_p, const unsigned long long* seeds, int* positions, int* out,
            int rows, int vocab, unsigned long long* row_max, int* host_out, int advance,
            int* ids, const int* seq_slots, int* seq_lens) {
  sample_impl(logits, temperature, top_k, top_p, seeds, positions, rows, vocab, row_max,
              Emit{out, host_out, advance, ids, positions, seq_slots, seq_lens});
}
