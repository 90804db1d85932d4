// The consumer warpgroups of the FA3-design backward at head dims over 128
// (BwdTraits::kSplitD): the two warpgroups split the head-dim columns of dK and dV instead
// of the keys, since 2 x D / 2 fp32 registers a thread would not fit beside S^T and dP^T.
//
// The CTA holds 64 keys. Warpgroup c (kCw) owns dK and dV of all of them in its column blocks
// bwd_kv_first(c) .. + bwd_kv_blocks(c) - 1 (2 x 64 x D / 2 fp32 over 128 threads at d = 256: 128
// registers). Per step (query block of kBlockM = 64 rows):
//   S^T = K Q_c^T and dP^T = V dO_c^T for the 64 keys x its 32 queries c 32 .. (wgmma M 64,
//   N 32, K = D), issued together; P^T and dS^T as in the key split (bwd_math.cuh);
//   both into shared memory (P^T and dS^T tiles, 64 keys x 64 queries, two buffers each, the
//   128-byte swizzle of bwd_store_ds); a named barrier once both halves are stored;
//   dV_c += P^T dO[:, cols_c] and dK_c += dS^T Q[:, cols_c] with both operands in shared
//   memory (A K-major over the queries, B MN-major), and between them the warpgroup's dQ
//   pieces (bwd_dq_blocks(c) column blocks of dS K, as in the key split); while dK runs, the
//   pieces go one after the other through the warpgroup's staging buffer to warp 2.
// Two P^T and dS^T buffers: a warpgroup writes buffer it % 2 only after the other passed the
// barrier of step it - 1, which follows its last GEMM on that buffer (step it - 2).
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/params.h"
#include "fa2/wgmma.cuh"
#include "fa3/bwd_epilogue.cuh"
#include "fa3/bwd_math.cuh"
#include "fa3/bwd_schedule.cuh"
#include "hopper/tma.cuh"
#include "hopper/warpgroup.cuh"

