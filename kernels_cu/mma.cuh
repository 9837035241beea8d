// mma.cuh: warp-level tensor-core building blocks shared by the GEMM and prefill attention.
//   - cp_async16: 16-byte global -> shared copy, zero-filled when `ok` is false
//   - ldmatrix x4 (plain and transposed) from shared memory
//   - mma_16816<T>: D(16x8, fp32) += A(16x16, T, row) * B(16x8, T, col)
//   - pack2<T>: two floats -> one 32-bit register of two T (round to nearest even)
//   - swz128 / load_tile128: tiles of 64-element (128-byte) rows in the 128-byte swizzle
//   - store_pair<T>: two adjacent outputs, with an optional residual added
// Shared tiles store rows of 16-byte chunks with the chunk index XOR-swizzled by the row, so
// the 8 row addresses of one ldmatrix phase land in 8 different bank groups.
#pragma once
#include <common.cuh>

namespace rg {

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               ::"r"(smem_addr(dst)), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

template <typename T> struct MmaType;
template <> struct MmaType<__half> { static constexpr bool bf16 = false; };
template <> struct MmaType<__nv_bfloat16> { static constexpr bool bf16 = true; };

template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                          unsigned b1) {
  if constexpr (MmaType<T>::bf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&h);
}
template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&h);
}

template <typename T> __device__ __forceinline__ float2 unpack2(unsigned v);
template <> __device__ __forceinline__ float2 unpack2<__half>(unsigned v) {
  return __half22float2(*reinterpret_cast<__half2*>(&v));
}
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(unsigned v) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of 128-byte rows (64 elements
// of T) with the 128-byte swizzle: chunk c of row r sits at chunk c ^ (r % 8). ldmatrix reads
// it without bank conflicts, and it is the layout wgmma's matrix descriptors call 128B.
__device__ __forceinline__ int swz128(int row, int chunk) {
  return row * 128 + ((chunk ^ (row & 7)) << 4);
}

// Rows [row0, row0 + ROWS) x k [k0, k0 + 64) of a (rows, k) matrix into a swz128 tile, by
// THREADS threads (ROWS * 8 % THREADS == 0); chunks past `rows` or k are zero-filled.
template <typename T, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile128(char* tile, const T* src, int rows, int k, int row0,
                                             int k0) {
#pragma unroll
  for (int u = 0; u < ROWS * 8 / THREADS; ++u) {
    const int i = threadIdx.x + u * THREADS, r = i >> 3, c = i & 7, kk = k0 + c * 8;
    const bool ok = row0 + r < rows && kk < k;
    cp_async16(tile + swz128(r, c), ok ? src + static_cast<long long>(row0 + r) * k + kk : src,
               ok);
  }
}

// y[at], y[at + 1] = T(lo (+ residual[at]), hi (+ residual[at + 1])); `at` even. residual may
// be y itself (each pair is read before it is written).
template <typename T>
__device__ __forceinline__ void store_pair(T* y, const T* residual, long long at, float lo,
                                           float hi) {
  if (residual != nullptr) {
    const float2 rv = unpack2<T>(*reinterpret_cast<const unsigned*>(residual + at));
    lo += rv.x;
    hi += rv.y;
  }
  *reinterpret_cast<unsigned*>(y + at) = pack2<T>(lo, hi);
}

}  // namespace rg
