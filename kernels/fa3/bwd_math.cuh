// The elementwise part of a backward step, in registers, on the transposed tiles of one
// consumer warpgroup (rows: its 64 keys; columns: the step's kBlockM queries; the C-fragment
// layout of wgmma.cuh, so this thread holds keys key0 and key0 + 8 and, per n8 tile nt,
// queries 8 nt + 2t, + 1):
//   P^T = exp2(S^T * scale * log2(e) - LSE_2) (LSE_2 = LSE * log2(e), per query), masked;
//   dS^T = P^T * (dP^T - Delta).
#pragma once
#include <stdint.h>

#include "common/params.h"
#include "fa2/mma.cuh"
#include "fa3/bwd_schedule.cuh"

namespace flashattn {
namespace fa3 {

// The two values of an LSE or Delta row at queries 8 nt + 2t, + 1 (a shared-memory float
// array of the step's queries).
__device__ __forceinline__ float2 bwd_row_pair(uint32_t rows, int nt, int t) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
               : "=f"(v.x), "=f"(v.y)
               : "r"(rows + static_cast<uint32_t>((nt * 8 + 2 * t) * 4)));
  return v;
}

// S^T -> P^T in place. kMask: zero the probabilities of queries past len_q, keys past len_k
// and (causal) keys j > i + shift. A query that sees no key has LSE_2 = +inf (bwd_load_rows):
// its probabilities are 0 in every block.
template <bool kMask, int NT>
__device__ __forceinline__ void bwd_probs(float (&acc)[1][NT][4], uint32_t lse_rows, float sl2, const AttnParams& p,
                                          const BwdWork& w, int key0, int m0) {
  const int t = static_cast<int>(threadIdx.x) % 4;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float2 l = bwd_row_pair(lse_rows, nt, t);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float pe = fa2::fast_exp2(fmaf(acc[0][nt][e], sl2, -((e & 1) ? l.y : l.x)));
      if (kMask) {
        const int j = key0 + (e >> 1) * 8, i = m0 + nt * 8 + 2 * t + (e & 1);
        if (i >= w.len_q || j >= w.len_k || (p.has_band && j > i + w.shift)) pe = 0.f;
      }
      acc[0][nt][e] = pe;
    }
  }
}

// dP^T -> dS^T in place, from P^T.
template <int NT>
__device__ __forceinline__ void bwd_dscores(float (&dp)[1][NT][4], const float (&pt)[1][NT][4], uint32_t delta_rows) {
  const int t = static_cast<int>(threadIdx.x) % 4;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float2 d = bwd_row_pair(delta_rows, nt, t);
#pragma unroll
    for (int e = 0; e < 4; ++e) dp[0][nt][e] = pt[0][nt][e] * (dp[0][nt][e] - ((e & 1) ? d.y : d.x));
  }
}

}  // namespace fa3
}  // namespace flashattn
