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
// (common/philox.h). col0 is a multiple of 8, so a row of an n8 tile is exactly one Philox
// call, and the quad of lanes t = 0..3 (one g) needs four calls per pair of n8 tiles: lane
// t makes the call of row row_g + 8 (t & 1) in tile 2k + (t >> 1) of pair k (an odd kNT's
// last tile twice), turns its eight halfwords into a byte of drop bits, and two shuffles
// give every lane of the quad the four bytes, of which it keeps its columns' bits 2t and
// 2t + 1. kUnroll: the calls the loop may keep in flight (registers beside the caller's
// accumulators).
template <int kNT, int kUnroll>
__device__ __forceinline__ DropBits<kNT> dropout_drop_bits(uint64_t seed, uint64_t head_ctr, uint32_t row_g,
                                                           uint32_t col0, int t, uint32_t threshold) {
  static_assert(kNT <= 16, "the dropout bit mask holds 16 n8 tiles");
  const uint32_t i_own = row_g + static_cast<uint32_t>(t & 1) * 8;
  DropBits<kNT> bits = 0;
#pragma unroll kUnroll
  for (int k = 0; k < (kNT + 1) / 2; ++k) {
    const int nt = 2 * k + (t >> 1) < kNT ? 2 * k + (t >> 1) : kNT - 1;
    const Philox4 w = dropout_words8(seed, head_ctr, i_own, (col0 >> 3) + static_cast<uint32_t>(nt));
    // Bit c: column 8 nt + c of row i_own is dropped (dropout_halfword(w, c) < threshold).
    // Word q holds halfwords 2q (low) and 2q + 1 (high): hi < t iff word < t << 16, and
    // lo < t iff word << 16 < t << 16 (t < 2^16), two compares and no extraction.
    const uint32_t t_hi = threshold << 16;
    uint32_t own = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if ((w.x[q] << 16) < t_hi) own |= 1u << (2 * q);
      if (w.x[q] < t_hi) own |= 2u << (2 * q);
    }
    // Byte s: lane s's row (s & 1) of tile 2k + (s >> 1).
    uint32_t quad = own << (8 * t);
    quad |= __shfl_xor_sync(0xffffffffu, quad, 1);
    quad |= __shfl_xor_sync(0xffffffffu, quad, 2);
    const uint32_t mine = (quad >> (2 * t)) & 0x03030303u;  // bits 0, 1 of each byte: columns 2t, 2t + 1
    // Tile 2k: e = 0, 1 from byte 0 (row g), e = 2, 3 from byte 1 (row g + 8); tile 2k + 1: bytes 2, 3.
    const uint32_t f = (mine & 0x3u) | ((mine >> 6) & 0xCu) | ((mine >> 12) & 0x30u) | ((mine >> 18) & 0xC0u);
    bits |= static_cast<DropBits<kNT>>(2 * k + 1 < kNT ? f : f & 0xFu) << (8 * k);
  }
  return bits;
}

}  // namespace fa2
}  // namespace flashattn
