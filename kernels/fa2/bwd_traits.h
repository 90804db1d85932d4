// Traits of the FA2-design backward main kernel: tile shapes, warp grids and the shared-memory
// layout of one instantiation (BwdTraits), built from the tuning table (tile_size.h).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/params.h"
#include "fa2/mma.cuh"
#include "fa2/tile_size.h"

namespace flashattn {
namespace fa2 {

// ---------------------------------------------------------------------------------
// Tile traits. 8 warps; Br x Bc per (q-block, k-block) step; the three warp grids are
// chosen per config so every warp tile is a multiple of 16 x 16 and the accumulators fit
// the 255-register budget without spills (1 CTA/SM: shared memory is the limit anyway).
// ---------------------------------------------------------------------------------
template <int D_, int DV_, int Br_, int Bc_, int WS_M_, int WS_N_, int WK_M_, int WK_N_, int WQ_M_, int WQ_N_,
          int SL_ = 1, int QP_ = 1, int V4_ = 0, int STG_ = 0, int DQM_ = 0, int TMA_ = 0, int SKEW_ = 0>
struct BwdTraits {
  static constexpr int D = D_, DV = DV_, Br = Br_, Bc = Bc_;
  static constexpr int kWarps = 8, kThreads = 256;
  static constexpr int WS_M = WS_M_, WS_N = WS_N_, WK_M = WK_M_, WK_N = WK_N_, WQ_M = WQ_M_, WQ_N = WQ_N_;
  static_assert(WS_M * WS_N == kWarps && WK_M * WK_N == kWarps && WQ_M * WQ_N == kWarps, "8 warps per grid");
  // Shared widths: swizzled tiles are multiples of 64 columns (96 -> 128).
  static constexpr int DS = round64(D), DVS = round64(DV);
  // S / dP warp tile: kSM x kSN.
  static constexpr int kSM = Br / WS_M, kSN = Bc / WS_N;
  static constexpr int kMTs = kSM / 16, kNTs = kSN / 8;
  // dK / dV warp tile: kKM keys x kKN (dK) / kVN (dV) columns.
  static constexpr int kKM = Bc / WK_M, kKN = D / WK_N, kVN = DV / WK_N;
  static constexpr int kMTk = kKM / 16, kNTk = kKN / 8, kNTv = kVN / 8;
  // dQ warp tile: kQM x kQN.
  static constexpr int kQM = Br / WQ_M, kQN = D / WQ_N;
  static constexpr int kMTq = kQM / 16, kNTq = kQN / 8;
  // S/dP rows computed at once (m16 tiles per slice; kMTs = whole warp tile, fewest K/V
  // fragment re-reads), dQ column passes (fewer live accumulators), float4 dQ atomics.
  static constexpr int kSL = SL_, kQP = QP_, kNTqp = kNTq / QP_;
  static constexpr bool kDqV4 = V4_ != 0;
  // sm_90 dQ reductions staged per warp through shared memory (16 rows x 32 fp32 per
  // warp, chunk-swizzled): each float4 reduction instruction then covers 4 rows x 128 B
  // instead of 16 rows x 32 B. Needs a 32-column dQ pass.
  static constexpr bool kDqStage = STG_ != 0;
  static_assert(!kDqStage || kQN / kQP == 32, "staged dQ needs 32-column passes");
  // STG_ == 2 (kDqBulk, sm_90 code, when the host passes a TMA map of the accumulator;
  // never in deterministic mode): each staged 16x32 block goes to global memory by one
  // tensor reduction (cp.reduce.async.bulk.tensor) that the copy engine performs
  // asynchronously: no shared-memory read and no reduction instructions in the warp's
  // stream. Two 2 KB buffers per warp (the engine may still read one while the warp fills
  // the other).
  static constexpr bool kDqBulk = STG_ == 2;
  static constexpr int kBulkBufBytes = 16 * 32 * 4;
  static constexpr int kStgWarpBytes = kDqBulk ? 2 * kBulkBufBytes : 16 * 32 * 4;
  // (+1024: the bulk buffers start at the first 1024-byte boundary of the region.)
  static constexpr int kStgBytes = kDqStage ? kWarps * kStgWarpBytes + (kDqBulk ? 1024 : 0) : 0;
  // dQ GEMM + reductions between the dV and dK GEMMs (else after both).
  static constexpr bool kDqMid = DQM_ != 0;
  static_assert(kMTs % kSL == 0 && kNTq % (2 * kQP) == 0, "slice / pass split");
  static_assert(kSM % 16 == 0 && kSN % 16 == 0, "S warp tile must be a multiple of 16x16");
  static_assert(kKM % 16 == 0 && kKN % 16 == 0 && kVN % 16 == 0, "dK/dV warp tile must be a multiple of 16x16");
  static_assert(kQM % 16 == 0 && kQN % 16 == 0, "dQ warp tile must be a multiple of 16x16");
  static_assert(Bc % 64 == 0 && D % 16 == 0 && DV % 16 == 0, "tile shapes");

  using TileK = SwizzledTile<Bc, DS>;
  using TileV = SwizzledTile<Bc, DVS>;
  using TileQ = SwizzledTile<Br, DS>;
  using TileDO = SwizzledTile<Br, DVS>;
  using TileP = SwizzledTile<Br, Bc>;  // P_dropped (unscaled) and dS, [query][key]

