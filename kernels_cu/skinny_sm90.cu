// skinny_sm90.cu: y = x W^T (+ residual) for up to 128 rows of x (decode batches) on Hopper's
// warpgroup tensor cores (wgmma), W and x brought by the tensor memory accelerator (TMA);
// compiled for sm_90a. The same contract as skinny.cu, whose cp.async ring streams W at
// about half the copy rate (benchmarks/NOTES.md, "Skinny GEMM").
//
//   extern "C" skinny90_{f16,bf16}_x{32,64,128}[_c2|_c4](   (the wrappers at the end are
//                                                 generated from ops.matmul's SKINNY90)
//       const __grid_constant__ TensorMap xmap,  // x (rows >= m, k) row-major, box (MX, 64)
//       const __grid_constant__ TensorMap wmap,  // w (n, k), the checkpoint's [out, in]
//                                                // layout, box (64, 64); both 128-byte swizzle
//       const T* residual,   // (m, n) or NULL; may be y itself (in-place residual add)
//       T* y,                // (m, n)
//       int m, int n, int k) // m <= MX * gridDim.y; k % 8 == 0
//   y[i][r] = T(sum_j x[i][j] * w[r][j] (+ residual[i][r])), fp32 accumulation.
//
//   W is the M side of wgmma.m64nMXk16 and x the N side (MX = 32, 64 or 128 rows of x): a
//   block owns 64 rows of W and every row of x, so W is read from DRAM once. One consumer
//   warpgroup issues the MMAs from shared memory (both operands K-major through matrix
//   descriptors); one producer warp's lane 0 issues each k tile's two TMA boxes (64 W rows
//   and MX x rows, 64 elements = 128 bytes wide) into a ring of S slots with `full`
//   (bytes landed) and `empty` (consumers done) barriers, as gemm_sm90.cu does. Under PDL
//   the first S boxes of W are requested before griddepcontrol.wait (W is no earlier
//   kernel's output), x's after it. S = 8 slots for MX = 32, 5 for 64, 3 for 128: two blocks
//   an SM, with 128, 80 or 48 KiB of W in flight per SM (x's boxes take the rest); in
//   clusters of 2 (grids of at most one block an SM) 18, 13 and 8: one block an SM with 144,
//   104 or 64 KiB of W in flight.
//   _c2, _c4: a cluster of 2 or 4 blocks shares the 64 W rows, block r taking k tiles r,
//   r + C, ... Every block leaves its 64 x MX sums in shared memory; block r then finishes
//   outputs [r, r + 1) * 64 MX / C, adding the blocks' sums (distributed shared memory) in
//   block order. Deterministic: no atomics anywhere.
//   Rows of x past MX take more tiles of MX along grid.y, each reading W again: a row's sums
//   run the same k order in any tile and at any m (ops.Variants.skinny_always).
//   grid (cdiv(n, 64) * C, cdiv(m, MX)), block (160), dynamic shared memory
//   S * ((64 + MX) * 128 + 16) + MX * 65 * 4 B: the ring, its barriers, the block's sums
//   (ops.matmul: skinny90_smem). Patchable: m (and grid.y with it) and the residual and y
//   pointers; the descriptors fix x's and w's addresses, n and k.
//   extern "C" skinny90_{f16,bf16}_x{32,64,128}[_c2|_c4]_silu(the same arguments; residual
//       NULL, y (m, n / 2)): the MLP's gate_up projection (rows interleaved in groups of 8
//       gate, 8 up; n % 16 == 0) finished in the epilogue, y = T(T(silu(T(gate))) * T(up)):
//       silu_mul.cu's bits without the (m, n) projection written and read back.
#include <cluster.cuh>
#include <tma.cuh>
#include <wgmma.cuh>

