// Same-precision standard attention (the tests' yardstick); see reference.hpp.
//
// Mirrors what a naive PyTorch implementation computes in fp16/bf16 (flash-attention's
// tests call it "pt"): q * scale rounded; S = rd(q_s . k) with fp32 accumulation; softcap as
// rd(tanh(rd(S / c))) * c rounded; S + bias rounded; softmax in fp32 rounded to P; dropout
// as P masked and V scaled by 65536/(65536-t) (rounded); O = rd(P_d . V_s). The backward is what
// autograd does with those ops: every tensor rounded, softmax backward in fp32.
#include "reference.hpp"

#include <math.h>

#include <algorithm>

#include "reference_internal.hpp"

namespace fat {

using namespace refdetail;

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
          for (int64_t j = 0; j < lk; ++j)
            acc += static_cast<float>(Pd[i * lk + j]) * static_cast<float>(vs[j * DV + d]);
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
          for (int64_t i = 0; i < lq; ++i)
            acc += static_cast<float>(dS0[i * lk + j]) * static_cast<float>(qs[i * D + d]);
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
        for (int64_t d = 0; d < D; ++d)
          out.dk[((tk0 + j) * HKV + hk) * D + d] = rd(static_cast<float>(dk_grp[(j * HKV + hk) * D + d]));
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
