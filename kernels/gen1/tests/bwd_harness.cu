// Standalone check and benchmark of the gen1 backward (src/cuda/gen1_bwd.cu +
// kernels/gen1/bwd_*.cu) without the public API: an fp64 CPU reference computes O, LSE
// (fed to the kernels, so no forward kernel is needed) and dQ, dK, dV, dBias; the GPU
// outputs are poisoned before each run and compared by relative L2 error.
// Usage: bwd_harness [check|bench|all]
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/mask.h"
#include "common/params.h"
#include "common/philox.h"
#include "cuda/launch.hpp"
#include "error.hpp"

using namespace flashattn;

namespace flashattn {
const char* last_error_message();
}

#define CK(x)                                                                                         \
  do {                                                                                                \
    cudaError_t e_ = (x);                                                                             \
    if (e_ != cudaSuccess) {                                                                          \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);           \
      std::exit(2);                                                                                   \
    }                                                                                                 \
  } while (0)

static uint16_t f2h(float f, int dt) {
  if (dt == kBf16) {
    __nv_bfloat16 b = __float2bfloat16_rn(f);
    uint16_t u;
    std::memcpy(&u, &b, 2);
    return u;
  }
  __half h = __float2half_rn(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
static float h2f(uint16_t u, int dt) {
  if (dt == kBf16) {
    __nv_bfloat16 b;
    std::memcpy(&b, &u, 2);
    return __bfloat162float(b);
  }
  __half h;
  std::memcpy(&h, &u, 2);
  return __half2float(h);
}

struct Case {
  std::string name;
  int dtype = kBf16;
  int64_t b = 2, sq = 130, sk = 130, hq = 4, hkv = 4, d = 64, dv = 64;
  float softcap = 0.f;
  int has_band = 0, align = 0;
  int64_t wl = -1, wr = -1;
  int bias = 0;  // 0 none, 1 tensor full, 2 broadcast over batch+queries, 3 alibi, 4 alibi sym, 5 broadcast over heads
  bool dbias = false;
  float pdrop = 0.f;
  int64_t bq = 0, bk = 0, lheads = 1;  // layout when bq > 0
  std::vector<int> lens_q, lens_k;     // varlen when non-empty
  bool det = false;
  int extra = 0;    // varlen: tokens after the last sequence (belong to none; grads must be 0)
  int strides = 0;  // 0 contiguous BSHD; 1 BHSD with padded rows
};

struct Tensor {
  Strides4 st;
  int64_t elems;
};
// Layout of a [b, s, h, d] tensor (varlen: b = 1, s = total).
static Tensor make_tensor(int mode, int64_t b, int64_t s, int64_t h, int64_t d) {
  Tensor t;
  if (mode == 0) {
    t.st = {s * h * d, h * d, d, 1};
    t.elems = b * s * h * d;
  } else {
    const int64_t dp = d + 8;
    t.st = {h * s * dp, dp, s * dp, 1};
    t.elems = b * h * s * dp;
  }
  return t;
}

struct Result {
  double err_dq, err_dk, err_dv, err_db;
  bool nan, det_ok;
};

static double rel_l2(const std::vector<double>& ref, const std::vector<double>& got, bool* nan) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) *nan = true;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

static int g_fail = 0, g_checks = 0;

static void run_case(const Case& c, std::mt19937& rng) {
  const bool varlen = !c.lens_q.empty();
  const int64_t B = c.b;
  std::vector<int> cq(B + 1, 0), ck(B + 1, 0);
  int64_t sq = c.sq, sk = c.sk;
  if (varlen) {
    sq = sk = 1;
    for (int64_t i = 0; i < B; ++i) {
      cq[i + 1] = cq[i] + c.lens_q[i];
      ck[i + 1] = ck[i] + c.lens_k[i];
      sq = std::max<int64_t>(sq, c.lens_q[i]);
      sk = std::max<int64_t>(sk, c.lens_k[i]);
    }
  }
  const int64_t tq = varlen ? cq[B] + c.extra : B * sq, tk = varlen ? ck[B] + c.extra : B * sk;
  const int64_t tb = varlen ? 1 : B;  // batch dim of the tensors
  const int64_t ts_q = varlen ? tq : sq, ts_k = varlen ? tk : sk;
  Tensor tQ = make_tensor(c.strides, tb, ts_q, c.hq, c.d), tK = make_tensor(c.strides, tb, ts_k, c.hkv, c.d);
  Tensor tV = make_tensor(c.strides, tb, ts_k, c.hkv, c.dv), tO = make_tensor(c.strides, tb, ts_q, c.hq, c.dv);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto fill = [&](const Tensor& t, int64_t s_, int64_t h_, int64_t d_, std::vector<uint16_t>& bits,
                  float sc) {
    bits.assign(t.elems, f2h(0.f, c.dtype));
    for (int64_t b = 0; b < tb; ++b)
      for (int64_t s = 0; s < s_; ++s)
        for (int64_t h = 0; h < h_; ++h)
          for (int64_t x = 0; x < d_; ++x)
            bits[b * t.st.b + s * t.st.s + h * t.st.h + x] = f2h(nd(rng) * sc, c.dtype);
  };
  std::vector<uint16_t> hQ, hK, hV, hdO;
  fill(tQ, ts_q, c.hq, c.d, hQ, 1.f);
  fill(tK, ts_k, c.hkv, c.d, hK, 1.f);
  fill(tV, ts_k, c.hkv, c.dv, hV, 1.f);
  fill(tO, ts_q, c.hq, c.dv, hdO, 1.f);
  auto at = [&](const std::vector<uint16_t>& v, const Tensor& t, int64_t b, int64_t s, int64_t h, int64_t x) {
    return static_cast<double>(h2f(v[b * t.st.b + s * t.st.s + h * t.st.h + x], c.dtype));
  };

  AttnParams p{};
  p.batch = B;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.heads_q = c.hq;
  p.heads_kv = c.hkv;
  p.head_dim_qk = c.d;
  p.head_dim_v = c.dv;
  p.dtype = c.dtype;
  p.direction = kBackward;
  p.deterministic = c.det;
  p.varlen = varlen;
  p.total_q = varlen ? tq : 0;
  p.total_k = varlen ? tk : 0;
  p.q_stride = tQ.st;
  p.k_stride = tK.st;
  p.v_stride = tV.st;
  p.o_stride = tO.st;
  p.do_stride = tO.st;
  p.dq_stride = tQ.st;
  p.dk_stride = tK.st;
  p.dv_stride = tV.st;
  p.scale = 1.f / std::sqrt(static_cast<float>(c.d));
  p.softcap = c.softcap;
  p.has_band = c.has_band;
  p.align = c.align;
  p.window_left = c.wl;
  p.window_right = c.wr;
  p.p_drop = c.pdrop;
  p.rp_keep = 1.f / (1.f - c.pdrop);
  p.drop_threshold = dropout_threshold(c.pdrop);
  p.seed = 0x1234567890abcdefull;
  p.offset = 77;
  // bias
  std::vector<uint16_t> hBias;
  int64_t bias_elems = 0;
  std::vector<float> slopes(c.hq);
  if (c.bias == 1 || c.bias == 2 || c.bias == 5) {
    p.bias_kind = kBiasTensor;
    if (c.bias == 1) {  // full [b, h, sq, sk]
      p.bias_stride[0] = c.hq * sq * sk; p.bias_stride[1] = sq * sk; p.bias_stride[2] = sk; p.bias_stride[3] = 1;
      bias_elems = B * c.hq * sq * sk;
    } else if (c.bias == 2) {  // [1, h, 1, sk]: broadcast over batch and queries (a broadcast over keys
                               // would sum dS over a row, which is exactly 0)
      p.bias_stride[0] = 0; p.bias_stride[1] = sk; p.bias_stride[2] = 0; p.bias_stride[3] = 1;
      bias_elems = c.hq * sk;
    } else {  // c.bias == 5: [b, 1, sq, sk], broadcast over heads
      p.bias_stride[0] = sq * sk; p.bias_stride[1] = 0; p.bias_stride[2] = sk; p.bias_stride[3] = 1;
      bias_elems = B * sq * sk;
    }
    hBias.resize(bias_elems);
    for (auto& x : hBias) x = f2h(nd(rng), c.dtype);
  } else if (c.bias == 3 || c.bias == 4) {
    p.bias_kind = c.bias == 3 ? kBiasAlibi : kBiasAlibiSymmetric;
    for (int64_t h = 0; h < c.hq; ++h) slopes[h] = std::pow(2.f, -8.f * (h + 1) / c.hq);
  }
  std::vector<uint8_t> layout;
  if (c.bq > 0) {
    p.block_q = c.bq;
    p.block_k = c.bk;
    p.layout_heads = c.lheads;
    p.n_row_blocks = (sq + c.bq - 1) / c.bq;
    p.n_col_blocks = (sk + c.bk - 1) / c.bk;
    layout.resize(p.layout_heads * p.n_row_blocks * p.n_col_blocks);
    for (auto& x : layout) x = (rng() % 3) != 0;
    layout[0] = 0;  // at least one zero block
    p.layout = layout.data();  // host copy for the reference; replaced by the device copy below
  }

  // ---- fp64 reference: forward (O, LSE) then backward ----
  std::vector<double> O(tO.elems, 0.0), LSE(varlen ? c.hq * tq : B * c.hq * sq, -INFINITY);
  std::vector<double> dQ(tQ.elems, 0.0), dK(tK.elems, 0.0), dV(tV.elems, 0.0), dB(bias_elems, 0.0);
  std::vector<uint16_t> hO(tO.elems, f2h(0.f, c.dtype));
  std::vector<float> hLSE(LSE.size(), -INFINITY);
  const int64_t grp = c.hq / c.hkv;
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t lq = varlen ? c.lens_q[b] : sq, lk = varlen ? c.lens_k[b] : sk;
      const int64_t q0 = varlen ? cq[b] : 0, k0 = varlen ? ck[b] : 0, bb = varlen ? 0 : b;
      const int64_t shift = align_shift(p, lq, lk);
      for (int64_t h = 0; h < c.hq; ++h) {
        const int64_t hk = h / grp;
        std::vector<double> S(lk), T(lk), P(lk), keepv(lk);
        for (int64_t i = 0; i < lq; ++i) {
          const int64_t lidx = varlen ? h * tq + q0 + i : (b * c.hq + h) * sq + i;
          double mx = -INFINITY;
          for (int64_t j = 0; j < lk; ++j) {
            double s = 0;
            for (int64_t x = 0; x < c.d; ++x) s += at(hQ, tQ, bb, q0 + i, h, x) * at(hK, tK, bb, k0 + j, hk, x);
            s *= p.scale;
            T[j] = 0;
            if (c.softcap > 0) {
              T[j] = std::tanh(s / c.softcap);
              s = c.softcap * T[j];
            }
            if (p.bias_kind == kBiasTensor) {
              s += h2f(hBias[b * p.bias_stride[0] + h * p.bias_stride[1] + i * p.bias_stride[2] + j * p.bias_stride[3]],
                       c.dtype);
            } else if (p.bias_kind != kBiasNone) {
              s += alibi_bias(p, slopes[h], i + shift, j);
            }
            const bool keep = band_keep(p, i + shift, j) && layout_keep(p, h, i, j);
            S[j] = keep ? s : -INFINITY;
            mx = std::max(mx, S[j]);
          }
          double lse = -INFINITY;
          if (mx != -INFINITY) {
            double sum = 0;
            for (int64_t j = 0; j < lk; ++j) sum += std::exp(S[j] - mx);
            lse = mx + std::log(sum);
          }
          for (int64_t j = 0; j < lk; ++j) {
            P[j] = lse == -INFINITY ? 0.0 : std::exp(S[j] - lse);
            keepv[j] = c.pdrop > 0 ? (dropout_keep(p.seed, p.offset, b, c.hq, h, i, j, p.drop_threshold) ? 1.0 / (1.0 - c.pdrop) : 0.0)
                                   : 1.0;
          }
          if (pass == 0) {
            LSE[lidx] = lse;
            hLSE[lidx] = static_cast<float>(lse);
            for (int64_t x = 0; x < c.dv; ++x) {
              double o = 0;
              for (int64_t j = 0; j < lk; ++j) o += P[j] * keepv[j] * at(hV, tV, bb, k0 + j, hk, x);
              const int64_t oi = bb * tO.st.b + (q0 + i) * tO.st.s + h * tO.st.h + x;
              O[oi] = o;
              hO[oi] = f2h(static_cast<float>(o), c.dtype);
            }
            continue;
          }
          // backward of row i
          double delta = 0;
          for (int64_t x = 0; x < c.dv; ++x) delta += at(hdO, tO, bb, q0 + i, h, x) * O[bb * tO.st.b + (q0 + i) * tO.st.s + h * tO.st.h + x];
          for (int64_t j = 0; j < lk; ++j) {
            if (P[j] == 0) continue;
            double dpd = 0;
            for (int64_t x = 0; x < c.dv; ++x) dpd += at(hdO, tO, bb, q0 + i, h, x) * at(hV, tV, bb, k0 + j, hk, x);
            const double pd = P[j] * keepv[j];
            for (int64_t x = 0; x < c.dv; ++x)
              dV[bb * tV.st.b + (k0 + j) * tV.st.s + hk * tV.st.h + x] += pd * at(hdO, tO, bb, q0 + i, h, x);
            double ds = P[j] * (dpd * keepv[j] - delta);
            if (p.bias_kind == kBiasTensor)
              dB[b * p.bias_stride[0] + h * p.bias_stride[1] + i * p.bias_stride[2] + j * p.bias_stride[3]] += ds;
            if (c.softcap > 0) ds *= 1.0 - T[j] * T[j];
            ds *= p.scale;
            for (int64_t x = 0; x < c.d; ++x) {
              dQ[bb * tQ.st.b + (q0 + i) * tQ.st.s + h * tQ.st.h + x] += ds * at(hK, tK, bb, k0 + j, hk, x);
              dK[bb * tK.st.b + (k0 + j) * tK.st.s + hk * tK.st.h + x] += ds * at(hQ, tQ, bb, q0 + i, h, x);
            }
          }
        }
      }
    }
  }

  // ---- device ----
  auto up16 = [&](const std::vector<uint16_t>& v) {
    void* d = nullptr;
    CK(cudaMalloc(&d, std::max<size_t>(2, v.size() * 2)));
    if (!v.empty()) CK(cudaMemcpy(d, v.data(), v.size() * 2, cudaMemcpyHostToDevice));
    return d;
  };
  void *dq_, *dk_, *dv_;
  void* q_ = up16(hQ);
  void* k_ = up16(hK);
  void* v_ = up16(hV);
  void* o_ = up16(hO);
  void* do_ = up16(hdO);
  CK(cudaMalloc(&dq_, tQ.elems * 2));
  CK(cudaMalloc(&dk_, tK.elems * 2));
  CK(cudaMalloc(&dv_, tV.elems * 2));
  float* lse_;
  CK(cudaMalloc(&lse_, hLSE.size() * 4));
  CK(cudaMemcpy(lse_, hLSE.data(), hLSE.size() * 4, cudaMemcpyHostToDevice));
  void* bias_ = nullptr;
  void* dbias_ = nullptr;
  if (p.bias_kind == kBiasTensor) {
    bias_ = up16(hBias);
    if (c.dbias) CK(cudaMalloc(&dbias_, bias_elems * 2));
  }
  float* slopes_ = nullptr;
  if (p.bias_kind == kBiasAlibi || p.bias_kind == kBiasAlibiSymmetric) {
    CK(cudaMalloc(&slopes_, c.hq * 4));
    CK(cudaMemcpy(slopes_, slopes.data(), c.hq * 4, cudaMemcpyHostToDevice));
  }
  uint8_t* layout_ = nullptr;
  if (!layout.empty()) {
    CK(cudaMalloc(&layout_, layout.size()));
    CK(cudaMemcpy(layout_, layout.data(), layout.size(), cudaMemcpyHostToDevice));
  }
  int *cq_ = nullptr, *ck_ = nullptr;
  if (varlen) {
    CK(cudaMalloc(&cq_, (B + 1) * 4));
    CK(cudaMalloc(&ck_, (B + 1) * 4));
    CK(cudaMemcpy(cq_, cq.data(), (B + 1) * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ck_, ck.data(), (B + 1) * 4, cudaMemcpyHostToDevice));
  }
  AttnParams dp = p;
  dp.q = q_; dp.k = k_; dp.v = v_; dp.o_in = o_; dp.dout = do_; dp.lse_in = lse_;
  dp.dq = dq_; dp.dk = dk_; dp.dv = dv_;
  dp.bias = bias_; dp.dbias = dbias_; dp.alibi_slopes = slopes_; dp.layout = layout_;
  dp.cu_seqlens_q = cq_; dp.cu_seqlens_k = ck_;
  const size_t wsb = gen1_bwd_workspace_size(dp);
  void* ws = nullptr;
  CK(cudaMalloc(&ws, std::max<size_t>(wsb, 16)));
  std::vector<uint16_t> gq(tQ.elems), gk(tK.elems), gv(tV.elems), gb(bias_elems);
  std::vector<uint16_t> gq2, gk2, gv2, gb2;
  bool ok_launch = true;
  for (int rep = 0; rep < (c.det ? 2 : 1); ++rep) {
    CK(cudaMemset(dq_, 0xFF, tQ.elems * 2));
    CK(cudaMemset(dk_, 0xFF, tK.elems * 2));
    CK(cudaMemset(dv_, 0xFF, tV.elems * 2));
    if (dbias_) CK(cudaMemset(dbias_, 0xFF, bias_elems * 2));
    CK(cudaMemset(ws, 0x7F, wsb));  // garbage workspace: the kernels must initialize what they use
    const flashattn_status_t s = gen1_bwd(dp, ws, wsb, nullptr);
    if (s != FLASHATTN_STATUS_SUCCESS) {
      std::printf("FAIL %-40s status %d: %s\n", c.name.c_str(), s, last_error_message());
      ok_launch = false;
      break;
    }
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(gq.data(), dq_, tQ.elems * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gk.data(), dk_, tK.elems * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gv.data(), dv_, tV.elems * 2, cudaMemcpyDeviceToHost));
    if (dbias_) CK(cudaMemcpy(gb.data(), dbias_, bias_elems * 2, cudaMemcpyDeviceToHost));
    if (rep == 0) { gq2 = gq; gk2 = gk; gv2 = gv; gb2 = gb; }
  }
  ++g_checks;
  if (ok_launch) {
    // compare the valid region only (padding of strided layouts stays poisoned)
    auto collect = [&](const Tensor& t, int64_t s_, int64_t h_, int64_t d_, const std::vector<double>& ref,
                       const std::vector<uint16_t>& got, std::vector<double>& r, std::vector<double>& g) {
      for (int64_t b = 0; b < tb; ++b)
        for (int64_t s = 0; s < s_; ++s)
          for (int64_t h = 0; h < h_; ++h)
            for (int64_t x = 0; x < d_; ++x) {
              const int64_t i = b * t.st.b + s * t.st.s + h * t.st.h + x;
              r.push_back(ref[i]);
              g.push_back(h2f(got[i], c.dtype));
            }
    };
    std::vector<double> r1, g1, r2, g2, r3, g3, r4, g4;
    collect(tQ, ts_q, c.hq, c.d, dQ, gq, r1, g1);
    collect(tK, ts_k, c.hkv, c.d, dK, gk, r2, g2);
    collect(tV, ts_k, c.hkv, c.dv, dV, gv, r3, g3);
    bool nan = false;
    const double eq = rel_l2(r1, g1, &nan), ek = rel_l2(r2, g2, &nan), ev = rel_l2(r3, g3, &nan);
    double eb = 0;
    if (dbias_) {
      for (int64_t i = 0; i < bias_elems; ++i) {
        r4.push_back(dB[i]);
        g4.push_back(h2f(gb[i], c.dtype));
      }
      eb = rel_l2(r4, g4, &nan);
    }
    const bool det_ok = !c.det || (gq == gq2 && gk == gk2 && gv == gv2 && gb == gb2);
    const double tol = c.dtype == kBf16 ? 2e-2 : 6e-3;
    const bool pass = !nan && det_ok && eq < tol && ek < tol && ev < tol && eb < tol;
    if (!pass) ++g_fail;
    std::printf("%s %-44s dQ %.2e dK %.2e dV %.2e dB %.2e%s%s\n", pass ? "ok  " : "FAIL", c.name.c_str(), eq, ek, ev,
                eb, nan ? " NaN/unwritten" : "", c.det ? (det_ok ? " bitwise-identical x2" : " NOT-DETERMINISTIC") : "");
  } else {
    ++g_fail;
  }
  cudaFree(q_); cudaFree(k_); cudaFree(v_); cudaFree(o_); cudaFree(do_); cudaFree(dq_); cudaFree(dk_); cudaFree(dv_);
  cudaFree(lse_); cudaFree(bias_); cudaFree(dbias_); cudaFree(slopes_); cudaFree(layout_); cudaFree(cq_);
  cudaFree(ck_); cudaFree(ws);
}

