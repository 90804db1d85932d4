// What a CTA of the fp32 kernels knows about its (sequence, query head): lengths,
// token offsets, mask alignment, ALiBi slope and dropout counter, with the same meaning
// as the CPU backend's HeadCtx (src/cpu/tensor_view.hpp), and the element offsets of its
// rows in the tensors and in the LSE / Delta vectors.
#pragma once
#include <stdint.h>

#include "common/mask.h"
#include "common/params.h"
#include "common/varlen.h"

namespace flashattn {
namespace fp32 {

// 32-bit fields (fewer registers): fp32_check bounds the lengths by 2^30 and the grids,
// hence sequences and heads, by 2^31 - 1; token offsets are int32 cu_seqlens entries.
struct SeqCtx {
  int32_t b, h, hk;       // sequence, query head, kv head
  int32_t len_q, len_k;   // this sequence's lengths
  int32_t q0, k0;         // first token of the sequence (0 without varlen)
  int32_t shift;          // aligned row i' = i + shift
  float slope;            // ALiBi slope of (b, h), 0 otherwise
  uint64_t head_counter;  // Philox counter word: offset + b * heads_q + h
};

__device__ __forceinline__ SeqCtx make_ctx(const AttnParams& p, int64_t b, int64_t h) {
  SeqCtx c;
  c.b = static_cast<int32_t>(b);
  c.h = static_cast<int32_t>(h);
  c.hk = static_cast<int32_t>(h / (p.heads_q / p.heads_kv));
  int64_t q0 = 0, k0 = 0;
  int len_q = static_cast<int>(p.seqlen_q), len_k = static_cast<int>(p.seqlen_k);
  if (p.varlen) varlen_extent(p, b, q0, k0, len_q, len_k);
  c.q0 = static_cast<int32_t>(q0);
  c.k0 = static_cast<int32_t>(k0);
  c.len_q = len_q;
  c.len_k = len_k;
  c.shift = static_cast<int32_t>(align_shift(p, c.len_q, c.len_k));
  c.slope = alibi_slope(p, b, h);
  c.head_counter = p.offset + static_cast<uint64_t>(b) * static_cast<uint64_t>(p.heads_q) + static_cast<uint64_t>(h);
  return c;
}

// Element offset of query row i (within the sequence) of head h in a tensor of strides s.
__device__ __forceinline__ int64_t q_row(const AttnParams& p, const SeqCtx& c, const Strides4& s, int64_t i) {
  return (p.varlen ? 0 : c.b * s.b) + (c.q0 + i) * s.s + c.h * s.h;
}
// Element offset of key row j of the kv head in a tensor of strides s.
__device__ __forceinline__ int64_t k_row(const AttnParams& p, const SeqCtx& c, const Strides4& s, int64_t j) {
  return (p.varlen ? 0 : c.b * s.b) + (c.k0 + j) * s.s + c.hk * s.h;
}
// Index of query row i in the LSE layout ([batch, heads_q, seqlen_q], or [heads_q, total_q]
// with varlen), which the backward's Delta vector shares.
__device__ __forceinline__ int64_t lse_at(const AttnParams& p, const SeqCtx& c, int64_t i) {
  return p.varlen ? c.h * p.total_q + c.q0 + i : (c.b * p.heads_q + c.h) * p.seqlen_q + i;
}

}  // namespace fp32
}  // namespace flashattn
