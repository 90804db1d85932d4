// dK/dV kernel of the fp32 backward: one CTA per (key block of Bc keys, kv head, sequence)
// keeps its K, V tiles in shared memory and dK, dV in registers (WarpGrid<Bc, D>), and
// loops over the query heads of its GQA group and their query blocks (skipping those the
// band mask or the layout remove):
//   dV += Z^T dO,  dK += dS^T Q   (dK scaled by the softmax scale at the end).
// With kAtomicDq it also adds scale * dS K into dQ (zeroed by bwd_prep_kernel unless the
// run accumulates into dQ) with fp32 atomics: the non-deterministic mode. The
// deterministic mode computes dQ in bwd_dq_kernel instead. Key blocks past a sequence's
// end write nothing; a block that no query reaches writes zeros. The split instance
// (kSplitKV, traits.h) splits K and V once, before the loop, for every pair's S and dP.
#pragma once
#include <stdint.h>

#include "fp32/bwd_tile.cuh"

namespace flashattn {
namespace fp32 {

// dQ [Br x D] of the current tile pair: acc += dS K (WarpGrid<Br, D>).
template <int D, bool kSplitKV, int NT>
__device__ __forceinline__ void pair_dq(float (&acc)[NT][4], const BwdSmem<D, kSplitKV>& s) {
  using T = BwdTile<D>;
  const WarpTile<T::Br, D, T::kThreads / 32> w;
  warp_gemm<false, false>(acc, s.ds, T::s_pitch, s.k, T::d_pitch, w.m0, w.n0, T::Bc);
}

// scale * dS K of the current tile pair into dQ rows [i0, i0 + nq) with atomics.
template <int D, bool kSplitKV>
__device__ __forceinline__ void add_dq_atomic(const AttnParams& p, const SeqCtx& c, const BwdSmem<D, kSplitKV>& s,
                                              int64_t i0, int nq) {
  using T = BwdTile<D>;
  constexpr int NT = WarpGrid<T::Br, D, T::kThreads / 32>::NT;
  const WarpTile<T::Br, D, T::kThreads / 32> w;
  float acc[NT][4];
  zero(acc);
  pair_dq(acc, s);
  float* dq = static_cast<float*>(p.dq);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = w.m0 + frag_row(2 * h);
    if (r >= nq) continue;
    float* row = dq + q_row(p, c, p.dq_stride, i0 + r);
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int col = w.n0 + frag_col(n, x);
        if (col < p.head_dim_qk) atomicAdd(row + col, acc[n][2 * h + x] * p.scale);
      }
  }
}

template <int D, bool kAtomicDq, bool kSplitKV>
__global__ void __launch_bounds__(BwdTile<D, kSplitKV>::kThreads)
    bwd_dkdv_kernel(const AttnParams p, const float* delta) {
  using T = BwdTile<D, kSplitKV>;
  constexpr int kWarps = T::kThreads / 32, NT = WarpGrid<T::Bc, D, kWarps>::NT;
  extern __shared__ float4 smem4[];
  const BwdSmem<D, kSplitKV> s(reinterpret_cast<float*>(smem4));

  const int64_t n_kb = (p.seqlen_k + T::Bc - 1) / T::Bc;
  const int64_t kb = static_cast<int64_t>(blockIdx.x) % n_kb, bhk = static_cast<int64_t>(blockIdx.x) / n_kb;
  const int64_t b = bhk / p.heads_kv, hk = bhk % p.heads_kv, group = p.heads_q / p.heads_kv;
  const SeqCtx ck = make_ctx(p, b, hk * group);
  const int64_t j0 = kb * T::Bc;
  if (j0 >= ck.len_k) return;
  const int nk = static_cast<int>(ck.len_k - j0 < T::Bc ? ck.len_k - j0 : T::Bc);
  load_key_side(p, ck, s, j0, nk);
  if constexpr (kSplitKV) {
    copy_wait<0>();
    __syncthreads();  // K and V are in
    split_rows<T::Bc, D, T::d_pitch, T::kv_pitch, T::kThreads>(s.ks, s.k);
    split_rows<T::Bc, D, T::d_pitch, T::kv_pitch, T::kThreads>(s.vs, s.v);
  }

  const WarpTile<T::Bc, D, kWarps> w;
  float dk[NT][4], dv[NT][4];
  zero(dk);
  zero(dv);
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const SeqCtx c = make_ctx(p, b, h);
    for (int64_t i0 = 0; i0 < c.len_q; i0 += T::Br) {
      const int nq = static_cast<int>(c.len_q - i0 < T::Br ? c.len_q - i0 : T::Br);
      const TileKind kind = classify_tile(p, h, c.shift, i0, nq, j0, nk);
      if (kind == kTileSkip) continue;
      __syncthreads();  // the previous pair's products are done with the query-side tiles (and V's staging)
      load_query_side(p, c, s, delta, i0, nq);
      pair_grads(p, c, s, i0, j0, kind);
      warp_gemm<true, false>(dv, s.z, T::s_pitch, s.dout, T::d_pitch, w.m0, w.n0, T::Br);
      warp_gemm<true, false>(dk, s.ds, T::s_pitch, s.q, T::d_pitch, w.m0, w.n0, T::Br);
      if (kAtomicDq) add_dq_atomic(p, c, s, i0, nq);
    }
  }
  copy_wait<0>();  // a block that no query reaches still has its key-side copies in flight
  const float scale[2] = {p.scale, p.scale}, one[2] = {1.f, 1.f};
  store_frag(
      static_cast<float*>(p.dk), nk, p.head_dim_qk, dk, scale, w.m0, w.n0,
      [&](int r) { return k_row(p, ck, p.dk_stride, j0 + r); }, p.grad_accumulate != 0);
  store_frag(
      static_cast<float*>(p.dv), nk, p.head_dim_v, dv, one, w.m0, w.n0,
      [&](int r) { return k_row(p, ck, p.dv_stride, j0 + r); }, p.grad_accumulate != 0);
}

}  // namespace fp32
}  // namespace flashattn
