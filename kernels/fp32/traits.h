// Tile shapes of the fp32 kernels (kernels/fp32), per head-dim bucket D (the list:
// kernels/instances.json, its "fp32" entry): the query and value head dims both run padded
// to D, a multiple of 64, with zeros past the real dims in shared memory. Plain C++, so
// the host code sizes shared memory from the same numbers the kernels use.
//
// Products run on warps of the 3xTF32 mma (mma.cuh). A CTA product of M rows (M / 16
// warps along the rows, one 16-row fragment each) spreads its warps as WarpGrid says.
// Shared fp32 tiles are row-major, rows 16-byte aligned for the asynchronous copies, with
// the pitch that keeps their fragment loads (mma.cuh) free of bank conflicts: kpitch for a
// tile whose rows are read as k pairs (8 rows x 4 pairs of 8 bytes: rows 8 banks apart),
// npitch for one read down its columns (pairs of rows 2t, 2t + 1 x 8 columns: rows 4
// banks apart). The backward reads its tiles both ways and takes kpitch for the
// head-dim-wide ones. Split tiles (split_tile.cuh, read 8 lanes x 16 bytes a phase; pitches
// in 4-byte words) take pair_pitch as B with k along their rows (rows 16 banks apart),
// pair_row_pitch as B with k down their columns (rows 8 banks apart) and a_pitch as A
// (unpadded: each lane's 16 bytes 8 words after its neighbour's, and odd rows hold their
// small quads first, so that the two rows a phase reads sit 4 banks apart). Staging tiles
// (forward) are unpadded: they are read and written a row of 16-byte chunks at a time.
#pragma once
#include "common/hostdevice.h"

