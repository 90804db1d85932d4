// Tile shapes and shared-memory plan of the FA3-design backward kernel (fa3/bwd_kernel.cuh),
// plain C++ so the host sizes its launch from the same numbers.
#pragma once

namespace flashattn {
namespace fa3 {

// One CTA per (key block of kBlockN rows, key head, sequence): a producer warpgroup and two
// consumer warpgroups, each owning 64 keys' dK and dV in registers, walking query blocks of
// kBlockM rows whose Q, dO, LSE and Delta arrive in a kStages-deep ring. Head dim D
// (= head_dim_qk = head_dim_v) in 64-column blocks of the 128-byte swizzle: a tile of R rows
// is D / 64 column blocks of R x 128 bytes, each 1024-byte aligned.
template <int D>
struct BwdTraits {
  static constexpr int kD = D;
  static constexpr int kBlockN = 128;  // keys: 64 per consumer warpgroup
  // Queries per step: S^T and dP^T take kBlockM / 2 registers each (128 at d = 64 spills).
  static constexpr int kBlockM = 64;
  static constexpr int kStages = 2;
  static constexpr int kThreads = 384;  // warpgroup 0 loads, 1 and 2 compute
  // setmaxnreg: the CTA's pool is the registers of its launch, 168 a thread under
  // __launch_bounds__(384, 1); a consumer raising its count waits until the producer's
  // release covers it, forever if it never does. 24 producer registers spill, so 32 and 232.
  static constexpr int kLaunchRegs = 168, kProducerRegs = 32, kConsumerRegs = 232;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kThreads * kLaunchRegs,
                "the consumers' registers exceed what the producer releases: setmaxnreg.inc would wait forever");
  static constexpr int kQBytes = kBlockM * D * 2;         // one Q or dO tile
  static constexpr int kKVBytes = kBlockN * D * 2;        // the K or the V tile
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;  // dS^T of one step (two buffers)
  static constexpr int kRowBytes = kBlockM * 4;           // LSE (base 2) or Delta of one step's queries
  // dQ of a step (64 x D) in 64 x 64 pieces (column blocks): at d = 128 warpgroup c takes
  // piece c; at d = 64 the one piece goes to warpgroup it % 2 at step it.
  static constexpr int kDqPieces = D / 64;
  // A piece staged in shared memory for the copy engine's reduce-add into the fp32 dQ
  // accumulator (one buffer per consumer warpgroup): two boxes of 32 columns (128 bytes, the
  // widest row of the 128-byte swizzle) x 64 rows, each 1024-byte aligned.
  static constexpr int kDqBoxCols = 32;
  static constexpr int kDqBoxBytes = kBlockM * kDqBoxCols * 4;
  static constexpr int kDqStageBytes = 2 * kDqBoxBytes;
  // Barriers: K/V full, then Q full and Q empty x kStages (8 bytes each).
  static constexpr int kBarBytes = 8 * (1 + 2 * kStages);
  // Dynamic shared memory: K, V, Q and dO rings, two dS^T buffers, two dQ staging buffers,
  // LSE and Delta rings, barriers; the tiles start at the first 1024-byte boundary (1024
  // bytes of slack).
  static constexpr int kSmemBytes = 1024 + 2 * kKVBytes + 2 * kStages * kQBytes + 2 * kDsBytes + 2 * kDqStageBytes +
                                    2 * kStages * kRowBytes + kBarBytes;
  static_assert(kSmemBytes <= 227 * 1024, "over the 227 KB of dynamic shared memory a CTA may have on sm_90");
  static_assert(D == 64 || D == 128, "head dim 64 or 128");
  static_assert(kBlockM == 64, "one 64-row wgmma tile of dQ");
};

}  // namespace fa3
}  // namespace flashattn
