// The tuning table of the generation-1 kernels: tile sizes, warps and the per-configuration
// code-path choices by direction and head dims. The kernels' traits are built from it
// (FwdTileFor in fwd_kernel.cuh, BwdCfgFor in bwd_kernel.cuh) and the host
// sizes launches and support checks with it; every instantiated configuration
// (instances.h) must have a row (static_assert'ed where the traits are built).
#pragma once

namespace flashattn {
namespace fa2 {

// Forward: block_m x block_n tiles (queries x keys) over `warps` warps. block_n_extras is the
// key tile of the kernel compiled with the rarer options (softcap, bias, ALiBi, dropout,
// block-sparse): at d <= 64 it takes 64-column KV tiles, which keeps the score tile (and
// register pressure) small and lines KV tiles up with 64-column block-sparse blocks.
struct FwdTile {
  int d, dv, block_m, block_n, warps, block_n_extras;
  // Dynamic shared memory of the kernel without extras: Q, K, V tiles, widths rounded up to
  // 64 columns, 2-byte elements (FwdTraits::kSmemBytes).
  constexpr int smem_bytes() const {
    return 2 * ((block_m + block_n) * ((d + 63) / 64 * 64) + block_n * ((dv + 63) / 64 * 64));
  }
};
inline constexpr FwdTile kFwdTiles[] = {
    {32, 32, 128, 128, 4, 64},  {64, 64, 128, 128, 4, 64},  {96, 96, 128, 64, 4, 64}, {128, 128, 128, 64, 4, 64},
    {192, 128, 128, 64, 8, 64}, {192, 192, 128, 64, 8, 64}, {256, 256, 64, 64, 4, 64}};

// The row of configuration (d, dv); block_m == 0 when there is none.
constexpr FwdTile fwd_tile(int d, int dv) {
  for (const FwdTile& t : kFwdTiles)
    if (t.d == d && t.dv == dv) return t;
  return FwdTile{d, dv, 0, 0, 0, 0};
}

// Backward main kernel (BwdTraits in bwd_kernel.cuh, 8 warps): Br x Bc tiles (queries x keys)
// and the three warp grids, S/dP ws_m x ws_n, dK/dV wk_m x wk_n, dQ wq_m x wq_n, chosen so
// every warp tile is a multiple of 16 x 16 and the accumulators fit 255 registers without
// spills (1 CTA/SM: shared memory is the limit anyway).
//   d<=64: 128x128 like FA2; S 4x2 warps (32x64 tiles), dK/dV 4x2, dQ 4x2.
//   d=96,128: Br 64, Bc 128; S 2x4 (32x32), dK/dV 4x2 (32 keys x d/2), dQ 2x4 / 4x2.
//   d=192,256: 64x64; dK/dV 2x4 so each warp holds 32 keys x d/4 of dK and dV.
// Variant 1, the small-shared-memory form of a config for devices whose opt-in limit per
// block the config exceeds (sm_86/sm_89/sm_120: 99 KB = 101376 B; the host takes it only
// when the config does not fit with either stage count). Same kernel, same numerics:
//   d<=64:  64x128, 2 stages 97 KB (FA2's sm86 d=64 tile): S 2x4 (32x32), dK/dV 4x2, dQ 4x2.
//   d<=128: 32x128, 1 stage 96.25 KB: S 2x4 (16x32), dK/dV 4x2 (32 keys x 64, as the d=128
//           config), dQ 2x4 (16x32). Same MMA work per step as FA2's sm86 64x64 tile, half
//           the Q/dO bytes and dQ atomics per FLOP.
//   d<=192: 32x64, 1 stage 80.25 KB: S 2x4 (16x16), dK/dV 2x4 (32 keys x 48), dQ 2x4 (16x48).
// (d=192 with dv<=128 needs none: its config fits 99 KB with 1 stage. d>192 has none: with
// Bc >= 64 and 8 warps of >= 16-row S tiles the K, V, Q, dO, P and dS tiles alone need
// 104.25 KB.)
// The other columns, each the winner of same-run A/B measurements (H100/H200, bf16):
//   slice      S/dP rows computed at once on the fast path, in m16 tiles (2 = whole warp
//              tile: fewest K/V fragment re-reads).
//   dq_passes  dQ column passes (fewer live accumulators; 2 at d=256).
//   dq_v4      sm_90: float4 dQ reductions after a lane swap (1) or float2 (0; at d=256 with
//              one pass the swap's registers cost more: 104 vs 142 TFLOP/s).
//   dq_stage   sm_90: dQ reductions staged per warp through shared memory, 16 rows x 32 fp32,
//              so one float4 reduction covers 4 rows x 128 B (1); 2: the staged blocks reduced
//              by the copy engine (d=64 +2.5..3.3% at 4k/16k; d=128 -1..-2% at 512/1k, so
//              not there; d=256 has no room for the larger buffers).
//   dq_mid     sm_90: the dQ GEMM and reductions between the dV and dK GEMMs (1) or after
//              both (0; d=256 +1.2..2.5% with dQ last, d=64/128 -3..5%).
//   tma_qdo    sm_90: the Q/dO prefetch by the copy engine (d=64 +1.4..2.3% at 1k/4k, d=128
//              +0.4..1.6% with the P-first order, d=256 +1.8..2.2%).
//   skew       sm_90, two stages: one CTA barrier per step instead of two; 1: one P/dS buffer
//              and a "free" mbarrier (d=64 +0.8..2.9%: no room for a second buffer), 2: a
//              second P/dS buffer (d=128 +0.6..2.7%); 0 at d=256 (-1.0..+0.6%).
struct BwdTile {
  int d, dv, variant, br, bc, ws_m, ws_n, wk_m, wk_n, wq_m, wq_n;
  int slice, dq_passes, dq_v4, dq_stage, dq_mid, tma_qdo, skew;
};
inline constexpr BwdTile kBwdTiles[] = {
    // d, dv, variant, br, bc, ws_m, ws_n, wk_m, wk_n, wq_m, wq_n, slice, dq_passes, dq_v4, dq_stage,
    // dq_mid, tma_qdo, skew
    {32, 32, 0, 128, 128, 4, 2, 4, 2, 4, 2, 2, 1, 1, 0, 0, 0, 0},
    {64, 64, 0, 128, 128, 4, 2, 4, 2, 4, 2, 2, 1, 1, 2, 1, 1, 1},
    {96, 96, 0, 64, 128, 2, 4, 4, 2, 4, 2, 2, 1, 1, 0, 0, 0, 0},
    {128, 128, 0, 64, 128, 2, 4, 4, 2, 2, 4, 2, 1, 1, 1, 1, 1, 2},
    {192, 128, 0, 64, 64, 4, 2, 2, 4, 2, 4, 1, 1, 0, 0, 0, 0, 0},
    {192, 192, 0, 64, 64, 4, 2, 2, 4, 2, 4, 1, 1, 0, 0, 0, 0, 0},
    {256, 256, 0, 64, 64, 4, 2, 2, 4, 2, 4, 1, 2, 0, 1, 0, 1, 0},
    {64, 64, 1, 64, 128, 2, 4, 4, 2, 4, 2, 2, 1, 1, 0, 0, 0, 0},
    {128, 128, 1, 32, 128, 2, 4, 4, 2, 2, 4, 1, 1, 1, 0, 0, 0, 0},
    {192, 192, 1, 32, 64, 2, 4, 2, 4, 2, 4, 1, 1, 0, 0, 0, 0, 0}};

// The row of instantiation (d, dv, variant); br == 0 when there is none.
constexpr BwdTile bwd_tile(int d, int dv, int variant) {
  for (const BwdTile& t : kBwdTiles)
    if (t.d == d && t.dv == dv && t.variant == variant) return t;
  return BwdTile{d, dv, variant, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
}

}  // namespace fa2
}  // namespace flashattn
