// Forward kernel of the fp32 SIMT family: FlashAttention-2 in fp32 registers.
//
// One CTA per (query block of Br rows, query head, sequence), last query block first (the
// longest under a top-left causal mask). Q stays in shared memory; K/V tiles of Bc keys
// stream through it; tiles that the band mask or the block-sparse layout remove entirely
// are skipped. Per row, the same invariants as the CPU backend (src/cpu/flash_fwd.cpp):
//   m = max of the kept scores so far (-inf if none),
//   l = sum exp(s - m) over kept scores (before dropout),
//   acc = sum dropout(exp(s - m)) * v.
// A row with l = 0 at the end is fully masked (O = 0, LSE = -inf); a NaN score makes l,
// O and LSE NaN. Memory: O(Br * D) shared per CTA, nothing per key.
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/params.h"
#include "simt/ctx.cuh"
#include "simt/gemm.cuh"
#include "simt/scores.cuh"
#include "simt/tile_io.cuh"
#include "simt/traits.h"

namespace flashattn {
namespace simt {

// Reductions over the 16 column threads of a row (one half-warp).
__device__ __forceinline__ float row_max16(float x) {
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float row_sum16(float x) {
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// One tile of the online softmax on final scores s: updates m, l and rescales acc, turns
// s into the (pre-dropout) probabilities. A row that has kept nothing yet (m' = -inf) takes
// its probabilities against 0: masked scores give exact zeros and a NaN stays NaN.
template <int SM, int SN, int N>
__device__ __forceinline__ void softmax_step(float (&s)[SM][SN], float (&m)[SM], float (&l)[SM], float (&acc)[SM][N]) {
#pragma unroll
  for (int i = 0; i < SM; ++i) {
    float mt = s[i][0];
#pragma unroll
    for (int j = 1; j < SN; ++j) mt = fmaxf(mt, s[i][j]);
    const float m_new = fmaxf(m[i], row_max16(mt));
    const bool none = m_new == -INFINITY;
    const float ref = none ? 0.f : m_new;
    const float alpha = none ? 1.f : expf(m[i] - m_new);
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < SN; ++j) {
      s[i][j] = expf(s[i][j] - ref);
      sum += s[i][j];
    }
    l[i] = l[i] * alpha + row_sum16(sum);
    m[i] = none ? m[i] : m_new;
    if (alpha != 1.f)
#pragma unroll
      for (int n = 0; n < N; ++n) acc[i][n] *= alpha;
  }
}

// Writes O = acc / l (0 for a fully masked row) and LSE = m + log(l) (-inf) of the CTA's
// rows [i0, i0 + nq).
template <int SM, int N>
__device__ __forceinline__ void store_output(const AttnParams& p, const SeqCtx& c, int64_t i0, int nq,
                                             const float (&acc)[SM][N], const float (&m)[SM], const float (&l)[SM]) {
  float inv[SM];
#pragma unroll
  for (int i = 0; i < SM; ++i) {
    const int r = thread_y() * SM + i;
    const bool empty = l[i] == 0.f;
    inv[i] = empty ? 0.f : 1.f / l[i];
    if (p.lse != nullptr && thread_x() == 0 && r < nq)
      p.lse[lse_at(p, c, i0 + r)] = empty ? -INFINITY : m[i] + logf(l[i]);
  }
  store_tile(static_cast<float*>(p.o), nq, p.head_dim_v, acc, inv,
             [&](int r) { return q_row(p, c, p.o_stride, i0 + r); });
}

template <int D>
__global__ void __launch_bounds__(kThreads, kMinBlocks<D>) fwd_kernel(const AttnParams p) {
  using T = FwdTile<D>;
  constexpr int SM = T::Br / 16, SN = T::Bc / 16, NG = D / 64;
  extern __shared__ float4 smem4[];
  float* const sm = reinterpret_cast<float*>(smem4);
  float *const sq = sm + T::q_off, *const sk = sm + T::k_off, *const sv = sm + T::v_off, *const sp = sm + T::p_off;
  uint8_t* const keep = reinterpret_cast<uint8_t*>(sm + T::keep_off);

  const int64_t n_qb = (p.seqlen_q + T::Br - 1) / T::Br;
  const int64_t qb = n_qb - 1 - static_cast<int64_t>(blockIdx.x) % n_qb, bh = static_cast<int64_t>(blockIdx.x) / n_qb;
  const SeqCtx c = make_ctx(p, bh / p.heads_q, bh % p.heads_q);
  const int64_t i0 = qb * T::Br;
  if (i0 >= c.len_q) return;  // varlen: past this sequence's end
  const int nq = static_cast<int>(c.len_q - i0 < T::Br ? c.len_q - i0 : T::Br);
  const int dqk = static_cast<int>(p.head_dim_qk), dv = static_cast<int>(p.head_dim_v), kd = (dqk + 3) / 4 * 4;
  const float *q = static_cast<const float*>(p.q), *k = static_cast<const float*>(p.k),
              *v = static_cast<const float*>(p.v);
  load_tile<T::Br, D>(sq, q, nq, dqk, [&](int r) { return q_row(p, c, p.q_stride, i0 + r); });

  float acc[SM][4 * NG], m[SM], l[SM];
  zero(acc);
#pragma unroll
  for (int i = 0; i < SM; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
  }
  for (int64_t j0 = 0; j0 < c.len_k; j0 += T::Bc) {
    const int nk = static_cast<int>(c.len_k - j0 < T::Bc ? c.len_k - j0 : T::Bc);
    const TileKind kind = classify_tile(p, c.h, c.shift, i0, nq, j0, nk);
    if (kind == kTileSkip) continue;
    __syncthreads();  // the previous tile's P V is done with sk, sv, sp
    load_tile<T::Bc, D>(sk, k, nk, dqk, [&](int r) { return k_row(p, c, p.k_stride, j0 + r); });
    load_tile<T::Bc, D>(sv, v, nk, dv, [&](int r) { return k_row(p, c, p.v_stride, j0 + r); });
    if (p.p_drop > 0.f) dropout_multipliers<T::Br, T::Bc>(p, c, sp, i0, j0);
    if (kind == kTilePartial) mask_tile<T::Br, T::Bc>(p, c, keep, i0, j0);
    __syncthreads();
    float s[SM][SN];
    zero(s);
    gemm_nt(s, sq, pitch(D), sk, pitch(D), kd);
    finish_scores<false>(p, c, s, s, i0, j0, kind == kTilePartial ? keep : nullptr);
    softmax_step(s, m, l, acc);
    // Each thread reads its own dropout multipliers and overwrites them with its P.
#pragma unroll
    for (int i = 0; i < SM; ++i)
#pragma unroll
      for (int j = 0; j < SN; ++j) {
        float* e = sp + (thread_y() * SM + i) * pitch(T::Bc) + thread_x() + 16 * j;
        *e = p.p_drop > 0.f ? s[i][j] * *e : s[i][j];
      }
    __syncthreads();
    gemm_nn<SM, NG>(acc, sp, pitch(T::Bc), sv, pitch(D), T::Bc);
  }
  store_output(p, c, i0, nq, acc, m, l);
}

}  // namespace simt
}  // namespace flashattn
