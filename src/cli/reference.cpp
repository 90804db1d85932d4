#include "reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

namespace facli {

void reference_philox(const uint32_t c[4], const uint32_t k[2], uint32_t out[4]) {
  uint32_t x0 = c[0], x1 = c[1], x2 = c[2], x3 = c[3];
  uint32_t k0 = k[0], k1 = k[1];
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * x0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * x2;
    const uint32_t y0 = static_cast<uint32_t>(p1 >> 32) ^ x1 ^ k0;
    const uint32_t y1 = static_cast<uint32_t>(p1);
    const uint32_t y2 = static_cast<uint32_t>(p0 >> 32) ^ x3 ^ k1;
    const uint32_t y3 = static_cast<uint32_t>(p0);
    x0 = y0;
    x1 = y1;
    x2 = y2;
    x3 = y3;
    k0 += 0x9E3779B9u;  // Weyl key schedule
    k1 += 0xBB67AE85u;
  }
  out[0] = x0;
  out[1] = x1;
  out[2] = x2;
  out[3] = x3;
}

bool reference_dropout_keep(uint64_t seed, uint64_t offset, int64_t b, int64_t heads_q, int64_t h, int64_t i,
                            int64_t j, float p) {
  const uint64_t head = offset + static_cast<uint64_t>(b) * static_cast<uint64_t>(heads_q) + static_cast<uint64_t>(h);
  const uint32_t c[4] = {static_cast<uint32_t>(j / 4), static_cast<uint32_t>(i), static_cast<uint32_t>(head),
                         static_cast<uint32_t>(head >> 32)};
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  uint32_t r[4];
  reference_philox(c, key, r);
  const double threshold = std::floor(static_cast<double>(p) * 4294967296.0);
  return static_cast<double>(r[j % 4]) >= threshold;
}

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct Dims {
  int64_t B, SQ, SK, HQ, HKV, D, DV, group;
  explicit Dims(const Problem& p)
      : B(p.batch), SQ(p.seqlen_q), SK(p.seqlen_k), HQ(p.heads_q), HKV(p.heads_kv), D(p.head_dim),
        DV(p.head_dim_v), group(p.heads_q / p.heads_kv) {}
  size_t q(int64_t b, int64_t i, int64_t h) const { return static_cast<size_t>(((b * SQ + i) * HQ + h) * D); }
  size_t o(int64_t b, int64_t i, int64_t h) const { return static_cast<size_t>(((b * SQ + i) * HQ + h) * DV); }
  size_t k(int64_t b, int64_t j, int64_t h) const { return static_cast<size_t>(((b * SK + j) * HKV + h) * D); }
  size_t v(int64_t b, int64_t j, int64_t h) const { return static_cast<size_t>(((b * SK + j) * HKV + h) * DV); }
  size_t lse(int64_t b, int64_t h, int64_t i) const { return static_cast<size_t>((b * HQ + h) * SQ + i); }
};

// Whether (i, j) of query head h is attended (band mask and block-sparse layout).
bool attended(const Problem& p, int64_t h, int64_t i, int64_t j) {
  const int64_t ip = i + (p.align == FLASHATTN_ALIGN_BOTTOM_RIGHT ? p.seqlen_k - p.seqlen_q : 0);
  if (p.has_band) {
    if (p.window_right >= 0 && j > ip + p.window_right) return false;
    if (p.window_left >= 0 && j < ip - p.window_left) return false;
  }
  if (!p.layout_blocks.empty()) {
    const int64_t blk = (h * p.row_blocks() + i / Problem::kSparseBlock) * p.col_blocks() + j / Problem::kSparseBlock;
    if (!p.layout_blocks[static_cast<size_t>(blk)]) return false;
  }
  return true;
}

// Scores of row i for query head h: s[j] (kNegInf where masked) and, for the backward,
// dsdx[j] = d s / d (scale * q.k) (the softcap derivative; 1 without softcap).
// Returns false when every key is masked.
bool row_scores(const Problem& p, const Dims& d, const std::vector<double>& q, const std::vector<double>& k,
                int64_t b, int64_t h, int64_t i, double* s, double* dsdx) {
  const int64_t hk = h / d.group;
  const double scale = p.scale();
  const double cap = p.softcap;
  const int64_t ip = i + (p.align == FLASHATTN_ALIGN_BOTTOM_RIGHT ? p.seqlen_k - p.seqlen_q : 0);
  const double slope = p.alibi_slopes.empty() ? 0.0 : static_cast<double>(p.alibi_slopes[static_cast<size_t>(h)]);
  const double* qi = &q[d.q(b, i, h)];
  bool any = false;
  for (int64_t j = 0; j < d.SK; ++j) {
    if (!attended(p, h, i, j)) {
      s[j] = kNegInf;
      dsdx[j] = 0.0;
      continue;
    }
    const double* kj = &k[d.k(b, j, hk)];
    double dot = 0.0;
    for (int64_t x = 0; x < d.D; ++x) dot += qi[x] * kj[x];
    double sc = scale * dot;
    double deriv = 1.0;
    if (cap > 0.0) {
      const double t = std::tanh(sc / cap);
      sc = cap * t;
      deriv = 1.0 - t * t;
    }
    if (p.alibi == FLASHATTN_BIAS_ALIBI) sc += slope * static_cast<double>(j - ip);
    if (p.alibi == FLASHATTN_BIAS_ALIBI_SYMMETRIC) sc -= slope * static_cast<double>(std::llabs(ip - j));
    s[j] = sc;
    dsdx[j] = deriv;
    any = true;
  }
  return any;
}

