// Forward kernel of the fp32 family: FlashAttention-2 with 3xTF32 tensor-core products
// (mma.cuh) and fp32 softmax.
//
// One CTA of Br / 16 warps per (query block of Br rows, query head, sequence), last query
// block first (the longest under a top-left causal mask); warp w owns rows [16w, 16w + 16)
// of the block whole, so the softmax reductions stay within a quad of lanes. Operands are
// split once per CTA (split_tile.cuh): Q into a split tile at the start (where the
// instance's shared memory holds none, Q stays fp32 and splits as Q K^T reads it: traits.h,
// FwdTile), each K and V tile of Bc keys when its copy into a staging tile has landed:
// with one staging tile the copy of V_j overlaps Q K_j^T and the softmax, that of K_j+1
// the product P V_j, each split between two barriers; with two (FwdTile::kTwoStages) the
// copies of V_j+1 and K_j+2 overlap P V_j, Q K_j+1^T and the softmax, and both split in
// one pass between two barriers, two per key tile instead of four. Tiles that the band mask or
// the block-sparse layout remove entirely are skipped. P stays fp32 in the registers that
// the softmax leaves it in, which under mma.cuh's relabelling of k are its A fragments of
// P V, and is split there (it is never infinite: no guard). Per row, the same invariants as
// the CPU backend (src/cpu/flash_fwd.cpp):
//   m = max of the kept scores so far (-inf if none),
//   l = sum exp(s - m) over kept scores (before dropout),
//   acc = sum dropout(exp(s - m)) * v.
// A row with l = 0 at the end is fully masked (O = 0, LSE = -inf); a NaN score makes l,
// O and LSE NaN. Memory: O(Br * D) shared per CTA, nothing per key.
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/params.h"
#include "fp32/ctx.cuh"
#include "fp32/mma.cuh"
#include "fp32/scores.cuh"
#include "fp32/split_tile.cuh"
#include "fp32/tile_io.cuh"
#include "fp32/traits.h"

