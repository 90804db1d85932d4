// A sequence's extent in a varlen batch from its offsets, clamped so that bad inputs stay
// in bounds: offsets outside [0, total], decreasing offsets and lengths above the plan's
// maxima cannot make a kernel leave its tensors. Valid offsets give the exact extent.
#pragma once
#include <stdint.h>

#include "common/hostdevice.h"
#include "common/params.h"

namespace flashattn {

struct SeqExtent {
  int64_t start, len;
};

// Sequence b of the offsets cu (entries b and b + 1) in a packed extent of total tokens,
// its length at most max_len.
FA_HD SeqExtent clamp_seq(const int32_t* cu, int64_t b, int64_t total, int64_t max_len) {
  int64_t a = cu[b], e = cu[b + 1];
  a = a < 0 ? 0 : (a > total ? total : a);
  e = e < a ? a : (e > total ? total : e);
  return {a, e - a < max_len ? e - a : max_len};
}

// Sequence b's first query and key token and its lengths under p's varlen offsets.
FA_HD void varlen_extent(const AttnParams& p, int64_t b, int64_t& q_start, int64_t& k_start, int& len_q, int& len_k) {
  const SeqExtent q = clamp_seq(p.cu_seqlens_q, b, p.total_q, p.seqlen_q);
  const SeqExtent k = clamp_seq(p.cu_seqlens_k, b, p.total_k, p.seqlen_k);
  q_start = q.start;
  k_start = k.start;
  len_q = static_cast<int>(q.len);
  len_k = static_cast<int>(k.len);
}

}  // namespace flashattn