namespace flashattn {
namespace fa3 {

// dK and dV of consumer warpgroup kCw across the CTA's walk: the 64 keys x its column blocks.
template <class Cfg, int kCw>
struct BwdSplitAcc {
  static constexpr int kNV = bwd_kv_blocks<Cfg>(kCw) * 8;
  float dk[1][kNV][4];
  float dv[1][kNV][4];
};

// One step of consumer warpgroup kCw, ring stage s = bwd_stage(it).
template <class Cfg, typename T, int kCw, bool kMask>
__device__ __forceinline__ void bwd_split_step(const AttnParams& p, const BwdSmem<Cfg>& sm, const BwdWork& w, int it,
                                               BwdSplitAcc<Cfg, kCw>& acc) {
  constexpr int kHalf = Cfg::kBlockM / 2, kNT = kHalf / 8, kD = Cfg::kD, kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN, kNV = BwdSplitAcc<Cfg, kCw>::kNV, kPieces = bwd_dq_blocks<Cfg>(kCw);
  const int warp = (static_cast<int>(threadIdx.x) / 32) % 4, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int s = bwd_stage<Cfg>(it), sd = bwd_stage<Cfg, Cfg::kDoStages>(it), m0 = w.m0<Cfg>(it), buf = it % 2;
  const int key0 = w.n0 + warp * 16 + g;                                 // this thread's keys: key0, key0 + 8
  constexpr uint32_t kQRows = static_cast<uint32_t>(kCw * kHalf * 128);  // its first query row in Q, dO
  float acc_s[1][kNT][4], acc_dp[1][kNT][4];

  hopper::mbar_wait(sm.q_full(s), bwd_parity<Cfg>(it));
  if constexpr (Cfg::kSeparateDo) hopper::mbar_wait(sm.do_full(sd), bwd_parity<Cfg, Cfg::kDoStages>(it));
  fa2::wg_fence();
  fa2::wg_gemm<T, kNT, kD, 0, kBlockN, kBlockM, true>(acc_s, sm.k(), sm.q(s) + kQRows);
  fa2::wg_commit();
  fa2::wg_gemm<T, kNT, kD, 0, kBlockN, kBlockM, true>(acc_dp, sm.v(), sm.dout(sd) + kQRows);
  fa2::wg_commit();
  fa2::wg_wait<1>();  // S^T done; dP^T may still run
  fa2::wg_hold(acc_s);
  const float sl2 = p.scale * static_cast<float>(M_LOG2E);
  bwd_probs<kMask>(acc_s, sm.lse(s) + 4u * kCw * kHalf, sl2, p, w, key0, m0 + kCw * kHalf);
  fa2::wg_hold(acc_s);
  fa2::wg_wait<0>();
  fa2::wg_hold(acc_dp);
  bwd_dscores(acc_dp, acc_s, sm.delta(s) + 4u * kCw * kHalf);
  uint32_t pa[kNT / 2][4], dsa[kNT / 2][4];
  hopper::pack_a<T>(pa, acc_s);
  hopper::pack_a<T>(dsa, acc_dp);
  bwd_store_ds<Cfg>(sm.pt(buf), 0, pa, warp, g, t, kCw * kNT);
  bwd_store_ds<Cfg>(sm.ds(buf), 0, dsa, warp, g, t, kCw * kNT);
  hopper::fence_proxy_async_smem();
  hopper::bar_sync(kBarDsReady, 256);

  // dV, the dQ pieces, dK, in that order (dK runs while the pieces are staged). dV and dK: A
  // = P^T or dS^T (K-major: k = the step's queries), B = dO or Q from column block bwd_kv_first
  // (MN-major: k16 step kk = query rows 16 kk.., N across column blocks kBlockM 128 bytes
  // apart). dQ piece = dS K: A = dS^T MN-major, B = K's column block, MN-major.
  constexpr uint32_t kCols = static_cast<uint32_t>(bwd_kv_first<Cfg>(kCw) * kBlockM * 128);
  fa2::wg_fence();
  fa2::wg_gemm<T, kNV, kBlockM, 1, kBlockN, kBlockM, false>(acc.dv, sm.pt(buf), sm.dout(sd) + kCols);
  fa2::wg_commit();
  float acc_dq[kPieces][1][8][4];
#pragma unroll
  for (int k = 0; k < kPieces; ++k)
    fa2::wg_gemm<T, 8, kBlockN, 3, kBlockN, kBlockN, true>(
        acc_dq[k], sm.ds(buf), sm.k() + static_cast<uint32_t>(bwd_dq_col_block<Cfg>(kCw, k) * kBlockN * 128));
  fa2::wg_commit();
  fa2::wg_gemm<T, kNV, kBlockM, 1, kBlockN, kBlockM, false>(acc.dk, sm.ds(buf), sm.q(s) + kCols);
  fa2::wg_commit();
  fa2::wg_wait<1>();  // dV and the pieces done; dK may still run
  if constexpr (Cfg::kSeparateDo) hopper::mbar_arrive(sm.do_empty(sd));
#pragma unroll
  for (int k = 0; k < kPieces; ++k) {
    fa2::wg_hold(acc_dq[k]);
    hopper::bar_sync(kBarDqEmpty + kCw, kDqBarThreads);
    bwd_stage_dq<Cfg>(sm.dq(kCw), acc_dq[k], w.len_q - m0, warp, g, t);
    hopper::fence_proxy_async_smem();
    hopper::bar_arrive(kBarDqFull + kCw, kDqBarThreads);
  }
  fa2::wg_wait<0>();
  fa2::wg_hold(acc.dv);
  fa2::wg_hold(acc.dk);
  hopper::mbar_arrive(sm.q_empty(s));
}

// Consumer warpgroup kCw's whole walk, then dK * scale and dV of its columns to the outputs.
template <class Cfg, typename T, int kCw>
__device__ __forceinline__ void bwd_split_consumer(const AttnParams& p, const BwdSmem<Cfg>& sm, const BwdWork& w) {
  BwdSplitAcc<Cfg, kCw> acc;
#pragma unroll
  for (int nv = 0; nv < BwdSplitAcc<Cfg, kCw>::kNV; ++nv)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc.dk[0][nv][e] = acc.dv[0][nv][e] = 0.f;
  hopper::mbar_wait(sm.kv_full(), 0u);
  for (int it = 0; it < w.steps(); ++it) {
    if (bwd_needs_mask<Cfg>(p, w, w.m0<Cfg>(it))) bwd_split_step<Cfg, T, kCw, true>(p, sm, w, it, acc);
    else bwd_split_step<Cfg, T, kCw, false>(p, sm, w, it, acc);
  }
  const int warp = (static_cast<int>(threadIdx.x) / 32) % 4, lane = static_cast<int>(threadIdx.x) % 32;
  const int key0 = w.n0 + warp * 16 + lane / 4, col0 = bwd_kv_first<Cfg>(kCw) * 64;
  const bool add = p.grad_accumulate != 0;
  bwd_store_rows<T, BwdSplitAcc<Cfg, kCw>::kNV * 8>(static_cast<T*>(p.dk) + col0, p.dk_stride, w, key0, acc.dk, p.scale,
                                                    add, lane % 4);
  bwd_store_rows<T, BwdSplitAcc<Cfg, kCw>::kNV * 8>(static_cast<T*>(p.dv) + col0, p.dv_stride, w, key0, acc.dv, 1.f,
                                                    add, lane % 4);
}

}  // namespace fa3
}  // namespace flashattn