namespace {

constexpr int kRows = 64, kBK = 64;  // W rows a block; k per tile (one 128-byte box row)
constexpr int kThreads = 160;        // a consumer warpgroup and a producer warp
// S, the ring's slots (the wrappers pass ops.matmul's SKINNY90_STAGES): as many as two blocks
// an SM hold, or as one block holds (the deep ring) for grids of at most one block an SM
template <typename T, int MX, int CS, int S, bool SILU = false>
__device__ void skinny90_impl(const TensorMap* xmap, const TensorMap* wmap, const T* residual,
                              T* y, int m, int n, int k) {
  constexpr int kStages = S;
  constexpr int kW = kRows * kBK * 2, kStage = (kRows + MX) * kBK * 2;  // bytes
  constexpr int kPart = kRows + 1;  // part[] row stride (floats): a bank per lane group
  // the ring's slots (1024-byte aligned, as the 128-byte swizzle needs), its full and empty
  // barriers, then this block's sums part[x row][W row] (no static shared memory: it would
  // come first and move the ring)
  extern __shared__ __align__(1024) char ring[];
  unsigned long long* full = reinterpret_cast<unsigned long long*>(ring + kStages * kStage);
  unsigned long long* empty = full + kStages;
  float* part = reinterpret_cast<float*>(empty + kStages);
  const int rank = CS > 1 ? static_cast<int>(rg::cluster_rank()) : 0;
  const int r0 = (blockIdx.x / CS) * kRows;
  const int x0 = blockIdx.y * MX;  // this block's tile of x rows (grid.y tiles of MX)
  const int ktiles = (k + kBK - 1) / kBK;
  const int mine = (ktiles - rank + CS - 1) / CS;  // k tiles rank, rank + CS, ...
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      rg::mbar_init(&full[s], 1);
      rg::mbar_init(&empty[s], 4);  // one arrival per consumer warp
    }
    rg::mbar_fence_init();
  } else if (threadIdx.x == 128) {
    rg::tma_prefetch(xmap);
    rg::tma_prefetch(wmap);
  }
  __syncthreads();

  if (threadIdx.x >= 128) {  // the producer warp; lane 0 issues
    if (threadIdx.x == 128) {
      // the prologue's W boxes before the wait (each slot's barrier expects W and x bytes)
      for (int t = 0; t < kStages && t < mine; ++t) {
        rg::mbar_expect_tx(&full[t], kStage);
        rg::tma_load_2d(ring + t * kStage, wmap, (rank + t * CS) * kBK, r0, &full[t]);
      }
      rg::pdl_trigger();
      rg::pdl_wait();  // x comes from an earlier kernel
      for (int t = 0; t < mine; ++t) {
        const int s = t % kStages, k0 = (rank + t * CS) * kBK;
        if (t >= kStages) {
          rg::mbar_wait(&empty[s], (t / kStages - 1) & 1);
          rg::mbar_expect_tx(&full[s], kStage);
          rg::tma_load_2d(ring + s * kStage, wmap, k0, r0, &full[s]);
        }
        rg::tma_load_2d(ring + s * kStage + kW, xmap, k0, x0, &full[s]);
      }
    }
  } else {  // the consumer warpgroup
    float acc[MX / 2];
#pragma unroll
    for (int i = 0; i < MX / 2; ++i) acc[i] = 0.f;
    const bool signals = (threadIdx.x & 31) == 0;
    for (int t = 0; t < mine; ++t) {
      const int s = t % kStages;
      rg::mbar_wait(&full[s], (t / kStages) & 1);
      const char* a = ring + s * kStage;
      rg::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk)
        rg::Wgmma<T, MX>::run(acc, rg::desc128(a + kk * 32), rg::desc128(a + kW + kk * 32));
      rg::wgmma_commit();
      rg::wgmma_wait<1>();  // tile t - 1's products are done: its slot may be refilled
      if (t > 0 && signals) rg::mbar_arrive(&empty[(t - 1) % kStages]);
    }
    rg::wgmma_wait<0>();
    // fragment j (of MX / 8), half hi, element e of lane (g, tq) in warp q: W row
    // 16 q + g + 8 hi, x row 8 j + 2 tq + e
    const int lane = threadIdx.x & 31, q = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int j = 0; j < MX / 8; ++j)
#pragma unroll
      for (int hi = 0; hi < 2; ++hi)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          part[(8 * j + 2 * tq + e) * kPart + 16 * q + g + 8 * hi] = acc[4 * j + 2 * hi + e];
  }
  __syncwarp();  // the producer warp's lanes together again (cluster barriers are .aligned)
  rg::pdl_wait();  // the residual comes from an earlier kernel (every thread reads it)
  if constexpr (CS > 1) rg::cluster_sync();  // every block's part[] is ready
  else __syncthreads();
  const long long skip = static_cast<long long>(x0) * (SILU ? n / 2 : n);  // y's rows before
  rg::store_cluster_sums<T, kRows, MX, CS, kThreads, SILU>(
      part, rank, y + skip, residual == nullptr ? nullptr : residual + skip, m - x0, n, r0);
  if constexpr (CS > 1) rg::cluster_sync();  // part[] stays alive until every block has read it
}

}  // namespace