static void checks() {
  std::mt19937 rng(1234);
  std::vector<Case> cs;
  auto add = [&](Case c) { cs.push_back(c); };
  // head dims x dtypes, awkward lengths
  for (int dt : {kBf16, kFp16}) {
    for (int64_t d : {32, 64, 96, 128, 192, 256}) {
      Case c;
      c.dtype = dt; c.d = c.dv = d; c.sq = 130; c.sk = 257; c.b = 1; c.hq = 2; c.hkv = 2;
      c.name = std::string(dt == kBf16 ? "bf16" : "fp16") + " d=" + std::to_string(d) + " sq130 sk257";
      add(c);
    }
  }
  { Case c; c.d = 40; c.dv = 40; c.sq = 17; c.sk = 17; c.name = "d=40 (config 64) seq17"; add(c); }
  // Masked fast-path tiles at d=256 (split S/dP path when enabled).
  { Case c; c.has_band = 1; c.wr = 0; c.d = c.dv = 256; c.sq = 200; c.sk = 200; c.name = "causal d256"; add(c); }
  { Case c; c.has_band = 1; c.wl = 70; c.wr = 10; c.d = c.dv = 256; c.hq = 4; c.hkv = 2; c.sq = 150; c.sk = 190; c.dtype = kFp16; c.name = "window GQA d256 fp16"; add(c); }
  { Case c; c.d = 72; c.dv = 72; c.sq = 1; c.sk = 1; c.name = "d=72 (config 96) seq1"; add(c); }
  { Case c; c.d = 136; c.dv = 136; c.sq = 130; c.sk = 65; c.hq = 2; c.hkv = 1; c.name = "d=136 (config 192) GQA"; add(c); }
  { Case c; c.d = 192; c.dv = 128; c.sq = 130; c.sk = 130; c.name = "d=192 dv=128 (unequal config)"; add(c); }
  { Case c; c.d = 64; c.dv = 128; c.sq = 70; c.sk = 130; c.name = "d=64 dv=128 (config 128)"; add(c); }
  { Case c; c.d = 248; c.dv = 248; c.sq = 65; c.sk = 65; c.b = 1; c.hq = 1; c.hkv = 1; c.name = "d=248 (config 256)"; add(c); }
  { Case c; c.sq = 1; c.sk = 1; c.name = "seq 1"; add(c); }
  { Case c; c.sq = 17; c.sk = 257; c.name = "sq17 sk257"; add(c); }
  { Case c; c.sq = 257; c.sk = 17; c.name = "sq257 sk17"; add(c); }
  { Case c; c.hq = 8; c.hkv = 2; c.sq = 130; c.sk = 200; c.name = "GQA 8/2"; add(c); }
  { Case c; c.hq = 4; c.hkv = 1; c.d = c.dv = 128; c.name = "MQA 4/1 d128"; add(c); }
  // masks
  { Case c; c.has_band = 1; c.wr = 0; c.name = "causal top-left sq=sk"; add(c); }
  { Case c; c.has_band = 1; c.wr = 0; c.sq = 70; c.sk = 257; c.align = 1; c.name = "causal bottom-right sq<sk"; add(c); }
  { Case c; c.has_band = 1; c.wr = 0; c.sq = 257; c.sk = 70; c.align = 1; c.name = "causal bottom-right sq>sk (empty rows)"; add(c); }
  { Case c; c.has_band = 1; c.wr = 0; c.sq = 257; c.sk = 70; c.align = 0; c.name = "causal top-left sq>sk"; add(c); }
  { Case c; c.has_band = 1; c.wl = 20; c.wr = 5; c.sq = 300; c.sk = 300; c.name = "window (20,5)"; add(c); }
  { Case c; c.has_band = 1; c.wl = 0; c.wr = 0; c.sq = 200; c.sk = 150; c.align = 1; c.name = "window (0,0) bottom-right"; add(c); }
  { Case c; c.has_band = 1; c.wr = 0; c.d = c.dv = 128; c.sq = 300; c.sk = 300; c.det = true; c.name = "causal d128 deterministic"; add(c); }
  // score modifiers
  { Case c; c.softcap = 5.f; c.name = "softcap 5"; add(c); }
  { Case c; c.bias = 1; c.dbias = true; c.name = "bias full + dbias"; add(c); }
  { Case c; c.bias = 1; c.dbias = true; c.has_band = 1; c.wr = 0; c.name = "bias full + dbias + causal"; add(c); }
  { Case c; c.bias = 2; c.dbias = true; c.name = "bias broadcast(b,q) + dbias"; add(c); }
  { Case c; c.bias = 5; c.dbias = true; c.hq = 4; c.hkv = 2; c.has_band = 1; c.wr = 0; c.name = "bias broadcast(h) + dbias GQA causal"; add(c); }
  { Case c; c.bias = 2; c.dbias = true; c.b = 3; c.lens_q = {50, 0, 70}; c.lens_k = {64, 10, 30}; c.name = "varlen bias broadcast(b,q) + dbias"; add(c); }
  { Case c; c.bias = 1; c.softcap = 3.f; c.dbias = true; c.name = "softcap + bias + dbias"; add(c); }
  { Case c; c.bias = 3; c.has_band = 1; c.wr = 0; c.align = 1; c.sq = 100; c.sk = 180; c.name = "alibi causal BR"; add(c); }
  { Case c; c.bias = 4; c.name = "alibi symmetric"; add(c); }
  // dropout
  { Case c; c.pdrop = 0.2f; c.name = "dropout 0.2"; add(c); }
  { Case c; c.pdrop = 0.3f; c.has_band = 1; c.wr = 0; c.d = c.dv = 128; c.hq = 4; c.hkv = 2; c.name = "dropout 0.3 causal GQA d128"; add(c); }
  { Case c; c.pdrop = 0.1f; c.softcap = 4.f; c.bias = 1; c.dbias = true; c.name = "dropout+softcap+bias+dbias"; add(c); }
  // block-sparse
  { Case c; c.bq = 128; c.bk = 64; c.sq = 300; c.sk = 300; c.name = "block-sparse 128x64"; add(c); }
  { Case c; c.bq = 50; c.bk = 30; c.lheads = 4; c.sq = 200; c.sk = 220; c.name = "block-sparse 50x30 per-head"; add(c); }
  { Case c; c.bq = 64; c.bk = 64; c.has_band = 1; c.wr = 0; c.sq = 256; c.sk = 256; c.det = true; c.name = "block-sparse + causal det"; add(c); }
  // varlen
  { Case c; c.b = 4; c.lens_q = {130, 0, 17, 257}; c.lens_k = {100, 5, 0, 300}; c.name = "varlen (empty seqs)"; add(c); }
  { Case c; c.b = 2; c.lens_q = {40, 90}; c.lens_k = {70, 20}; c.extra = 37; c.hq = 4; c.hkv = 2; c.name = "varlen + 37 uncovered tokens"; add(c); }
  { Case c; c.b = 3; c.lens_q = {50, 129, 1}; c.lens_k = {70, 129, 64}; c.has_band = 1; c.wr = 0; c.align = 1; c.hq = 4; c.hkv = 2; c.name = "varlen causal BR GQA"; add(c); }
  { Case c; c.b = 3; c.lens_q = {50, 129, 1}; c.lens_k = {70, 129, 64}; c.bias = 1; c.dbias = true; c.pdrop = 0.2f; c.name = "varlen bias dbias dropout"; add(c); }
  // strides
  { Case c; c.strides = 1; c.name = "BHSD padded strides"; add(c); }
  { Case c; c.strides = 1; c.b = 2; c.lens_q = {33, 90}; c.lens_k = {90, 33}; c.d = c.dv = 96; c.name = "varlen padded strides d96"; add(c); }
  // determinism
  { Case c; c.det = true; c.hq = 4; c.hkv = 1; c.sq = 257; c.sk = 257; c.d = c.dv = 64; c.name = "deterministic MQA"; add(c); }
  { Case c; c.det = true; c.b = 3; c.lens_q = {50, 129, 1}; c.lens_k = {300, 129, 64}; c.d = c.dv = 256; c.name = "deterministic varlen d256"; add(c); }
  { Case c; c.det = true; c.bias = 1; c.dbias = true; c.pdrop = 0.1f; c.name = "deterministic bias+dbias+dropout"; add(c); }
  { Case c; c.det = true; c.bias = 2; c.dbias = true; c.hq = 4; c.hkv = 2; c.name = "deterministic broadcast(b,q) dbias GQA"; add(c); }
  { Case c; c.det = true; c.bias = 5; c.dbias = true; c.hq = 8; c.hkv = 2; c.has_band = 1; c.wr = 0; c.sq = 200; c.sk = 260; c.name = "deterministic broadcast(h) dbias GQA causal"; add(c); }
  { Case c; c.det = true; c.bias = 2; c.dbias = true; c.b = 3; c.lens_q = {50, 0, 70}; c.lens_k = {64, 10, 30}; c.pdrop = 0.1f; c.name = "deterministic varlen broadcast dbias dropout"; add(c); }
  // BWD_CHECK_FILTER="a|b": only the cases whose name contains one of the substrings (for
  // slow tools such as compute-sanitizer racecheck).
  const char* filt = std::getenv("BWD_CHECK_FILTER");
  for (const Case& c : cs) {
    bool run = filt == nullptr || *filt == 0;
    for (std::string f = filt ? filt : "", part; !run && !f.empty();) {
      const size_t bar = f.find('|');
      part = f.substr(0, bar);
      f = bar == std::string::npos ? "" : f.substr(bar + 1);
      run = !part.empty() && c.name.find(part) != std::string::npos;
    }
    if (run) run_case(c, rng);
  }
  std::printf("CHECKS: %d/%d passed\n", g_checks - g_fail, g_checks);
}

