// The consumer warpgroups of the FA3-design backward: each walks the CTA's steps (query
// blocks of kBlockM rows) and accumulates its share of the key block's dK and dV in
// registers, then writes them. BwdTraits picks one of two ways to share a step; the code is
// one, and only the marked parts (if constexpr Cfg::kSplitD) differ:
// - by keys (head dims up to 128; 128 keys a CTA): warpgroup c owns keys 64 c .. + 63 and
//   their dK, dV; S^T and dP^T are 64 keys x the step's queries (bwd_block_m: 128 at d = 64,
//   80 at d = 128 unmasked, else 64); P^T and dS^T stay in registers as the A operands of dV
//   and dK, and dS^T also goes to shared memory for dQ (at d = 64 each warpgroup computes the
//   dQ of half the queries; at 80 queries dQ^T of half the columns, from dS stored
//   query-major);
// - by head-dim columns (kSplitD, head dims over 128, where 2 x D / 2 fp32 registers a
//   thread would not fit beside S^T and dP^T; 64 keys a CTA): warpgroup c owns dK, dV of all
//   the keys in its column blocks (bwd_kv_blocks); S^T and dP^T are the 64 keys x its 32
//   queries; both halves of P^T and dS^T go to shared memory, where dV and dK read them.
// Per step:
//   S^T = K Q^T and dP^T = V dO^T (wgmma, shared-memory operands, issued together);
//   P^T = exp2(S^T scale log2(e) - LSE_2), masked; dS^T = P^T (dP^T - Delta) (bwd_math.cuh);
//   dS^T (kSplitD: and P^T) into shared memory, the 128-byte swizzle of a TMA tile;
//   dV += P^T dO, the warpgroup's dQ pieces (dQ = dS K, dS^T read transposed through its
//   descriptor; at 80 queries dQ^T = K^T dS^T; bwd_dq_cols), dK += dS^T Q, in that order
//   (FA3's): dK runs on the tensor cores while the warpgroup stages the pieces in shared
//   memory for warp 2, which adds them into the fp32 dQ accumulator (named barriers,
//   bwd_schedule.cuh). The dQ GEMM reads both warpgroups' dS^T: a named barrier once both
//   are stored.
// dS^T and P^T have two buffers, so a warpgroup writes the next step's while the other still
// reads this step's: one named barrier per step. Epilogue: dK * scale and dV through the K
// and V tiles and the copy engine (BwdMaps::grads_by_copy), or from registers to the outputs
// (added to the values there when accumulating).
#pragma once
#include <stdint.h>

#include "common/exp2.h"
#include "common/params.h"
#include "fa2/wgmma.cuh"
#include "fa3/bwd_epilogue.cuh"
#include "fa3/bwd_math.cuh"
#include "fa3/bwd_schedule.cuh"
#include "hopper/tma.cuh"
#include "hopper/warpgroup.cuh"

