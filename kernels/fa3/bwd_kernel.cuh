// The FA3-design backward kernel (sm_90a only): warp specialization over a TMA / mbarrier
// pipeline and wgmma GEMMs, dK and dV in registers.
//
// One CTA per (key block of 128 rows, key head, sequence), 384 threads (this file: head dims
// up to 128, BwdTraits' key split; above, the consumers split the head-dim columns instead,
// fa3/bwd_split.cuh, with the same producer):
//   warpgroup 0, the producer: drops to 32 registers (setmaxnreg); warp 0's first thread
//     loads K and V once, then each step's Q and dO tiles with TMA into a 2-stage ring;
//     warp 1 copies the step's LSE and Delta rows beside them; warp 2 adds the staged dQ
//     pieces into the fp32 dQ workspace with the copy engine's tensor reduce-add, in
//     deterministic mode in key-block order (bwd_producer.cuh).
//   warpgroups 1 and 2, the consumers: raised to 232 registers; warpgroup c owns keys
//     64 c .. 64 c + 63 of the block and their dK, dV (fp32, registers). Per step (one query
//     block of one query head of the GQA group):
//       S^T = K Q^T and dP^T = V dO^T (wgmma, shared-memory operands, issued together);
//       P^T = exp2(S^T scale log2(e) - LSE_2), masked; dS^T = P^T (dP^T - Delta);
//       dS^T into shared memory; dV += P^T dO (wgmma, P^T from registers); once both
//       warpgroups' dS^T are stored (named barrier), dQ = dS K (wgmma, dS^T read transposed
//       through its descriptor) in 64 x 64 pieces, one per warpgroup at d = 128 and, at
//       d = 64, the one piece on each warpgroup in turn; then dK += dS^T Q (wgmma, dS^T from
//       registers), which runs while the warpgroup stages its dQ piece in shared memory for
//       warp 2 (named barriers, bwd_schedule.cuh).
//     Epilogue: dK * scale and dV straight from registers to the outputs (added to the
//     values there when accumulating).
// dS^T has two buffers, so a warpgroup writes the next step's while the other still reads
// this step's: one named barrier per step. A CTA whose keys no query sees (causal) writes
// dK = dV = 0.
//
// Serves: head_dim_qk = head_dim_v = D (kernels/instances.json), no varlen, bias, softcap, dropout or block-sparse
// layout, band mask only causal (window_right 0, window_left unbounded) with either
// alignment, GQA (the CTA walks every query head of its key head's group), gradients
// written or accumulated, deterministic mode (the dQ adds of a query block in key-block
// order: turn counters, bwd_schedule.cuh). The host sends everything else to fa2.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "common/params.h"
#include "fa2/mma.cuh"
#include "fa2/wgmma.cuh"
#include "fa3/bwd.h"
#include "fa3/bwd_epilogue.cuh"
#include "fa3/bwd_math.cuh"
#include "fa3/bwd_producer.cuh"
#include "fa3/bwd_schedule.cuh"
#include "fa3/bwd_split.cuh"
#include "fa3/bwd_traits.h"
#include "hopper/tma.cuh"
#include "hopper/warpgroup.cuh"