static bool g_prof = false;  // one launch of one shape, for a profiler

static void bench() {
  struct B { int64_t d, s; bool causal; };
  // d = 64 / 128 / 256 x seqlen 1k / 4k / 16k x non-causal / causal (16k tokens per launch),
  // deterministic mode at d=128 16k, and one short sequence.
  std::vector<B> shapes;
  for (int64_t d : {64, 128, 256})
    for (int64_t s : {1024, 4096, 16384})
      for (bool c : {false, true}) shapes.push_back({d, s, c});
  shapes.push_back({128, 512, false});
  // BWD_BENCH_MIN_SEQ=N: only the shapes with seqlen >= N (shorter device calls).
  const char* min_seq_env = std::getenv("BWD_BENCH_MIN_SEQ");
  const int64_t min_seq = min_seq_env != nullptr ? std::atoll(min_seq_env) : 0;
  std::mt19937 rng(7);
  for (const B& sh : shapes) {
    if (sh.s < min_seq) continue;
    for (int det = 0; det < 2; ++det) {
      if (det && !(sh.d == 128 && sh.s == 16384)) continue;
      if (g_prof && (det || sh.d != 128 || sh.s != 4096 || sh.causal)) continue;
      const int64_t b = 16384 / sh.s, h = 2048 / sh.d, s = sh.s, d = sh.d;
      AttnParams p{};
      p.batch = b; p.seqlen_q = p.seqlen_k = s; p.heads_q = p.heads_kv = h; p.head_dim_qk = p.head_dim_v = d;
      p.dtype = kBf16; p.direction = kBackward; p.deterministic = det;
      const Strides4 st = {s * h * d, h * d, d, 1};
      p.q_stride = p.k_stride = p.v_stride = p.o_stride = p.do_stride = p.dq_stride = p.dk_stride = p.dv_stride = st;
      p.scale = 1.f / std::sqrt(static_cast<float>(d));
      if (sh.causal) { p.has_band = 1; p.window_left = -1; p.window_right = 0; } else { p.window_left = p.window_right = -1; }
      const int64_t n = b * s * h * d;
      std::vector<uint16_t> hx(n);
      std::normal_distribution<float> nd(0.f, 1.f);
      // Inputs from a pool of 2^20 normal samples read at a different offset per tensor
      // (drawing 5 x 33.5M samples per shape took most of the benchmark's wall time).
      constexpr int64_t kPool = int64_t{1} << 20;
      std::vector<uint16_t> pool(kPool);
      for (auto& x : pool) x = f2h(nd(rng), kBf16);
      void* bufs[8];
      for (int i = 0; i < 8; ++i) {
        CK(cudaMalloc(&bufs[i], n * 2));
        if (i < 5) {
          for (int64_t e = 0; e < n; ++e) hx[e] = pool[(e + 7919 * (i + 1) * 131) & (kPool - 1)];
          CK(cudaMemcpy(bufs[i], hx.data(), n * 2, cudaMemcpyHostToDevice));
        }
      }
      std::vector<float> hl(b * h * s);
      for (auto& x : hl) x = 8.f + 0.1f * nd(rng);
      float* lse;
      CK(cudaMalloc(&lse, hl.size() * 4));
      CK(cudaMemcpy(lse, hl.data(), hl.size() * 4, cudaMemcpyHostToDevice));
      p.q = bufs[0]; p.k = bufs[1]; p.v = bufs[2]; p.o_in = bufs[3]; p.dout = bufs[4];
      p.dq = bufs[5]; p.dk = bufs[6]; p.dv = bufs[7]; p.lse_in = lse;
      const size_t wsb = gen1_bwd_workspace_size(p);
      void* ws;
      CK(cudaMalloc(&ws, wsb));
      cudaEvent_t e0, e1;
      CK(cudaEventCreate(&e0));
      CK(cudaEventCreate(&e1));
      std::vector<float> ts;
      bool ok = true;
      for (int it = 0; it < (g_prof ? 1 : 13) && ok; ++it) {
        CK(cudaEventRecord(e0));
        if (gen1_bwd(p, ws, wsb, nullptr) != FLASHATTN_STATUS_SUCCESS) {
          std::printf("BENCH launch failed: %s\n", last_error_message());
          ok = false;
        }
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (it >= 3) ts.push_back(ms);
      }
      CK(cudaGetLastError());
      if (ok && !ts.empty()) {
        std::sort(ts.begin(), ts.end());
        const double ms = ts[ts.size() / 2];
        const double flops = 2.5 * 4.0 * b * h * s * s * d / (sh.causal ? 2 : 1);
        std::printf("BENCH gen1-bwd%s d=%lld seq=%lld %s: %.3f ms  %.1f TFLOP/s\n", det ? "-det" : "",
                    (long long)d, (long long)s, sh.causal ? "causal" : "noncausal", ms, flops / ms / 1e9);
      }
      for (auto bp : bufs) cudaFree(bp);
      cudaFree(lse);
      cudaFree(ws);
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
    }
  }
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  if (mode == "check" || mode == "all") checks();
  if (mode == "prof") g_prof = true;
  if (mode == "bench" || mode == "all" || mode == "prof") bench();
  return g_fail ? 1 : 0;
}
