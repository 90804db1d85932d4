// dK/dV kernel of the fp32 SIMT backward: one CTA per (key block of Bc keys, kv head,
// sequence) keeps its K, V tiles in shared memory and dK, dV in registers, and loops over
// the query heads of its GQA group and their query blocks (skipping those the band mask or
// the layout remove):
//   dV += Z^T dO,  dK += dS^T Q   (dK scaled by the softmax scale at the end).
// With kAtomicDq it also adds scale * dS K into dQ (zeroed by bwd_prep_kernel) with fp32
// atomics: the non-deterministic mode. The deterministic mode computes dQ in
// bwd_dq_kernel instead. Key blocks past a sequence's end write nothing; a block that no
// query reaches writes zeros.
#pragma once
#include <stdint.h>

#include "simt/bwd_tile.cuh"

namespace flashattn {
namespace simt {

// scale * dS K of the current tile pair into dQ rows [i0, i0 + nq) with atomics, 64
// columns at a time.
template <int D>
__device__ __forceinline__ void add_dq_atomic(const AttnParams& p, const SeqCtx& c, const BwdSmem<D>& s, int64_t i0,
                                              int nq) {
  constexpr int Br = BwdTile<D>::Br, Bc = BwdTile<D>::Bc, SM = Br / 16;
  float* dq = static_cast<float*>(p.dq);
#pragma unroll 1
  for (int g = 0; g < D / 64; ++g) {
    if (64 * g >= p.head_dim_qk) break;
    float acc[SM][4];
    zero(acc);
    gemm_nn<SM, 1>(acc, s.ds, pitch(Bc), s.k + 64 * g, pitch(D), Bc);
#pragma unroll
    for (int i = 0; i < SM; ++i) {
      const int r = thread_y() * SM + i;
      if (r >= nq) continue;
      float* row = dq + q_row(p, c, p.dq_stride, i0 + r);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 64 * g + thread_x() * 4 + e;
        if (col < p.head_dim_qk) atomicAdd(row + col, acc[i][e] * p.scale);
      }
    }
  }
}

template <int D, bool kAtomicDq>
__global__ void __launch_bounds__(kThreads, kMinBlocks<D>) bwd_dkdv_kernel(const AttnParams p, const float* delta) {
  using T = BwdTile<D>;
  constexpr int KM = T::Bc / 16, NG = D / 64;
  extern __shared__ float4 smem4[];
  const BwdSmem<D> s(reinterpret_cast<float*>(smem4));

  const int64_t n_kb = (p.seqlen_k + T::Bc - 1) / T::Bc;
  const int64_t kb = static_cast<int64_t>(blockIdx.x) % n_kb, bhk = static_cast<int64_t>(blockIdx.x) / n_kb;
  const int64_t b = bhk / p.heads_kv, hk = bhk % p.heads_kv, group = p.heads_q / p.heads_kv;
  const SeqCtx ck = make_ctx(p, b, hk * group);
  const int64_t j0 = kb * T::Bc;
  if (j0 >= ck.len_k) return;
  const int nk = static_cast<int>(ck.len_k - j0 < T::Bc ? ck.len_k - j0 : T::Bc);
  load_key_side(p, ck, s, j0, nk);

  float dk[KM][4 * NG], dv[KM][4 * NG];
  zero(dk);
  zero(dv);
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const SeqCtx c = make_ctx(p, b, h);
    for (int64_t i0 = 0; i0 < c.len_q; i0 += T::Br) {
      const int nq = static_cast<int>(c.len_q - i0 < T::Br ? c.len_q - i0 : T::Br);
      const TileKind kind = classify_tile(p, h, c.shift, i0, nq, j0, nk);
      if (kind == kTileSkip) continue;
      __syncthreads();  // the previous pair's products are done with the query-side tiles
      load_query_side(p, c, s, delta, i0, nq);
      pair_grads(p, c, s, i0, j0, kind);
      gemm_tn<KM, NG>(dv, s.z, pitch(T::Bc), s.dout, pitch(D), T::Br);
      gemm_tn<KM, NG>(dk, s.ds, pitch(T::Bc), s.q, pitch(D), T::Br);
      if (kAtomicDq) add_dq_atomic(p, c, s, i0, nq);
    }
  }
  float scale[KM], one[KM];
#pragma unroll
  for (int i = 0; i < KM; ++i) {
    scale[i] = p.scale;
    one[i] = 1.f;
  }
  store_tile(static_cast<float*>(p.dk), nk, p.head_dim_qk, dk, scale,
             [&](int r) { return k_row(p, ck, p.dk_stride, j0 + r); });
  store_tile(static_cast<float*>(p.dv), nk, p.head_dim_v, dv, one,
             [&](int r) { return k_row(p, ck, p.dv_stride, j0 + r); });
}

}  // namespace simt
}  // namespace flashattn
