// Traits of the FA2-design forward kernel: tile shapes, warps and shared memory of one
// configuration (FwdTraits), built from the tuning table (tile_size.h).
#pragma once
#include "fa2/mma.cuh"
#include "fa2/tile_size.h"

namespace flashattn {
namespace fa2 {

template <int kD_, int kDV_, int kBlockM_, int kBlockN_, int kNWarps_>
struct FwdTraits {
  static constexpr int kD = kD_;    // head_dim_qk served (multiple of 16)
  static constexpr int kDV = kDV_;  // head_dim_v served (multiple of 16)
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kMT = kBlockM / (16 * kNWarps);  // m16 tiles per warp
  static constexpr int kRowsPerWarp = kMT * 16;
  static constexpr int kNT = kBlockN / 8;   // n8 tiles of S
  static constexpr int kKQ = kD / 16;       // k16 steps of Q K^T
  static constexpr int kKV = kBlockN / 16;  // k16 steps of P V
  static constexpr int kNV = kDV / 8;       // n8 tiles of O
  static constexpr int kDS = round64(kD);
  static constexpr int kDVS = round64(kDV);
  using QTile = SwizzledTile<kBlockM, kDS>;
  using KTile = SwizzledTile<kBlockN, kDS>;
  using VTile = SwizzledTile<kBlockN, kDVS>;
  using OTile = SwizzledTile<kBlockM, kDVS>;  // aliases the Q tile in the epilogue
  static constexpr int kSmemBytes = QTile::kBytes + KTile::kBytes + VTile::kBytes;
  // Optional bias tile [kBlockM][kBlockN + 8] (the pad makes fragment-pattern reads conflict free).
  static constexpr int kBiasStride = kBlockN + 8;
  static constexpr int kBiasSmemBytes = kBlockM * kBiasStride * 2;
  static_assert(kMT >= 1 && kBlockM % (16 * kNWarps) == 0, "rows must split evenly over warps");
  static_assert(kD % 16 == 0 && kDV % 16 == 0 && kBlockN % 16 == 0, "tile shape");
  static_assert(OTile::kBytes <= QTile::kBytes, "O staging must fit in the Q tile");
};

// Traits of configuration (D, DV) from the tuning table (tile_size.h): `type` serves plans
// without the rarer options, `extras_type` the kernel compiled with them.
template <int D, int DV>
struct FwdTileFor {
  static constexpr FwdTile kTile = fwd_tile(D, DV);
  static_assert(kTile.block_m > 0, "no row for this configuration in kFwdTiles (tile_size.h)");
  using type = FwdTraits<D, DV, kTile.block_m, kTile.block_n, kTile.warps>;
  using extras_type = FwdTraits<D, DV, kTile.block_m, kTile.block_n_extras, kTile.warps>;
};

// Shared-memory slack of the sm_90a code (its tiles start at a 1024-byte boundary).
constexpr int kFwdWgAlign = 1024;

}  // namespace fa2
}  // namespace flashattn
