// The fp64 attention reference; see reference.hpp. Deliberately simple: one (sequence,
// head) at a time, the full score row materialized, no tiling, no online softmax.
#include "reference.hpp"

#include <math.h>

#include <algorithm>
#include <thread>

#include "common/philox.h"
#include "reference_internal.hpp"

namespace fat {

namespace refdetail {

void expand_dbias(const RefSpec& s, const std::vector<double>& reduced, std::vector<double>& out) {
  out.assign(static_cast<size_t>(s.batch * s.heads_q * s.max_sq * s.max_sk), 0.0);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads_q; ++h)
      for (int64_t i = 0; i < s.max_sq; ++i)
        for (int64_t j = 0; j < s.max_sk; ++j) out[bias_index(s, b, h, i, j)] = reduced[group_index(s, b, h, i, j)];
}

}  // namespace refdetail

using namespace refdetail;

namespace {

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

// Forward (and backward) of every query head of kv head hk in sequence b. Writes only the
// rows of those heads (O, LSE, dQ) and the kv rows of (b, hk) (dK, dV); dBias goes to the
// reduced arrays given, which are shared between sequences/heads when the bias broadcasts.
void fp64_group(const RefSpec& s, const RefInputs& in, bool backward, int64_t b, int64_t hk, RefOutputs& out,
                double* dbias_red, double* dbias_mag_red) {
  const int64_t HQ = s.heads_q, HKV = s.heads_kv, D = s.head_dim_qk, DV = s.head_dim_v;
  const int64_t group = HQ / HKV;
  const double rpk = dropout_scale(s);
  const int64_t lq = s.len_q(b), lk = s.len_k(b), tq0 = s.cu_q[b], tk0 = s.cu_k[b];
  const bool mag = s.magnitudes;
  std::vector<double> raw, sc, P, Pd, dP, dP_mag;
  std::vector<uint8_t> ok;
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
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
        for (int64_t d = 0; d < DV; ++d) o[d] += Pd[j] * v[d];
        if (mag)
          for (int64_t d = 0; d < DV; ++d) out.o_mag[row * DV + d] += Pd[j] * fabs(v[d]);
      }
      if (!backward) continue;
      // dP = dropout'(dO . V^T); dS = P * (dP - sum_j P dP); chain through bias, softcap, scale.
      const double* dout = &in.dout[row * DV];
      dP.assign(lk, 0.0);
      dP_mag.assign(lk, 0.0);
      double Dsum = 0.0, D_mag = 0.0;
      for (int64_t j = 0; j < lk; ++j) {
        if (!ok[j]) continue;
        const double* v = &in.v[((tk0 + j) * HKV + hk) * DV];
        double dpd = 0.0, dpd_mag = 0.0;
        for (int64_t d = 0; d < DV; ++d) dpd += dout[d] * v[d];
        if (mag)
          for (int64_t d = 0; d < DV; ++d) dpd_mag += fabs(dout[d] * v[d]);
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
          if (mag) dbias_mag_red[group_index(s, b, h, i, j)] += dS_mag;
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
        for (int64_t d = 0; d < D; ++d) {
          dq[d] += s.scale * draw * k[d];
          dk[d] += s.scale * draw * q[d];
        }
        for (int64_t d = 0; d < DV; ++d) dv[d] += Pd[j] * dout[d];
        if (!mag) continue;
        double* dk_mag = &out.dk_mag[((tk0 + j) * HKV + hk) * D];
        double* dv_mag = &out.dv_mag[((tk0 + j) * HKV + hk) * DV];
        for (int64_t d = 0; d < D; ++d) {
          out.dq_mag[row * D + d] += s.scale * draw_mag * fabs(k[d]);
          dk_mag[d] += s.scale * draw_mag * fabs(q[d]);
        }
        for (int64_t d = 0; d < DV; ++d) dv_mag[d] += Pd[j] * fabs(dout[d]);
      }
    }
  }
}

}  // namespace

bool ref_dropout_keep(const RefSpec& s, int64_t b, int64_t h, int64_t i, int64_t j) {
  const uint32_t threshold = flashattn::dropout_threshold(s.p_drop);
  if (!flashattn::dropout_active(threshold)) return true;
  // keep iff r >= t, r and t from the documented Philox keying.
  return flashattn::dropout_keep(s.seed, s.offset, static_cast<uint64_t>(b), static_cast<uint64_t>(s.heads_q),
                                 static_cast<uint64_t>(h), static_cast<uint32_t>(i), static_cast<uint32_t>(j),
                                 threshold);
}

