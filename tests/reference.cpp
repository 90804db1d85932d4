// Naive attention references; see reference.hpp. Deliberately simple: one (sequence, head)
// at a time, the full score matrix materialized, no tiling, no online softmax.
#include "reference.hpp"

#include <math.h>

#include <algorithm>
#include <limits>

#include "common/philox.h"

namespace fat {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

int64_t bias_index(const RefSpec& s, int64_t b, int64_t h, int64_t i, int64_t j) {
  return ((b * s.heads_q + h) * s.max_sq + i) * s.max_sk + j;
}

// Index of the broadcast group (b, h, i, j) belongs to, in the reduced bias shape.
int64_t group_index(const RefSpec& s, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t nb = s.bias_bcast[0] ? 1 : s.batch, nh = s.bias_bcast[1] ? 1 : s.heads_q;
  const int64_t ni = s.bias_bcast[2] ? 1 : s.max_sq, nj = s.bias_bcast[3] ? 1 : s.max_sk;
  (void)nb;
  const int64_t bb = s.bias_bcast[0] ? 0 : b, hh = s.bias_bcast[1] ? 0 : h;
  const int64_t ii = s.bias_bcast[2] ? 0 : i, jj = s.bias_bcast[3] ? 0 : j;
  return ((bb * nh + hh) * ni + ii) * nj + jj;
}

int64_t group_count(const RefSpec& s) {
  return (s.bias_bcast[0] ? 1 : s.batch) * (s.bias_bcast[1] ? 1 : s.heads_q) * (s.bias_bcast[2] ? 1 : s.max_sq) *
         (s.bias_bcast[3] ? 1 : s.max_sk);
}

// Additive bias (tensor or ALiBi) in double; 0 without bias.
double ref_bias(const RefSpec& s, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t ip = i + (s.align == 1 ? s.len_k(b) - s.len_q(b) : 0);
  switch (s.bias_kind) {
    case 1: return s.bias[bias_index(s, b, h, i, j)];
    case 2: return s.slopes[h] * static_cast<double>(j - ip);
    case 3: return -s.slopes[h] * static_cast<double>(std::llabs(ip - j));
    default: return 0.0;
  }
}

bool band_and_layout(const RefSpec& s, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (s.band) {
    const int64_t ip = i + (s.align == 1 ? s.len_k(b) - s.len_q(b) : 0);
    if (s.window_right >= 0 && j > ip + s.window_right) return false;
    if (s.window_left >= 0 && j < ip - s.window_left) return false;
  }
  if (!s.layout.empty()) {
    const int64_t lh = s.layout_heads == 1 ? 0 : h;
    if (s.layout[(lh * s.n_row_blocks + i / s.block_q) * s.n_col_blocks + j / s.block_k] == 0) return false;
  }
  return true;
}

double dropout_scale(const RefSpec& s) { return 1.0 / (1.0 - static_cast<double>(s.p_drop)); }

void expand_dbias(const RefSpec& s, const std::vector<double>& reduced, std::vector<double>& out) {
  out.assign(static_cast<size_t>(s.batch * s.heads_q * s.max_sq * s.max_sk), 0.0);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads_q; ++h)
      for (int64_t i = 0; i < s.max_sq; ++i)
        for (int64_t j = 0; j < s.max_sk; ++j) out[bias_index(s, b, h, i, j)] = reduced[group_index(s, b, h, i, j)];
}

}  // namespace

bool ref_dropout_keep(const RefSpec& s, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (s.p_drop == 0.f) return true;
  // keep iff r >= floor(p * 2^32), r from the documented Philox keying.
  const double t = floor(static_cast<double>(s.p_drop) * 4294967296.0);
  const uint32_t threshold = t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
  return flashattn::dropout_keep(s.seed, s.offset, static_cast<uint64_t>(b), static_cast<uint64_t>(s.heads_q),
                                 static_cast<uint64_t>(h), static_cast<uint32_t>(i), static_cast<uint32_t>(j),
                                 threshold);
}