namespace flashattn {
namespace fp32 {

// Dynamic shared memory a block may opt in to: on compute capability 8.0 (A100), and on
// 8.6, 8.9 and 12.x (the least of the devices the fp32 kernels serve, which they serve up
// to the 128 bucket).
constexpr int kSm80SmemPerBlock = 166912;
constexpr int kLeastSmemPerBlock = 101376;
// On compute capability 9.0 (H100, H200).
constexpr int kSm90SmemPerBlock = 232448;

FA_HD constexpr int kpitch(int width) { return width + 8; }
FA_HD constexpr int npitch(int width) { return width + 4; }
FA_HD constexpr int pair_pitch(int width) { return 2 * width + 16; }
FA_HD constexpr int pair_row_pitch(int width) { return 4 * width + 8; }
FA_HD constexpr int a_pitch(int width) { return 4 * width; }

// Warps of a CTA of `warps` on an M x N product: M / 16 along the rows, the rest along the
// columns, each warp a 16 x (N / cols) tile of NT fragments of 8 columns.
template <int M, int N, int kWarps>
struct WarpGrid {
  static constexpr int rows = M / 16, cols = kWarps / rows, width = N / cols, NT = width / 8;
  static_assert(rows * cols == kWarps && width * cols == N && NT * 8 == width, "warp grid must tile the product");
};

// Forward: one CTA of Br / 16 warps per (query block of Br rows, query head, sequence),
// warp w owning rows [16w, 16w + 16) whole; K/V tiles of Bc keys. K and V are held as split
// tiles (K with k along its rows, V with k = key down its columns), split once per CTA from
// a staging tile that the asynchronous copies fill; so is Q (an A split tile, staged in
// pieces of Bc rows) where that fits the shared memory of the instance's devices, else Q
// stays an fp32 tile (kpitch) whose fragments split as the products read them. P stays in
// registers. Two instances per bucket:
// - narrow (kWide = false), for every served device: Br = 64 (4 warps), Bc = 32 at D = 64
//   and 16 above, Q split at D = 64 only (a split Q would take the 128 bucket past 8.6/8.9
//   devices' 99 KB); two CTAs per SM up to the 128 bucket. Buckets up to 128 fit the least
//   device's block, 256 an A100's.
// - wide (kWide = true), where a block may have an H100's 227 KB (fwd_launch.cuh says
//   when it runs): Br = 128 (8 warps, one CTA per SM), Bc = 64 at D = 64, 32 at D = 128,
//   16 at 256, Q split up to D = 128; each K/V copy, split and barrier serves twice the
//   query rows and, up to D = 128, twice the keys of the narrow instance. Up to D = 128
//   it stages K and V in two tiles (kTwoStages), so that V_j and K_j+1 split in one pass
//   between two barriers per key tile (fwd_kernel.cuh).
template <int D, bool kWide = false>
struct FwdTile {
  static constexpr int Br = kWide ? 128 : 64;
  static constexpr int kThreads = Br / 16 * 32;
  static constexpr int Bc = D <= 64 ? (kWide ? 64 : 32) : D <= 128 && kWide ? 32 : 16;
  static constexpr bool kSplitQ = D <= (kWide ? 128 : 64);
  static constexpr bool kTwoStages = kWide && D <= 128;
  static constexpr int q_pitch = kSplitQ ? a_pitch(D) : kpitch(D), k_pitch = pair_pitch(D), v_pitch = pair_row_pitch(D),
                       stage_pitch = D;
  static constexpr int q_off = 0;
  static constexpr int k_off = q_off + (kSplitQ ? Br / 2 : Br) * q_pitch;
  static constexpr int v_off = k_off + Bc * k_pitch;
  // K's staging tile (also Q's, in pieces), then V's (with two stages).
  static constexpr int stage_off = v_off + Bc / 2 * v_pitch;
  static constexpr int vstage_off = stage_off + (kTwoStages ? Bc * stage_pitch : 0);
  static constexpr int floats = vstage_off + Bc * stage_pitch;
  static constexpr int smem_bytes = floats * 4;
  // CTAs per SM the kernel is compiled for (__launch_bounds__): two leave 255 registers
  // per thread of 4 warps.
  static constexpr int min_blocks = !kWide && D <= 128 ? 2 : 1;
  static_assert(Br % Bc == 0 && Bc % 16 == 0, "Q is staged in pieces of Bc rows, whole A fragments");
  static_assert(smem_bytes <= (kWide      ? kSm90SmemPerBlock
                               : D <= 128 ? kLeastSmemPerBlock
                                          : kSm80SmemPerBlock),
                "narrow: buckets up to 128 fit every served device's block, 256 an A100's; wide: an H100's");
};

// Backward: one CTA of 8 warps per (key block of Bc keys, kv head, sequence) for dK/dV,
// per (query block, query head, sequence) for a deterministic dQ, per dBias tile for
// dBias; query blocks of Br rows. All tiles fp32, their fragments split as the products
// read them, except in the dK/dV kernel's split instance (kSplitKV, where a block may have
// an H100's 227 KB: bwd_launch.cuh): there K and V are also held as split tiles (B with k
// along their rows), split once per CTA, for S = Q K^T and dP = dO V^T; V's fp32 tile is
// then only the staging of that split, in the place of Q and dO, and K's stays for dQ.
template <int D, bool kSplitKV = false>
struct BwdTile {
  static constexpr int kThreads = 256;
  static constexpr int Br = D <= 64 ? 64 : 32;
  static constexpr int Bc = D <= 128 ? 64 : 32;
  // K, V [Bc x D]; Q, dO [Br x D]; Z (dropped P), dS [Br x Bc]; LSE, Delta [Br]; split K, V
  static constexpr int d_pitch = kpitch(D), s_pitch = npitch(Bc), kv_pitch = pair_pitch(D);
  static constexpr int k_off = 0;
  static constexpr int v_off = k_off + Bc * d_pitch;
  static constexpr int q_off = kSplitKV ? v_off : v_off + Bc * d_pitch;
  static constexpr int do_off = q_off + Br * d_pitch;
  static constexpr int z_off = do_off + Br * d_pitch;
  static constexpr int ds_off = z_off + Br * s_pitch;
  static constexpr int lse_off = ds_off + Br * s_pitch;
  static constexpr int delta_off = lse_off + Br;
  static constexpr int ks_off = delta_off + Br;
  static constexpr int vs_off = ks_off + Bc * kv_pitch;
  static constexpr int floats = kSplitKV ? vs_off + Bc * kv_pitch : ks_off;
  static constexpr int smem_bytes = floats * 4;
  static_assert(!kSplitKV || (2 * Br >= Bc && ks_off % 4 == 0 && smem_bytes <= kSm90SmemPerBlock),
                "split instance: V stages where Q and dO go, split tiles 16-byte aligned, an H100's block");
};

}  // namespace fp32
}  // namespace flashattn