namespace flashattn {
namespace fp32 {

// Reductions over the quad of lanes that holds a row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// One tile of the online softmax on final scores s (the thread's rows h = 0, 1: g and
// g + 8): updates m, l and rescales acc, turns s into the (pre-dropout) probabilities. A
// row that has kept nothing yet (m' = -inf) takes its probabilities against 0: masked
// scores give exact zeros and a NaN stays NaN.
template <int NS, int NO>
__device__ __forceinline__ void softmax_step(float (&s)[NS][4], float (&m)[2], float (&l)[2], float (&acc)[NO][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mt = s[0][2 * h];
#pragma unroll
    for (int n = 0; n < NS; ++n) mt = fmaxf(mt, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
    const float m_new = fmaxf(m[h], quad_max(mt));
    const bool none = m_new == -INFINITY;
    const float ref = none ? 0.f : m_new;
    const float alpha = none ? 1.f : expf(m[h] - m_new);
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        s[n][2 * h + x] = expf(s[n][2 * h + x] - ref);
        sum += s[n][2 * h + x];
      }
    l[h] = l[h] * alpha + quad_sum(sum);
    m[h] = none ? m[h] : m_new;
    if (alpha != 1.f)
#pragma unroll
      for (int o = 0; o < NO; ++o) {
        acc[o][2 * h] *= alpha;
        acc[o][2 * h + 1] *= alpha;
      }
  }
}

// acc += P V for the warp's 16 rows: P in the C layout of the scores (s[n] holds keys
// [8n, 8n + 8)), which is the A fragment of k-step n with a1, a2 exchanged; V a split tile
// with k = key down its columns, read at fixed offsets from the lane's base. Two k-steps
// (16 keys) run into the same fresh zeros before their one fp32 addition to acc (mma.cuh:
// the tensor cores' truncation acts on sums of 16 keys, small against acc): half the
// additions, and the compiler keeps more products in flight (docs/internals/kernels-fp32.md,
// "Forward: two staging tiles").
template <int NS, int NO>
__device__ __forceinline__ void pv_product(float (&acc)[NO][4], const float (&s)[NS][4], const uint32_t* v, int ldv) {
  const uint32_t* const v_lane = v + lane_t() * ldv + 4 * lane_g();
#pragma unroll
  for (int n = 0; n < NS; n += 2) {
    Split a[2][4];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      a[x][0] = split_probability(s[n + x][0]);
      a[x][1] = split_probability(s[n + x][2]);
      a[x][2] = split_probability(s[n + x][1]);
      a[x][3] = split_probability(s[n + x][3]);
    }
#pragma unroll
    for (int o = 0; o < NO; ++o) {
      float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        Split b[2];
        load_b_split_rows(b, v_lane, ldv, 8 * (n + x), 8 * o);
        mma3_into(d, a[x], b);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[o][e] += d[e];
    }
  }
}

// Start of the first tile at or after j0 that the band mask and the layout keep some of
// (len_k when none).
template <int Bc>
__device__ __forceinline__ int64_t next_tile(const AttnParams& p, const SeqCtx& c, int64_t i0, int nq, int64_t j0) {
  while (j0 < c.len_k && classify_tile(p, c.h, c.shift, i0, nq, j0, c.len_k - j0 < Bc ? c.len_k - j0 : Bc) == kTileSkip)
    j0 += Bc;
  return j0 < c.len_k ? j0 : c.len_k;
}

template <int D, bool kWide>
__global__ void __launch_bounds__(FwdTile<D, kWide>::kThreads, FwdTile<D, kWide>::min_blocks)
    fwd_kernel(const AttnParams p) {
  using T = FwdTile<D, kWide>;
  constexpr int NS = T::Bc / 8, NO = D / 8, kThreads = T::kThreads;
  extern __shared__ float4 smem4[];
  float* const sm = reinterpret_cast<float*>(smem4);
  uint32_t *const sq = reinterpret_cast<uint32_t*>(sm + T::q_off),
                  *const sk = reinterpret_cast<uint32_t*>(sm + T::k_off),
                  *const sv = reinterpret_cast<uint32_t*>(sm + T::v_off);
  float* const stage = sm + T::stage_off;

  const int64_t n_qb = (p.seqlen_q + T::Br - 1) / T::Br;
  const int64_t qb = n_qb - 1 - static_cast<int64_t>(blockIdx.x) % n_qb, bh = static_cast<int64_t>(blockIdx.x) / n_qb;
  const SeqCtx c = make_ctx(p, bh / p.heads_q, bh % p.heads_q);
  const int64_t i0 = qb * T::Br;
  if (i0 >= c.len_q) return;  // varlen: past this sequence's end
  const int nq = static_cast<int>(c.len_q - i0 < T::Br ? c.len_q - i0 : T::Br);
  const int dqk = static_cast<int>(p.head_dim_qk), dv = static_cast<int>(p.head_dim_v), kd = (dqk + 7) / 8 * 8;
  const float *q = static_cast<const float*>(p.q), *k = static_cast<const float*>(p.k),
              *v = static_cast<const float*>(p.v);
  const bool qc = chunked(q, p.q_stride), kc = chunked(k, p.k_stride), vc = chunked(v, p.v_stride);
  // Starts the copy of Bc rows of a tensor (row(st, r): the element offset of row r) into
  // the staging tile dst, zeros past n rows and dim columns, and commits it.
  const auto stage_rows = [&](float* dst, const float* src, const Strides4& st, bool ch, int n, int dim, auto row) {
    load_tile<T::Bc, D, T::stage_pitch, kThreads>(dst, src, n, dim, ch, [&](int r) { return row(st, r); });
    copy_commit();
  };
  const auto key_rows = [&](int64_t j0) {
    return [&p, &c, j0](const Strides4& st, int r) { return k_row(p, c, st, j0 + r); };
  };
  const auto keys_in = [&](int64_t j0) { return static_cast<int>(c.len_k - j0 < T::Bc ? c.len_k - j0 : T::Bc); };

  // Q: split, in pieces of Bc rows through the staging tile; or as it is.
  if constexpr (T::kSplitQ) {
    for (int r0 = 0; r0 < T::Br; r0 += T::Bc) {
      stage_rows(stage, q, p.q_stride, qc, nq - r0, dqk,
                 [&](const Strides4& st, int r) { return q_row(p, c, st, i0 + r0 + r); });
      copy_wait<0>();
      __syncthreads();  // the piece is in; the previous piece's split is done with the staging tile
      split_a_rows<T::Bc, D, T::stage_pitch, T::q_pitch, kThreads>(sq + r0 / 2 * T::q_pitch, stage);
      __syncthreads();
    }
  } else {
    load_tile<T::Br, D, T::q_pitch, kThreads>(reinterpret_cast<float*>(sq), q, nq, dqk, qc,
                                              [&](int r) { return q_row(p, c, p.q_stride, i0 + r); });
    copy_commit();
    copy_wait<0>();
    __syncthreads();
  }
  const int m0 = 16 * warp_id();
  float acc[NO][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  zero(acc);
  // P_j of the warp's rows in s: S_j = Q K_j^T (K_j split in sk), the softmax step, dropout.
  const auto probabilities = [&](float(&s)[NS][4], int64_t j0) {
    const bool partial = classify_tile(p, c.h, c.shift, i0, nq, j0, keys_in(j0)) == kTilePartial;
    zero(s);
    warp_gemm_split<true, T::kSplitQ>(s, sq, T::q_pitch, sk, T::k_pitch, m0, 0, kd);
    finish_scores<false>(p, c, s, s, i0 + m0, j0, partial);
    softmax_step(s, m, l, acc);
    if (dropout_active(p.drop_threshold)) {
      float dm[NS][4];
      dropout_multipliers(p, c, dm, i0 + m0, j0);
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] *= dm[n][e];
    }
  };
  const auto next = [&](int64_t j0) { return next_tile<T::Bc>(p, c, i0, nq, j0); };

  int64_t j0 = next(0);
  if constexpr (T::kTwoStages) {
    // Both staging tiles in flight under each tile's products: V_j and K_j+1 land while
    // S_j and P_j V_j-1 run and split in one pass, two barriers per key tile.
    float* const vstage = sm + T::vstage_off;
    int64_t jn = c.len_k;
    if (j0 < c.len_k) {
      stage_rows(stage, k, p.k_stride, kc, keys_in(j0), dqk, key_rows(j0));
      stage_rows(vstage, v, p.v_stride, vc, keys_in(j0), dv, key_rows(j0));
      copy_wait<1>();
      __syncthreads();  // K_j0 is in
      split_rows<T::Bc, D, T::stage_pitch, T::k_pitch, kThreads>(sk, stage);
      __syncthreads();  // K_j0 is split; its staging tile is free
      jn = next(j0 + T::Bc);
      if (jn < c.len_k) stage_rows(stage, k, p.k_stride, kc, keys_in(jn), dqk, key_rows(jn));
    }
    while (j0 < c.len_k) {
      float s[NS][4];
      probabilities(s, j0);
      copy_wait<0>();
      __syncthreads();  // V_j and K_j+1 are in; every warp is done with K_j and V_j-1
      split_columns<T::Bc, D, T::stage_pitch, T::v_pitch, kThreads>(sv, vstage);
      if (jn < c.len_k) split_rows<T::Bc, D, T::stage_pitch, T::k_pitch, kThreads>(sk, stage);
      __syncthreads();  // V_j and K_j+1 are split; both staging tiles are free
      int64_t jn2 = c.len_k;
      if (jn < c.len_k) {
        stage_rows(vstage, v, p.v_stride, vc, keys_in(jn), dv, key_rows(jn));
        jn2 = next(jn + T::Bc);
        if (jn2 < c.len_k) stage_rows(stage, k, p.k_stride, kc, keys_in(jn2), dqk, key_rows(jn2));
      }
      pv_product(acc, s, sv, T::v_pitch);
      j0 = jn;
      jn = jn2;
    }
  } else {
    // One staging tile: V_j's copy overlaps S_j, K_j+1's P_j V_j, each split between two
    // barriers.
    if (j0 < c.len_k) {
      stage_rows(stage, k, p.k_stride, kc, keys_in(j0), dqk, key_rows(j0));
      copy_wait<0>();
      __syncthreads();
      split_rows<T::Bc, D, T::stage_pitch, T::k_pitch, kThreads>(sk, stage);
      __syncthreads();
      stage_rows(stage, v, p.v_stride, vc, keys_in(j0), dv, key_rows(j0));
    }
    while (j0 < c.len_k) {
      float s[NS][4];
      probabilities(s, j0);
      copy_wait<0>();
      __syncthreads();  // V_j is in; every warp is done with K_j and with V_j-1
      split_columns<T::Bc, D, T::stage_pitch, T::v_pitch, kThreads>(sv, stage);
      __syncthreads();  // V_j is split; the staging tile is free
      const int64_t jn = next(j0 + T::Bc);
      if (jn < c.len_k) stage_rows(stage, k, p.k_stride, kc, keys_in(jn), dqk, key_rows(jn));
      pv_product(acc, s, sv, T::v_pitch);
      if (jn < c.len_k) {
        copy_wait<0>();
        __syncthreads();  // K_j+1 is in
        split_rows<T::Bc, D, T::stage_pitch, T::k_pitch, kThreads>(sk, stage);
        __syncthreads();  // K_j+1 is split; the staging tile is free
        stage_rows(stage, v, p.v_stride, vc, keys_in(jn), dv, key_rows(jn));
      }
      j0 = jn;
    }
  }

  // O = acc / l (0 for a fully masked row), LSE = m + log(l) (-inf).
  float one[2] = {1.f, 1.f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const bool empty = l[h] == 0.f;
#pragma unroll
    for (int o = 0; o < NO; ++o)
#pragma unroll
      for (int x = 0; x < 2; ++x) acc[o][2 * h + x] = empty ? 0.f : acc[o][2 * h + x] / l[h];
    const int r = m0 + frag_row(2 * h);
    if (p.lse != nullptr && lane_t() == 0 && r < nq)
      p.lse[lse_at(p, c, i0 + r)] = empty ? -INFINITY : m[h] + logf(l[h]);
  }
  store_frag(static_cast<float*>(p.o), nq, dv, acc, one, m0, 0, [&](int r) { return q_row(p, c, p.o_stride, i0 + r); });
}

}  // namespace fp32
}  // namespace flashattn
