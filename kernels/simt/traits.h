// Tile shapes of the fp32 SIMT kernels (kernels/simt), per head-dim bucket D (the list:
// kernels/instances.json, its "simt" entry): the query and value head dims both run padded
// to D, a multiple of 64, with zeros past the real dims in shared memory. Plain C++, so the host code sizes workspaces
// and shared memory from the same numbers the kernels use.
//
// Every kernel runs 256 threads as a 16 x 16 grid (ty = tid / 16, tx = tid % 16). A
// score tile [Br x Bc] gives thread (ty, tx) rows ty*(Br/16) + i and columns tx + 16*j;
// an accumulator [rows x D] gives it rows ty*(rows/16) + i and columns tx*4 + 64*m + e.
// Shared tiles are row-major with a row pitch of (width + 4) floats: 16-byte aligned
// float4 accesses along a row, and rows 4 banks apart so the 16 column threads reading 16
// rows hit distinct banks.
#pragma once
#include "common/hostdevice.h"

namespace flashattn {
namespace simt {

constexpr int kThreads = 256;
// CTAs per SM the kernels of bucket D are compiled for (__launch_bounds__): two caps the
// registers at 128 per thread, which the shared memory of D <= 128 allows anyway.
template <int D>
constexpr int kMinBlocks = D <= 128 ? 2 : 1;

FA_HD constexpr int pitch(int width) { return width + 4; }

// Forward: one CTA per (query block of Br rows, query head, sequence); K/V tiles of Bc keys.
template <int D>
struct FwdTile {
  static constexpr int Br = 64;
  static constexpr int Bc = D <= 64 ? 64 : 32;
  // Q [Br x D], K [Bc x D], V [Bc x D], P [Br x Bc]; mask bytes [Br x Bc]
  static constexpr int q_off = 0;
  static constexpr int k_off = q_off + Br * pitch(D);
  static constexpr int v_off = k_off + Bc * pitch(D);
  static constexpr int p_off = v_off + Bc * pitch(D);
  static constexpr int keep_off = p_off + Br * pitch(Bc);
  static constexpr int floats = keep_off + Br * Bc / 4;
  static constexpr int smem_bytes = floats * 4;
};

// Backward: one CTA per (key block of Bc keys, kv head, sequence) for dK/dV, per (query
// block, query head, sequence) for a deterministic dQ, per dBias tile for dBias; query
// blocks of Br rows.
template <int D>
struct BwdTile {
  static constexpr int Br = D <= 64 ? 64 : 32;
  static constexpr int Bc = D <= 64 ? 64 : 32;
  // K, V [Bc x D]; Q, dO [Br x D]; Z (dropped P), dS [Br x Bc]; LSE, Delta [Br]; mask
  // bytes [Br x Bc]
  static constexpr int k_off = 0;
  static constexpr int v_off = k_off + Bc * pitch(D);
  static constexpr int q_off = v_off + Bc * pitch(D);
  static constexpr int do_off = q_off + Br * pitch(D);
  static constexpr int z_off = do_off + Br * pitch(D);
  static constexpr int ds_off = z_off + Br * pitch(Bc);
  static constexpr int lse_off = ds_off + Br * pitch(Bc);
  static constexpr int delta_off = lse_off + Br;
  static constexpr int keep_off = delta_off + Br;
  static constexpr int floats = keep_off + Br * Bc / 4;
  static constexpr int smem_bytes = floats * 4;
};

}  // namespace simt
}  // namespace flashattn
