// Helpers shared by reference.cpp (fp64) and reference_lowp.cpp (same precision): index
// arithmetic of the expanded bias and of its broadcast groups, the additive bias and the
// dropout scale.
// Internal to fa_reference.
#pragma once
#include <stdint.h>
#include <stdlib.h>

#include <limits>
#include <vector>

#include "common/philox.h"
#include "reference.hpp"

namespace fat {
namespace refdetail {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Index of (b, h, i, j) in the expanded bias [batch][heads_q][max_sq][max_sk].
inline int64_t bias_index(const RefSpec& s, int64_t b, int64_t h, int64_t i, int64_t j) {
  return ((b * s.heads_q + h) * s.max_sq + i) * s.max_sk + j;
}

// Index of the broadcast group (b, h, i, j) belongs to, in the reduced bias shape.
inline int64_t group_index(const RefSpec& s, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t nh = s.bias_bcast[1] ? 1 : s.heads_q;
  const int64_t ni = s.bias_bcast[2] ? 1 : s.max_sq, nj = s.bias_bcast[3] ? 1 : s.max_sk;
  const int64_t bb = s.bias_bcast[0] ? 0 : b, hh = s.bias_bcast[1] ? 0 : h;
  const int64_t ii = s.bias_bcast[2] ? 0 : i, jj = s.bias_bcast[3] ? 0 : j;
  return ((bb * nh + hh) * ni + ii) * nj + jj;
}

inline int64_t group_count(const RefSpec& s) {
  return (s.bias_bcast[0] ? 1 : s.batch) * (s.bias_bcast[1] ? 1 : s.heads_q) * (s.bias_bcast[2] ? 1 : s.max_sq) *
         (s.bias_bcast[3] ? 1 : s.max_sk);
}

// ALiBi slope of sequence b, head h: slopes are [heads_q] (shared) or [batch][heads_q].
inline double ref_slope(const RefSpec& s, int64_t b, int64_t h) {
  return s.slopes[static_cast<size_t>(static_cast<int64_t>(s.slopes.size()) == s.heads_q ? h : b * s.heads_q + h)];
}

// Additive bias (tensor or ALiBi) in double; 0 without bias.
inline double ref_bias(const RefSpec& s, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t ip = i + (s.align == 1 ? s.len_k(b) - s.len_q(b) : 0);
  switch (s.bias_kind) {
    case 1: return s.bias[bias_index(s, b, h, i, j)];
    case 2: return ref_slope(s, b, h) * static_cast<double>(j - ip);
    case 3: return -ref_slope(s, b, h) * static_cast<double>(llabs(ip - j));
    default: return 0.0;
  }
}

// The multiplier of kept values, 65536 / (65536 - t) (1 without dropout).
inline double dropout_scale(const RefSpec& s) {
  return flashattn::dropout_keep_scale(flashattn::dropout_threshold(s.p_drop));
}

// The expanded [batch][heads_q][max_sq][max_sk] tensor whose every element holds its
// broadcast group's value in `reduced`.
void expand_dbias(const RefSpec& s, const std::vector<double>& reduced, std::vector<double>& out);

}  // namespace refdetail
}  // namespace fat