namespace flashattn {
namespace fa3 {

// The accumulators of one consumer warpgroup across the CTA's walk.
template <class Cfg>
struct BwdAcc {
  float dk[1][Cfg::kTileD / 8][4];
  float dv[1][Cfg::kTileD / 8][4];
};

// One step of a consumer warpgroup (cw: 0 or 1), ring stage s = bwd_stage(it); kPiece =
// bwd_has_dq_piece(it, cw), a template argument so that no wgmma is in flight across a
// branch on it (ptxas would serialize the GEMMs: C7520).
template <class Cfg, typename T, bool kMask, bool kPiece>
__device__ __forceinline__ void bwd_step(const AttnParams& p, const BwdSmem<Cfg>& sm, const BwdWork& w, int it, int cw,
                                         BwdAcc<Cfg>& acc) {
  constexpr int kNT = Cfg::kBlockM / 8, kD = Cfg::kD, kTileD = Cfg::kTileD, kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  const int warp = (static_cast<int>(threadIdx.x) / 32) % 4, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int s = bwd_stage<Cfg>(it), m0 = w.m0<Cfg>(it);
  const int key0 = w.n0 + cw * 64 + warp * 16 + g;              // this thread's keys: key0, key0 + 8
  const uint32_t krows = static_cast<uint32_t>(cw * 64 * 128);  // the warpgroup's first K / V row
  float acc_s[1][kNT][4], acc_dp[1][kNT][4];

  hopper::mbar_wait(sm.q_full(s), bwd_parity<Cfg>(it));
  fa2::wg_fence();
  fa2::wg_gemm<T, kNT, kD, 0, kBlockN, kBlockM, true>(acc_s, sm.k() + krows, sm.q(s));
  fa2::wg_commit();
  fa2::wg_gemm<T, kNT, kD, 0, kBlockN, kBlockM, true>(acc_dp, sm.v() + krows, sm.dout(s));
  fa2::wg_commit();
  fa2::wg_wait<1>();  // S^T done; dP^T may still run
  fa2::wg_hold(acc_s);
  const float sl2 = p.scale * static_cast<float>(M_LOG2E);
  bwd_probs<kMask>(acc_s, sm.lse(s), sl2, p, w, key0, m0);
  fa2::wg_hold(acc_s);
  fa2::wg_wait<0>();
  fa2::wg_hold(acc_dp);
  bwd_dscores(acc_dp, acc_s, sm.delta(s));
  uint32_t pa[kNT / 2][4], dsa[kNT / 2][4];
  hopper::pack_a<T>(pa, acc_s);
  hopper::pack_a<T>(dsa, acc_dp);
  const uint32_t sds = sm.ds(it % 2);
  bwd_store_ds<Cfg>(sds, cw * 64, dsa, warp, g, t);
  hopper::fence_proxy_async_smem();

  // dV += P^T dO, then (once both halves of dS^T are stored) the dQ piece, then dK += dS^T Q,
  // in that order so that dK runs on the tensor cores while this warpgroup stages the dQ
  // piece (FA3's order). dV and dK: B MN-major (k16 step kk = query rows 16 kk.., 2048
  // bytes further; N = kTileD across 64-column blocks kBlockM * 128 bytes apart). dQ piece cb
  // (column block cb of the step's 64 x kTileD) = dS K: A = dS^T, MN-major (k = keys along its
  // rows); B = K's column block cb, MN-major.
  fa2::wg_fence();
  const uint64_t ddo = fa2::wg_desc(sm.dout(s), kBlockM * 128), dq = fa2::wg_desc(sm.q(s), kBlockM * 128);
#pragma unroll
  for (int kk = 0; kk < kNT / 2; ++kk) fa2::wg_mma_rs<T, kTileD>(acc.dv, pa[kk], ddo + static_cast<uint64_t>(kk * 128));
  fa2::wg_commit();
  hopper::bar_sync(kBarDsReady, 256);
  const int cb = bwd_dq_col_block<Cfg>(cw);
  float acc_dq[1][8][4];
  if (kPiece) {
    fa2::wg_fence();
    fa2::wg_gemm<T, 8, kBlockN, 3, kBlockN, kBlockN, true>(acc_dq, sds,
                                                           sm.k() + static_cast<uint32_t>(cb * kBlockN * 128));
    fa2::wg_commit();
  }
#pragma unroll
  for (int kk = 0; kk < kNT / 2; ++kk) fa2::wg_mma_rs<T, kTileD>(acc.dk, dsa[kk], dq + static_cast<uint64_t>(kk * 128));
  fa2::wg_commit();
  if (kPiece) {
    // dV and the dQ piece done (wgmma groups complete in order); dK may still run. The
    // staging buffer is free once the writer warp arrived on its empty barrier (the protocol
    // at bwd_reduce_dq).
    fa2::wg_wait<1>();
    fa2::wg_hold(acc_dq);
    hopper::bar_sync(kBarDqEmpty + cw, kDqBarThreads);
    bwd_stage_dq<Cfg>(sm.dq(cw), acc_dq, w.len_q - m0, warp, g, t);
    hopper::fence_proxy_async_smem();
    hopper::bar_arrive(kBarDqFull + cw, kDqBarThreads);
  }
  fa2::wg_wait<0>();
  fa2::wg_hold(acc.dv);
  fa2::wg_hold(acc.dk);
  hopper::mbar_arrive(sm.q_empty(s));
}

// Consumer warpgroup cw's whole walk (split by keys), then dK * scale and dV of its keys to
// the outputs.
template <class Cfg, typename T>
__device__ __forceinline__ void bwd_consumer(const AttnParams& p, const BwdSmem<Cfg>& sm, const BwdWork& w, int cw) {
  BwdAcc<Cfg> acc;
#pragma unroll
  for (int nv = 0; nv < Cfg::kTileD / 8; ++nv)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc.dk[0][nv][e] = acc.dv[0][nv][e] = 0.f;
  hopper::mbar_wait(sm.kv_full(), 0u);
  for (int it = 0; it < w.steps(); ++it) {
    const bool mask = bwd_needs_mask<Cfg>(p, w, w.m0<Cfg>(it));
    if (bwd_has_dq_piece<Cfg>(it, cw)) {
      if (mask) bwd_step<Cfg, T, true, true>(p, sm, w, it, cw, acc);
      else bwd_step<Cfg, T, false, true>(p, sm, w, it, cw, acc);
    } else {
      if (mask) bwd_step<Cfg, T, true, false>(p, sm, w, it, cw, acc);
      else bwd_step<Cfg, T, false, false>(p, sm, w, it, cw, acc);
    }
  }
  const int warp = (static_cast<int>(threadIdx.x) / 32) % 4, lane = static_cast<int>(threadIdx.x) % 32;
  const int key0 = w.n0 + cw * 64 + warp * 16 + lane / 4;
  const bool add = p.grad_accumulate != 0;
  bwd_store_rows<T, Cfg::kD>(p.dk, p.dk_stride, w, key0, acc.dk, p.scale, add, lane % 4);
  bwd_store_rows<T, Cfg::kD>(p.dv, p.dv_stride, w, key0, acc.dv, 1.f, add, lane % 4);
}

template <class Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    bwd_kernel(const AttnParams p, const __grid_constant__ BwdMaps maps, const BwdScratch scratch) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const BwdSmem<Cfg> sm{(fa2::smem_u32(smem_raw) + 1023u) & ~1023u};
  const BwdWork w = bwd_work<Cfg>(p);

