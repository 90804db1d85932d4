// Per-element score semantics shared by every backend: band mask, block-sparse lookup,
// softcap, ALiBi. One definition, so the CPU backend (the oracle) and the CUDA kernels
// cannot disagree on what a plan means.
#pragma once
#include <math.h>
#include <stdint.h>

#include "hostdevice.h"
#include "params.h"

namespace flashattn {

// Shift from query row i to the aligned row i' for a sequence of lengths (len_q, len_k).
FA_HD int64_t align_shift(const AttnParams& p, int64_t len_q, int64_t len_k) {
  return p.align == 1 ? len_k - len_q : 0;
}

// Band mask on aligned row ip = i + shift.
FA_HD bool band_keep(const AttnParams& p, int64_t ip, int64_t j) {
  if (!p.has_band) return true;
  // Differences instead of ip +/- window: windows may be as large as INT64_MAX.
  if (p.window_right >= 0 && j - ip > p.window_right) return false;
  if (p.window_left >= 0 && ip - j > p.window_left) return false;
  return true;
}

// Block-sparse layout lookup (true when there is no layout).
FA_HD bool layout_keep(const AttnParams& p, int64_t h, int64_t i, int64_t j) {
  if (p.layout == nullptr) return true;
  const int64_t lh = p.layout_heads == 1 ? 0 : h;
  return p.layout[(lh * p.n_row_blocks + i / p.block_q) * p.n_col_blocks + j / p.block_k] != 0;
}

// ALiBi slope of sequence b, query head h (0 when the bias kind is not ALiBi).
FA_HD float alibi_slope(const AttnParams& p, int64_t b, int64_t h) {
  if (p.bias_kind != kBiasAlibi && p.bias_kind != kBiasAlibiSymmetric) return 0.f;
  return p.alibi_slopes[b * p.alibi_batch_stride + h];
}

// ALiBi bias for a slope at aligned row ip and column j (0 when not ALiBi).
FA_HD float alibi_bias(const AttnParams& p, float slope, int64_t ip, int64_t j) {
  if (p.bias_kind == kBiasAlibi) return slope * static_cast<float>(j - ip);
  if (p.bias_kind == kBiasAlibiSymmetric) {
    const int64_t d = ip - j;
    return -slope * static_cast<float>(d < 0 ? -d : d);
  }
  return 0.f;
}

// Whether a tile of rows [i0, i0+ni) (query positions within the sequence; aligned row
// i' = i + shift) by columns [j0, j0+nj) of query head h has any / only elements that
// survive the band mask and the block-sparse layout. Skip tiles are never computed (that
// is what makes causal, sliding-window and block-sparse attention cheaper); Full tiles
// need no per-element mask.
enum TileKind { kTileSkip, kTileFull, kTilePartial };

FA_HD TileKind classify_tile(const AttnParams& p, int64_t h, int64_t shift, int64_t i0, int64_t ni, int64_t j0,
                             int64_t nj) {
  bool full = true;
  if (p.has_band) {
    // Row ip keeps [ip - wl, ip + wr]; the union over the tile's rows is contiguous.
    // Compared as differences: windows may be as large as INT64_MAX.
    const int64_t ip_first = i0 + shift, ip_last = i0 + ni - 1 + shift, j_last = j0 + nj - 1;
    if (p.window_right >= 0) {
      if (j0 - ip_last > p.window_right) return kTileSkip;
      if (j_last - ip_first > p.window_right) full = false;
    }
    if (p.window_left >= 0) {
      if (ip_first - j_last > p.window_left) return kTileSkip;
      if (ip_last - j0 > p.window_left) full = false;
    }
  }
  if (p.layout != nullptr) {
    const int64_t lh = p.layout_heads == 1 ? 0 : h;
    const int64_t rb0 = i0 / p.block_q, rb1 = (i0 + ni - 1) / p.block_q;
    const int64_t cb0 = j0 / p.block_k, cb1 = (j0 + nj - 1) / p.block_k;
    bool any = false, all = true;
    for (int64_t rb = rb0; rb <= rb1; ++rb) {
      const uint8_t* row = p.layout + (lh * p.n_row_blocks + rb) * p.n_col_blocks;
      for (int64_t cb = cb0; cb <= cb1; ++cb) {
        any |= row[cb] != 0;
        all &= row[cb] != 0;
      }
    }
    if (!any) return kTileSkip;
    if (!all) full = false;
  }
  return full ? kTileFull : kTilePartial;
}

}  // namespace flashattn
