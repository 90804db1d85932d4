// Deterministic dQ kernel of the fp32 backward: one CTA per (query block, query head,
// sequence) keeps its Q, dO tiles in shared memory and dQ in registers (WarpGrid<Br, D>),
// and loops over the key blocks in order (dQ += dS K, scaled at the end): every dQ element
// is computed by one thread in a fixed order, so runs are bitwise reproducible. The price
// is the recomputation of S and dP, which the dK/dV kernel already computed.
#pragma once
#include <stdint.h>

#include "fp32/bwd_dkdv.cuh"

namespace flashattn {
namespace fp32 {

template <int D>
__global__ void __launch_bounds__(BwdTile<D>::kThreads) bwd_dq_kernel(const AttnParams p, const float* delta) {
  using T = BwdTile<D>;
  constexpr int kWarps = T::kThreads / 32, NT = WarpGrid<T::Br, D, kWarps>::NT;
  extern __shared__ float4 smem4[];
  const BwdSmem<D> s(reinterpret_cast<float*>(smem4));

  const int64_t n_qb = (p.seqlen_q + T::Br - 1) / T::Br;
  const int64_t qb = n_qb - 1 - static_cast<int64_t>(blockIdx.x) % n_qb, bh = static_cast<int64_t>(blockIdx.x) / n_qb;
  const SeqCtx c = make_ctx(p, bh / p.heads_q, bh % p.heads_q);
  const int64_t i0 = qb * T::Br;
  if (i0 >= c.len_q) return;
  const int nq = static_cast<int>(c.len_q - i0 < T::Br ? c.len_q - i0 : T::Br);
  load_query_side(p, c, s, delta, i0, nq);

  const WarpTile<T::Br, D, kWarps> w;
  float acc[NT][4];
  zero(acc);
  for (int64_t j0 = 0; j0 < c.len_k; j0 += T::Bc) {
    const int nk = static_cast<int>(c.len_k - j0 < T::Bc ? c.len_k - j0 : T::Bc);
    const TileKind kind = classify_tile(p, c.h, c.shift, i0, nq, j0, nk);
    if (kind == kTileSkip) continue;
    __syncthreads();  // the previous pair's dS K is done with s.k, s.ds
    load_key_side(p, c, s, j0, nk);
    pair_grads(p, c, s, i0, j0, kind);
    pair_dq(acc, s);
  }
  copy_wait<0>();  // a block that no key reaches still has its query-side copies in flight
  const float scale[2] = {p.scale, p.scale};
  store_frag(
      static_cast<float*>(p.dq), nq, p.head_dim_qk, acc, scale, w.m0, w.n0,
      [&](int r) { return q_row(p, c, p.dq_stride, i0 + r); }, p.grad_accumulate != 0);
}

}  // namespace fp32
}  // namespace flashattn