  // TMA_ (sm_90 code, when the host passes TMA maps of Q and dO): the prefetch of the next
  // tile's Q and dO is one copy-engine request per 64-column block issued by one thread,
  // completing on a per-stage mbarrier, instead of 16-byte cp.async from every thread (the
  // address arithmetic of those was ~60 of ~1200 instructions per warp and step at d=128).
  // The engine writes the 128-byte swizzle of SwizzledTile when each 64-column block starts
  // at a 1024-byte boundary: the layout is then based at the first 1024-byte boundary of the
  // dynamic shared memory (kAlign90 bytes of slack), and the stages hold only Q and dO (whole
  // 1024-byte blocks; their LSE/Delta rows lie apart, kOffRows90).
  static constexpr bool kTmaQdo = TMA_ != 0;
  static_assert(!kTmaQdo || (D % 64 == 0 && DV % 64 == 0), "TMA boxes are 64 columns wide");
  static constexpr int kAlign90 = kTmaQdo ? 1024 : 0;
  // SKEW_ (sm_90 code, two stages): no loop-top CTA barrier when the step's Q/dO came through
  // an mbarrier (the copy engine's, or per-thread arrivals after cp.async), so a warp that
  // finishes a step's dV/dQ/dK GEMMs starts the next step's S/dP GEMMs while slower warps are
  // still in theirs; the one CTA barrier per step left is the one between the S phase and the
  // GEMM phase. The Q/dO prefetch is then issued after that barrier (the stage it overwrites
  // is free once every warp is past the previous step), the LSE/Delta rows of the next tile
  // at the step's top (they are read only in the S phase). What keeps the next step's P/dS stores off the
  // tiles that slower warps still read: SKEW_ = 1, one P/dS buffer and an mbarrier ("free")
  // that every thread arrives on after its last read of the step, waited on before the next
  // step's first store; SKEW_ = 2, a second P/dS buffer (steps alternate), no wait at all.
  static constexpr bool kSkew = SKEW_ != 0, kSkew2 = SKEW_ == 2;

  // Shared layout (bytes): K | V | P | dS | dQ staging | per stage: Q | dO | lse2[Br] | delta[Br];
  // in sm_90 code with kTmaQdo the rows of both stages lie apart, before the stages (kOffRows90:
  // per stage lse2[Br] | delta[Br]), so that a stage (Q | dO) is a multiple of 1024 bytes.
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + TileK::kBytes;
  static constexpr int kOffP = kOffV + TileV::kBytes;
  static constexpr int kOffDS = kOffP + TileP::kBytes;
  static constexpr int kOffStg = kOffDS + TileP::kBytes;
  static constexpr int kRowBytes = 2 * Br * 4;                                 // lse2 and delta of one stage
  static constexpr int kStage80 = TileQ::kBytes + TileDO::kBytes + kRowBytes;  // bytes per stage
  static constexpr int kStage90 = kTmaQdo ? TileQ::kBytes + TileDO::kBytes : kStage80;
  static_assert(!kTmaQdo || kStage90 % 1024 == 0, "TMA stages of whole 1024-byte blocks");
  // The staging buffer exists only in the Sm90a policy's code (the reductions it serves are
  // sm_90 instructions), so the layout after it depends on the policy: `sm90` = Arch::kSm90
  // (arch.h); the host sizes the launch with the same flag.
  static constexpr int kOffQ80 = kOffStg, kOffRows90 = kOffStg + kStgBytes;
  static constexpr int kOffQ90 = kOffRows90 + (kTmaQdo ? 2 * kRowBytes : 0);
  static_assert(!kTmaQdo || kOffQ90 % 1024 == 0, "TMA destinations on 1024-byte boundaries");
  // kSkew2: the second P | dS buffer after both stages (allocated only with two stages).
  static constexpr int kOffP1 = kOffQ90 + 2 * kStage90;
  static constexpr int smem_bytes(int stages, bool sm90) {
    return sm90 ? kAlign90 + kOffQ90 + stages * kStage90 + (kSkew2 && stages == 2 ? 2 * TileP::kBytes : 0)
                : kOffQ80 + stages * kStage80;
  }
};

// Traits of instantiation (D, DV, kVariant) from the tuning table (kBwdTiles, tile_size.h):
// variant 0 is the config of kBwdInstances, variant 1 its small-shared-memory form.
template <int D, int DV, int kVariant = 0>
struct BwdCfgFor {
  static constexpr BwdTile kT = bwd_tile(D, DV, kVariant);
  static_assert(kT.br > 0, "no row for this instantiation in kBwdTiles (tile_size.h)");
  using type = BwdTraits<D, DV, kT.br, kT.bc, kT.ws_m, kT.ws_n, kT.wk_m, kT.wk_n, kT.wq_m, kT.wq_n, kT.slice,
                         kT.dq_passes, kT.dq_v4, kT.dq_stage, kT.dq_mid, kT.tma_qdo, kT.skew>;
};

template <int kDtype>
struct BwdElem;
template <>
struct BwdElem<kFp16> {
  using type = __half;
};
template <>
struct BwdElem<kBf16> {
  using type = __nv_bfloat16;
};

}  // namespace fa2
}  // namespace flashattn