namespace flashattn {
namespace fa3 {

// dK and dV of consumer warpgroup kCw (kAnyWg by keys) across the CTA's walk: its keys x its
// column blocks.
template <class Cfg, int kCw>
struct BwdAcc {
  static_assert(Cfg::kSplitD == (kCw != kAnyWg), "kSplitD shares are fixed at compile time, by keys shares are not");
  static constexpr int kNV = bwd_kv_blocks<Cfg>(kCw) * Cfg::kCols / 8;
  float dk[1][kNV][4];
  float dv[1][kNV][4];
};

// acc (+)= A B for dV (A = P^T, B = dO) or dK (A = dS^T, B = Q) of the warpgroup's share, the
// step's queries as k: B (tile b, from the warpgroup's first column) MN-major (k16 step kk =
// query rows 16 kk.., 16 kSw bytes further; N across column blocks kBlockM kSw bytes apart);
// A from registers (a) by keys, from its shared tile (sa, K-major, the 128-byte swizzle of
// bwd_store_ds whatever the head dim) with kSplitD.
template <class Cfg, typename T, int NV, int KK>
__device__ __forceinline__ void bwd_gemm_kv(float (&acc)[1][NV][4], const uint32_t (&a)[KK][4], uint32_t sa,
                                            uint32_t b) {
  constexpr int kBlockM = Cfg::kBlockM, kSw = Cfg::kSwizzle;
  if constexpr (Cfg::kSplitD) {
    fa2::wg_gemm<T, NV, kBlockM, 1, Cfg::kBlockN, kBlockM, false, 128, kSw>(acc, sa, b);
  } else {
    fa2::wg_gemm_rs<T, NV, KK, kBlockM, kSw>(acc, a, b);
  }
}

// Stages dQ pieces k .. kPieces - 1 of a step for the writer warp (bwd_reduce_dq), each once its
// own wgmma group is done: the step committed dV, piece 0, .., piece kPieces - 1 and dK as
// groups in that order, so piece k is done while at most kPieces - k groups (the later
// pieces and dK) are in flight. A piece staged while the next one's GEMM still runs gives the
// copy engine that GEMM's time to read it before the next piece needs the buffer (kSplitD:
// two pieces a step through one buffer; one group for both left the second piece waiting
// for the buffer, 19% of the samples at d = 256).
template <class Cfg, int kPieces, int k, int NT>
__device__ __forceinline__ void bwd_stage_pieces(const BwdSmem<Cfg>& sm, float (&acc_dq)[kPieces][1][NT][4],
                                                 int rows_left, int cw, int warp, int g, int t) {
  if constexpr (k < kPieces) {
    fa2::wg_wait<kPieces - k>();
    fa2::wg_hold(acc_dq[k]);
    hopper::bar_sync(kBarDqEmpty + cw, kDqBarThreads);
    if constexpr (Cfg::kDqTransposed) bwd_stage_dq_t<Cfg>(sm.dq(cw), acc_dq[k], rows_left, warp, g, t);
    else bwd_stage_dq<Cfg>(sm.dq(cw), acc_dq[k], rows_left, warp, g, t);
    hopper::fence_proxy_async_smem();
    hopper::bar_arrive(kBarDqFull + cw, kDqBarThreads);
    bwd_stage_pieces<Cfg, kPieces, k + 1>(sm, acc_dq, rows_left, cw, warp, g, t);
  }
}

// One step of consumer warpgroup cw (kCw as for BwdAcc), ring stage s = bwd_stage(it), with
// kPieces dQ pieces of kPieceCols columns (bwd_dq_cols; template arguments so that no wgmma
// is in flight across a branch on them: ptxas would serialize the GEMMs, C7520).
template <class Cfg, typename T, int kCw, bool kMask, int kPieces, int kPieceCols>
__device__ __forceinline__ void bwd_step(const AttnParams& p, const BwdSmem<Cfg>& sm_in, const BwdWork& w, int it,
                                         int cw, BwdAcc<Cfg, kCw>& acc) {
  constexpr int kNT = Cfg::kWgQueries / 8, kD = Cfg::kD, kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  constexpr int kSw = Cfg::kSwizzle;
  static_assert(kPieces > 0 || !Cfg::kSeparateDo, "dO's release waits for dV behind the pieces and dK");
  // kWideStep (S^T, dP^T, dK, dV: 192 registers or more): the step's addresses are computed
  // in the step, from a base the compiler cannot see through, rather than hoisted out of the
  // walk and kept (spilled) across it. The thread's indices in unsigned arithmetic: the
  // compiler knows no range of a laundered index, and signed division and remainder cost
  // instructions and registers (at the 80-query step: spills 60 -> 32 bytes, none left in
  // the unmasked step).
  uint32_t base = sm_in.base, tid = threadIdx.x;
  if constexpr (Cfg::kWideStep) asm volatile("" : "+r"(base), "+r"(tid));
  const BwdSmem<Cfg> sm{base};
  const int warp = static_cast<int>(tid / 32 % 4), lane = static_cast<int>(tid % 32);
  const int g = lane / 4, t = lane % 4;
  const int s = bwd_stage<Cfg>(it), sd = bwd_stage<Cfg, Cfg::kDoStages>(it), m0 = w.m0<Cfg>(it), buf = it % 2;
  const int q0 = bwd_wg_query<Cfg>(cw);                         // the warpgroup's first query of the step
  const int key0 = w.n0 + bwd_wg_key<Cfg>(cw) + warp * 16 + g;  // this thread's keys: key0, key0 + 8
  const uint32_t krows = static_cast<uint32_t>(bwd_wg_key<Cfg>(cw) * kSw), qrows = static_cast<uint32_t>(q0 * kSw);
  float acc_s[1][kNT][4], acc_dp[1][kNT][4];

  hopper::mbar_wait(sm.q_full(s), bwd_parity<Cfg>(it));
  fa2::wg_fence();
  fa2::wg_gemm<T, kNT, kD, 0, kBlockN, kBlockM, true, kSw>(acc_s, sm.k() + krows, sm.q(s) + qrows);
  fa2::wg_commit();
  if constexpr (Cfg::kSeparateDo) {
    // d = 256's one dO stage loads while the step before runs its pieces and dK: S^T, which
    // does not read dO, runs while it may still arrive. The fence after the wait loop keeps
    // ptxas from serializing the GEMMs (C7520: "WG.AR in divergent path" without it).
    hopper::mbar_wait(sm.do_full(sd), bwd_parity<Cfg, Cfg::kDoStages>(it));
    fa2::wg_fence();
  }
  fa2::wg_gemm<T, kNT, kD, 0, kBlockN, kBlockM, true, kSw>(acc_dp, sm.v() + krows, sm.dout(sd) + qrows);
  fa2::wg_commit();
  fa2::wg_wait<1>();  // S^T done; dP^T may still run
  fa2::wg_hold(acc_s);
  const float sl2 = p.scale * kLog2e;
  bwd_probs<kMask>(acc_s, sm.lse(s) + 4u * q0, sl2, p, w, key0, m0 + q0);
  fa2::wg_hold(acc_s);
  fa2::wg_wait<0>();
  fa2::wg_hold(acc_dp);
  bwd_dscores(acc_dp, acc_s, sm.delta(s) + 4u * q0);
  uint32_t pa[kNT / 2][4], dsa[kNT / 2][4];
  hopper::pack_a<T>(pa, acc_s);
  hopper::pack_a<T>(dsa, acc_dp);
  if constexpr (Cfg::kSplitD) bwd_store_ds<Cfg>(sm.pt(buf), 0, pa, warp, g, t, q0 / 8);
  if constexpr (Cfg::kDqTransposed) bwd_store_ds_rows<Cfg>(sm.ds(buf), cw, dsa, warp, lane);
  else bwd_store_ds<Cfg>(sm.ds(buf), bwd_wg_key<Cfg>(cw), dsa, warp, g, t, q0 / 8);
  hopper::fence_proxy_async_smem();
  // kSplitD: dV reads the other warpgroup's half of P^T.
  if constexpr (Cfg::kSplitD) hopper::bar_sync(kBarDsReady, 256);

  // dV, the dQ pieces, dK (bwd_gemm_kv from the warpgroup's first column block,
  // bwd_kv_first). dQ piece = dS K: A = dS^T, MN-major (k = keys along its rows); B = K's
  // columns of the piece, MN-major (kDqTransposed: dQ^T = K^T dS^T, below).
  constexpr uint32_t kColOff = static_cast<uint32_t>(bwd_kv_first<Cfg>(kCw) * kBlockM * kSw);
  fa2::wg_fence();
  bwd_gemm_kv<Cfg, T>(acc.dv, pa, sm.pt(buf), sm.dout(sd) + kColOff);
  fa2::wg_commit();
  // By keys: dQ reads the other warpgroup's half of dS^T; its GEMMs are a new batch.
  if constexpr (!Cfg::kSplitD) hopper::bar_sync(kBarDsReady, 256);
  // kDqTransposed: dQ^T, the piece's columns x the step's queries.
  constexpr int kDqNT = Cfg::kDqTransposed ? kBlockM / 8 : kPieceCols / 8;
  float acc_dq[kPieces > 0 ? kPieces : 1][1][kDqNT][4];
  // The warpgroup's dQ queries: a 64-column block of dS^T (its columns are the queries;
  // kDqTransposed: all of them, from dS's rows).
  const int dq_q0 = bwd_dq_query<Cfg>(cw);
  const uint32_t dq_block = static_cast<uint32_t>(dq_q0 / 64 * kBlockN * 128);
  if constexpr (kPieces > 0) {
    if constexpr (!Cfg::kSplitD) fa2::wg_fence();
#pragma unroll
    for (int k = 0; k < kPieces; ++k) {
      const uint32_t k_cols = sm.k() + static_cast<uint32_t>(bwd_dq_col<Cfg>(it, cw, k) / Cfg::kCols * kBlockN * kSw);
      if constexpr (Cfg::kDqTransposed)  // dQ^T = K^T dS^T: A = K's columns MN-major, B = dS K-major
        fa2::wg_gemm<T, kDqNT, kBlockN, 2, kBlockN, kBlockM, true, kSw, 128>(acc_dq[k], k_cols, sm.ds(buf));
      else
        fa2::wg_gemm<T, kDqNT, kBlockN, 3, kBlockN, kBlockN, true, 128, kSw>(acc_dq[k], sm.ds(buf) + dq_block, k_cols);
      fa2::wg_commit();  // a group per piece: bwd_stage_pieces stages each as soon as it is done
    }
  }
  bwd_gemm_kv<Cfg, T>(acc.dk, dsa, sm.ds(buf), sm.q(s) + kColOff);
  fa2::wg_commit();
  if constexpr (Cfg::kSeparateDo) {
    // dV done (wgmma groups complete in order): the one dO stage is free for the next step's
    // load while the pieces and dK still run.
    fa2::wg_wait<kPieces + 1>();
    hopper::mbar_arrive(sm.do_empty(sd));
  }
  // Each piece once its GEMM is done, while the later pieces and dK may still run; its
  // staging buffer is free once the writer warp arrived on its empty barrier (the protocol
  // at bwd_reduce_dq).
  if constexpr (kPieces > 0) bwd_stage_pieces<Cfg, kPieces, 0>(sm, acc_dq, w.len_q - m0 - dq_q0, cw, warp, g, t);
  fa2::wg_wait<0>();
  fa2::wg_hold(acc.dv);
  fa2::wg_hold(acc.dk);
  hopper::mbar_arrive(sm.q_empty(s));
}

// Consumer warpgroup cw's whole walk (kCw: cw with kSplitD, where cw is kCw itself, else
// kAnyWg), then dK * scale and dV of its share to the outputs.
template <class Cfg, typename T, int kCw>
__device__ __forceinline__ void bwd_consumer(const AttnParams& p, const BwdMaps& maps, const BwdSmem<Cfg>& sm,
                                             const BwdWork& w, int cw = kCw) {
  using Acc = BwdAcc<Cfg, kCw>;
  Acc acc;
#pragma unroll
  for (int nv = 0; nv < Acc::kNV; ++nv)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc.dk[0][nv][e] = acc.dv[0][nv][e] = 0.f;
  hopper::mbar_wait(sm.kv_full(), 0u);
  // The step's pieces as template arguments: kSplitD the warpgroup's fixed ones; by keys the
  // 64-column piece, or the rest of the head dim (none at d = 64).
  constexpr int kRest = Cfg::kD - 64, kRestPieces = kRest > 0 ? 1 : 0, kRestCols = kRest > 0 ? kRest : 64;
  for (int it = 0; it < w.steps(); ++it) {
    const bool mask = bwd_needs_mask<Cfg>(p, w, w.m0<Cfg>(it));
    if constexpr (Cfg::kSplitD) {
      constexpr int kPieces = bwd_dq_blocks<Cfg>(kCw);
      if (mask) bwd_step<Cfg, T, kCw, true, kPieces, 64>(p, sm, w, it, cw, acc);
      else bwd_step<Cfg, T, kCw, false, kPieces, 64>(p, sm, w, it, cw, acc);
    } else if (bwd_dq_cols<Cfg>(it, cw) == 64) {
      if (mask) bwd_step<Cfg, T, kCw, true, 1, 64>(p, sm, w, it, cw, acc);
      else bwd_step<Cfg, T, kCw, false, 1, 64>(p, sm, w, it, cw, acc);
    } else {
      if (mask) bwd_step<Cfg, T, kCw, true, kRestPieces, kRestCols>(p, sm, w, it, cw, acc);
      else bwd_step<Cfg, T, kCw, false, kRestPieces, kRestCols>(p, sm, w, it, cw, acc);
    }
  }
  const int warp = (static_cast<int>(threadIdx.x) / 32) % 4, lane = static_cast<int>(threadIdx.x) % 32;
  constexpr int kCol0 = bwd_kv_first<Cfg>(kCw) * Cfg::kCols;
  if (maps.grads_by_copy) {
    // Through the K and V tiles and the copy engine: whole 16-byte chunks of full rows, where
    // the 4-byte stores from registers below leave every 32-byte sector half written per
    // instruction; the engine skips keys past len_k and columns past the head dims.
    hopper::bar_sync(kBarGrads, 256);
    bwd_stage_grad<Cfg, T>(sm.k(), bwd_wg_key<Cfg>(cw), kCol0, acc.dk, p.scale, warp, lane / 4, lane % 4);
    bwd_stage_grad<Cfg, T>(sm.v(), bwd_wg_key<Cfg>(cw), kCol0, acc.dv, 1.f, warp, lane / 4, lane % 4);
    hopper::fence_proxy_async_smem();
    hopper::bar_sync(kBarGrads, 256);
    if (threadIdx.x == 128) {
#pragma unroll
      for (int c = 0; c < Cfg::kColBlocks; ++c) {
        const uint32_t off = static_cast<uint32_t>(c * Cfg::kBlockN * Cfg::kSwizzle);
        hopper::tma_store(&maps.dk, sm.k() + off, c * Cfg::kCols, w.n0, w.kvh, w.b);
        hopper::tma_store(&maps.dv, sm.v() + off, c * Cfg::kCols, w.n0, w.kvh, w.b);
      }
      hopper::bulk_commit();
      hopper::bulk_wait_read_all();  // the tiles stay the CTA's until the engine has read them
    }
    return;
  }
  const int key0 = w.n0 + bwd_wg_key<Cfg>(cw) + warp * 16 + lane / 4;
  const bool add = p.grad_accumulate != 0;
  const int cols_k = static_cast<int>(p.head_dim_qk) - kCol0, cols_v = static_cast<int>(p.head_dim_v) - kCol0;
  bwd_store_rows<T>(static_cast<T*>(p.dk) + kCol0, p.dk_stride, w, key0, cols_k, acc.dk, p.scale, add, lane % 4);
  bwd_store_rows<T>(static_cast<T*>(p.dv) + kCol0, p.dv_stride, w, key0, cols_v, acc.dv, 1.f, add, lane % 4);
}

}  // namespace fa3
}  // namespace flashattn
