// Tile shapes of the fp32 kernels (kernels/fp32), per head-dim bucket D (the list:
// kernels/instances.json, its "fp32" entry): the query and value head dims both run padded
// to D, a multiple of 64, with zeros past the real dims in shared memory. Plain C++, so
// the host code sizes shared memory from the same numbers the kernels use.
//
// Products run on warps of the 3xTF32 mma (mma.cuh). A CTA product of M rows (M / 16
// warps along the rows, one 16-row fragment each) spreads its warps as WarpGrid says.
// Shared tiles are row-major with a row pitch of (width + 4) floats: 16-byte aligned rows
// for the asynchronous copies, and the fragment loads of 8 rows x 4 columns hit 32
// distinct banks.
#pragma once
#include "common/hostdevice.h"

namespace flashattn {
namespace fp32 {

FA_HD constexpr int pitch(int width) { return width + 4; }

// Warps of a CTA of `warps` on an M x N product: M / 16 along the rows, the rest along the
// columns, each warp a 16 x (N / cols) tile of NT fragments of 8 columns.
template <int M, int N, int kWarps>
struct WarpGrid {
  static constexpr int rows = M / 16, cols = kWarps / rows, width = N / cols, NT = width / 8;
  static_assert(rows * cols == kWarps && width * cols == N && NT * 8 == width, "warp grid must tile the product");
};

// Forward: one CTA of 4 warps per (query block of Br = 64 rows, query head, sequence),
// warp w owning rows [16w, 16w + 16) whole; K/V tiles of Bc keys.
template <int D>
struct FwdTile {
  static constexpr int kThreads = 128;
  static constexpr int Br = 64;
  static constexpr int Bc = D <= 128 ? 64 : 32;
  // Q [Br x D], K [Bc x D], V [Bc x D]
  static constexpr int q_off = 0;
  static constexpr int k_off = q_off + Br * pitch(D);
  static constexpr int v_off = k_off + Bc * pitch(D);
  static constexpr int floats = v_off + Bc * pitch(D);
  static constexpr int smem_bytes = floats * 4;
};

// Backward: one CTA of 8 warps per (key block of Bc keys, kv head, sequence) for dK/dV,
// per (query block, query head, sequence) for a deterministic dQ, per dBias tile for
// dBias; query blocks of Br rows.
template <int D>
struct BwdTile {
  static constexpr int kThreads = 256;
  static constexpr int Br = D <= 64 ? 64 : 32;
  static constexpr int Bc = D <= 128 ? 64 : 32;
  // K, V [Bc x D]; Q, dO [Br x D]; Z (dropped P), dS [Br x Bc]; LSE, Delta [Br]
  static constexpr int k_off = 0;
  static constexpr int v_off = k_off + Bc * pitch(D);
  static constexpr int q_off = v_off + Bc * pitch(D);
  static constexpr int do_off = q_off + Br * pitch(D);
  static constexpr int z_off = do_off + Br * pitch(D);
  static constexpr int ds_off = z_off + Br * pitch(Bc);
  static constexpr int lse_off = ds_off + Br * pitch(Bc);
  static constexpr int delta_off = lse_off + Br;
  static constexpr int floats = delta_off + Br;
  static constexpr int smem_bytes = floats * 4;
};

}  // namespace fp32
}  // namespace flashattn
