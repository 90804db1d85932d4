// Per-CTA state of the FA2-design backward main kernel (BwdCtx, in shared memory) with its
// accessors, and the kernel's TMA-map parameters.
#pragma once
#include <stdint.h>

#include <type_traits>

#include "common/tensor_map.h"
#include "fa2/mma.cuh"

namespace flashattn {
namespace fa2 {

// Per-CTA scalars, kept in shared memory and re-read (volatile) where they are used: in
// registers they would stay live across the whole main loop next to the dK/dV
// accumulators and push the kernel into spills.
struct BwdCtx {
  int64_t q_tok0, k_tok0;  // first token of the sequence (varlen), else 0
  int len_q, len_k;        // sequence lengths
  int n0, n_valid;         // first key of the block, keys in it
  int shift;               // aligned row i' = i + shift
  int m_lo, m_hi, n_mb;    // q-blocks seeing this k-block under the band mask; q-blocks of the sequence
  int band_lo, band_hi;    // keep j iff i + band_lo <= j <= i + band_hi (clamped)
  int b, hk, n_blk;
  // SCHED (sm_90): q-blocks in [m_un_lo, m_un_hi) need no element mask; simple = 1 if
  // the next tile is always the next q-block (no layout, not deterministic).
  int m_un_lo, m_un_hi, simple;
  // SCHED2 (block-sparse layout, not deterministic): the states of q-blocks
  // [win_base, win_base + kWinTiles) of relative head win_hi as two bitmaps, "computed"
  // (win_act) and "needs the element mask" (win_msk); win_hi = -1 before the first window.
  int win_base, win_hi;
  uint32_t win_act[32], win_msk[32];
  // LD4 (sm_90): Q and dO rows of head hk * group (row 0 of the sequence), the LSE/Delta
  // index of that row and the index step from one head to the next.
  const void* q_row0;
  const void* do_row0;
  int64_t lse_row0, lse_hstep;
  // TMA (kTmaQdo): per stage the mbarrier its Q/dO copies complete on, whether the tile in
  // it came that way ((parity of the phase to wait for) << 1 | 1, else 0), and how often
  // the barrier was used (thread 0's bookkeeping).
  uint64_t tma_bar[2];
  int tma_state[2], tma_uses[2];
  // SKEW_: per stage, completes a phase when every thread's cp.async into it (Q/dO not by
  // the copy engine) has landed; SKEW_ = 1: completes a phase when every thread has done
  // its last P/dS read of a step.
  uint64_t cpa_bar[2];
  uint64_t free_bar;
};

// The main kernel's BwdCtx (a static shared variable, so that the kernel's steps address it
// as the kernel itself does: by its shared-memory symbol, not through a pointer).
__device__ __forceinline__ BwdCtx& bwd_ctx() {
  __shared__ BwdCtx ctx;
  return ctx;
}
__device__ __forceinline__ int bwd_lds(const int& x) {
  int v;
  asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(v) : "r"(smem_u32(&x)));
  return v;
}
__device__ __forceinline__ int64_t bwd_lds64(const int64_t& x) {
  int64_t v;
  asm volatile("ld.shared.s64 %0, [%1];\n" : "=l"(v) : "r"(smem_u32(&x)));
  return v;
}
template <typename P>
__device__ __forceinline__ const P* bwd_ldsp(const void* const& x) {
  uint64_t v;
  asm volatile("ld.shared.u64 %0, [%1];\n" : "=l"(v) : "r"(smem_u32(&x)));
  return reinterpret_cast<const P*>(v);
}

// The main kernel's TMA-map parameter: the map for kernels with kDqBulk, a placeholder
// word for the others.
struct NoDqMap {
  int unused;
};
template <class Tr>
using DqMapParam = std::conditional_t<Tr::kDqBulk, TensorMap128, NoDqMap>;
// Likewise the maps of Q and dO (kTmaQdo).
struct QdoMaps {
  TensorMap128 q, dout;
};
template <class Tr>
using QdoMapParam = std::conditional_t<Tr::kTmaQdo, QdoMaps, NoDqMap>;

}  // namespace fa2
}  // namespace flashattn
