// Deterministic dQ kernel of the fp32 SIMT backward: one CTA per (query block, query
// head, sequence) keeps its Q, dO tiles in shared memory and dQ in registers, and loops
// over the key blocks in order (dQ += dS K, scaled at the end): every dQ element is
// computed by one thread in a fixed order, so runs are bitwise reproducible. The price is
// the recomputation of S and dP, which the dK/dV kernel already computed.
#pragma once
#include <stdint.h>

#include "simt/bwd_tile.cuh"

namespace flashattn {
namespace simt {

template <int D>
__global__ void __launch_bounds__(kThreads, kMinBlocks<D>) bwd_dq_kernel(const AttnParams p, const float* delta) {
  using T = BwdTile<D>;
  constexpr int SM = T::Br / 16, NG = D / 64;
  extern __shared__ float4 smem4[];
  const BwdSmem<D> s(reinterpret_cast<float*>(smem4));

  const int64_t n_qb = (p.seqlen_q + T::Br - 1) / T::Br;
  const int64_t qb = n_qb - 1 - static_cast<int64_t>(blockIdx.x) % n_qb, bh = static_cast<int64_t>(blockIdx.x) / n_qb;
  const SeqCtx c = make_ctx(p, bh / p.heads_q, bh % p.heads_q);
  const int64_t i0 = qb * T::Br;
  if (i0 >= c.len_q) return;
  const int nq = static_cast<int>(c.len_q - i0 < T::Br ? c.len_q - i0 : T::Br);
  load_query_side(p, c, s, delta, i0, nq);

  float acc[SM][4 * NG];
  zero(acc);
  for (int64_t j0 = 0; j0 < c.len_k; j0 += T::Bc) {
    const int nk = static_cast<int>(c.len_k - j0 < T::Bc ? c.len_k - j0 : T::Bc);
    const TileKind kind = classify_tile(p, c.h, c.shift, i0, nq, j0, nk);
    if (kind == kTileSkip) continue;
    __syncthreads();  // the previous pair's dS K is done with s.k, s.ds
    load_key_side(p, c, s, j0, nk);
    pair_grads(p, c, s, i0, j0, kind);
    gemm_nn<SM, NG>(acc, s.ds, pitch(T::Bc), s.k, pitch(D), T::Bc);
  }
  float mul[SM];
#pragma unroll
  for (int i = 0; i < SM; ++i) mul[i] = p.scale;
  store_tile(static_cast<float*>(p.dq), nq, p.head_dim_qk, acc, mul,
             [&](int r) { return q_row(p, c, p.dq_stride, i0 + r); });
}

}  // namespace simt
}  // namespace flashattn
