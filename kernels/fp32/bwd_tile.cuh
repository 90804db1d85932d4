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
#include "fp32/tile_io.cuh"
#include "fp32/traits.h"

namespace flashattn {
namespace fp32 {

// Shared tiles of BwdTile<D> in the CTA's dynamic shared memory.
template <int D>
struct BwdSmem {
  float *k, *v, *q, *dout, *z, *ds, *lse, *delta;
  __device__ explicit BwdSmem(float* sm)
      : k(sm + BwdTile<D>::k_off),
        v(sm + BwdTile<D>::v_off),
        q(sm + BwdTile<D>::q_off),
        dout(sm + BwdTile<D>::do_off),
        z(sm + BwdTile<D>::z_off),
        ds(sm + BwdTile<D>::ds_off),
        lse(sm + BwdTile<D>::lse_off),
        delta(sm + BwdTile<D>::delta_off) {}
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
template <int D>
__device__ __forceinline__ void load_query_side(const AttnParams& p, const SeqCtx& c, const BwdSmem<D>& s,
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

// Starts the copies of K and V of key rows [j0, j0 + nk) of c's kv head.
template <int D>
__device__ __forceinline__ void load_key_side(const AttnParams& p, const SeqCtx& c, const BwdSmem<D>& s, int64_t j0,
                                              int nk) {
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
// memory. (dP * Dm - Delta) takes the softcap factor before P: the same product as the
// CPU backend's up to the order of the last two roundings.
template <bool kCapGrad, int D, int NT>
__device__ __forceinline__ void tile_grads(const AttnParams& p, const SeqCtx& c, const BwdSmem<D>& s, int64_t i0,
                                           int64_t j0, bool partial, float (&z)[NT][4], float (&ds)[NT][4]) {
  const WarpTile<BwdTile<D>::Br, BwdTile<D>::Bc, BwdTile<D>::kThreads / 32> w;
  const int kd = static_cast<int>((p.head_dim_qk + 7) / 8 * 8), kdv = static_cast<int>((p.head_dim_v + 7) / 8 * 8);
  const bool drop = dropout_active(p.drop_threshold);
  float dm[NT][4];
  if (drop) dropout_multipliers(p, c, dm, i0 + w.m0, j0 + w.n0);
  zero(ds);
  warp_gemm<false, true>(ds, s.dout, BwdTile<D>::d_pitch, s.v, BwdTile<D>::d_pitch, w.m0, w.n0, kdv);  // dP
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) ds[n][e] = (drop ? ds[n][e] * dm[n][e] : ds[n][e]) - s.delta[w.m0 + frag_row(e)];
  zero(z);
  warp_gemm<false, true>(z, s.q, BwdTile<D>::d_pitch, s.k, BwdTile<D>::d_pitch, w.m0, w.n0, kd);  // S
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
template <int D>
__device__ __forceinline__ void pair_grads(const AttnParams& p, const SeqCtx& c, const BwdSmem<D>& s, int64_t i0,
                                           int64_t j0, TileKind kind) {
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
