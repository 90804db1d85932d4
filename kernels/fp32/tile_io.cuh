// Global <-> shared memory tiles of the fp32 kernels. Tensors have arbitrary strides (the
// head dim contiguous, 4-byte alignment only): a tensor whose pointer is 16-byte aligned
// and whose batch, sequence and head strides are multiples of 4 elements is copied in
// 16-byte chunks, any other element by element, both by cp.async (sm_80+) so that a copy
// overlaps the products. Everything outside the real rows and dims is stored as zero,
// which makes the padded columns of every product vanish.
#pragma once
#include <stdint.h>

#include "common/params.h"
#include "fp32/mma.cuh"

namespace flashattn {
namespace fp32 {

// Whether rows of the tensor at ptr with strides s can be copied in 16-byte chunks.
__device__ __forceinline__ bool chunked(const void* ptr, const Strides4& s) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && (s.b | s.s | s.h) % 4 == 0;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Copies `bytes` (0..16; the rest of the 16 zero-filled) from src to dst.
__device__ __forceinline__ void copy16(float* dst, const float* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes) : "memory");
}
// Copies one element (zero when !valid).
__device__ __forceinline__ void copy4(float* dst, const float* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}
// Closes the copies issued so far into a group.
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N groups of this thread are still in flight.
template <int N>
__device__ __forceinline__ void copy_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Starts filling the shared tile dst [ROWS x W] (row pitch PITCH) with rows [0, n) of src,
// element (r, d) at src[row_off(r) + d] for d < dim, zero elsewhere; in 16-byte chunks
// when `chunks` (chunked()). The caller commits and waits.
template <int ROWS, int W, int PITCH, int kThreads, class RowOff>
__device__ __forceinline__ void load_tile(float* dst, const float* src, int n, int dim, bool chunks, RowOff row_off) {
  if (chunks) {
#pragma unroll 4
    for (int e = threadIdx.x; e < ROWS * W / 4; e += kThreads) {
      const int r = e / (W / 4), d = 4 * (e % (W / 4));
      const int left = r < n ? 4 * (dim - d) : 0;
      const int bytes = left < 0 ? 0 : left > 16 ? 16 : left;
      copy16(dst + r * PITCH + d, bytes > 0 ? src + row_off(r) + d : src, bytes);
    }
  } else {
#pragma unroll 4
    for (int e = threadIdx.x; e < ROWS * W; e += kThreads) {
      const int r = e / W, d = e % W;
      const bool valid = r < n && d < dim;
      copy4(dst + r * PITCH + d, valid ? src + row_off(r) + d : src, valid);
    }
  }
}

// Loads `n` entries v(r) into dst[0, ROWS) (`fill` past n).
template <int ROWS, int kThreads, class Value>
__device__ __forceinline__ void load_vec(float* dst, int n, float fill, Value v) {
  for (int r = threadIdx.x; r < ROWS; r += kThreads) dst[r] = r < n ? v(r) : fill;
}

// Writes a warp's accumulator tile c (rows m0 + frag_row(e), columns n0 + frag_col(n, e))
// times mul[e / 2] (its two rows' factors) into rows [0, rows) and columns [0, dim) of
// dst, element (r, col) at dst[row_off(r) + col]; with add, adds it to the element there
// (one fp32 addition: the accumulating backward).
template <int NT, class RowOff>
__device__ __forceinline__ void store_frag(float* dst, int rows, int64_t dim, const float (&c)[NT][4],
                                           const float (&mul)[2], int m0, int n0, RowOff row_off, bool add = false) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = m0 + frag_row(2 * h);
    if (r >= rows) continue;
    float* row = dst + row_off(r);
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int col = n0 + frag_col(n, x);
        const float v = c[n][2 * h + x];
        // __fmul_rn: the product rounds before the addition (no contraction into an FMA).
        if (col < dim) row[col] = add ? row[col] + __fmul_rn(v, mul[h]) : v * mul[h];
      }
  }
}

}  // namespace fp32
}  // namespace flashattn
