// Global <-> shared memory tiles of the fp32 SIMT kernels. Tensors have arbitrary strides
// (the head dim contiguous, 4-byte alignment only), so loads are scalar and coalesced
// along the head dim; everything outside the real rows and dims is stored as zero, which
// makes the padded columns of every product vanish.
#pragma once
#include <stdint.h>

#include "simt/gemm.cuh"
#include "simt/traits.h"

namespace flashattn {
namespace simt {

// Fills the shared tile dst [ROWS x W] (pitch(W)) with rows [0, n) of src, element (r, d)
// at src[row_off(r) + d] for d < dim, zero elsewhere.
template <int ROWS, int W, class RowOff>
__device__ __forceinline__ void load_tile(float* dst, const float* src, int n, int dim, RowOff row_off) {
#pragma unroll 4
  for (int e = threadIdx.x; e < ROWS * W; e += kThreads) {
    const int r = e / W, d = e % W;
    dst[r * pitch(W) + d] = (r < n && d < dim) ? src[row_off(r) + d] : 0.f;
  }
}

// Loads `n` entries v(r) into dst[0, ROWS) (`fill` past n).
template <int ROWS, class Value>
__device__ __forceinline__ void load_vec(float* dst, int n, float fill, Value v) {
  for (int r = threadIdx.x; r < ROWS; r += kThreads) dst[r] = r < n ? v(r) : fill;
}

// Writes acc (accumulator layout, traits.h) times mul[i] into rows [0, n) of dst, element
// (r, col) at dst[row_off(r) + col] for col < dim.
template <int SM, int N, class RowOff>
__device__ __forceinline__ void store_tile(float* dst, int n, int64_t dim, const float (&acc)[SM][N],
                                           const float (&mul)[SM], RowOff row_off) {
#pragma unroll
  for (int i = 0; i < SM; ++i) {
    const int r = thread_y() * SM + i;
    if (r >= n) continue;
    float* row = dst + row_off(r);
#pragma unroll
    for (int c = 0; c < N; ++c) {
      const int col = thread_x() * 4 + 64 * (c / 4) + c % 4;
      if (col < dim) row[col] = acc[i][c] * mul[i];
    }
  }
}

}  // namespace simt
}  // namespace flashattn