  if (threadIdx.x == 0) {
    hopper::mbar_init(sm.kv_full());
    for (int s = 0; s < Cfg::kStages; ++s) {
      hopper::mbar_init(sm.q_full(s), 1 + 32);  // the TMA thread (with the bytes) + warp 1's lanes
      hopper::mbar_init(sm.q_empty(s), 2 * 128);
    }
    if constexpr (Cfg::kSeparateDo)
      for (int s = 0; s < Cfg::kDoStages; ++s) {
        hopper::mbar_init(sm.do_full(s), 1);
        hopper::mbar_init(sm.do_empty(s), 2 * 128);
      }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  const int wg = static_cast<int>(threadIdx.x) / 128;
  if (wg == 0) {
    hopper::regs_dec<Cfg::kProducerRegs>();
    const int warp = static_cast<int>(threadIdx.x) / 32;
    if (threadIdx.x == 0) bwd_load_tiles<Cfg>(maps, sm, w);
    if (warp == 1) bwd_load_rows<Cfg>(p, scratch, sm, w, static_cast<int>(threadIdx.x) % 32);
    if (warp == 2) {
      if (scratch.dq_turns != nullptr)
        bwd_reduce_dq<Cfg, true>(p, maps, scratch, sm, w, static_cast<int>(threadIdx.x) % 32);
      else bwd_reduce_dq<Cfg, false>(p, maps, scratch, sm, w, static_cast<int>(threadIdx.x) % 32);
    }
    return;
  }

  hopper::regs_inc<Cfg::kConsumerRegs>();
  if constexpr (Cfg::kSplitD) {
    if (wg == 1) bwd_split_consumer<Cfg, T, 0>(p, sm, w);
    else bwd_split_consumer<Cfg, T, 1>(p, sm, w);
  } else {
    bwd_consumer<Cfg, T>(p, sm, w, wg - 1);
  }
}

}  // namespace fa3
}  // namespace flashattn
