// sample.cu: one token per row from temperature / top-k / top-p sampling, seeded, on the device.
//
//   extern "C" sample_{f16,bf16}(
//       const T* logits,                 // (rows, vocab)
//       const T* proc, const int* rules, // a row with rules[r] != 0 samples from proc's row
//                                        //   (logits.cu's processed copy); NULL: none
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
//       int* seq_lens,                   //   sequence (seq_slots[r] >= 0); NULL if advance = 0
//       const int* top_n,                // (rows,) or NULL: rows with top_n[r] >= 0 get the
//       const float* lse,                //   token's raw log-probability, logits[token] -
//       float* lp, int* lp_ids)          //   lse[r] (logits.cu), in lp[.. 0], lp_ids[.. 0] of
//                                        //   (rows, [2,] 21): halves as host_out's when given
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
#include <select.cuh>

namespace {

using namespace rg;

__device__ __forceinline__ u64 mix64(u64 z) {  // splitmix64's finalizer
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Where a row's token goes: `out`, the host's mapped copy, its log-probability (rows that ask,
// from the raw logits and logits.cu's lse), and with `advance` the inputs of the decode step
// that continues this one. Called by one thread per row, after every thread of the row has
// read positions[r].
template <typename T> struct Emit {
  int* out;
  int* host_out;
  int advance;
  int* ids;
  int* positions;
  const int* seq_slots;
  int* seq_lens;
  const T* logits;     // the raw logits (rows, vocab)
  int vocab;
  const int* top_n;    // (rows,) >= 0: write lp[0], lp_ids[0]; NULL: none
  const float* lse;
  float* lp;           // (rows, [2,] 21) as logits.cu's: halves with host_out
  int* lp_ids;

  __device__ void operator()(int r, int token) const {
    out[r] = token;
    const int half = positions[r] & 1;
    if (host_out != nullptr) host_out[2 * r + half] = token;
    if (top_n != nullptr && top_n[r] >= 0) {
      const int at = (host_out != nullptr ? 2 * r + half : r) * 21;
      lp_ids[at] = token;
      lp[at] = to_float(logits[static_cast<long long>(r) * vocab + token]) - lse[r];
    }
    if (advance == 0) return;
    const int seq = seq_slots[r];
    if (seq < 0) return;  // a padding row
    ids[r] = token;
    positions[r] += 1;
    seq_lens[seq] += 1;
  }
};

template <typename T>
__device__ void sample_impl(const T* logits, const T* proc, const int* rules,
                            const float* temperature, const int* top_k, const float* top_p,
                            const u64* seeds, const int* positions,
                            int rows, int vocab, u64* row_max, const Emit<T>& emit) {
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
  // a row with rules samples from logits.cu's processed copy, whose greedy key the head
  // did not merge
  const bool ruled = rules != nullptr && rules[r] != 0;
  if (ruled) row_max = nullptr;
  Row<T> row{(ruled ? proc : logits) + static_cast<long long>(r) * vocab, vocab, 0.f, 0.f};
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

extern "C" __global__ void __launch_bounds__(kThreads, 1) sample_f16(
    const __half* logits, const __half* proc, const int* rules, const float* temperature,
    const int* top_k, const float* top_p, const unsigned long long* seeds, int* positions,
    int* out, int rows, int vocab, unsigned long long* row_max, int* host_out, int advance,
    int* ids, const int* seq_slots, int* seq_lens, const int* top_n, const float* lse,
    float* lp, int* lp_ids) {
  sample_impl(logits, proc, rules, temperature, top_k, top_p, seeds, positions, rows,
              vocab, row_max,
              Emit<__half>{out, host_out, advance, ids, positions, seq_slots, seq_lens, logits,
                      vocab, top_n, lse, lp, lp_ids});
}

extern "C" __global__ void __launch_bounds__(kThreads, 1) sample_bf16(
    const __nv_bfloat16* logits, const __nv_bfloat16* proc, const int* rules,
    const float* temperature,
    const int* top_k, const float* top_p, const unsigned long long* seeds, int* positions,
    int* out, int rows, int vocab, unsigned long long* row_max, int* host_out, int advance,
    int* ids, const int* seq_slots, int* seq_lens, const int* top_n, const float* lse,
    float* lp, int* lp_ids) {
  sample_impl(logits, proc, rules, temperature, top_k, top_p, seeds, positions, rows,
              vocab, row_max,
              Emit<__nv_bfloat16>{out, host_out, advance, ids, positions, seq_slots, seq_lens,
                                  logits, vocab, top_n, lse, lp, lp_ids});
}

