// Tile shapes and shared-memory plan of the FA3-design backward kernel (fa3/bwd_kernel.cuh),
// plain C++ so the host sizes its launch from the same numbers.
#pragma once
#include "hopper/limits.h"

namespace flashattn {
namespace fa3 {

// One CTA per (key block of kBlockN rows, key head, sequence): a producer warpgroup and two
// consumer warpgroups walking query blocks of kBlockM rows whose Q, LSE and Delta arrive in a
// kStages-deep ring, dO in a kDoStages-deep one (the same ring where they are equal). Head dim
// D (= head_dim_qk = head_dim_v) in column blocks of kCols columns, rows of kSwizzle bytes in
// the copy engine's swizzle of that width: a tile of R rows is D / kCols column blocks of R x
// kSwizzle bytes, each 1024-byte aligned. Two ways to split a step between the consumers
// (fa3/bwd_consumer.cuh; bwd_schedule.cuh has each warpgroup's share):
// - by keys (D <= 128): 128 keys, warpgroup c owns keys 64 c .. + 63 and their dK, dV (fp32,
//   2 x D / 2 registers a thread), computes S^T and dP^T for them (64 x kBlockM) and keeps
//   P^T and dS^T in registers as the A operands of dV and dK;
// - by head-dim columns (kSplitD, D > 128, where 2 x D / 2 registers do not fit beside S^T
//   and dP^T): 64 keys, warpgroup c owns dK, dV of all of them in its column blocks
//   (bwd_kv_blocks), computes S^T and dP^T for the 64 keys x its kWgQueries queries, and
//   both halves of P^T and dS^T go to shared memory for dV and dK.
// The fewest queries of any kernel's step (the host lays out the deterministic mode's turn
// counters by it).
constexpr int kBwdMinBlockM = 64;

// Queries per step of head dim d's kernel, for runs without (band false) or with the causal
// mask: S^T and dP^T take kBlockM / 2 registers each beside dK, dV's D. 128 at d = 64 (192
// accumulator registers at the step's peak); 80 at d = 128 unmasked (208, FA3's step: dQ
// transposed, below); 64 elsewhere (under the causal mask a larger step masks more of the
// diagonal's cells for nothing, and FA3 and FA4 keep 64 there too).
constexpr int bwd_block_m(int d, bool band) { return d == 64 ? 128 : d == 128 && !band ? 80 : 64; }

template <int D, int M = bwd_block_m(D, false)>
struct BwdTraits {
  static constexpr int kD = D;
  // The 128-byte swizzle (64 columns) where D is a multiple of 64; else (d = 96) the 64-byte
  // swizzle (32 columns), as the forward's tiles: no padding, no GEMM work on zero columns.
  static constexpr int kSwizzle = D % 64 == 0 ? 128 : 64;
  static constexpr int kCols = kSwizzle / 2;
  static constexpr int kColBlocks = D / kCols;
  static constexpr bool kSplitD = D > 128;
  static_assert(!kSplitD || kCols == 64, "the head-dim split shares out 64-column blocks (dK, dV, dQ pieces)");
  static constexpr int kBlockN = kSplitD ? 64 : 128;  // keys
  static constexpr int kBlockM = M;                   // queries per step (bwd_block_m)
  static_assert(M == bwd_block_m(D, false) || M == bwd_block_m(D, true), "a step of bwd_block_m's");
  // The queries of a warpgroup's S^T and dP^T: all by keys, half with kSplitD.
  static constexpr int kWgQueries = kSplitD ? kBlockM / 2 : kBlockM;
  // kDqByQueries (a 128-query step): each warpgroup computes the dQ of its half of the step's
  // queries, all D columns (64: one piece), from both warpgroups' dS^T; else the step's dQ
  // (64 or 80 queries; kDqTransposed below) goes out in column pieces (bwd_schedule.cuh's
  // bwd_dq_cols).
  static constexpr bool kDqByQueries = kBlockM == 128;
  static_assert(!kDqByQueries || (D == 64 && !kSplitD), "a warpgroup's dQ rows are one 64-column piece");
  // kDqTransposed (an 80-query step, which no 64-row wgmma tile divides): each warpgroup
  // computes dQ^T of its 64 head-dim columns (bwd_dq_col) x the step's queries, M = 64
  // columns from the K tile read MN-major, N = the queries from dS, K = 128 keys; dS is
  // stored query-major for it (bwd_store_ds_rows) and dQ^T staged transposed into the dQ
  // map's boxes (bwd_stage_dq_t).
  static constexpr bool kDqTransposed = kBlockM % 64 != 0;
  static_assert(!kDqTransposed || (D == 128 && kBlockM % 16 == 0), "dQ^T by 64-column halves, queries in k16 steps");
  // The steps whose accumulators pass 192 registers at the peak (S^T, dP^T, dK, dV).
  static constexpr bool kWideStep = kBlockM > 64;
  static constexpr int kStages = 2;
  // At d = 256 a second dO stage (32 KB) does not fit beside K, V, two Q stages, P^T, dS^T
  // and the dQ staging (FA3's choice there too): dO gets its own one-stage ring, released
  // once the step's dV GEMM is done, so the next step's dO loads while dQ and dK run.
  static constexpr int kDoStages = D == 256 ? 1 : kStages;
  static constexpr bool kSeparateDo = kDoStages != kStages;
  static_assert(!kSeparateDo || kSplitD, "a separate dO ring is waited on by the head-dim-split step only");
  static constexpr int kThreads = 384;  // warpgroup 0 loads, 1 and 2 compute
  // setmaxnreg: the CTA's pool is the registers of its launch, 168 a thread under
  // __launch_bounds__(384, 1); a consumer raising its count waits until the producer's
  // release covers it, forever if it never does. 24 producer registers spill, so 32 and 232;
  // but the 128-query step (S^T, dP^T, dK, dV: 192 accumulator registers) spilled 208 bytes
  // in the consumers at 232 and measured 9-13% slower than 64-query steps; at 24 / 240, with
  // the step's addresses kept in the step (bwd_step), 0.5-3% faster. The 80-query step (208)
  // runs at 24 / 240 too, spill-free in its unmasked step once bwd_step's indices were
  // unsigned (docs/internals/kernels-fa3-backward.md has the spill counts).
  static constexpr int kLaunchRegs = 168, kProducerRegs = kWideStep ? 24 : 32;
  static constexpr int kConsumerRegs = kWideStep ? 240 : 232;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kThreads * kLaunchRegs,
                "the consumers' registers exceed what the producer releases: setmaxnreg.inc would wait forever");
  static constexpr int kQBytes = kBlockM * D * 2;          // one Q or dO tile
  static constexpr int kKVBytes = kBlockN * D * 2;         // the K or the V tile
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;   // dS^T (or dS) of one step (two buffers)
  static constexpr int kPtBytes = kSplitD ? kDsBytes : 0;  // P^T of one step (two buffers; kSplitD only)
  static constexpr int kRowBytes = kBlockM * 4;            // LSE (base 2) or Delta of one step's queries
  // dQ of a step (64 x D; kDqByQueries 128 x 64, a 64-row half a warpgroup; kDqTransposed
  // 80 x 128) in pieces of up to 64 columns, each computed by one warpgroup
  // (bwd_schedule.cuh's bwd_dq_cols).
  // kSplitD: warpgroup 0 owns the first kHiBlocks column blocks of dK and dV and computes
  // the first kLoBlocks dQ pieces of every step, warpgroup 1 the rest (at d = 192 two and
  // one of dK, dV's, one and two of dQ's).
  static constexpr int kHiBlocks = (kColBlocks + 1) / 2, kLoBlocks = kColBlocks / 2;
  // The most pieces a warpgroup stages in one step (one after the other in its buffer).
  static constexpr int kDqSlots = kSplitD ? kHiBlocks : 1;
  // A piece staged in shared memory for the copy engine's reduce-add into the fp32 dQ
  // accumulator (one buffer per consumer warpgroup): two boxes of 32 columns (128 bytes, the
  // widest row of the 128-byte swizzle) x kDqRows rows (64; kDqTransposed the step's
  // queries), each 1024-byte aligned.
  static constexpr int kDqBoxCols = 32;
  static constexpr int kDqRows = kDqTransposed ? kBlockM : 64;
  static constexpr int kDqBoxBytes = kDqRows * kDqBoxCols * 4;
  static constexpr int kDqStageBytes = 2 * kDqBoxBytes;
  // Barriers: K/V full, Q full and Q empty x kStages, (kSeparateDo) dO full and dO empty x
  // kDoStages (8 bytes each).
  static constexpr int kBarBytes = 8 * (1 + 2 * kStages + (kSeparateDo ? 2 * kDoStages : 0));
  // Dynamic shared memory: K, V, the Q and dO rings, two dS^T (and kSplitD P^T) buffers, two dQ
  // staging buffers, LSE and Delta rings, barriers; the tiles start at the first 1024-byte
  // boundary (1024 bytes of slack).
  static constexpr int kSmemBytes = 1024 + 2 * kKVBytes + (kStages + kDoStages) * kQBytes + 2 * kDsBytes +
                                    2 * kPtBytes + 2 * kDqStageBytes + 2 * kStages * kRowBytes + kBarBytes;
  static_assert(kSmemBytes <= hopper::kSmemLimit, "over the dynamic shared memory a CTA may have on sm_90");
  static_assert(D == 64 || D == 96 || D == 128 || D == 192 || D == 256, "head dim 64, 96, 128, 192 or 256");
  static_assert(kBlockM == kDqRows * (kDqByQueries ? 2 : 1), "a dQ piece holds a warpgroup's rows of the step");
  static_assert(kBlockM >= kBwdMinBlockM, "the turn counters are laid out by the smallest step");
};

}  // namespace fa3
}  // namespace flashattn
