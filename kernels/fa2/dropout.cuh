// Dropout keep decisions for the register fragments of mma.m16n8 accumulators (fa2 forward
// and backward): which elements of one m16 tile's row pair, across n8 tiles, are dropped.
#pragma once
#include <stdint.h>

#include <type_traits>

#include "common/philox.h"

namespace flashattn {
namespace fa2 {

// Bit 4 nt + e is set iff element e of n8 tile nt is dropped.
template <int kNT>
using DropBits = typename std::conditional<(kNT > 8), uint64_t, uint32_t>::type;

// The dropped elements of thread (g, t): element e of n8 tile nt sits at row
// row_g + 8 (e >> 1), column col0 + 8 nt + 2 t + (e & 1) of head head_ctr's score matrix
// (common/philox.h). Lanes t and t ^ 1 share one 4-column Philox group: each computes the
// words of one of the two rows (row_g for even t, row_g + 8 for odd) and they swap the
// halves the other needs, so a thread makes one Philox call per n8 tile. kUnroll: the
// calls the loop may keep in flight (registers beside the caller's accumulators).
template <int kNT, int kUnroll>
__device__ __forceinline__ DropBits<kNT> dropout_drop_bits(uint64_t seed, uint64_t head_ctr, uint32_t row_g,
                                                           uint32_t col0, int t, uint32_t threshold) {
  static_assert(kNT <= 16, "the dropout bit mask holds 16 n8 tiles");
  const uint32_t i_own = row_g + static_cast<uint32_t>(t & 1) * 8;
  DropBits<kNT> bits = 0;
#pragma unroll kUnroll
  for (int nt = 0; nt < kNT; ++nt) {
    const uint32_t j4 = ((col0 + static_cast<uint32_t>(nt) * 8) >> 2) + static_cast<uint32_t>(t >> 1);
    const Philox4 w = dropout_words(seed, head_ctr, i_own, j4);
    const uint32_t send0 = (t & 1) ? w.x[0] : w.x[2];
    const uint32_t send1 = (t & 1) ? w.x[1] : w.x[3];
    const uint32_t recv0 = __shfl_xor_sync(0xffffffffu, send0, 1);
    const uint32_t recv1 = __shfl_xor_sync(0xffffffffu, send1, 1);
    const uint32_t r00 = (t & 1) ? recv0 : w.x[0];  // row g, col 2t
    const uint32_t r01 = (t & 1) ? recv1 : w.x[1];  // row g, col 2t+1
    const uint32_t r10 = (t & 1) ? w.x[2] : recv0;  // row g+8, col 2t
    const uint32_t r11 = (t & 1) ? w.x[3] : recv1;  // row g+8, col 2t+1
    const uint32_t f = (r00 < threshold ? 1u : 0u) | (r01 < threshold ? 2u : 0u) | (r10 < threshold ? 4u : 0u) |
                       (r11 < threshold ? 8u : 0u);
    bits |= static_cast<DropBits<kNT>>(f) << (4 * nt);
  }
  return bits;
}

}  // namespace fa2
}  // namespace flashattn