bool ref_allowed(const RefSpec& s, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (!band_and_layout(s, b, h, i, j)) return false;
  return !(s.bias_kind == 1 && s.bias[bias_index(s, b, h, i, j)] == kNegInf);
}

RefOutputs reference_fp64(const RefSpec& s, const RefInputs& in, bool backward) {
  const int64_t HQ = s.heads_q, HKV = s.heads_kv, D = s.head_dim_qk, DV = s.head_dim_v;
  const int64_t group = HQ / HKV;
  const double rpk = dropout_scale(s);
  RefOutputs out;
  out.o.assign(static_cast<size_t>(s.total_q() * HQ * DV), 0.0);
  out.lse.assign(static_cast<size_t>(s.total_q() * HQ), kNegInf);
  out.row_masked.assign(static_cast<size_t>(s.total_q() * HQ), 0);
  out.o_mag.assign(out.o.size(), 0.0);
  std::vector<double> dbias_red, dbias_mag_red;
  if (backward) {
    out.dq.assign(in.q.size(), 0.0);
    out.dk.assign(in.k.size(), 0.0);
    out.dv.assign(in.v.size(), 0.0);
    out.dq_mag.assign(in.q.size(), 0.0);
    out.dk_mag.assign(in.k.size(), 0.0);
    out.dv_mag.assign(in.v.size(), 0.0);
    if (s.bias_kind == 1) {
      dbias_red.assign(static_cast<size_t>(group_count(s)), 0.0);
      dbias_mag_red.assign(dbias_red.size(), 0.0);
    }
  }
  std::vector<double> raw, sc, P, Pd;
  std::vector<uint8_t> ok;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t lq = s.len_q(b), lk = s.len_k(b), tq0 = s.cu_q[b], tk0 = s.cu_k[b];
    for (int64_t h = 0; h < HQ; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < lq; ++i) {
        const double* q = &in.q[((tq0 + i) * HQ + h) * D];
        raw.assign(lk, 0.0);
        sc.assign(lk, kNegInf);
        ok.assign(lk, 0);
        double m = kNegInf;
        for (int64_t j = 0; j < lk; ++j) {
          const double* k = &in.k[((tk0 + j) * HKV + hk) * D];
          double dot = 0.0;
          for (int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
          raw[j] = s.scale * dot;
          if (!ref_allowed(s, b, h, i, j)) continue;
          double x = s.softcap > 0 ? s.softcap * tanh(raw[j] / s.softcap) : raw[j];
          x += ref_bias(s, b, h, i, j);
          ok[j] = 1;
          sc[j] = x;
          m = std::max(m, x);
        }
        const int64_t row = (tq0 + i) * HQ + h;
        if (m == kNegInf) {  // fully masked: O = 0, LSE = -inf, zero gradients
          out.row_masked[row] = 1;
          continue;
        }
        double l = 0.0;
        P.assign(lk, 0.0);
        Pd.assign(lk, 0.0);
        for (int64_t j = 0; j < lk; ++j)
          if (ok[j]) l += (P[j] = exp(sc[j] - m));
        out.lse[row] = m + log(l);
        double* o = &out.o[row * DV];
        for (int64_t j = 0; j < lk; ++j) {
          P[j] /= l;
          Pd[j] = ref_dropout_keep(s, b, h, i, j) ? P[j] * rpk : 0.0;
          const double* v = &in.v[((tk0 + j) * HKV + hk) * DV];
          for (int64_t d = 0; d < DV; ++d) {
            o[d] += Pd[j] * v[d];
            out.o_mag[row * DV + d] += Pd[j] * fabs(v[d]);
          }
        }
        if (!backward) continue;
        // dP = dropout'(dO . V^T); dS = P * (dP - sum_j P dP); chain through bias, softcap, scale.
        const double* dout = &in.dout[row * DV];
        std::vector<double> dP(lk, 0.0), dP_mag(lk, 0.0);
        double Dsum = 0.0, D_mag = 0.0;
        for (int64_t j = 0; j < lk; ++j) {
          if (!ok[j]) continue;
          const double* v = &in.v[((tk0 + j) * HKV + hk) * DV];
          double dpd = 0.0, dpd_mag = 0.0;
          for (int64_t d = 0; d < DV; ++d) {
            dpd += dout[d] * v[d];
            dpd_mag += fabs(dout[d] * v[d]);
          }
          const bool keep = ref_dropout_keep(s, b, h, i, j);
          dP[j] = keep ? dpd * rpk : 0.0;
          dP_mag[j] = keep ? dpd_mag * rpk : 0.0;
          Dsum += P[j] * dP[j];
          D_mag += P[j] * dP_mag[j];
        }
        double* dq = &out.dq[row * D];
        for (int64_t j = 0; j < lk; ++j) {
          if (!ok[j]) continue;
          const double dS = P[j] * (dP[j] - Dsum);
          const double dS_mag = P[j] * (dP_mag[j] + D_mag);
          if (s.bias_kind == 1) {
            dbias_red[group_index(s, b, h, i, j)] += dS;
            dbias_mag_red[group_index(s, b, h, i, j)] += dS_mag;
          }
          double draw = dS, draw_mag = dS_mag;
          if (s.softcap > 0) {
            const double t = tanh(raw[j] / s.softcap);
            draw = dS * (1.0 - t * t);
            draw_mag = dS_mag * (1.0 - t * t);
          }
          const double* k = &in.k[((tk0 + j) * HKV + hk) * D];
          double* dk = &out.dk[((tk0 + j) * HKV + hk) * D];
          double* dv = &out.dv[((tk0 + j) * HKV + hk) * DV];
          double* dk_mag = &out.dk_mag[((tk0 + j) * HKV + hk) * D];
          double* dv_mag = &out.dv_mag[((tk0 + j) * HKV + hk) * DV];
          for (int64_t d = 0; d < D; ++d) {
            dq[d] += s.scale * draw * k[d];
            dk[d] += s.scale * draw * q[d];
            out.dq_mag[row * D + d] += s.scale * draw_mag * fabs(k[d]);
            dk_mag[d] += s.scale * draw_mag * fabs(q[d]);
          }
          for (int64_t d = 0; d < DV; ++d) {
            dv[d] += Pd[j] * dout[d];
            dv_mag[d] += Pd[j] * fabs(dout[d]);
          }
        }
      }
    }
  }
  if (backward && s.bias_kind == 1) {
    expand_dbias(s, dbias_red, out.dbias);
    expand_dbias(s, dbias_mag_red, out.dbias_mag);
  }
  return out;
}

