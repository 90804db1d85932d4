// The epilogue of the FA2-design forward kernel (fwd_kernel.cuh): O normalized, the LSE, O
// to global memory.
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/exp2.h"
#include "common/params.h"
#include "fa2/fwd_traits.h"
#include "fa2/mma.cuh"

namespace flashattn {
namespace fa2 {

// Epilogue: O normalized by the row sums (and by 1 - p with dropout), the LSE, and O through
// shared memory (the Q tile) to global memory, each warp its own rows.
template <class Cfg, typename T, bool kExtras, bool kWgF, class WRow>
__device__ __forceinline__ void fwd_epilogue(const AttnParams& p, float (&acc_o)[Cfg::kMT][Cfg::kNV][4],
                                             const float (&row_max)[Cfg::kMT * 2], const float (&row_sum)[Cfg::kMT * 2],
                                             const WRow& wrow, T* sQ, T* gO, bool dropout, float sl2, int b, int h,
                                             int64_t q_start, int m0, int rows_q, int dv_chunks, int row_w0, int lane,
                                             int g, int t) {
  constexpr int kMT = Cfg::kMT;
  using OTile = typename Cfg::OTile;
  const float out_scale = kExtras && dropout ? p.rp_keep : 1.f;
  float* lse_out = nullptr;
  if (p.lse != nullptr)
    lse_out = p.lse + (p.varlen ? h * p.total_q + q_start : (static_cast<int64_t>(b) * p.heads_q + h) * p.seqlen_q);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = mt * 2 + hh;
      // sum = 0 exactly iff every probability of the row was 0 (the row maximum alone
      // contributes ex2(0) = 1): a fully masked row, O = 0 and LSE = -inf. fmaxf skips
      // NaN, so a NaN score (NaN in Q, or in a kept K row) leaves the max alone but makes
      // its exp, and from then on the sum (NaN * alpha), NaN: O and LSE become NaN.
      const float sum = quad_sum(row_sum[r]);
      const float inv = sum != 0.f ? out_scale / sum : 0.f;
#pragma unroll
      for (int nv = 0; nv < Cfg::kNV; ++nv) {
        acc_o[mt][nv][2 * hh] *= inv;
        acc_o[mt][nv][2 * hh + 1] *= inv;
      }
      const int row = wrow(mt) + g + hh * 8;
      if (lse_out != nullptr && t == 0 && row < rows_q)
        lse_out[m0 + row] = sum != 0.f ? (row_max[r] * sl2 + __log2f(sum)) * kLn2 : -INFINITY;
    }
  // Each warp only ever read its own rows of sQ, so it may overwrite them now (kWgF: the
  // warpgroup's GEMMs read every row; they are all complete after this barrier).
  if constexpr (kWgF) __syncthreads();
  T* sO = sQ;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nv = 0; nv < Cfg::kNV; ++nv)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = wrow(mt) + g + hh * 8;
        const int col = nv * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(sO + OTile::offset(row, col)) =
            pack2<T>(acc_o[mt][nv][2 * hh], acc_o[mt][nv][2 * hh + 1]);
      }
  __syncwarp();
  constexpr int kOChunks = Cfg::kDV / 8;
#pragma unroll
  for (int it = 0; it < (Cfg::kRowsPerWarp * kOChunks + 31) / 32; ++it) {
    const int idx = lane + it * 32;
    const int r = idx / kOChunks, c = idx - r * kOChunks;
    const int row = kWgF ? wrow(r >> 4) + (r & 15) : row_w0 + r;
    if (r < Cfg::kRowsPerWarp && row < rows_q && c < dv_chunks) {
      const uint4 v = *reinterpret_cast<const uint4*>(sO + OTile::offset(row, c * 8));
      *reinterpret_cast<uint4*>(gO + row * p.o_stride.s + c * 8) = v;
    }
  }
}

}  // namespace fa2
}  // namespace flashattn
