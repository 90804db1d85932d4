// Counter-based Philox4x32-10 and the dropout keep decision shared by every backend.
//
// The keying is part of the public contract (flashattn.h, flashattn_plan_set_dropout):
//   key     = (lo32(seed), hi32(seed))
//   counter = (j / 8, i, lo32(offset + b*heads_q + h), hi32(offset + b*heads_q + h))
//   (w0, w1, w2, w3) = Philox4x32-10(counter, key)
//   r       = (w[(j % 8) / 2] >> (16 * (j % 2))) & 0xFFFF   (halfword j % 8, low half first)
//   keep    = r >= t, t = min(floor(p * 65536 + 1/2), 65535)
//   kept values are scaled by 65536 / (65536 - t), the reciprocal of the keep probability
// The CPU backend and the CUDA kernels both include this header, so their masks agree
// bit for bit.
#pragma once
#include <stdint.h>

#include "hostdevice.h"

namespace flashattn {

struct Philox4 {
  uint32_t x[4];
};

// The 64-bit product a * b: its high word in *hi, its low word returned. Device code asks for
// the two words as 32-bit multiplies (which ptxas issues as one IMAD.WIDE.U32): written as a
// 64-bit product, ptxas added a register to each high word in the kernels' dropout code (one
// VIADD per multiply, a sixth of its instructions).
FA_HD uint32_t philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
#if defined(__CUDA_ARCH__)
  *hi = __umulhi(a, b);
  return a * b;
#else
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
#endif
}

// Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
FA_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = philox_mulhilo(kM0, c0, &hi0);
    const uint32_t lo1 = philox_mulhilo(kM1, c2, &hi1);
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  Philox4 r;
  r.x[0] = c0;
  r.x[1] = c1;
  r.x[2] = c2;
  r.x[3] = c3;
  return r;
}

// The 16-bit keep threshold of drop probability p in [0, 1): p * 65536 rounded to the
// nearest integer (halves up; p * 65536 is exact in double), at most 65535 so that one
// value in 65536 is always kept. An element is kept iff its 16-bit r >= threshold.
FA_HD uint32_t dropout_threshold(float p) {
  const double t = static_cast<double>(p) * 65536.0 + 0.5;
  return t >= 65535.0 ? 65535u : static_cast<uint32_t>(t);
}

// Whether dropout at this threshold drops anything: not at 0 (p < 2^-17, p = 0 included),
// where every element is kept and scaled by 1. Every backend and the references gate their
// dropout work on this, so such a p gives the p = 0 result bit for bit.
FA_HD bool dropout_active(uint32_t threshold) { return threshold != 0; }

// The multiplier of kept values: 65536 / (65536 - threshold), the reciprocal of the exact
// keep probability, so that dropout leaves every expectation unchanged (1 for p = 0).
FA_HD double dropout_keep_scale(uint32_t threshold) { return 65536.0 / (65536.0 - static_cast<double>(threshold)); }

// The four random words (eight 16-bit values) covering columns 8*(j/8) .. 8*(j/8)+7 of
// row i of head (b, h). head_counter = offset + b*heads_q + h.
FA_HD Philox4 dropout_words8(uint64_t seed, uint64_t head_counter, uint32_t i, uint32_t j_div8) {
  return philox4x32_10(j_div8, i, static_cast<uint32_t>(head_counter), static_cast<uint32_t>(head_counter >> 32),
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// The 16-bit value r of column 8*(j/8) + c (c = j % 8) in dropout_words8's result: halfword c,
// the low half of a word first. Selects rather than an indexed array (which device code
// would keep in local memory).
FA_HD uint32_t dropout_halfword(const Philox4& w, uint32_t c) {
  const uint32_t k = (c >> 1) & 3u;
  const uint32_t word = k == 0 ? w.x[0] : k == 1 ? w.x[1] : k == 2 ? w.x[2] : w.x[3];
  return (word >> (16u * (c & 1u))) & 0xFFFFu;
}

// The keep decision for one element (b, h, i, j).
FA_HD bool dropout_keep(uint64_t seed, uint64_t offset, uint64_t b, uint64_t heads_q, uint64_t h, uint32_t i,
                        uint32_t j, uint32_t threshold) {
  const Philox4 w = dropout_words8(seed, offset + b * heads_q + h, i, j >> 3);
  return dropout_halfword(w, j & 7u) >= threshold;
}

}  // namespace flashattn