double reference_loss(const RefSpec& s, const RefInputs& in) {
  const RefOutputs r = reference_fp64(s, in, false);
  double loss = 0.0;
  for (size_t n = 0; n < r.o.size(); ++n) loss += r.o[n] * in.dout[n];
  return loss;
}

// ---- same-precision standard attention ----
//
// Mirrors what a naive PyTorch implementation computes in fp16/bf16 (flash-attention's
// tests call it "pt"): q * scale rounded; S = rd(q_s . k) with fp32 accumulation; softcap as
// rd(tanh(rd(S / c))) * c rounded; S + bias rounded; softmax in fp32 rounded to P; dropout
// as P masked and V scaled by 1/(1-p) (rounded); O = rd(P_d . V_s). The backward is what
// autograd does with those ops: every tensor rounded, softmax backward in fp32.
namespace {

float fdot(const double* a, const double* b, int64_t n) {
  float acc = 0.f;
  for (int64_t d = 0; d < n; ++d) acc += static_cast<float>(a[d]) * static_cast<float>(b[d]);
  return acc;
}

}  // namespace

RefOutputs reference_lowp(const RefSpec& s, const RefInputs& in, Rounder rd, bool backward) {
  const int64_t HQ = s.heads_q, HKV = s.heads_kv, D = s.head_dim_qk, DV = s.head_dim_v;
  const int64_t group = HQ / HKV;
  const float rpk_f = static_cast<float>(dropout_scale(s));
  const float scale_f = static_cast<float>(s.scale);
  const float cap = static_cast<float>(s.softcap);
  RefOutputs out;
  out.o.assign(static_cast<size_t>(s.total_q() * HQ * DV), 0.0);
  out.lse.assign(static_cast<size_t>(s.total_q() * HQ), kNegInf);
  out.row_masked.assign(static_cast<size_t>(s.total_q() * HQ), 0);
  std::vector<float> dbias_red;
  if (backward) {
    out.dq.assign(in.q.size(), 0.0);
    out.dk.assign(in.k.size(), 0.0);
    out.dv.assign(in.v.size(), 0.0);
    if (s.bias_kind == 1) dbias_red.assign(static_cast<size_t>(group_count(s)), 0.f);
  }
  // Per-q-head dK / dV before the GQA group sum (autograd of repeat_interleave).
  std::vector<float> dk_acc, dv_acc;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t lq = s.len_q(b), lk = s.len_k(b), tq0 = s.cu_q[b], tk0 = s.cu_k[b];
    if (lq == 0) continue;
    std::vector<double> dk_grp(static_cast<size_t>(lk * HKV * D), 0.0), dv_grp(static_cast<size_t>(lk * HKV * DV), 0.0);
    for (int64_t h = 0; h < HQ; ++h) {
      const int64_t hk = h / group;
      std::vector<double> qs(static_cast<size_t>(lq * D)), vs(static_cast<size_t>(lk * DV));
      for (int64_t i = 0; i < lq; ++i)
        for (int64_t d = 0; d < D; ++d) qs[i * D + d] = rd(in.q[((tq0 + i) * HQ + h) * D + d] * scale_f);
      for (int64_t j = 0; j < lk; ++j)
        for (int64_t d = 0; d < DV; ++d) vs[j * DV + d] = rd(in.v[((tk0 + j) * HKV + hk) * DV + d] * rpk_f);
      std::vector<double> S2(static_cast<size_t>(lq * lk), 0.0), P(static_cast<size_t>(lq * lk), 0.0),
          Pd(static_cast<size_t>(lq * lk), 0.0);
      std::vector<uint8_t> ok(static_cast<size_t>(lq * lk), 0);
      for (int64_t i = 0; i < lq; ++i) {
        std::vector<double> S(lk, kNegInf);
        float m = -INFINITY;
        for (int64_t j = 0; j < lk; ++j) {
          if (!ref_allowed(s, b, h, i, j)) continue;
          double x = rd(fdot(&qs[i * D], &in.k[((tk0 + j) * HKV + hk) * D], D));
          if (cap > 0) {
            const double t = rd(tanh(rd(static_cast<float>(x) / cap)));
            S2[i * lk + j] = t;
            x = rd(static_cast<float>(t) * cap);
          }
          if (s.bias_kind == 1) x = rd(x + s.bias[bias_index(s, b, h, i, j)]);
          if (s.bias_kind >= 2) x = rd(x + rd(static_cast<float>(ref_bias(s, b, h, i, j))));
          S[j] = x;
          ok[i * lk + j] = 1;
          m = std::max(m, static_cast<float>(x));
        }
        const int64_t row = (tq0 + i) * HQ + h;
        if (m == -INFINITY) {
          out.row_masked[row] = 1;
          continue;
        }
        float l = 0.f;
        for (int64_t j = 0; j < lk; ++j)
          if (ok[i * lk + j]) l += expf(static_cast<float>(S[j]) - m);
        out.lse[row] = static_cast<double>(static_cast<float>(m + logf(l)));
        for (int64_t j = 0; j < lk; ++j) {
          if (!ok[i * lk + j]) continue;
          P[i * lk + j] = rd(expf(static_cast<float>(S[j]) - m) / l);
          Pd[i * lk + j] = ref_dropout_keep(s, b, h, i, j) ? P[i * lk + j] : 0.0;
        }
        for (int64_t d = 0; d < DV; ++d) {
          float acc = 0.f;
          for (int64_t j = 0; j < lk; ++j) acc += static_cast<float>(Pd[i * lk + j]) * static_cast<float>(vs[j * DV + d]);
          out.o[row * DV + d] = rd(acc);
        }
      }
      if (!backward) continue;
      // dS0 (gradient of the rounded q_s . k scores) for this head, row-major [lq][lk].
      std::vector<double> dS0(static_cast<size_t>(lq * lk), 0.0);
      for (int64_t i = 0; i < lq; ++i) {
        const int64_t row = (tq0 + i) * HQ + h;
        if (out.row_masked[row]) continue;
        const double* dout = &in.dout[row * DV];
        std::vector<double> dP(lk, 0.0);
        float Dsum = 0.f;
        for (int64_t j = 0; j < lk; ++j) {
          if (!ok[i * lk + j]) continue;
          const double dpd = rd(fdot(dout, &vs[j * DV], DV));
          dP[j] = ref_dropout_keep(s, b, h, i, j) ? dpd : 0.0;
          Dsum += static_cast<float>(P[i * lk + j]) * static_cast<float>(dP[j]);
        }
        for (int64_t j = 0; j < lk; ++j) {
          if (!ok[i * lk + j]) continue;
          double dS = rd(static_cast<float>(P[i * lk + j]) * (static_cast<float>(dP[j]) - Dsum));
          if (s.bias_kind == 1) dbias_red[group_index(s, b, h, i, j)] += static_cast<float>(dS);
          if (cap > 0) {
            const float t = static_cast<float>(S2[i * lk + j]);
            const double d2 = rd(static_cast<float>(dS) * cap);
            const double d1 = rd(static_cast<float>(d2) * (1.f - t * t));
            dS = rd(static_cast<float>(d1) / cap);
          }
          dS0[i * lk + j] = dS;
        }
      }
      for (int64_t i = 0; i < lq; ++i) {
        const int64_t row = (tq0 + i) * HQ + h;
        for (int64_t d = 0; d < D; ++d) {
          float acc = 0.f;
          for (int64_t j = 0; j < lk; ++j)
            acc += static_cast<float>(dS0[i * lk + j]) * static_cast<float>(in.k[((tk0 + j) * HKV + hk) * D + d]);
          out.dq[row * D + d] = rd(static_cast<float>(rd(acc)) * scale_f);
        }
      }
      for (int64_t j = 0; j < lk; ++j) {
        for (int64_t d = 0; d < D; ++d) {
          float acc = 0.f;
          for (int64_t i = 0; i < lq; ++i) acc += static_cast<float>(dS0[i * lk + j]) * static_cast<float>(qs[i * D + d]);
          dk_grp[(j * HKV + hk) * D + d] += static_cast<float>(rd(acc));
        }
        for (int64_t d = 0; d < DV; ++d) {
          float acc = 0.f;
          for (int64_t i = 0; i < lq; ++i)
            acc += static_cast<float>(Pd[i * lk + j]) * static_cast<float>(in.dout[((tq0 + i) * HQ + h) * DV + d]);
          dv_grp[(j * HKV + hk) * DV + d] += static_cast<float>(rd(static_cast<float>(rd(acc)) * rpk_f));
        }
      }
    }
    if (!backward) continue;
    for (int64_t j = 0; j < lk; ++j)
      for (int64_t hk = 0; hk < HKV; ++hk) {
        for (int64_t d = 0; d < D; ++d) out.dk[((tk0 + j) * HKV + hk) * D + d] = rd(static_cast<float>(dk_grp[(j * HKV + hk) * D + d]));
        for (int64_t d = 0; d < DV; ++d)
          out.dv[((tk0 + j) * HKV + hk) * DV + d] = rd(static_cast<float>(dv_grp[(j * HKV + hk) * DV + d]));
      }
  }
  if (backward && s.bias_kind == 1) {
    std::vector<double> red(dbias_red.size());
    for (size_t n = 0; n < red.size(); ++n) red[n] = rd(dbias_red[n]);
    expand_dbias(s, red, out.dbias);
  }
  return out;
}

}  // namespace fat
