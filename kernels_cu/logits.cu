// logits.cu: what a head does to its logits between the LM head and the sampler, per row,
// and the per-sequence state that needs (the rules of a request: penalties, logit biases,
// min_tokens' bans).
//
//   extern "C" logits_{f16,bf16}(                one block of 1024 per row; grid (rows)
//       const T* logits, T* proc,                (rows, vocab) each: raw in, processed out
//       int rows, int vocab,
//       const int* positions,                    (rows,) the position of the row's last token
//       const int* top_n,                        (rows,) -1: no log-probabilities; 0..20
//       const int* targets,                      (rows,) or NULL: lp[0] = the target's
//       int halves,                              1, or 2: row r writes its half
//                                                  positions[r] & 1 of (rows, 2, 21)
//       float* lse, float* lp, int* lp_ids,      (rows,), (rows, [2,] 21) each
//       const int* rules,                        (rows,) nonzero: the row has rules;
//                                                  NULL: no row has (the rest NULL too)
//       const int* slots,                        (rows,) the row's sequence slot (< 0: none)
//       const int* fed,                          (rows,) or NULL: the token fed at
//                                                  positions[r], counted as an output token
//       int* counts, int* counted,               (slots, vocab), (slots,): per sequence
//       const float* presence, const float* frequency, const float* repetition,  (rows,)
//       const int* bias_n, const int* bias_ids, const float* bias_val,
//       const int* bias_until, int bias_cap)     (slots,), (slots, bias_cap) each
//
//   Log-probabilities are the raw row's (before any rule or temperature, vLLM's default):
//   lse[r] = max + log(sum exp(x - max)) over the non-NaN logits, in fp32, summed in one
//   fixed order; with targets, lp[0] = x[target] - lse and lp_ids[0] = target (else the
//   sampler writes them for the token it picks); lp[1 .. n], lp_ids[1 .. n]: the n largest
//   logits (larger first, then smaller index; found by a radix select of the keys, then an
//   ordered gather, so the same bits every time). Fewer than n numbers: ids -1, lp -inf.
//   Rules (rows with rules[r] != 0): with `fed`, the fed token is counted once per position
//   (counted[slot] remembers the next position to count, so a replayed or rolled-back step
//   does not count twice). Then proc = the raw row with, per token j (c = counts[slot][j]:
//   bits 0-29 its output count, bit 30 it has a bias entry, bit 31 it is in the prompt):
//     x += bias (an entry's; -inf instead while positions[r] < its until: min_tokens' bans)
//       first, as vLLM's order has it
//     if repetition != 1 and (count > 0 or in prompt): x = x > 0 ? x / rep : x * rep
//     if count > 0: x = (x - frequency * count) - presence
//   each in fp32 with no contraction, rounded once to T. The sampler reads proc's row.
//
//   extern "C" rules_start(seqs, install, seq_slots, nb, ids, vals, until, counts, counted,
//                          marks, bias_n, bias_ids, bias_val, bias_until, vocab, bias_cap)
//     grid (seqs, 32): piece i with install[i] & 1 starts its sequence's rules: the slot's
//     counts zeroed, counted = 0, marks = install bit 1, its bias entries (nb[i] of them,
//     staged) copied in.
//   extern "C" rules_mark(n, ids, tok_slots, seqs, install, seq_slots, nb, bias_ids, counts,
//                         marks, vocab, bias_cap)
//     grid (16, 2): y = 0: each chunk token whose piece's sequence has marks (install bit 1,
//     repetition != 1) gets its prompt bit; y = 1: each installed entry's token its bias bit.
//     atomicOr: the same bits in any order.
#include <select.cuh>