// ---- generated by rawgraph/ops/generate.py (python -m rawgraph.ops.generate); do not edit
extern "C" __global__ void __launch_bounds__(kThreads, 2)
skinny90_f16_x32(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 32, 1, 8>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 1)
skinny90_f16_x32_d(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 32, 1, 18>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
skinny90_f16_x32_c2(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 32, 2, 18>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(kThreads, 2)
skinny90_f16_x32_c4(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 32, 4, 8>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 2)
skinny90_f16_x64(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 64, 1, 5>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 1)
skinny90_f16_x64_d(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 64, 1, 13>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
skinny90_f16_x64_c2(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 64, 2, 13>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(kThreads, 2)
skinny90_f16_x64_c4(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 64, 4, 5>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 2)
skinny90_f16_x128(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 128, 1, 3>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 1)
skinny90_f16_x128_d(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 128, 1, 8>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
skinny90_f16_x128_c2(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 128, 2, 8>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(kThreads, 2)
skinny90_f16_x128_c4(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 128, 4, 3>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 2)
skinny90_bf16_x32(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 32, 1, 8>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 1)
skinny90_bf16_x32_d(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 32, 1, 18>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
skinny90_bf16_x32_c2(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 32, 2, 18>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(kThreads, 2)
skinny90_bf16_x32_c4(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 32, 4, 8>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 2)
skinny90_bf16_x64(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 64, 1, 5>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 1)
skinny90_bf16_x64_d(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 64, 1, 13>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
skinny90_bf16_x64_c2(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 64, 2, 13>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(kThreads, 2)
skinny90_bf16_x64_c4(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 64, 4, 5>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 2)
skinny90_bf16_x128(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 128, 1, 3>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 1)
skinny90_bf16_x128_d(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 128, 1, 8>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
skinny90_bf16_x128_c2(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 128, 2, 8>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(kThreads, 2)
skinny90_bf16_x128_c4(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 128, 4, 3>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 2)
skinny90_f16_x32_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 32, 1, 8, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 1)
skinny90_f16_x32_d_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 32, 1, 18, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
skinny90_f16_x32_c2_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 32, 2, 18, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(kThreads, 2)
skinny90_f16_x32_c4_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 32, 4, 8, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 2)
skinny90_f16_x64_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 64, 1, 5, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 1)
skinny90_f16_x64_d_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 64, 1, 13, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
skinny90_f16_x64_c2_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 64, 2, 13, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(kThreads, 2)
skinny90_f16_x64_c4_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 64, 4, 5, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 2)
skinny90_f16_x128_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 128, 1, 3, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 1)
skinny90_f16_x128_d_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 128, 1, 8, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
skinny90_f16_x128_c2_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 128, 2, 8, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(kThreads, 2)
skinny90_f16_x128_c4_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __half* residual, __half* y, int m, int n, int k) {
  skinny90_impl<__half, 128, 4, 3, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 2)
skinny90_bf16_x32_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 32, 1, 8, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 1)
skinny90_bf16_x32_d_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 32, 1, 18, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
skinny90_bf16_x32_c2_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 32, 2, 18, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(kThreads, 2)
skinny90_bf16_x32_c4_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 32, 4, 8, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 2)
skinny90_bf16_x64_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 64, 1, 5, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 1)
skinny90_bf16_x64_d_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 64, 1, 13, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
skinny90_bf16_x64_c2_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 64, 2, 13, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(kThreads, 2)
skinny90_bf16_x64_c4_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 64, 4, 5, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 2)
skinny90_bf16_x128_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 128, 1, 3, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(kThreads, 1)
skinny90_bf16_x128_d_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 128, 1, 8, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
skinny90_bf16_x128_c2_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 128, 2, 8, true>(&xmap, &wmap, residual, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(kThreads, 2)
skinny90_bf16_x128_c4_silu(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap,
    const __nv_bfloat16* residual, __nv_bfloat16* y, int m, int n, int k) {
  skinny90_impl<__nv_bfloat16, 128, 4, 3, true>(&xmap, &wmap, residual, y, m, n, k);
}
