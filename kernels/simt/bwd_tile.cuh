// The backward's recomputation of one (query block, key block) tile pair of the fp32 SIMT
// family, shared by its dK/dV, dQ and dBias kernels. With P = exp(S - LSE), the dropout
// multipliers Dm and Delta = rowsum(dO * O), as in the CPU backend (src/cpu/flash_bwd.cpp):
//   dP = dO V^T,  Z = P * Dm,  dS = P * (dP * Dm - Delta)   (dBias = dS),
// times the softcap's chain factor 1 - tanh^2 for dQ and dK.
#pragma once
#include <math.h>
#include <stdint.h>

#include "simt/ctx.cuh"
#include "simt/gemm.cuh"
#include "simt/scores.cuh"
#include "simt/tile_io.cuh"
#include "simt/traits.h"

namespace flashattn {
namespace simt {

// Shared tiles of BwdTile<D> in the CTA's dynamic shared memory.
template <int D>
struct BwdSmem {
  float *k, *v, *q, *dout, *z, *ds, *lse, *delta;
  uint8_t* keep;
  __device__ explicit BwdSmem(float* sm)
      : k(sm + BwdTile<D>::k_off),
        v(sm + BwdTile<D>::v_off),
        q(sm + BwdTile<D>::q_off),
        dout(sm + BwdTile<D>::do_off),
        z(sm + BwdTile<D>::z_off),
        ds(sm + BwdTile<D>::ds_off),
        lse(sm + BwdTile<D>::lse_off),
        delta(sm + BwdTile<D>::delta_off),
        keep(reinterpret_cast<uint8_t*>(sm + BwdTile<D>::keep_off)) {}
};

// Loads Q, dO, the LSE (a -inf LSE, a fully masked row, and rows past the sequence as +inf,
// so that exp(s - lse) = 0 for every s) and Delta of query rows [i0, i0 + nq) of c.
template <int D>
__device__ __forceinline__ void load_query_side(const AttnParams& p, const SeqCtx& c, const BwdSmem<D>& s,
                                                const float* delta, int64_t i0, int nq) {
  constexpr int Br = BwdTile<D>::Br;
  load_tile<Br, D>(s.q, static_cast<const float*>(p.q), nq, static_cast<int>(p.head_dim_qk),
                   [&](int r) { return q_row(p, c, p.q_stride, i0 + r); });
  load_tile<Br, D>(s.dout, static_cast<const float*>(p.dout), nq, static_cast<int>(p.head_dim_v),
                   [&](int r) { return q_row(p, c, p.do_stride, i0 + r); });
  load_vec<Br>(s.lse, nq, INFINITY, [&](int r) {
    const float l = p.lse_in[lse_at(p, c, i0 + r)];
    return l == -INFINITY ? INFINITY : l;
  });
  load_vec<Br>(s.delta, nq, 0.f, [&](int r) { return delta[lse_at(p, c, i0 + r)]; });
}

// Loads K and V of key rows [j0, j0 + nk) of c's kv head.
template <int D>
__device__ __forceinline__ void load_key_side(const AttnParams& p, const SeqCtx& c, const BwdSmem<D>& s, int64_t j0,
                                              int nk) {
  constexpr int Bc = BwdTile<D>::Bc;
  load_tile<Bc, D>(s.k, static_cast<const float*>(p.k), nk, static_cast<int>(p.head_dim_qk),
                   [&](int r) { return k_row(p, c, p.k_stride, j0 + r); });
  load_tile<Bc, D>(s.v, static_cast<const float*>(p.v), nk, static_cast<int>(p.head_dim_v),
                   [&](int r) { return k_row(p, c, p.v_stride, j0 + r); });
}

// z (Z) and ds (dS, times the softcap factor with kCapGrad) of the thread's elements of
// the tile pair (score layout). Needs every tile loaded, with dropout the multipliers in
// s.z, and on a partial tile its mask in s.keep (mask_tile). (dP * Dm - Delta) takes the softcap factor before P: the
// same product as the CPU backend's up to the order of the last two roundings.
template <bool kCapGrad, int D, int SM, int SN>
__device__ __forceinline__ void tile_grads(const AttnParams& p, const SeqCtx& c, const BwdSmem<D>& s, int64_t i0,
                                           int64_t j0, bool partial, float (&z)[SM][SN], float (&ds)[SM][SN]) {
  constexpr int Bc = BwdTile<D>::Bc;
  const int kd = static_cast<int>((p.head_dim_qk + 3) / 4 * 4), kdv = static_cast<int>((p.head_dim_v + 3) / 4 * 4);
  const bool drop = p.p_drop > 0.f;
  zero(ds);
  gemm_nt(ds, s.dout, pitch(D), s.v, pitch(D), kdv);  // dP
#pragma unroll
  for (int i = 0; i < SM; ++i)
#pragma unroll
    for (int j = 0; j < SN; ++j) {
      const int r = thread_y() * SM + i;
      const float dm = drop ? s.z[r * pitch(Bc) + thread_x() + 16 * j] : 1.f;
      ds[i][j] = ds[i][j] * dm - s.delta[r];
    }
  zero(z);
  gemm_nt(z, s.q, pitch(D), s.k, pitch(D), kd);  // S
  finish_scores<kCapGrad>(p, c, z, ds, i0, j0, partial ? s.keep : nullptr);
#pragma unroll
  for (int i = 0; i < SM; ++i)
#pragma unroll
    for (int j = 0; j < SN; ++j) {
      const int r = thread_y() * SM + i;
      const float pr = expf(z[i][j] - s.lse[r]);
      const float dm = drop ? s.z[r * pitch(Bc) + thread_x() + 16 * j] : 1.f;
      ds[i][j] *= pr;
      z[i][j] = pr * dm;
    }
}

// Once the pair's tiles are being loaded: its dropout multipliers into s.z and, on a
// partial tile, its mask into s.keep; then a barrier.
template <int D>
__device__ __forceinline__ void prepare_pair(const AttnParams& p, const SeqCtx& c, const BwdSmem<D>& s, int64_t i0,
                                             int64_t j0, TileKind kind) {
  if (p.p_drop > 0.f) dropout_multipliers<BwdTile<D>::Br, BwdTile<D>::Bc>(p, c, s.z, i0, j0);
  if (kind == kTilePartial) mask_tile<BwdTile<D>::Br, BwdTile<D>::Bc>(p, c, s.keep, i0, j0);
  __syncthreads();
}

// prepare_pair, then Z and dS (times the softcap factor) of the pair into s.z and s.ds,
// behind a barrier. Each thread overwrites the dropout multipliers it read.
template <int D>
__device__ __forceinline__ void pair_grads(const AttnParams& p, const SeqCtx& c, const BwdSmem<D>& s, int64_t i0,
                                           int64_t j0, TileKind kind) {
  constexpr int Br = BwdTile<D>::Br, Bc = BwdTile<D>::Bc, SM = Br / 16, SN = Bc / 16;
  prepare_pair(p, c, s, i0, j0, kind);
  float z[SM][SN], ds[SM][SN];
  tile_grads<true>(p, c, s, i0, j0, kind == kTilePartial, z, ds);
#pragma unroll
  for (int i = 0; i < SM; ++i)
#pragma unroll
    for (int j = 0; j < SN; ++j) {
      const int e = (thread_y() * SM + i) * pitch(Bc) + thread_x() + 16 * j;
      s.z[e] = z[i][j];
      s.ds[e] = ds[i][j];
    }
  __syncthreads();
}

}  // namespace simt
}  // namespace flashattn