namespace {

using namespace rg;

constexpr int kTop = 20, kStride = kTop + 1;
constexpr int kCount = (1 << 30) - 1, kBias = 1 << 30;
constexpr unsigned kPrompt = 1u << 31;

struct Top {  // the gathered top-n candidates
  unsigned key[kTop];
  int idx[kTop];
};

// one token's rules, in fp32, no contraction (matches the NumPy reference bit for bit)
__device__ __forceinline__ float penalize(float x, unsigned c, float presence, float frequency,
                                          float rep) {
  const int count = static_cast<int>(c & kCount);
  if (rep != 1.f && (count > 0 || (c & kPrompt)))
    x = x > 0.f ? __fdiv_rn(x, rep) : __fmul_rn(x, rep);
  if (count > 0)
    x = __fsub_rn(__fsub_rn(x, __fmul_rn(frequency, static_cast<float>(count))), presence);
  return x;
}

// lse and the n largest of a row into out_lp[1..n], out_ids[1..n]
template <typename T>
__device__ void top_logprobs(const Row<T>& row, int n, float& lse_out, float* out_lp,
                             int* out_ids, Shared& sh, unsigned* whist) {
  __shared__ Top top;
  const int tid = threadIdx.x, chunks = row.chunks();
  float m = neg_inf();
  for (int j = tid; j < chunks; j += kThreads) {
    float v[8];
    row.load8(8 * j, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) m = fmaxf(m, v[e]);
  }
  m = block_reduce(m, sh.fval, MaxOp());
  float s = 0.f;
  if (m != neg_inf()) {
    for (int j = tid; j < chunks; j += kThreads) {
      float v[8];
      row.load8(8 * j, v);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (v[e] == v[e]) s += expf(v[e] - m);
    }
  }
  s = block_reduce(s, sh.fval, SumOp());
  const float lse = m == neg_inf() ? m : m + logf(s);
  if (tid == 0) lse_out = lse;
  if (n <= 0) return;
  const unsigned th = radix_select(row, 1u, false, static_cast<u64>(n), sh, whist);
  // ordered gather: thread t owns chunks [t * span, (t + 1) * span)
  const int span = (chunks + kThreads - 1) / kThreads;
  const int lo = min(chunks, tid * span), hi = min(chunks, lo + span);
  u64 mine = 0;  // (count above th) << 32 | (count at th)
  for (int j = lo; j < hi; ++j) {
    float v[8];
    row.load8(8 * j, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const unsigned k = key_of(v[e]);
      if (k > th) mine += 1ull << 32;
      else if (k == th && k != 0u) mine += 1;
    }
  }
  u64 total;
  const u64 before = block_scan(mine, total, sh);
  const int above = static_cast<int>(total >> 32);
  int a = static_cast<int>(before >> 32), b = above + static_cast<int>(before & 0xffffffffu);
  for (int j = lo; j < hi && (mine != 0); ++j) {
    float v[8];
    row.load8(8 * j, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const unsigned k = key_of(v[e]);
      int at = -1;
      if (k > th) at = a++;
      else if (k == th && k != 0u) at = b++;
      if (at >= 0 && at < n) {
        top.key[at] = k;
        top.idx[at] = 8 * j + e;
      }
    }
  }
  __syncthreads();
  if (tid == 0) {
    const int got = min(n, above + static_cast<int>(total & 0xffffffffu));
    for (int i = 1; i < got; ++i) {  // insertion sort: larger key, then smaller index
      const unsigned k = top.key[i];
      const int x = top.idx[i];
      int p = i - 1;
      while (p >= 0 && (top.key[p] < k || (top.key[p] == k && top.idx[p] > x))) {
        top.key[p + 1] = top.key[p];
        top.idx[p + 1] = top.idx[p];
        --p;
      }
      top.key[p + 1] = k;
      top.idx[p + 1] = x;
    }
    for (int i = 0; i < n; ++i) {
      out_ids[1 + i] = i < got ? top.idx[i] : -1;
      out_lp[1 + i] = i < got ? to_float(row.x[top.idx[i]]) - lse : neg_inf();
    }
  }
  __syncthreads();
}

template <typename T>
__device__ void logits_impl(const T* logits, T* proc, int rows, int vocab, const int* positions,
                            const int* top_n, const int* targets, int halves, float* lse,
                            float* lp, int* lp_ids, const int* rules, const int* slots,
                            const int* fed, int* counts, int* counted, const float* presence,
                            const float* frequency, const float* repetition, const int* bias_n,
                            const int* bias_ids, const float* bias_val, const int* bias_until,
                            int bias_cap) {
  pdl_start();
  __shared__ Shared sh;
  extern __shared__ unsigned whist[];
  const int r = blockIdx.x, tid = threadIdx.x;
  if (r >= rows) return;
  const int n = top_n[r], pos = positions[r];
  const long long base = static_cast<long long>(r) * vocab;
  Row<T> row{logits + base, vocab, 0.f, 0.f};
  if (n >= 0) {
    const int at = (r * halves + (halves == 2 ? (pos & 1) : 0)) * kStride;
    top_logprobs(row, min(n, kTop), lse[r], lp + at, lp_ids + at, sh, whist);
    if (targets != nullptr && tid == 0) {
      const int t = targets[r];
      lp_ids[at] = t;
      lp[at] = t >= 0 && t < vocab ? to_float(row.x[t]) - lse[r] : neg_inf();
    }
  }
  if (rules == nullptr || rules[r] == 0 || slots[r] < 0) return;
  const int slot = slots[r];
  unsigned* c = reinterpret_cast<unsigned*>(counts) + static_cast<long long>(slot) * vocab;
  if (fed != nullptr && tid == 0 && pos >= counted[slot]) {
    const int t = fed[r];
    if (t >= 0 && t < vocab) c[t] += 1;
    counted[slot] = pos + 1;
  }
  __syncthreads();
  const float pr = presence[r], fr = frequency[r], rep = repetition[r];
  T* out = proc + base;
  for (int j = tid; j < vocab; j += kThreads) {
    const unsigned cj = c[j];
    if (cj & kBias) continue;  // written below, bias first
    const float x = to_float(row.x[j]);
    out[j] = cj == 0u ? row.x[j] : from_float<T>(penalize(x, cj, pr, fr, rep));
  }
  const int nb = bias_n[slot];
  for (int e = tid; e < nb; e += kThreads) {
    const long long at = static_cast<long long>(slot) * bias_cap + e;
    const int j = bias_ids[at];
    // min_tokens' ban while the position is below `until`, the bias after (and always)
    const float x = pos < bias_until[at] ? neg_inf() : __fadd_rn(to_float(row.x[j]), bias_val[at]);
    out[j] = from_float<T>(penalize(x, c[j], pr, fr, rep));
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1) logits_f16(
    const __half* logits, __half* proc, int rows, int vocab, const int* positions, const int* top_n,
    const int* targets, int halves, float* lse, float* lp, int* lp_ids, const int* rules,
    const int* slots, const int* fed, int* counts, int* counted, const float* presence,
    const float* frequency, const float* repetition, const int* bias_n,
    const int* bias_ids, const float* bias_val, const int* bias_until, int bias_cap) {
  logits_impl(logits, proc, rows, vocab, positions, top_n, targets, halves, lse, lp,
              lp_ids, rules, slots, fed, counts, counted, presence, frequency, repetition,
              bias_n, bias_ids, bias_val, bias_until, bias_cap);
}

extern "C" __global__ void __launch_bounds__(kThreads, 1) logits_bf16(
    const __nv_bfloat16* logits, __nv_bfloat16* proc, int rows, int vocab, const int* positions,
    const int* top_n,
    const int* targets, int halves, float* lse, float* lp, int* lp_ids, const int* rules,
    const int* slots, const int* fed, int* counts, int* counted, const float* presence,
    const float* frequency, const float* repetition, const int* bias_n,
    const int* bias_ids, const float* bias_val, const int* bias_until, int bias_cap) {
  logits_impl(logits, proc, rows, vocab, positions, top_n, targets, halves, lse, lp,
              lp_ids, rules, slots, fed, counts, counted, presence, frequency, repetition,
              bias_n, bias_ids, bias_val, bias_until, bias_cap);
}


extern "C" __global__ void rules_start(int seqs, const int* install, const int* seq_slots,
                                       const int* nb, const int* ids, const float* vals,
                                       const int* until, int* counts, int* counted,
                                       int* marks, int* bias_n, int* bias_ids, float* bias_val,
                                       int* bias_until, int vocab, int bias_cap) {
  pdl_start();
  const int i = blockIdx.x;
  if (i >= seqs || !(install[i] & 1)) return;
  const int slot = seq_slots[i];
  int* c = counts + static_cast<long long>(slot) * vocab;
  for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < vocab; j += gridDim.y * blockDim.x)
    c[j] = 0;
  if (blockIdx.y != 0) return;
  if (threadIdx.x == 0) {
    counted[slot] = 0;
    marks[slot] = (install[i] >> 1) & 1;
    bias_n[slot] = nb[i];
  }
  for (int e = threadIdx.x; e < nb[i]; e += blockDim.x) {
    const long long from = static_cast<long long>(i) * bias_cap + e;
    const long long to = static_cast<long long>(slot) * bias_cap + e;
    bias_ids[to] = ids[from];
    bias_val[to] = vals[from];
    bias_until[to] = until[from];
  }
}

extern "C" __global__ void rules_mark(int n, const int* ids, const int* tok_slots, int seqs,
                                      const int* install, const int* seq_slots, const int* nb,
                                      const int* bias_ids, int* counts, const int* marks,
                                      int vocab, int bias_cap) {
  pdl_start();
  unsigned* c = reinterpret_cast<unsigned*>(counts);
  const int t0 = blockIdx.x * blockDim.x + threadIdx.x, step = gridDim.x * blockDim.x;
  if (blockIdx.y == 0) {
    for (int t = t0; t < n; t += step) {
      const int slot = tok_slots[t];
      if (slot >= 0 && marks[slot] && ids[t] >= 0 && ids[t] < vocab)
        atomicOr(c + static_cast<long long>(slot) * vocab + ids[t], kPrompt);
    }
    return;
  }
  for (int i = 0; i < seqs; ++i) {
    if (!(install[i] & 1)) continue;
    const long long row = static_cast<long long>(seq_slots[i]) * vocab;
    for (int e = t0; e < nb[i]; e += step)
      atomicOr(c + row + bias_ids[static_cast<long long>(i) * bias_cap + e], kBias);
  }
}
