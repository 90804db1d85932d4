// What the pieces of the FA2-design backward main kernel share: the warp grids of its
// GEMMs (BwdGrid, compile time) and the kernel's per-CTA context (BwdKernel: parameters,
// shared-memory layout).
#pragma once
#include <stdint.h>

#include "common/params.h"
#include "fa2/bwd.h"
#include "fa2/bwd_ctx.cuh"

namespace flashattn {
namespace fa2 {

template <class Arch, class Tr>
struct BwdGrid {
  static constexpr int Br = Tr::Br, Bc = Tr::Bc, D = Tr::D, DV = Tr::DV;
  static constexpr bool kTma = Arch::kSm90 && Tr::kTmaQdo;
  static constexpr int kOffQ = Arch::kSm90 ? Tr::kOffQ90 : Tr::kOffQ80;
  static constexpr int kStage = Arch::kSm90 ? Tr::kStage90 : Tr::kStage80;
  // S/dP warp grid. kWg (sm_90a code, the copy-engine layout): two warpgroups,
  // each one wgmma tile of 64 rows x kSN columns; warp w computes rows 16 (w % kWS_M) .. + 15
  // and columns kSN (w / kWS_M) ..: Br = 64 splits the Bc columns between the warpgroups,
  // Br = 128 the rows. Else the traits' WS_M x WS_N grid of mma.sync warp tiles.
  static constexpr bool kWg =
      Arch::kWgmma && kTma && (Br == 64 || Br == 128) && Bc * Br / 128 >= 32 && Bc * Br / 128 <= 128;
  static constexpr int kWS_M = kWg ? 4 * (Br / 64) : Tr::WS_M;
  static constexpr int kSM = kWg ? 16 : Tr::kSM, kSN = kWg ? Bc * Br / 128 : Tr::kSN;
  static constexpr int kMTs = kSM / 16, kNTs = kSN / 8, kSL = kWg ? 1 : Tr::kSL;
  // dK/dV warp grid. kWgK: two warpgroups, each 64 keys x kKN (dK) / kVN (dV)
  // columns of wgmma accumulators; warp w owns keys 16 (w % kWK_M) .. + 15 and column part
  // w / kWK_M (Bc = 128: the warpgroups split the keys, Bc = 64: the columns). Else the
  // traits' WK_M x WK_N grid.
  static constexpr bool kWgK = kWg && (Bc == 64 || Bc == 128);
  static constexpr int kWK_M = kWgK ? 4 * (Bc / 64) : Tr::WK_M, kWK_N = 8 / kWK_M;
  static constexpr int kKM = Bc / kWK_M, kKN = D / kWK_N, kVN = DV / kWK_N;
  static constexpr int kMTk = kKM / 16, kNTk = kKN / 8, kNTv = kVN / 8;
  static_assert(!kWgK || ((kKN == 64 || kKN == 128) && (kVN == 64 || kVN == 128)), "wgmma dK/dV widths");
  // dQ warp grid. kWgQ: two warpgroups, each 64 rows x kQN columns (Br = 64: the
  // warpgroups split the columns, Br = 128: the rows), computed in kQPx passes of 64 columns;
  // warp w owns rows 16 (w % kWQ_M) .. + 15, column part w / kWQ_M. Else the traits' grid.
  static constexpr bool kWgQ = kWg;
  static constexpr int kWQ_M = kWgQ ? 4 * (Br / 64) : Tr::WQ_M, kWQ_N = 8 / kWQ_M;
  static constexpr int kQM = Br / kWQ_M, kQN = D / kWQ_N;
  static constexpr int kQPx = kWgQ ? kQN / 64 : Tr::kQP;
  // The reductions' unit: kBlk blocks of kMTq m16 tiles x (8 kNTqp) columns per pass.
  static constexpr int kBlk = kWgQ ? 2 : 1, kMTq = kQM / 16, kNTqp = kWgQ ? 4 : Tr::kNTqp;
  static_assert(!kWgQ || (kQN % 64 == 0 && Tr::kDqStage), "wgmma dQ: 64-column passes, staged reductions");
  // kSkew with two stages: one CTA barrier per step (BwdTraits::kSkew).
  static constexpr bool kSkew = Arch::kSm90 && Tr::kSkew, kSkew1 = kSkew && !Tr::kSkew2;
  // This warp's first key and first dK / dV column in the dK/dV grid.
  static __device__ __forceinline__ void wk_pos(int warp, int& m0, int& kn0, int& vn0) {
    const int cw = kWgK ? warp / kWK_M : warp % Tr::WK_N;
    m0 = (kWgK ? warp % kWK_M : warp / Tr::WK_N) * kKM;
    kn0 = cw * kKN;
    vn0 = cw * kVN;
  }
};

// The kernel's parameters and shared-memory layout, by reference / value.
template <class Arch, class Tr, typename T>
struct BwdKernel {
  using G = BwdGrid<Arch, Tr>;
  const BwdArgs& args;
  const AttnParams& p;
  BwdCtx& ctx;
  const DqMapParam<Tr>& dq_map;
  const QdoMapParam<Tr>& qdo_map;
  int group;
  bool det;
  uint32_t s_base;
  unsigned char* smem_al;
  uint32_t sK, sV;
  // Q and dO of stage st.
  __device__ __forceinline__ uint32_t sQ(int st) const { return s_base + G::kOffQ + st * G::kStage; }
  __device__ __forceinline__ uint32_t sdO(int st) const { return sQ(st) + Tr::TileQ::kBytes; }
  // LSE and Delta rows of stage st.
  __device__ __forceinline__ float* lse_s(int st) const {
    if constexpr (G::kTma) return reinterpret_cast<float*>(smem_al + Tr::kOffRows90 + st * Tr::kRowBytes);
    return reinterpret_cast<float*>(smem_al + G::kOffQ + st * G::kStage + Tr::TileQ::kBytes + Tr::TileDO::kBytes);
  }
  __device__ __forceinline__ float* delta_s(int st) const { return lse_s(st) + Tr::Br; }
};

}  // namespace fa2
}  // namespace flashattn
