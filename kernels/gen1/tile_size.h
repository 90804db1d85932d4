// The tuning table of the generation-1 kernels: tile sizes and warps by direction and head
// dims. The kernels' traits are built from it (FwdTileFor in fwd_kernel.cuh) and the host
// sizes launches and support checks with it; every instantiated configuration
// (instances.h) must have a row (static_assert'ed where the traits are built).
#pragma once

namespace flashattn {
namespace gen1 {

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
    {32, 32, 128, 128, 4, 64},   {64, 64, 128, 128, 4, 64},   {96, 96, 128, 64, 4, 64},
    {128, 128, 128, 64, 4, 64},  {192, 128, 128, 64, 8, 64},  {192, 192, 128, 64, 8, 64},
    {256, 256, 64, 64, 4, 64}};

// The row of configuration (d, dv); block_m == 0 when there is none.
constexpr FwdTile fwd_tile(int d, int dv) {
  for (const FwdTile& t : kFwdTiles)
    if (t.d == d && t.dv == dv) return t;
  return FwdTile{d, dv, 0, 0, 0, 0};
}

}  // namespace gen1
}  // namespace flashattn
