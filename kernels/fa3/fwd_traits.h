// Tile shapes and shared-memory plan of the FA3-design forward kernel (fa3/fwd_kernel.cuh),
// plain C++ so the host sizes its launch from the same numbers.
#pragma once

namespace flashattn {
namespace fa3 {

// One CTA: a 128-row query tile, a producer warpgroup and two consumer warpgroups (64 rows
// each), K/V blocks of kBlockN rows in a kStages-deep ring. Head dim D (= head_dim_v) in
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
  static constexpr int kOBoxRows = 64;              // O leaves through the Q tile, one warpgroup's rows per store
  static constexpr int kKVBytes = kBlockN * D * 2;  // one K or V tile
  // Barriers: Q full, then K full, V full, K empty, V empty x kStages each (8 bytes each).
  static constexpr int kBarBytes = 8 * (1 + 4 * kStages);
  // Dynamic shared memory: the tiles start at the first 1024-byte boundary (1024 bytes of slack).
  static constexpr int kSmemBytes = 1024 + kQBytes + 2 * kStages * kKVBytes + kBarBytes;
  static_assert(D % 64 == 0 && D <= 256, "head dim: a multiple of 64 up to 256");
};

}  // namespace fa3
}  // namespace flashattn
