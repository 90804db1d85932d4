// Score semantics of the fp32 SIMT kernels on a tile held in registers (score layout of
// traits.h), the same per-element steps as the CPU backend (src/cpu/scores.hpp):
//   s = scale * q.k;  softcap: s = cap * tanh(s / cap);  s += bias | ALiBi;  masked -> -inf,
// with the mask helpers of kernels/common/mask.h, and the dropout multipliers of a tile
// from kernels/common/philox.h (so the masks equal the CPU backend's bit for bit).
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/mask.h"
#include "common/philox.h"
#include "simt/ctx.cuh"
#include "simt/gemm.cuh"
#include "simt/traits.h"

namespace flashattn {
namespace simt {

// Band mask and block-sparse layout of rows [i0, i0 + ROWS) x columns [j0, j0 + COLS) of
// a partial tile into the shared bytes keep [ROWS x COLS] (mask.h; one element per thread
// and step, which keeps the 64-bit layout lookups out of the unrolled score code).
template <int ROWS, int COLS>
__device__ __forceinline__ void mask_tile(const AttnParams& p, const SeqCtx& c, uint8_t* keep, int64_t i0, int64_t j0) {
#pragma unroll 1
  for (int e = threadIdx.x; e < ROWS * COLS; e += kThreads) {
    const int64_t i = i0 + e / COLS, j = j0 + e % COLS;
    keep[e] = band_keep(p, i + c.shift, j) && layout_keep(p, c.h, i, j);
  }
}

// Raw dot products s of rows i0 + ty*SM + i, columns j0 + tx + 16*j into final scores.
// Rows and columns past the sequence become -inf (no bias read there); on a partial tile
// (keep != null: mask_tile of the tile, 16*SN columns wide) so do the masked elements.
// With kCapGrad, g is multiplied by the softcap's chain factor 1 - tanh^2 (the backward's
// dS; untouched without softcap).
template <bool kCapGrad, int SM, int SN>
__device__ __forceinline__ void finish_scores(const AttnParams& p, const SeqCtx& c, float (&s)[SM][SN],
                                              float (&g)[SM][SN], int64_t i0, int64_t j0, const uint8_t* keep) {
  // One pass per step, each behind a CTA-uniform branch: few values live at a time.
  const int64_t row0 = i0 + thread_y() * SM, col0 = j0 + thread_x();
  if (p.softcap > 0.f) {
#pragma unroll
    for (int i = 0; i < SM; ++i)
#pragma unroll
      for (int j = 0; j < SN; ++j) {
        const float t = tanhf((s[i][j] * p.scale) / p.softcap);
        s[i][j] = p.softcap * t;
        if (kCapGrad) g[i][j] *= 1.f - t * t;
      }
  } else {
#pragma unroll
    for (int i = 0; i < SM; ++i)
#pragma unroll
      for (int j = 0; j < SN; ++j) s[i][j] *= p.scale;
  }
  if (p.bias_kind == kBiasTensor) {
    const float* bias = static_cast<const float*>(p.bias) + c.b * p.bias_stride[0] + c.h * p.bias_stride[1];
#pragma unroll
    for (int i = 0; i < SM; ++i) {
      if (row0 + i >= c.len_q) continue;
      const float* brow = bias + (row0 + i) * p.bias_stride[2];
#pragma unroll
      for (int j = 0; j < SN; ++j)
        if (col0 + 16 * j < c.len_k) s[i][j] += brow[(col0 + 16 * j) * p.bias_stride[3]];
    }
  } else if (p.bias_kind != kBiasNone) {
#pragma unroll
    for (int i = 0; i < SM; ++i)
#pragma unroll
      for (int j = 0; j < SN; ++j) s[i][j] += alibi_bias(p, c.slope, row0 + i + c.shift, col0 + 16 * j);
  }
#pragma unroll
  for (int i = 0; i < SM; ++i)
#pragma unroll
    for (int j = 0; j < SN; ++j) {
      const int r = thread_y() * SM + i, x = thread_x() + 16 * j;
      if (row0 + i >= c.len_q || col0 + 16 * j >= c.len_k || (keep != nullptr && !keep[r * 16 * SN + x]))
        s[i][j] = -INFINITY;
    }
}

// Dropout multipliers of rows [i0, i0 + ROWS) x columns [j0, j0 + COLS) (j0 a multiple of
// 4) into the shared tile dst (pitch(COLS)): rp_keep where kept, 0 where dropped. One
// Philox call per thread and group of four columns.
template <int ROWS, int COLS>
__device__ __forceinline__ void dropout_multipliers(const AttnParams& p, const SeqCtx& c, float* dst, int64_t i0,
                                                    int64_t j0) {
  constexpr int kGroups = COLS / 4;
#pragma unroll 1
  for (int e = threadIdx.x; e < ROWS * kGroups; e += kThreads) {
    const int r = e / kGroups, g = e % kGroups;
    const Philox4 w =
        dropout_words(p.seed, c.head_counter, static_cast<uint32_t>(i0 + r), static_cast<uint32_t>(j0 + 4 * g) >> 2);
    float* d = dst + r * pitch(COLS) + 4 * g;
#pragma unroll
    for (int l = 0; l < 4; ++l) d[l] = w.x[l] >= p.drop_threshold ? p.rp_keep : 0.f;
  }
}

}  // namespace simt
}  // namespace flashattn
