// Counter-based Philox4x32-10 and the dropout keep decision shared by every backend.
//
// The keying is part of the public contract (flashattn.h, flashattn_plan_set_dropout):
//   key     = (lo32(seed), hi32(seed))
//   counter = (j / 4, i, lo32(offset + b*heads_q + h), hi32(offset + b*heads_q + h))
//   r       = word (j % 4) of Philox4x32-10(counter, key)
//   keep    = r >= threshold, threshold = floor(p * 2^32)
// The CPU backend and the CUDA kernels both include this header, so their masks agree
// bit for bit.
#pragma once
#include <stdint.h>

#include "hostdevice.h"

namespace flashattn {

struct Philox4 {
  uint32_t x[4];
};

FA_HD uint32_t philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
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

// Threshold for keep decisions: an element is kept iff its word r >= threshold.
FA_HD uint32_t dropout_threshold(float p) {
  const double t = static_cast<double>(p) * 4294967296.0;
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
}

// The four random words covering columns 4*(j/4) .. 4*(j/4)+3 of row i of head (b, h).
// head_counter = offset + b*heads_q + h.
FA_HD Philox4 dropout_words(uint64_t seed, uint64_t head_counter, uint32_t i, uint32_t j_div4) {
  return philox4x32_10(j_div4, i, static_cast<uint32_t>(head_counter), static_cast<uint32_t>(head_counter >> 32),
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// The keep decision for one element (b, h, i, j).
FA_HD bool dropout_keep(uint64_t seed, uint64_t offset, uint64_t b, uint64_t heads_q, uint64_t h, uint32_t i,
                        uint32_t j, uint32_t threshold) {
  const Philox4 w = dropout_words(seed, offset + b * heads_q + h, i, j >> 2);
  return w.x[j & 3u] >= threshold;
}

}  // namespace flashattn
