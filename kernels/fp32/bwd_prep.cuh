// Backward preprocessing of the fp32 family: Delta = rowsum(dO * O) per query row,
// in the LSE layout (ctx.cuh), and with zero_dq the zeroing of dQ, which the dK/dV
// kernel then accumulates into with atomics. One warp per row.
#pragma once
#include <stdint.h>

#include "common/params.h"

namespace flashattn {
namespace fp32 {

constexpr int kPrepThreads = 256;

__global__ void __launch_bounds__(kPrepThreads) bwd_prep_kernel(const AttnParams p, float* delta, bool zero_dq) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kPrepThreads / 32);
  // Rows in LSE order: (b, h, i) without varlen, (h, token) with.
  const int64_t rows = lse_row_count(p);
  const float *o = static_cast<const float*>(p.o_in), *dout = static_cast<const float*>(p.dout);
  float* dq = static_cast<float*>(p.dq);
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * (kPrepThreads / 32) + threadIdx.x / 32; n < rows; n += warps) {
    int64_t b = 0, h, i;
    if (p.varlen) {
      h = n / p.total_q;
      i = n % p.total_q;
    } else {
      i = n % p.seqlen_q;
      h = (n / p.seqlen_q) % p.heads_q;
      b = n / (p.seqlen_q * p.heads_q);
    }
    const int64_t ro = b * p.o_stride.b + i * p.o_stride.s + h * p.o_stride.h;
    const int64_t rd = b * p.do_stride.b + i * p.do_stride.s + h * p.do_stride.h;
    float sum = 0.f;
    for (int64_t d = lane; d < p.head_dim_v; d += 32) sum = fmaf(dout[rd + d], o[ro + d], sum);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) delta[n] = sum;
    if (zero_dq) {
      const int64_t rq = b * p.dq_stride.b + i * p.dq_stride.s + h * p.dq_stride.h;
      for (int64_t d = lane; d < p.head_dim_qk; d += 32) dq[rq + d] = 0.f;
    }
  }
}

}  // namespace fp32
}  // namespace flashattn
