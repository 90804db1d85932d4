// The backward's recomputation of one (query block, key block) tile pair of the fp32
// family, shared by its dK/dV, dQ and dBias kernels. With P = exp(S - LSE), the dropout
// multipliers Dm and Delta = rowsum(dO * O), as in the CPU backend (src/cpu/flash_bwd.cpp):
//   dP = dO V^T,  Z = P * Dm,  dS = P * (dP * Dm - Delta)   (dBias = dS),
// times the softcap's chain factor 1 - tanh^2 for dQ and dK. The score tile [Br x Bc] is
// spread over the CTA's warps as WarpGrid<Br, Bc> (traits.h); P, Z and dS stay fp32.
#pragma once
#include <math.h>
#include <stdint.h>

#include "fp32/ctx.cuh"
#include "fp32/mma.cuh"
#include "fp32/scores.cuh"
#include "fp32/split_tile.cuh"
#include "fp32/tile_io.cuh"
#include "fp32/traits.h"

namespace flashattn {
namespace fp32 {

// Shared tiles of BwdTile<D, kSplitKV> in the CTA's dynamic shared memory (ks, vs: the
// split K and V of the split instance).
template <int D, bool kSplitKV = false>
struct BwdSmem {
  using T = BwdTile<D, kSplitKV>;
  float *k, *v, *q, *dout, *z, *ds, *lse, *delta;
  uint32_t *ks, *vs;
  __device__ explicit BwdSmem(float* sm)
      : k(sm + T::k_off),
        v(sm + T::v_off),
        q(sm + T::q_off),
        dout(sm + T::do_off),
        z(sm + T::z_off),
        ds(sm + T::ds_off),
        lse(sm + T::lse_off),
        delta(sm + T::delta_off),
        ks(reinterpret_cast<uint32_t*>(sm + T::ks_off)),
        vs(reinterpret_cast<uint32_t*>(sm + T::vs_off)) {}
};

// The warp's place in a product of M rows and N columns spread as WarpGrid<M, N>: its
// first row m0 and column n0.
template <int M, int N, int kWarps>
struct WarpTile {
  using G = WarpGrid<M, N, kWarps>;
  int m0, n0;
  __device__ WarpTile() : m0(16 * (warp_id() % G::rows)), n0(G::width * (warp_id() / G::rows)) {}
};

// Starts the copies of Q and dO and loads the LSE (a -inf LSE, a fully masked row, and
// rows past the sequence as +inf, so that exp(s - lse) = 0 for every s) and Delta of
// query rows [i0, i0 + nq) of c. The caller waits for the copies (copy_wait).
template <int D, bool kSplitKV>
__device__ __forceinline__ void load_query_side(const AttnParams& p, const SeqCtx& c, const BwdSmem<D, kSplitKV>& s,
                                                const float* delta, int64_t i0, int nq) {
  constexpr int Br = BwdTile<D>::Br, kThreads = BwdTile<D>::kThreads;
  const float *q = static_cast<const float*>(p.q), *dout = static_cast<const float*>(p.dout);
  load_tile<Br, D, BwdTile<D>::d_pitch, kThreads>(s.q, q, nq, static_cast<int>(p.head_dim_qk), chunked(q, p.q_stride),
                                                  [&](int r) { return q_row(p, c, p.q_stride, i0 + r); });
  load_tile<Br, D, BwdTile<D>::d_pitch, kThreads>(s.dout, dout, nq, static_cast<int>(p.head_dim_v),
                                                  chunked(dout, p.do_stride),
                                                  [&](int r) { return q_row(p, c, p.do_stride, i0 + r); });
  copy_commit();
  load_vec<Br, kThreads>(s.lse, nq, INFINITY, [&](int r) {
    const float l = p.lse_in[lse_at(p, c, i0 + r)];
    return l == -INFINITY ? INFINITY : l;
  });
  load_vec<Br, kThreads>(s.delta, nq, 0.f, [&](int r) { return delta[lse_at(p, c, i0 + r)]; });
}

// Starts the copies of K and V of key rows [j0, j0 + nk) of c's kv head (into s.k, s.v).
template <int D, bool kSplitKV>
__device__ __forceinline__ void load_key_side(const AttnParams& p, const SeqCtx& c, const BwdSmem<D, kSplitKV>& s,
                                              int64_t j0, int nk) {
  constexpr int Bc = BwdTile<D>::Bc, kThreads = BwdTile<D>::kThreads;
  const float *k = static_cast<const float*>(p.k), *v = static_cast<const float*>(p.v);
  load_tile<Bc, D, BwdTile<D>::d_pitch, kThreads>(s.k, k, nk, static_cast<int>(p.head_dim_qk), chunked(k, p.k_stride),
                                                  [&](int r) { return k_row(p, c, p.k_stride, j0 + r); });
  load_tile<Bc, D, BwdTile<D>::d_pitch, kThreads>(s.v, v, nk, static_cast<int>(p.head_dim_v), chunked(v, p.v_stride),
                                                  [&](int r) { return k_row(p, c, p.v_stride, j0 + r); });
  copy_commit();
}

// z (Z) and ds (dS, times the softcap factor with kCapGrad) of the warp's elements of the
// tile pair, its place w in the score tile. Needs every tile of the pair in shared
// memory (with kSplitKV, K and V as their split tiles). (dP * Dm - Delta) takes the
// softcap factor before P: the same product as the CPU backend's up to the order of the
// last two roundings.
template <bool kCapGrad, int D, bool kSplitKV, int NT>
__device__ __forceinline__ void tile_grads(const AttnParams& p, const SeqCtx& c, const BwdSmem<D, kSplitKV>& s,
                                           int64_t i0, int64_t j0, bool partial, float (&z)[NT][4],
                                           float (&ds)[NT][4]) {
  using T = BwdTile<D, kSplitKV>;
  const WarpTile<BwdTile<D>::Br, BwdTile<D>::Bc, BwdTile<D>::kThreads / 32> w;
  const int kd = static_cast<int>((p.head_dim_qk + 7) / 8 * 8), kdv = static_cast<int>((p.head_dim_v + 7) / 8 * 8);
  const bool drop = dropout_active(p.drop_threshold);
  float dm[NT][4];
  if (drop) dropout_multipliers(p, c, dm, i0 + w.m0, j0 + w.n0);
  zero(ds);
  if constexpr (kSplitKV)  // dP
    warp_gemm_split<true, false>(ds, reinterpret_cast<const uint32_t*>(s.dout), T::d_pitch, s.vs, T::kv_pitch, w.m0,
                                 w.n0, kdv);
  else warp_gemm<false, true>(ds, s.dout, T::d_pitch, s.v, T::d_pitch, w.m0, w.n0, kdv);
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) ds[n][e] = (drop ? ds[n][e] * dm[n][e] : ds[n][e]) - s.delta[w.m0 + frag_row(e)];
  zero(z);
  if constexpr (kSplitKV)  // S
    warp_gemm_split<true, false>(z, reinterpret_cast<const uint32_t*>(s.q), T::d_pitch, s.ks, T::kv_pitch, w.m0, w.n0,
                                 kd);
  else warp_gemm<false, true>(z, s.q, T::d_pitch, s.k, T::d_pitch, w.m0, w.n0, kd);
  finish_scores<kCapGrad>(p, c, z, ds, i0 + w.m0, j0 + w.n0, partial);
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float pr = expf(z[n][e] - s.lse[w.m0 + frag_row(e)]);
      ds[n][e] *= pr;
      z[n][e] = drop ? pr * dm[n][e] : pr;
    }
}

// Waits for the pair's copies, then Z and dS (times the softcap factor) of the pair into
// s.z and s.ds, behind a barrier.
template <int D, bool kSplitKV>
__device__ __forceinline__ void pair_grads(const AttnParams& p, const SeqCtx& c, const BwdSmem<D, kSplitKV>& s,
                                           int64_t i0, int64_t j0, TileKind kind) {
  using T = BwdTile<D>;
  constexpr int NT = WarpGrid<T::Br, T::Bc, T::kThreads / 32>::NT;
  copy_wait<0>();
  __syncthreads();  // the pair's tiles are in
  const WarpTile<T::Br, T::Bc, T::kThreads / 32> w;
  float z[NT][4], ds[NT][4];
  tile_grads<true>(p, c, s, i0, j0, kind == kTilePartial, z, ds);
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int at = (w.m0 + frag_row(e)) * T::s_pitch + w.n0 + frag_col(n, e);
      s.z[at] = z[n][e];
      s.ds[at] = ds[n][e];
    }
  __syncthreads();
}

}  // namespace fp32
}  // namespace flashattn
