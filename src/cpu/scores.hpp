// Score semantics on a tile, shared by the flash and standard paths so both produce
// the same S for the same (b, h, i, j): scale, softcap, bias tensor or ALiBi, band mask,
// block-sparse layout, and which tiles may be skipped entirely.
//
// A tile is rows [i0, i0+ni) (query positions within the sequence) by columns
// [j0, j0+nj) (key positions). It is stored either "normal" (element (r, c) at
// s[r*ld + c]) or transposed (s[c*ld + r], used by the dK/dV pass which works on S^T);
// the loops always run along the contiguous dimension.
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/mask.h"
#include "common/params.h"
#include "common/philox.h"
#include "cpu/convert.hpp"
#include "cpu/tensor_view.hpp"
#include "cpu/tile_math.hpp"

namespace flashattn {
namespace cpu {

// Tile classification (kernels/common/mask.h) of context c.
inline TileKind classify_tile(const AttnParams& p, const HeadCtx& c, int64_t i0, int64_t ni, int64_t j0, int64_t nj) {
  return flashattn::classify_tile(p, c.h, c.shift, i0, ni, j0, nj);
}

// The inner indices [lo, hi) of outer index o of a tile (layout as in transform_scores)
// that the band mask keeps (lo <= hi, both within [0, n_inner]): band_keep's condition,
// j - i' <= window_right and i' - j <= window_left (i' = i + shift), keeps one interval of
// keys per query row and of query rows per key. With d the offset below, both differences
// are x - d and d - x; the windows are compared as differences (they may be INT64_MAX).
template <bool kTransposed>
inline void band_interval(const AttnParams& p, const HeadCtx& c, int64_t i0, int64_t j0, int64_t o, int64_t n_inner,
                          int64_t* lo, int64_t* hi) {
  *lo = 0;
  *hi = n_inner;
  if (!p.has_band) return;
  const int64_t d = kTransposed ? j0 + o - i0 - c.shift : i0 + o + c.shift - j0;
  const int64_t up = kTransposed ? p.window_left : p.window_right;    // keeps x - d <= up
  const int64_t down = kTransposed ? p.window_right : p.window_left;  // keeps d - x <= down
  if (up >= 0 && up < n_inner - d) *hi = d + up + 1 > 0 ? d + up + 1 : 0;
  if (down >= 0 && down < d) *lo = d - down < n_inner ? d - down : n_inner;
  if (*hi < *lo) *hi = *lo;
}

// Turns raw dot products q.k of a tile into final scores:
//   s = scale * qk;  softcap: s = cap * tanh(s / cap);  s += bias | ALiBi;  masked -> -inf.
// Padding (inner index in [n_inner, inner_pad)) is set to -inf so row reductions can
// run over the padded width. If cap_grad is given (backward with softcap) it receives
// ds_final/ds_capped-input = 1 - tanh^2 in the same layout. scaled: s holds scale * qk
// already (the forward's gemm_panels; only without softcap).
template <bool kTransposed>
inline void transform_scores(const AttnParams& p, const HeadCtx& c, float* s, int64_t ld, int64_t i0, int64_t ni,
                             int64_t j0, int64_t nj, int64_t inner_pad, bool partial, float* cap_grad,
                             bool scaled = false) {
  const int64_t n_outer = kTransposed ? nj : ni;
  const int64_t n_inner = kTransposed ? ni : nj;
  const float scale = p.scale;
  const float cap = p.softcap;
  if (cap <= 0.f && !scaled) scale_rows(s, ld, n_outer, inner_pad, scale);  // the padding is overwritten below
  for (int64_t o = 0; o < n_outer; ++o) {
    float* row = s + o * ld;
    if (cap > 0.f) {
      float* g = cap_grad ? cap_grad + o * ld : nullptr;
      for (int64_t x = 0; x < n_inner; ++x) {
        const float t = tanhf((row[x] * scale) / cap);
        row[x] = cap * t;
        if (g) g[x] = 1.f - t * t;
      }
    }
    if (p.bias_kind == kBiasTensor) {
      const int64_t* bs = p.bias_stride;
      const int64_t base = c.b * bs[0] + c.h * bs[1];
      for (int64_t x = 0; x < n_inner; ++x) {
        const int64_t i = i0 + (kTransposed ? x : o), j = j0 + (kTransposed ? o : x);
        row[x] += load_elem(p.bias, p.dtype, base + i * bs[2] + j * bs[3]);
      }
    } else if (p.bias_kind == kBiasAlibi || p.bias_kind == kBiasAlibiSymmetric) {
      for (int64_t x = 0; x < n_inner; ++x) {
        const int64_t i = i0 + (kTransposed ? x : o), j = j0 + (kTransposed ? o : x);
        row[x] += alibi_bias(p, c.slope, i + c.shift, j);
      }
    }
    if (partial) {
      int64_t lo, hi;
      band_interval<kTransposed>(p, c, i0, j0, o, n_inner, &lo, &hi);
      for (int64_t x = 0; x < lo; ++x) row[x] = -INFINITY;
      for (int64_t x = hi; x < n_inner; ++x) row[x] = -INFINITY;
      if (p.layout != nullptr) {
        for (int64_t x = lo; x < hi; ++x) {
          const int64_t i = i0 + (kTransposed ? x : o), j = j0 + (kTransposed ? o : x);
          if (!layout_keep(p, c.h, i, j)) row[x] = -INFINITY;
        }
      }
    }
    for (int64_t x = n_inner; x < inner_pad; ++x) row[x] = -INFINITY;
  }
}

// Dropout multipliers of a tile: rp_keep (or with unscaled 1: the caller applies rp_keep)
// where kept, 0 where dropped (philox.h keying: b = sequence, h = query head, i/j =
// positions within the sequence). One Philox call yields the 16-bit values of eight
// consecutive columns. Layout as in transform_scores.
template <bool kTransposed>
inline void dropout_tile(const AttnParams& p, const HeadCtx& c, float* d, int64_t ld, int64_t i0, int64_t ni,
                         int64_t j0, int64_t nj, bool unscaled = false) {
  const float kept = unscaled ? 1.f : p.rp_keep;
  for (int64_t r = 0; r < ni; ++r) {
    const uint32_t i = static_cast<uint32_t>(i0 + r);
    int64_t x = 0;
    while (x < nj) {
      const uint32_t j = static_cast<uint32_t>(j0 + x);
      const Philox4 w = dropout_words8(p.seed, c.head_counter, i, j >> 3);
      for (uint32_t l = j & 7u; l < 8u && x < nj; ++l, ++x) {
        const float v = dropout_halfword(w, l) >= p.drop_threshold ? kept : 0.f;
        if (kTransposed) {
          d[x * ld + r] = v;
        } else {
          d[r * ld + x] = v;
        }
      }
    }
  }
}

}  // namespace cpu
}  // namespace flashattn
