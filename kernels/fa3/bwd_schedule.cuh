// The work of one CTA of the FA3-design backward and the order it walks it in, shared by
// the producer and the consumers (both must walk the same steps), and the kernel's
// shared-memory layout.
#pragma once
#include <stdint.h>

#include "common/params.h"
#include "fa3/bwd_traits.h"

namespace flashattn {
namespace fa3 {

// Addresses (shared space) of the tiles and barriers of BwdTraits' plan, from the first
// 1024-byte boundary of the dynamic shared memory.
template <class Cfg>
struct BwdSmem {
  uint32_t base;
  __device__ uint32_t k() const { return base; }
  __device__ uint32_t v() const { return base + Cfg::kKVBytes; }
  __device__ uint32_t q(int s) const { return base + 2 * Cfg::kKVBytes + s * Cfg::kQBytes; }
  __device__ uint32_t dout(int s) const { return q(Cfg::kStages) + s * Cfg::kQBytes; }
  __device__ uint32_t ds(int buf) const { return dout(Cfg::kDoStages) + buf * Cfg::kDsBytes; }
  __device__ uint32_t pt(int buf) const { return ds(2) + buf * Cfg::kPtBytes; }
  __device__ uint32_t dq(int cw) const { return pt(2) + cw * Cfg::kDqStageBytes; }
  __device__ uint32_t lse(int s) const { return dq(2) + s * Cfg::kRowBytes; }
  __device__ uint32_t delta(int s) const { return lse(Cfg::kStages) + s * Cfg::kRowBytes; }
  __device__ uint32_t kv_full() const { return delta(Cfg::kStages); }
  __device__ uint32_t q_full(int s) const { return kv_full() + 8u * (1 + s); }
  __device__ uint32_t q_empty(int s) const { return kv_full() + 8u * (1 + Cfg::kStages + s); }
  __device__ uint32_t do_full(int s) const { return kv_full() + 8u * (1 + 2 * Cfg::kStages + s); }
  __device__ uint32_t do_empty(int s) const { return kv_full() + 8u * (1 + 2 * Cfg::kStages + Cfg::kDoStages + s); }
};

// Step it of the walk uses stage it % kN of a kN-stage ring, in that stage's use number
// it / kN: the Q ring (kStages, also LSE, Delta and, unless Cfg::kSeparateDo, dO), or the
// dO ring (kDoStages).
template <class Cfg, int kN = Cfg::kStages>
__device__ __forceinline__ int bwd_stage(int it) {
  return it % kN;
}
template <class Cfg, int kN = Cfg::kStages>
__device__ __forceinline__ uint32_t bwd_parity(int it) {
  return static_cast<uint32_t>(it / kN) & 1u;
}

// The CTA's keys n0 .. n0 + kBlockN - 1 of key head kvh in sequence b, and its walk: for each
// query head of the GQA group (kvh * group ..), the query blocks m_first .. tiles_m - 1 (under
// the causal mask the blocks before m_first see none of its keys). Key blocks are numbered
// fastest, so the CTAs with the longest causal walks (the first key blocks) start first;
// deterministic causal runs number them last first (bwd_dq_turn says why). Deterministic runs
// without a mask (chain > 1, BwdScratch::chain_groups) number chunks of `chain` (key head,
// sequence) pairs, and within a chunk key block 0 of each pair, then key block 1 of each, ...:
// key block n adds its dQ pieces after key block n - 1's, so it should start about a step
// later. Numbered fastest, a pair's CTAs start together and the later ones hold their SMs
// while they wait; in chunks of about twice the CTAs that start in a step's time (the host's
// choice), each starts as the CTAs of earlier chunks end, a step or more after the one it
// follows (measured in docs/internals/kernels-fa3-backward.md).
struct BwdWork {
  int n0, kvh, b;
  int group;              // query heads per key head
  int m_first, per_head;  // first query block, query blocks per head
  int len_q, len_k, shift;
  __device__ int steps() const { return group * per_head; }
  __device__ int head(int it) const { return kvh * group + it / per_head; }
  template <class Cfg>
  __device__ int m0(int it) const {
    return (m_first + it % per_head) * Cfg::kBlockM;
  }
};

template <class Cfg>
__device__ __forceinline__ BwdWork bwd_work(const AttnParams& p, int chain) {
  BwdWork w;
  w.len_q = static_cast<int>(p.seqlen_q);
  w.len_k = static_cast<int>(p.seqlen_k);
  w.shift = p.align == 1 ? w.len_k - w.len_q : 0;
  const int n_blocks = (w.len_k + Cfg::kBlockN - 1) / Cfg::kBlockN;
  const int cta = static_cast<int>(blockIdx.x);
  int kvh_b = cta / n_blocks, nb = cta % n_blocks;
  if (chain > 1) {
    const int span = chain * n_blocks, first = cta / span * chain, at = cta % span;
    const int pairs = min(chain, static_cast<int>(p.heads_kv * p.batch) - first);  // the last chunk's may be fewer
    kvh_b = first + at % pairs;
    nb = at / pairs;
  }
  w.n0 = (p.deterministic && p.has_band ? n_blocks - 1 - nb : nb) * Cfg::kBlockN;
  w.kvh = kvh_b % static_cast<int>(p.heads_kv);
  w.b = kvh_b / static_cast<int>(p.heads_kv);
  w.group = static_cast<int>(p.heads_q / p.heads_kv);
  const int tiles_m = (w.len_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  // Causal: query i sees key j iff j <= i + shift; the first query that sees key n0 is n0 - shift.
  const int first_q = p.has_band ? max(w.n0 - w.shift, 0) : 0;
  w.m_first = min(first_q / Cfg::kBlockM, tiles_m);
  w.per_head = tiles_m - w.m_first;
  return w;
}

// Deterministic mode: the dQ pieces of query block m of head h in sequence b are added in a
// fixed order of the key blocks, each CTA when the block's turn counter
// (BwdScratch::dq_turns, [batch, heads_q, query blocks of kBlockM rows], zero at launch)
// equals its turn; it passes the turn on once its adds have completed (bwd_reduce_dq). The
// key blocks whose walk includes block m are 0 .. L(m) (unmasked: all; causal: m_first
// grows with the key block, so the blocks with m_first <= m are a prefix); key blocks past
// L(m) never wait on m. The order is fixed by the problem, not by the scheduling:
// - unmasked: ascending, the turn of key block n is n;
// - causal: descending, the turn is L(m) - n with L(m) the key block of the last key that
//   block m's last row sees. A CTA's walk starts at the diagonal (m_first), where it is the
//   last contributor and so the first in the order: it waits only for blocks further down,
//   which the CTAs of the following key blocks took first. In ascending order every CTA
//   would wait for the first key block's whole walk to reach its diagonal (measured on an
//   H100: 1.4-2.2x the plain time under the causal mask).
// No deadlock, whatever number of CTAs is resident: a CTA waits only on CTAs of the same
// (key head, sequence) that come before it in the order, and bwd_work numbers key blocks in
// that same order (descending for deterministic causal runs; ascending within each pair of a
// chunk without a mask), so those CTAs have smaller linear block indices, which the hardware
// dispatches no later. By induction on the index, the lowest unfinished CTA is resident and
// everything it waits for has finished (and passed every turn it took, as each CTA does
// before it exits), so it makes progress.
template <class Cfg>
__device__ __forceinline__ int bwd_dq_turn(const AttnParams& p, const BwdWork& w, int m0) {
  const int n = w.n0 / Cfg::kBlockN;
  if (!p.has_band) return n;
  const int last_row = min(m0 + Cfg::kBlockM, w.len_q) - 1;
  const int last_key = min(last_row + w.shift, w.len_k - 1);
  return last_key / Cfg::kBlockN - n;
}
// The turn counter of step it's query block.
template <class Cfg>
__device__ __forceinline__ int32_t* bwd_dq_counter(int32_t* turns, const AttnParams& p, const BwdWork& w, int it) {
  const int tiles_m = (w.len_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  return turns + (static_cast<int64_t>(w.b) * p.heads_q + w.head(it)) * tiles_m + w.m0<Cfg>(it) / Cfg::kBlockM;
}

// Named barriers (bar.sync / bar.arrive ids; 0 is __syncthreads):
//   kBarDsReady (256 threads): both consumer warpgroups' dS^T (kSplitD: and P^T) of the
//     step are stored; every consumer thread syncs once a step.
//   kBarDqFull + cw (kDqBarThreads): consumer warpgroup cw's dQ piece is staged; its 128
//     threads arrive, the dQ writer warp (32 threads, bwd_reduce_dq) syncs.
//   kBarDqEmpty + cw (kDqBarThreads): staging buffer cw may be written; the writer warp
//     arrives (its bulk reads of the buffer's previous piece are done), the 128 threads of
//     warpgroup cw sync.
//   kBarGrads (256 threads): the epilogue's copy of dK and dV (BwdMaps::grads_by_copy): both
//     consumer warpgroups' walks are done (the K and V tiles are free), then both have
//     stored their share of the gradients there.
// Both dQ barriers complete once per piece of warpgroup cw (bwd_dq_cols), in the same step
// order on both sides.
constexpr int kBarDsReady = 1;
constexpr int kBarDqFull = 2;
constexpr int kBarDqEmpty = 4;
constexpr int kBarGrads = 6;
constexpr int kDqBarThreads = 128 + 32;

// A consumer warpgroup's share of a step. By keys both warpgroups share alike and run the same
// code with their index cw at run time (the template argument kAnyWg where one is taken);
// kSplitD their shares differ in size, and each runs code of its own (cw a constant).
constexpr int kAnyWg = -1;

// The column blocks of dK and dV that warpgroup cw owns, bwd_kv_first .. + bwd_kv_blocks - 1:
// by keys all of them (of its keys); kSplitD the larger half for warpgroup 0.
template <class Cfg>
__host__ __device__ constexpr int bwd_kv_blocks(int cw) {
  return !Cfg::kSplitD ? Cfg::kColBlocks : cw == 0 ? Cfg::kHiBlocks : Cfg::kLoBlocks;
}
template <class Cfg>
__host__ __device__ constexpr int bwd_kv_first(int cw) {
  return Cfg::kSplitD && cw == 1 ? Cfg::kHiBlocks : 0;
}
// kSplitD: the dQ pieces warpgroup cw computes a step, column blocks bwd_dq_first ..
// + bwd_dq_blocks - 1: the larger half of dK, dV goes with the smaller of dQ.
template <class Cfg>
__host__ __device__ constexpr int bwd_dq_blocks(int cw) {
  return cw == 0 ? Cfg::kLoBlocks : Cfg::kHiBlocks;
}
template <class Cfg>
__host__ __device__ constexpr int bwd_dq_first(int cw) {
  return cw == 0 ? 0 : Cfg::kLoBlocks;
}

// The keys (rows of the K and V tiles) and the step's queries (columns of S^T, dP^T; rows of
// the Q and dO tiles) of warpgroup cw's S^T and dP^T, from: 64 keys each by keys, 32 queries
// each with kSplitD.
template <class Cfg>
__device__ __forceinline__ int bwd_wg_key(int cw) {
  return Cfg::kSplitD ? 0 : cw * 64;
}
template <class Cfg>
__device__ __forceinline__ int bwd_wg_query(int cw) {
  return Cfg::kSplitD ? cw * Cfg::kWgQueries : 0;
}

// The dQ piece of slot k (0 .. kDqSlots - 1) of warpgroup cw at step it: columns bwd_dq_col
// .. + bwd_dq_cols - 1 of the step's dQ, none where bwd_dq_cols is 0.
// kDqByQueries (d = 64): all 64 columns, of the warpgroup's queries (bwd_dq_query).
// By keys: at d = 128 columns 64 cw .. + 63; at d = 96 warpgroup it % 2 takes columns 0 ..
// 63 and the other 64 .. 95, so the larger piece alternates (a template argument of the
// step: no wgmma is in flight across a branch on it, which ptxas would serialize, C7520).
// kSplitD: bwd_dq_blocks(cw) pieces of 64 columns from column block bwd_dq_first(cw).
template <class Cfg>
__device__ __forceinline__ int bwd_dq_cols(int it, int cw, int k = 0) {
  if constexpr (Cfg::kSplitD) return k < bwd_dq_blocks<Cfg>(cw) ? 64 : 0;
  else if constexpr (Cfg::kDqByQueries || Cfg::kD == 128) return 64;
  else return cw == it % 2 ? 64 : Cfg::kD - 64;
}
template <class Cfg>
__device__ __forceinline__ int bwd_dq_col(int it, int cw, int k = 0) {
  if constexpr (Cfg::kSplitD) return (bwd_dq_first<Cfg>(cw) + k) * 64;
  else if constexpr (Cfg::kDqByQueries) return 0;
  else if constexpr (Cfg::kD == 128) return cw * 64;
  else return cw == it % 2 ? 0 : 64;
}
// The first of the step's queries in warpgroup cw's dQ pieces: kDqByQueries its half, else
// all of them (kDqRows rows from 0).
template <class Cfg>
__host__ __device__ constexpr int bwd_dq_query(int cw) {
  return Cfg::kDqByQueries ? cw * Cfg::kDqRows : 0;
}

// Whether the step's (query block, key block) pair takes the element mask: queries past
// len_q, keys past len_k, or (causal) a key above the diagonal of the block's first query.
// Uniform per step.
template <class Cfg>
__device__ __forceinline__ bool bwd_needs_mask(const AttnParams& p, const BwdWork& w, int m0) {
  return m0 + Cfg::kBlockM > w.len_q || w.n0 + Cfg::kBlockN > w.len_k ||
         (p.has_band && w.n0 + Cfg::kBlockN - 1 > m0 + w.shift);
}

}  // namespace fa3
}  // namespace flashattn
