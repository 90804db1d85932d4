// dBias kernel of the fp32 backward (bias tensor with a dbias output): one CTA per
// tile of the compact dBias (1 along every dim whose bias stride is 0, summed there), in
// both modes. It loops over the (sequence, head, query block, key block) combinations
// that add into its tile in a fixed order, recomputes dS of each (bwd_tile.cuh) and sums
// in registers, then reduces the broadcast rows or columns in a fixed order: every
// element is written exactly once (zeros where no query reaches), without atomics.
#pragma once
#include <stdint.h>

#include "fp32/bwd_tile.cuh"

namespace flashattn {
namespace fp32 {

// Compact extents of dBias: (batch, heads_q, query blocks, key blocks) for dims with a
// nonzero stride, 1 for broadcast ones.
struct DbiasGrid {
  int64_t nb, nh, nrb, ncb;
};
template <int D>
__host__ __device__ inline DbiasGrid dbias_grid(const AttnParams& p) {
  const int64_t* st = p.bias_stride;
  return {st[0] ? p.batch : 1, st[1] ? p.heads_q : 1, st[2] ? (p.seqlen_q + BwdTile<D>::Br - 1) / BwdTile<D>::Br : 1,
          st[3] ? (p.seqlen_k + BwdTile<D>::Bc - 1) / BwdTile<D>::Bc : 1};
}

// Sums the CTA's accumulated dS tile (in s.ds) over the broadcast rows and/or columns and
// writes its elements of dBias: rows [i0, i0 + Br) and columns [j0, j0 + Bc) within
// (seqlen_q, seqlen_k), or the single broadcast row / column.
template <int D>
__device__ __forceinline__ void write_dbias(const AttnParams& p, const BwdSmem<D>& s, int64_t b, int64_t h, int64_t i0,
                                            int64_t j0) {
  constexpr int Br = BwdTile<D>::Br, Bc = BwdTile<D>::Bc, kThreads = BwdTile<D>::kThreads;
  const int64_t* st = p.bias_stride;
  const int rows = st[2] ? Br : 1, cols = st[3] ? Bc : 1;
  float* out = static_cast<float*>(p.dbias) + b * st[0] + h * st[1];
  for (int e = threadIdx.x; e < rows * cols; e += kThreads) {
    const int r = e / cols, x = e % cols;
    if ((st[2] && i0 + r >= p.seqlen_q) || (st[3] && j0 + x >= p.seqlen_k)) continue;
    float sum = 0.f;
    for (int rr = st[2] ? r : 0; rr < (st[2] ? r + 1 : Br); ++rr)
      for (int xx = st[3] ? x : 0; xx < (st[3] ? x + 1 : Bc); ++xx) sum += s.ds[rr * BwdTile<D>::s_pitch + xx];
    out[(i0 + r) * st[2] + (j0 + x) * st[3]] = sum;
  }
}

template <int D>
__global__ void __launch_bounds__(BwdTile<D>::kThreads) bwd_dbias_kernel(const AttnParams p, const float* delta) {
  using T = BwdTile<D>;
  constexpr int kWarps = T::kThreads / 32, NT = WarpGrid<T::Br, T::Bc, kWarps>::NT;
  extern __shared__ float4 smem4[];
  const BwdSmem<D> s(reinterpret_cast<float*>(smem4));
  const int64_t* st = p.bias_stride;
  const DbiasGrid g = dbias_grid<D>(p);
  int64_t x = blockIdx.x;
  const int64_t cb = x % g.ncb, rb = (x /= g.ncb) % g.nrb, th = (x /= g.nrb) % g.nh, tb = x / g.nh;

  const WarpTile<T::Br, T::Bc, kWarps> w;
  float acc[NT][4];
  zero(acc);
  for (int64_t b = st[0] ? tb : 0; b < (st[0] ? tb + 1 : p.batch); ++b)
    for (int64_t h = st[1] ? th : 0; h < (st[1] ? th + 1 : p.heads_q); ++h) {
      const SeqCtx c = make_ctx(p, b, h);
      for (int64_t i0 = st[2] ? rb * T::Br : 0; i0 < (st[2] ? rb * T::Br + 1 : c.len_q); i0 += T::Br) {
        if (i0 >= c.len_q) continue;
        const int nq = static_cast<int>(c.len_q - i0 < T::Br ? c.len_q - i0 : T::Br);
        for (int64_t j0 = st[3] ? cb * T::Bc : 0; j0 < (st[3] ? cb * T::Bc + 1 : c.len_k); j0 += T::Bc) {
          if (j0 >= c.len_k) continue;
          const int nk = static_cast<int>(c.len_k - j0 < T::Bc ? c.len_k - j0 : T::Bc);
          const TileKind kind = classify_tile(p, h, c.shift, i0, nq, j0, nk);
          if (kind == kTileSkip) continue;
          __syncthreads();  // the previous pair's products are done with every tile
          load_query_side(p, c, s, delta, i0, nq);
          load_key_side(p, c, s, j0, nk);
          copy_wait<0>();
          __syncthreads();  // the pair's tiles are in
          float z[NT][4], ds[NT][4];
          tile_grads<false>(p, c, s, i0, j0, kind == kTilePartial, z, ds);
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[n][e] += ds[n][e];
        }
      }
    }
  __syncthreads();
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) s.ds[(w.m0 + frag_row(e)) * T::s_pitch + w.n0 + frag_col(n, e)] = acc[n][e];
  __syncthreads();
  write_dbias(p, s, st[0] ? tb : 0, st[1] ? th : 0, rb * T::Br, cb * T::Bc);
}

}  // namespace fp32
}  // namespace flashattn
