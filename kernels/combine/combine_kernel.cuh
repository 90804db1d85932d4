// Merge of partial attention results over a split of the keys (flashattn_combine), the
// same arithmetic as the CPU backend's combine_row: per row, over parts with a finite
// LSE, lse = lse_max + log(sum exp(lse_i - lse_max)), O = sum exp(lse_i - lse) O_i, in
// increasing split order; no part gives O = 0, LSE = -inf; a NaN part gives NaN. The
// decode kernel's merge of a cluster's splits repeats these loops (combine_element.cuh)
// and must give the same bits: change both together.
//
// One thread per output element (row, d): every thread of a row recomputes the row's
// LSE from the num_splits partial LSEs (cached reads, tiny next to the O reads), so no
// shared memory or synchronization is needed and any head_dim works. Memory-bound:
// each O_i element is read exactly once; the loops over the splits are unrolled so that a
// thread's loads of 16 parts are in flight together (one round trip, not one per part).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "common/params.h"

namespace flashattn {
namespace combine {

__global__ void combine_kernel(const CombineParams c) {
#if __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent (combine.cu): the grid before it on the stream
  // (the decode kernel writing the parts) has ended and its writes are visible past here.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  const int64_t n = c.batch * c.seqlen_q * c.heads * c.head_dim;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < n; t += step) {
    const int64_t d = t % c.head_dim, row = t / c.head_dim;
    const int64_t h = row % c.heads, i = (row / c.heads) % c.seqlen_q, b = row / (c.heads * c.seqlen_q);
    const int64_t* ls = c.lse_partial_stride;
    const int64_t* os = c.o_partial_stride;
    const float* lse = c.lse_partial + b * ls[1] + h * ls[2] + i * ls[3];
    const float* o = c.o_partial + b * os[1] + i * os[2] + h * os[3] + d;
    float lse_max = -INFINITY;
    bool nan = false;
#pragma unroll 16
    for (int64_t s = 0; s < c.num_splits; ++s) {
      const float l = lse[s * ls[0]];
      nan |= l != l;
      if (l > lse_max) lse_max = l;
    }
    float out = 0.f, lse_out = -INFINITY;
    if (nan) {
      out = lse_out = NAN;
    } else if (lse_max != -INFINITY) {
      float sum = 0.f;
#pragma unroll 16
      for (int64_t s = 0; s < c.num_splits; ++s) {
        const float l = lse[s * ls[0]];
        if (l != -INFINITY) sum += expf(l - lse_max);
      }
      lse_out = lse_max + logf(sum);
#pragma unroll 16
      for (int64_t s = 0; s < c.num_splits; ++s) {
        const float l = lse[s * ls[0]];
        if (l != -INFINITY) out += expf(l - lse_out) * o[s * os[0]];
      }
    }
    const int64_t off = b * c.o_stride.b + i * c.o_stride.s + h * c.o_stride.h + d;
    if (c.dtype == kFp32) {
      static_cast<float*>(c.o)[off] = out;
    } else if (c.dtype == kBf16) {
      static_cast<__nv_bfloat16*>(c.o)[off] = __float2bfloat16_rn(out);
    } else {
      static_cast<__half*>(c.o)[off] = __float2half_rn(out);
    }
    if (d == 0 && c.lse != nullptr) c.lse[(b * c.heads + h) * c.seqlen_q + i] = lse_out;
  }
}

}  // namespace combine
}  // namespace flashattn
