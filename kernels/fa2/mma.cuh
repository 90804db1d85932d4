// Generation-1 device primitives (sm_80+): mma.sync m16n8k16, ldmatrix, cp.async,
// XOR-swizzled shared-memory tiles and fragment conversions. Shared by the forward
// (fwd*) and backward (bwd*) kernels.
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4):
//   A (16x16, row-major), 4 x b32:  a[0] = (g,   2t..2t+1)   a[1] = (g+8, 2t..2t+1)
//                                   a[2] = (g,   2t+8..+9)   a[3] = (g+8, 2t+8..+9)
//   B (16x8, k x n),     2 x b32:  b[0] = (k = 2t..2t+1, n = g)  b[1] = (k = 2t+8..+9, n = g)
//   C (16x8, f32),       4 x f32:  c[0..1] = (g, 2t..2t+1)  c[2..3] = (g+8, 2t..2t+1)
// so the C fragments of n8 tiles 2k and 2k+1 converted to 16-bit pairs are exactly the
// A fragment of k16 step k: {pack(c0[0],c0[1]), pack(c0[2],c0[3]), pack(c1[0],c1[1]), pack(c1[2],c1[3])}.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace flashattn {
namespace fa2 {

// ---------------------------------------------------------------------------------
// Element types
// ---------------------------------------------------------------------------------
template <typename T>
struct ElemTraits;
template <>
struct ElemTraits<__half> {
  static constexpr bool kIsBf16 = false;
  static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
};
template <>
struct ElemTraits<__nv_bfloat16> {
  static constexpr bool kIsBf16 = true;
  static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
};

// Two floats -> one b32 register holding (lo = a, hi = b) in the 16-bit type.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
  __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Two gradient values to a b32 slot of the output (dst, 4-byte aligned): pack2 of (a, b),
// or with `add` (flashattn_plan_set_grad_accumulate) of their fp32 sums with the two
// values stored there, rounded once.
template <typename T>
__device__ __forceinline__ void store_grad2(T* dst, float a, float b, bool add) {
  uint32_t* d = reinterpret_cast<uint32_t*>(dst);
  if (add) {
    const uint32_t old = *d;
    const T* h = reinterpret_cast<const T*>(&old);
    a = __fadd_rn(ElemTraits<T>::to_float(h[0]), a);
    b = __fadd_rn(ElemTraits<T>::to_float(h[1]), b);
  }
  *d = pack2<T>(a, b);
}

// ---------------------------------------------------------------------------------
// mma.sync m16n8k16, fp32 accumulate: c += a * b
// ---------------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ---------------------------------------------------------------------------------
// ldmatrix (shared-space byte addresses from smem_u32)
// ---------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l gives the row address of matrix l/8, row l%8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Same, each 8x8 matrix transposed (thread (g,t) receives stored elements [2t][g], [2t+1][g]).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// ---------------------------------------------------------------------------------
// cp.async 16 B global -> shared (L2 only, .cg). pred false: 16 zero bytes are written
// and gmem is not read (gmem must still be a valid-looking address; pass any in-bounds one).
// ---------------------------------------------------------------------------------
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem, bool pred) {
  const int src_size = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_size));
}
// Same with an explicit source size in bytes (0..16): bytes past src_bytes are zero-filled.
__device__ __forceinline__ void cp_async_16_bytes(uint32_t smem_addr, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most N committed groups are still pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ---------------------------------------------------------------------------------
// Swizzled shared tile: kRows x kCols 16-bit elements (kCols a multiple of 64), stored
// as kCols/64 column blocks of [kRows][64] with 128-byte rows; within a row the 16-byte
// chunk index c (0..7) is stored at c ^ (row & 7). ldmatrix of 8 consecutive rows at one
// chunk column and 16-byte cp.async stores are bank-conflict free.
// ---------------------------------------------------------------------------------
template <int kRows, int kCols>
struct SwizzledTile {
  static_assert(kCols % 64 == 0, "swizzled tile columns must be a multiple of 64");
  static constexpr int kElems = kRows * kCols;
  static constexpr int kBytes = kElems * 2;
  // Element offset of (row, col); col a multiple of 8 for 16-byte accesses.
  static __device__ __forceinline__ int offset(int row, int col) {
    return (col >> 6) * (kRows * 64) + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
  }
};

// Per-lane ldmatrix addressing into a SwizzledTile with no per-access swizzle math: a lane
// reads rows row_lane + (multiple of 8) and columns (multiple of 16) + col_lane (col_lane 0 or
// 8). Within a row, chunk (2k | col_lane/8) lands at (2k | col_lane/8) ^ (row & 7), which takes
// 4 values (k = 0..3); they are precomputed, so each access is a register + immediate.
template <int kRows>
struct SwizzledLane {
  uint32_t base[4];
  __device__ __forceinline__ void init(uint32_t tile_smem_addr, int row_lane, int col_lane) {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      base[k] = tile_smem_addr +
                2u * static_cast<uint32_t>(row_lane * 64 + (((2 * k) | (col_lane >> 3)) ^ (row_lane & 7)) * 8);
  }
  // Shared address of (row_lane + row_off, col + col_lane); row_off % 8 == 0, col % 16 == 0,
  // both compile-time constants after unrolling.
  __device__ __forceinline__ uint32_t at(int row_off, int col) const {
    return base[(col >> 4) & 3] + 2u * static_cast<uint32_t>((col >> 6) * (kRows * 64) + row_off * 64);
  }
};

// Round up to a multiple of 64 (shared tile width for a head dim).
__host__ __device__ constexpr int round64(int d) { return (d + 63) / 64 * 64; }

// ---------------------------------------------------------------------------------
// Warp reductions across the 4 threads of a quad (threads holding one row of a C tile).
// ---------------------------------------------------------------------------------
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace fa2
}  // namespace flashattn
