// Tile shapes and shared-memory plan of the FA3-design forward kernel (fa3/fwd_kernel.cuh),
// plain C++ so the host sizes its launch from the same numbers.
#pragma once
#include "hopper/limits.h"

namespace flashattn {
namespace fa3 {

// One CTA per SM, persistent over query tiles of kBlockM rows: a producer warpgroup and
// kConsumers consumer warpgroups (64 rows each), K/V blocks of kBlockN rows in a
// kStages-deep ring. Head dims Dqk (Q, K) and Dv (V, O) in column blocks of kCols columns,
// rows of kSwizzle bytes in the copy engine's swizzle of that width: a tile of R rows and D
// columns is D / kCols column blocks of R x kSwizzle bytes, each 1024-byte aligned. The 128-byte swizzle (64 columns)
// where both head dims are multiples of 64; else (d = 96) the 64-byte swizzle (32 columns):
// the tiles hold exactly the head dim, no padding.
template <int Dqk, int Dv>
struct FwdTraits {
  static constexpr int kDqk = Dqk, kDv = Dv;
  static constexpr int kSwizzle = Dqk % 64 == 0 && Dv % 64 == 0 ? 128 : 64;
  static constexpr int kCols = kSwizzle / 2;
  // Consumer warpgroups: three at d = 64 (192-row tiles, as FA3), where a 128 x 128 block's
  // exponentials take about as long as its two GEMMs and two warpgroups cannot hide one's
  // softmax under the other's GEMMs; two elsewhere, where the O accumulator needs the
  // registers (three warpgroups leave a consumer 160, two 240).
  static constexpr int kConsumers = Dqk <= 64 && Dv <= 64 ? 3 : 2;
  static constexpr int kBlockM = 64 * kConsumers;
  // Key block rows, a multiple of 16 (the k16 steps of O += P V): 128 up to d = 128; 112 at
  // head_dim_qk 192 (the largest that fits shared memory at 192/192, as FA3's 128 x 112; the
  // O accumulator takes 96 registers, S 56, P 28; at 192/128 it leaves room for an O buffer);
  // 64 at d = 256 (the O accumulator takes 128 registers).
  static constexpr int kBlockN = Dv > 192 ? 64 : Dqk > 128 ? 112 : 128;
  static constexpr int kStages = 2;
  static constexpr int kThreads = 128 * (1 + kConsumers);  // warpgroup 0 loads, the others compute
  // setmaxnreg: the producer drops to kProducerRegs, the consumers rise to kConsumerRegs, within
  // the register file of the one CTA per SM (64K registers).
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : 240;
  static constexpr int kQBytes = kBlockM * Dqk * 2;
  static constexpr int kKBytes = kBlockN * Dqk * 2;  // one K tile
  static constexpr int kVBytes = kBlockN * Dv * 2;   // one V tile
  // Barriers: Q full, Q empty, then K full, V full, K empty, V empty x kStages each (8 bytes
  // each); after them the slot through which the producer names the consumers' next tile
  // (its index, first row, head and sequence: 16 bytes).
  static constexpr int kBarBytes = 8 * (2 + 4 * kStages);
  static constexpr int kSlotBytes = 16;
  // Dynamic shared memory but the O buffer: the tiles start at the first 1024-byte boundary
  // (1024 bytes of slack).
  static constexpr int kSmemNoO = 1024 + kQBytes + kStages * (kKBytes + kVBytes) + kBarBytes + kSlotBytes;
  // Q arrives and O leaves one consumer warpgroup's rows per TMA box. O leaves through shared
  // memory: through a buffer of its own wherever one fits (d <= 128, 192/128), so the next
  // tile's Q loads once the last S GEMM has read Q; else (192/192, 256/256) through the Q tile,
  // once the tile is done.
  static constexpr int kBoxRows = 64;
  static constexpr bool kOwnO = kSmemNoO + kBlockM * Dv * 2 <= hopper::kSmemLimit;
  static constexpr int kOBytes = kOwnO ? kBlockM * Dv * 2 : 0;
  static constexpr int kSmemBytes = kSmemNoO + kOBytes;
  static_assert(Dqk % kCols == 0 && Dv % kCols == 0 && Dqk <= 256 && Dv <= 256,
                "head dims: whole column blocks, up to 256");
  static_assert(kBlockN % 16 == 0 && kSmemBytes <= hopper::kSmemLimit,
                "key blocks of whole k16 steps, in shared memory");
  static_assert(kOwnO || Dv <= Dqk, "O through the Q tile: O's columns fit Q's");
  static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <= 64 * 1024 && kConsumerRegs % 8 == 0,
                "setmaxnreg within the register file, in steps of 8");
};

}  // namespace fa3
}  // namespace flashattn