bool ref_allowed(const RefSpec& s, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (!band_and_layout(s, b, h, i, j)) return false;
  return !(s.bias_kind == 1 && s.bias[bias_index(s, b, h, i, j)] == kNegInf);
}

RefOutputs reference_fp64(const RefSpec& s, const RefInputs& in, bool backward, int threads) {
  const int64_t HQ = s.heads_q, HKV = s.heads_kv, DV = s.head_dim_v;
  RefOutputs out;
  out.o.assign(static_cast<size_t>(s.total_q() * HQ * DV), 0.0);
  out.lse.assign(static_cast<size_t>(s.total_q() * HQ), kNegInf);
  out.row_masked.assign(static_cast<size_t>(s.total_q() * HQ), 0);
  if (s.magnitudes) out.o_mag.assign(out.o.size(), 0.0);
  const bool want_dbias = backward && s.bias_kind == 1;
  const size_t ngroups = want_dbias ? static_cast<size_t>(group_count(s)) : 0;
  if (backward) {
    out.dq.assign(in.q.size(), 0.0);
    out.dk.assign(in.k.size(), 0.0);
    out.dv.assign(in.v.size(), 0.0);
    if (s.magnitudes) {
      out.dq_mag.assign(in.q.size(), 0.0);
      out.dk_mag.assign(in.k.size(), 0.0);
      out.dv_mag.assign(in.v.size(), 0.0);
    }
  }
  // Tasks are (sequence, kv head) pairs, b-major: with one worker that is the plain loop
  // order. A task is the only writer of its rows of O, LSE, dQ, dK and dV; dBias groups are
  // shared between tasks only when the bias broadcasts over batch or heads, and then each
  // worker sums into its own partial array (the workers are capped so that the partials
  // take no more memory than the expanded bias the caller already holds, or 16 Mi values).
  const int64_t tasks = s.batch * HKV;
  const bool shared_groups = want_dbias && (s.bias_bcast[0] || s.bias_bcast[1]);
  int64_t workers = std::max<int64_t>(1, std::min<int64_t>(threads, tasks));
  if (shared_groups) {
    const int64_t expanded = std::max<int64_t>(s.batch * HQ * s.max_sq * s.max_sk, int64_t(1) << 24);
    workers = std::min<int64_t>(workers, std::max<int64_t>(1, expanded / static_cast<int64_t>(ngroups)));
  }
  const size_t nparts = shared_groups ? static_cast<size_t>(workers) : 1;
  std::vector<std::vector<double>> dbias_red(nparts, std::vector<double>(ngroups, 0.0)),
      dbias_mag_red(nparts, std::vector<double>(s.magnitudes ? ngroups : 0, 0.0));
  auto work = [&](int64_t w) {
    const size_t part = shared_groups ? static_cast<size_t>(w) : 0;
    for (int64_t t = w; t < tasks; t += workers)
      fp64_group(s, in, backward, t / HKV, t % HKV, out, dbias_red[part].data(), dbias_mag_red[part].data());
  };
  if (workers == 1) {
    work(0);
  } else {
    std::vector<std::thread> pool;
    for (int64_t w = 0; w < workers; ++w) pool.emplace_back(work, w);
    for (std::thread& th : pool) th.join();
  }
  if (want_dbias) {
    for (size_t p = 1; p < nparts; ++p)
      for (size_t g = 0; g < ngroups; ++g) {
        dbias_red[0][g] += dbias_red[p][g];
        if (s.magnitudes) dbias_mag_red[0][g] += dbias_mag_red[p][g];
      }
    expand_dbias(s, dbias_red[0], out.dbias);
    if (s.magnitudes) expand_dbias(s, dbias_mag_red[0], out.dbias_mag);
  }
  return out;
}

double reference_loss(const RefSpec& s, const RefInputs& in) {
  const RefOutputs r = reference_fp64(s, in, false);
  double loss = 0.0;
  for (size_t n = 0; n < r.o.size(); ++n) loss += r.o[n] * in.dout[n];
  return loss;
}

}  // namespace fat
