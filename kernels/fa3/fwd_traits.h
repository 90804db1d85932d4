// Tile shapes and shared-memory plan of the FA3-design forward kernel (fa3/fwd_kernel.cuh),
// plain C++ so the host sizes its launch from the same numbers.
#pragma once

namespace flashattn {
namespace fa3 {

// One CTA per SM, persistent over 128-row query tiles: a producer warpgroup and two
// consumer warpgroups (64 rows each), K/V blocks of kBlockN rows in a kStages-deep ring. Head dim D (= head_dim_v) in
// 64-column blocks of the 128-byte swizzle: a tile of R rows is D / 64 column blocks of
// R x 128 bytes, each 1024-byte aligned.
template <int D>
struct FwdTraits {
  static constexpr int kD = D;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = D <= 128 ? 128 : 64;  // d = 256: the O accumulator takes 128 registers
  static constexpr int kStages = 2;
  static constexpr int kThreads = 384;  // warpgroup 0 loads, 1 and 2 compute
  static constexpr int kQBytes = kBlockM * D * 2;
  // O leaves through shared memory, one warpgroup's rows per TMA store: through a buffer of
  // its own up to d = 128, so the next tile's Q loads once the last S GEMM has read Q; at
  // d = 256 (shared memory is short) through the Q tile, once the tile is done.
  static constexpr int kOBoxRows = 64;
  static constexpr bool kOwnO = D <= 128;
  static constexpr int kOBytes = kOwnO ? kBlockM * D * 2 : 0;
  static constexpr int kKVBytes = kBlockN * D * 2;  // one K or V tile
  // Barriers: Q full, Q empty, then K full, V full, K empty, V empty x kStages each (8 bytes
  // each); after them the slot through which the producer names the consumers' next tile.
  static constexpr int kBarBytes = 8 * (2 + 4 * kStages);
  static constexpr int kSlotBytes = 8;
  // Dynamic shared memory: the tiles start at the first 1024-byte boundary (1024 bytes of slack).
  static constexpr int kSmemBytes = 1024 + kQBytes + kOBytes + 2 * kStages * kKVBytes + kBarBytes + kSlotBytes;
  static_assert(D % 64 == 0 && D <= 256, "head dim: a multiple of 64 up to 256");
};

}  // namespace fa3
}  // namespace flashattn
