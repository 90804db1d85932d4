// Score semantics of the fp32 kernels on a warp's accumulator tile (mma.cuh: rows
// i0 + frag_row(e), columns j0 + frag_col(n, e) of the sequence), the same per-element
// steps as the CPU backend (src/cpu/scores.hpp):
//   s = scale * q.k;  softcap: s = cap * tanh(s / cap);  s += bias | ALiBi;  masked -> -inf,
// with the mask helpers of kernels/common/mask.h, and the dropout multipliers from
// kernels/common/philox.h (so the masks equal the CPU backend's bit for bit).
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/mask.h"
#include "common/philox.h"
#include "fp32/ctx.cuh"
#include "fp32/mma.cuh"

namespace flashattn {
namespace fp32 {

// Raw dot products s of the warp tile into final scores. Rows and columns past the
// sequence become -inf (no bias read there); on a partial tile (classify_tile) so do the
// elements that the band mask or the block-sparse layout remove. With kCapGrad, g is
// multiplied by the softcap's chain factor 1 - tanh^2 (the backward's dS; untouched
// without softcap).
template <bool kCapGrad, int NT>
__device__ __forceinline__ void finish_scores(const AttnParams& p, const SeqCtx& c, float (&s)[NT][4],
                                              float (&g)[NT][4], int64_t i0, int64_t j0, bool partial) {
  // One pass per step, each behind a CTA-uniform branch: few values live at a time.
  if (p.softcap > 0.f) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float t = tanhf((s[n][e] * p.scale) / p.softcap);
        s[n][e] = p.softcap * t;
        if (kCapGrad) g[n][e] *= 1.f - t * t;
      }
  } else {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= p.scale;
  }
  if (p.bias_kind == kBiasTensor) {
    const float* bias = static_cast<const float*>(p.bias) + c.b * p.bias_stride[0] + c.h * p.bias_stride[1];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t i = i0 + frag_row(e), j = j0 + frag_col(n, e);
        if (i < c.len_q && j < c.len_k) s[n][e] += bias[i * p.bias_stride[2] + j * p.bias_stride[3]];
      }
  } else if (p.bias_kind != kBiasNone) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] += alibi_bias(p, c.slope, i0 + frag_row(e) + c.shift, j0 + frag_col(n, e));
  }
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t i = i0 + frag_row(e), j = j0 + frag_col(n, e);
      if (i >= c.len_q || j >= c.len_k || (partial && !(band_keep(p, i + c.shift, j) && layout_keep(p, c.h, i, j))))
        s[n][e] = -INFINITY;
    }
}

// Dropout multipliers of the warp tile (j0 a multiple of 8): rp_keep where kept, 0 where
// dropped. Column group n of a row is one Philox call (dropout_words8), of whose words
// the thread's two columns 2t, 2t + 1 take word t.
template <int NT>
__device__ __forceinline__ void dropout_multipliers(const AttnParams& p, const SeqCtx& c, float (&dm)[NT][4],
                                                    int64_t i0, int64_t j0) {
  const int t = lane_t();
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const Philox4 w = dropout_words8(p.seed, c.head_counter, static_cast<uint32_t>(i0 + frag_row(2 * h)),
                                       static_cast<uint32_t>((j0 + 8 * n) >> 3));
      const uint32_t word = t == 0 ? w.x[0] : t == 1 ? w.x[1] : t == 2 ? w.x[2] : w.x[3];
      dm[n][2 * h] = (word & 0xFFFFu) >= p.drop_threshold ? p.rp_keep : 0.f;
      dm[n][2 * h + 1] = (word >> 16) >= p.drop_threshold ? p.rp_keep : 0.f;
    }
}

}  // namespace fp32
}  // namespace flashattn
