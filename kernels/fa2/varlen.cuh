// A sequence's extent in a varlen batch, for the FA2-design forward and backward kernels.
#pragma once
#include <stdint.h>

#include "common/params.h"

namespace flashattn {
namespace fa2 {

// Sequence b's first query and key token and its lengths from the offsets, clamped so that
// bad inputs stay in bounds: offsets outside [0, total], decreasing offsets and lengths above
// the plan's maxima cannot make a kernel leave its tensors.
__device__ __forceinline__ void varlen_extent(const AttnParams& p, int b, int64_t& q_start, int64_t& k_start,
                                              int& len_q, int& len_k) {
  int64_t a = p.cu_seqlens_q[b], e = p.cu_seqlens_q[b + 1];
  a = a < 0 ? 0 : (a > p.total_q ? p.total_q : a);
  e = e < a ? a : (e > p.total_q ? p.total_q : e);
  q_start = a;
  len_q = static_cast<int>(e - a < p.seqlen_q ? e - a : p.seqlen_q);
  a = p.cu_seqlens_k[b];
  e = p.cu_seqlens_k[b + 1];
  a = a < 0 ? 0 : (a > p.total_k ? p.total_k : a);
  e = e < a ? a : (e > p.total_k ? p.total_k : e);
  k_start = a;
  len_k = static_cast<int>(e - a < p.seqlen_k ? e - a : p.seqlen_k);
}

}  // namespace fa2
}  // namespace flashattn