// Normalized probabilities of a row with its LSE; returns the LSE (kNegInf if empty).
double softmax_row(int64_t n, const double* s, double* prob) {
  double m = kNegInf;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, s[j]);
  if (m == kNegInf) {
    std::fill(prob, prob + n, 0.0);
    return kNegInf;
  }
  double l = 0.0;
  for (int64_t j = 0; j < n; ++j) l += s[j] == kNegInf ? 0.0 : std::exp(s[j] - m);
  const double lse = m + std::log(l);
  for (int64_t j = 0; j < n; ++j) prob[j] = s[j] == kNegInf ? 0.0 : std::exp(s[j] - lse);
  return lse;
}

// Runs fn(b, hk) for every (batch, kv head) pair on a few threads. A task owns every
// query head of its group, so it is the only writer of its dK/dV rows and dQ/O rows.
template <class Fn>
void for_each_group(const Dims& d, Fn fn) {
  const int64_t tasks = d.B * d.HKV;
  const int64_t nt = std::max<int64_t>(1, std::min<int64_t>(tasks, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < nt; ++t)
    pool.emplace_back([&, t] {
      for (int64_t task = t; task < tasks; task += nt) fn(task / d.HKV, task % d.HKV);
    });
  for (auto& th : pool) th.join();
}

}  // namespace

void reference_forward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                       const std::vector<double>& v, RefOutputs* out) {
  const Dims d(p);
  out->o.assign(static_cast<size_t>(d.B * d.SQ * d.HQ * d.DV), 0.0);
  out->lse.assign(static_cast<size_t>(d.B * d.HQ * d.SQ), kNegInf);
  const double rp = p.dropout > 0.f ? 1.0 / (1.0 - static_cast<double>(p.dropout)) : 1.0;
  for_each_group(d, [&](int64_t b, int64_t hk) {
    std::vector<double> s(static_cast<size_t>(d.SK)), dsdx(s.size()), prob(s.size());
    for (int64_t h = hk * d.group; h < (hk + 1) * d.group; ++h)
      for (int64_t i = 0; i < d.SQ; ++i) {
        row_scores(p, d, q, k, b, h, i, s.data(), dsdx.data());
        const double lse = softmax_row(d.SK, s.data(), prob.data());
        out->lse[d.lse(b, h, i)] = lse;
        double* oi = &out->o[d.o(b, i, h)];
        for (int64_t j = 0; j < d.SK; ++j) {
          if (prob[j] == 0.0) continue;
          double pj = prob[j];
          if (p.dropout > 0.f) pj = reference_dropout_keep(p.seed, 0, b, d.HQ, h, i, j, p.dropout) ? pj * rp : 0.0;
          const double* vj = &v[d.v(b, j, hk)];
          for (int64_t x = 0; x < d.DV; ++x) oi[x] += pj * vj[x];
        }
      }
  });
}

void reference_backward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                        const std::vector<double>& v, const std::vector<double>& dout, RefOutputs* out) {
  const Dims d(p);
  out->dq.assign(q.size(), 0.0);
  out->dk.assign(k.size(), 0.0);
  out->dv.assign(v.size(), 0.0);
  const double rp = p.dropout > 0.f ? 1.0 / (1.0 - static_cast<double>(p.dropout)) : 1.0;
  const double scale = p.scale();
  for_each_group(d, [&](int64_t b, int64_t hk) {
    std::vector<double> s(static_cast<size_t>(d.SK)), dsdx(s.size()), prob(s.size()), dp(s.size());
    for (int64_t h = hk * d.group; h < (hk + 1) * d.group; ++h)
      for (int64_t i = 0; i < d.SQ; ++i) {
        if (!row_scores(p, d, q, k, b, h, i, s.data(), dsdx.data())) continue;  // zero gradients
        softmax_row(d.SK, s.data(), prob.data());
        const double* doi = &dout[d.o(b, i, h)];
        const double* oi = &out->o[d.o(b, i, h)];
        // Delta_i = dO_i . O_i = sum_j P_ij dP_ij.
        double delta = 0.0;
        for (int64_t x = 0; x < d.DV; ++x) delta += doi[x] * oi[x];
        for (int64_t j = 0; j < d.SK; ++j) {
          if (prob[j] == 0.0) {
            dp[j] = 0.0;
            continue;
          }
          // Z_ij: the dropout factor (0 or 1/(1-p)) applied to P_ij in the forward.
          double z = 1.0;
          if (p.dropout > 0.f) z = reference_dropout_keep(p.seed, 0, b, d.HQ, h, i, j, p.dropout) ? rp : 0.0;
          const double* vj = &v[d.v(b, j, hk)];
          double* dvj = &out->dv[d.v(b, j, hk)];
          double dot = 0.0;
          for (int64_t x = 0; x < d.DV; ++x) {
            dot += doi[x] * vj[x];
            dvj[x] += prob[j] * z * doi[x];
          }
          dp[j] = dot * z;
        }
        const double* qi = &q[d.q(b, i, h)];
        double* dqi = &out->dq[d.q(b, i, h)];
        for (int64_t j = 0; j < d.SK; ++j) {
          if (prob[j] == 0.0) continue;
          // dL/d(scale*q.k) = P (dP - Delta) * softcap derivative; then chain through scale.
          const double g = prob[j] * (dp[j] - delta) * dsdx[j] * scale;
          const double* kj = &k[d.k(b, j, hk)];
          double* dkj = &out->dk[d.k(b, j, hk)];
          for (int64_t x = 0; x < d.D; ++x) {
            dqi[x] += g * kj[x];
            dkj[x] += g * qi[x];
          }
        }
      }
  });
}

}  // namespace facli
