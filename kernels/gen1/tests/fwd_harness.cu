// Standalone check and benchmark of the gen1 forward kernels, independent of the API layer.
//
// Builds AttnParams directly, runs flashattn::gen1_fwd, and compares O and LSE against an
// fp64 CPU reference (common/mask.h + common/philox.h semantics) and against a
// same-precision "standard attention" emulation (S and P rounded to the input dtype), for
// a list of shapes and options. Then times d = 64/128/256 at 16k tokens (bf16).
//
// Build (from the repo root):
//   nvcc -std=c++17 -O3 -arch=sm_90 --use_fast_math -Iinclude -Isrc -Ikernels \
//     kernels/gen1/tests/fwd_harness.cu src/cuda/gen1_fwd.cu src/cuda/gen1_check.cpp \
//     src/error.cpp kernels/gen1/fwd_*.cu -o fwd_harness
// Run: ./fwd_harness [check|bench|all]
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/mask.h"
#include "common/params.h"
#include "common/philox.h"
#include "cuda/launch.hpp"
#include "flashattn.h"
#include "gen1/fwd_kernel.cuh"

using namespace flashattn;

#define CK(x)                                                                                     \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
      exit(2);                                                                                    \
    }                                                                                             \
  } while (0)

namespace flashattn {
const char* last_error_message();
}

static uint16_t f2h(float f, int dtype) {
  if (dtype == kBf16) {
    __nv_bfloat16 b = __float2bfloat16_rn(f);
    uint16_t u;
    memcpy(&u, &b, 2);
    return u;
  }
  __half h = __float2half_rn(f);
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}
static float h2f(uint16_t u, int dtype) {
  if (dtype == kBf16) {
    __nv_bfloat16 b;
    memcpy(&b, &u, 2);
    return __bfloat162float(b);
  }
  __half h;
  memcpy(&h, &u, 2);
  return __half2float(h);
}
static float round_dt(float f, int dtype) { return h2f(f2h(f, dtype), dtype); }

struct Case {
  std::string name;
  int dtype = kBf16;
  int64_t b = 2, sq = 130, sk = 130, hq = 4, hkv = 4, d = 64, dv = 64;
  bool varlen = false;
  std::vector<int> lens_q, lens_k;  // varlen lengths
  int align = 0;
  int64_t wl = -1, wr = -1;
  float softcap = 0.f;
  int bias_kind = kBiasNone;
  int64_t bias_stride_mode = 0;  // 0: full [b,h,sq,sk]; 1: broadcast b (stride 0); 2: broadcast b,h and k stride 0
  float p_drop = 0.f;
  bool layout = false;
  int64_t block_q = 128, block_k = 64, layout_heads = 1;
  float density = 0.5f;
  int stride_mode = 0;  // 0: BSHD contiguous; 1: BHSD; 2: padded (extra head + seq padding)
  float scale = 0.f;    // 0: 1/sqrt(d)
  bool no_lse = false;
};

struct Result {
  double max_err = 0, mean_err = 0, std_max_err = 0, lse_max_err = 0;
  long long not_finite = 0, outside_written = 0, inf_mismatch = 0;
};

// Strides in elements for a logical [b, s, h, d] tensor, plus the buffer size.
static Strides4 make_strides(int mode, int64_t b, int64_t s, int64_t h, int64_t d, int64_t* elems) {
  Strides4 st{};
  st.d = 1;
  if (mode == 0) {
    st.h = d;
    st.s = h * d;
    st.b = s * h * d;
    *elems = b * s * h * d;
  } else if (mode == 1) {
    st.s = d;
    st.h = s * d;
    st.b = h * s * d;
    *elems = b * s * h * d;
  } else {
    st.h = d + 8;
    st.s = (h + 1) * (d + 8);
    st.b = (s + 3) * st.s;
    *elems = b * st.b;
  }
  return st;
}

// fp64 reference for one (sequence, head) problem; optional same-precision emulation.
static void reference(const AttnParams& p, const std::vector<float>& Q, const std::vector<float>& K,
                      const std::vector<float>& V, const std::vector<float>& Bias, int64_t bsq, int64_t h,
                      int64_t q_off, int64_t k_off, int64_t lq, int64_t lk, bool emulate, std::vector<double>& O,
                      std::vector<double>& L) {
  const int64_t hk = h / (p.heads_q / p.heads_kv);
  const int64_t shift = align_shift(p, lq, lk);
  std::vector<double> s(lk > 0 ? lk : 1);
  std::vector<char> keep(lk > 0 ? lk : 1);
  const float slope = (p.bias_kind == kBiasAlibi || p.bias_kind == kBiasAlibiSymmetric) ? p.alibi_slopes[h] : 0.f;
  for (int64_t i = 0; i < lq; ++i) {
    const float* q = &Q[(p.varlen ? (q_off + i) * p.q_stride.s : bsq * p.q_stride.b + i * p.q_stride.s) +
                        h * p.q_stride.h];
    double mx = -INFINITY;
    for (int64_t j = 0; j < lk; ++j) {
      const float* k = &K[(p.varlen ? (k_off + j) * p.k_stride.s : bsq * p.k_stride.b + j * p.k_stride.s) +
                          hk * p.k_stride.h];
      double acc = 0;
      for (int64_t c = 0; c < p.head_dim_qk; ++c) acc += double(q[c]) * k[c];
      if (emulate) acc = round_dt(float(acc), p.dtype);
      double x = acc * p.scale;
      if (p.softcap > 0) x = p.softcap * tanh(x / p.softcap);
      if (p.bias_kind == kBiasTensor)
        x += Bias[bsq * p.bias_stride[0] + h * p.bias_stride[1] + i * p.bias_stride[2] + j * p.bias_stride[3]];
      else
        x += alibi_bias(p, slope, i + shift, j);
      keep[j] = band_keep(p, i + shift, j) && layout_keep(p, h, i, j);
      s[j] = keep[j] ? x : -INFINITY;
      mx = std::max(mx, s[j]);
    }
    double* o = &O[((bsq * p.heads_q + h) * p.seqlen_q + i) * p.head_dim_v];
    if (mx == -INFINITY) {
      for (int64_t c = 0; c < p.head_dim_v; ++c) o[c] = 0;
      L[(bsq * p.heads_q + h) * p.seqlen_q + i] = -INFINITY;
      continue;
    }
    double sum = 0;
    for (int64_t j = 0; j < lk; ++j) {
      s[j] = keep[j] ? exp(s[j] - mx) : 0;
      sum += s[j];
    }
    L[(bsq * p.heads_q + h) * p.seqlen_q + i] = mx + log(sum);
    std::vector<double> acc(p.head_dim_v, 0.0);
    for (int64_t j = 0; j < lk; ++j) {
      if (s[j] == 0) continue;
      double pj = s[j] / sum;
      if (p.p_drop > 0) {
        if (!dropout_keep(p.seed, p.offset, bsq, p.heads_q, h, uint32_t(i), uint32_t(j), p.drop_threshold)) continue;
        pj *= p.rp_keep;
      }
      if (emulate) pj = round_dt(float(pj), p.dtype);
      const float* v = &V[(p.varlen ? (k_off + j) * p.v_stride.s : bsq * p.v_stride.b + j * p.v_stride.s) +
                          hk * p.v_stride.h];
      for (int64_t c = 0; c < p.head_dim_v; ++c) acc[c] += pj * v[c];
    }
    for (int64_t c = 0; c < p.head_dim_v; ++c) o[c] = emulate ? round_dt(float(acc[c]), p.dtype) : acc[c];
  }
}

static bool run_case(const Case& cs, Result* res, std::mt19937& rng) {
  AttnParams p{};
  p.batch = cs.b;
  p.heads_q = cs.hq;
  p.heads_kv = cs.hkv;
  p.head_dim_qk = cs.d;
  p.head_dim_v = cs.dv;
  p.dtype = cs.dtype;
  p.direction = kForward;
  p.varlen = cs.varlen;
  std::vector<int32_t> cuq(cs.b + 1, 0), cuk(cs.b + 1, 0);
  if (cs.varlen) {
    int64_t mq = 1, mk = 1;
    for (int64_t i = 0; i < cs.b; ++i) {
      cuq[i + 1] = cuq[i] + cs.lens_q[i];
      cuk[i + 1] = cuk[i] + cs.lens_k[i];
      mq = std::max<int64_t>(mq, cs.lens_q[i]);
      mk = std::max<int64_t>(mk, cs.lens_k[i]);
    }
    p.total_q = cuq[cs.b];
    p.total_k = cuk[cs.b];
    p.seqlen_q = mq;
    p.seqlen_k = mk;
  } else {
    p.seqlen_q = cs.sq;
    p.seqlen_k = cs.sk;
  }
  // Token-major extents: non-varlen (b, s); varlen (1, total).
  const int64_t tb = cs.varlen ? 1 : cs.b;
  const int64_t tsq = cs.varlen ? p.total_q : p.seqlen_q, tsk = cs.varlen ? p.total_k : p.seqlen_k;
  int64_t nq, nk, nv, no;
  p.q_stride = make_strides(cs.stride_mode, tb, tsq, cs.hq, cs.d, &nq);
  p.k_stride = make_strides(cs.stride_mode, tb, tsk, cs.hkv, cs.d, &nk);
  p.v_stride = make_strides(cs.stride_mode, tb, tsk, cs.hkv, cs.dv, &nv);
  p.o_stride = make_strides(cs.stride_mode, tb, tsq, cs.hq, cs.dv, &no);
  nq = std::max<int64_t>(nq, 8);
  nk = std::max<int64_t>(nk, 8);
  nv = std::max<int64_t>(nv, 8);
  no = std::max<int64_t>(no, 8);
  p.scale = cs.scale > 0 ? cs.scale : float(1.0 / sqrt(double(cs.d)));
  p.softcap = cs.softcap;
  p.has_band = (cs.wl >= 0 || cs.wr >= 0);
  p.align = cs.align;
  p.window_left = cs.wl;
  p.window_right = cs.wr;
  p.bias_kind = cs.bias_kind;
  p.p_drop = cs.p_drop;
  p.rp_keep = cs.p_drop > 0 ? 1.f / (1.f - cs.p_drop) : 1.f;
  p.drop_threshold = dropout_threshold(cs.p_drop);
  p.seed = 0x1234abcd9876ull;
  p.offset = 77;

  std::normal_distribution<float> nd(0.f, 1.f);
  auto fill = [&](int64_t n, float amp) {
    std::vector<float> v(n);
    for (auto& x : v) x = round_dt(nd(rng) * amp, cs.dtype);
    return v;
  };
  std::vector<float> Q = fill(nq, 1.f), K = fill(nk, 1.f), V = fill(nv, 1.f);
  // Bias
  std::vector<float> Bias;
  int64_t nbias = 0;
  if (cs.bias_kind == kBiasTensor) {
    const int64_t sq = p.seqlen_q, sk = p.seqlen_k;
    if (cs.bias_stride_mode == 0) {
      p.bias_stride[3] = 1;
      p.bias_stride[2] = sk;
      p.bias_stride[1] = sq * sk;
      p.bias_stride[0] = cs.hq * sq * sk;
      nbias = cs.b * cs.hq * sq * sk;
    } else if (cs.bias_stride_mode == 1) {
      p.bias_stride[3] = 1;
      p.bias_stride[2] = sk + 3;
      p.bias_stride[1] = sq * (sk + 3);
      p.bias_stride[0] = 0;
      nbias = cs.hq * sq * (sk + 3);
    } else if (cs.bias_stride_mode == 3) {  // 16-byte aligned rows: staged through shared memory
      const int64_t rs = (sk + 7) / 8 * 8 + 8;
      p.bias_stride[3] = 1;
      p.bias_stride[2] = rs;
      p.bias_stride[1] = sq * rs;
      p.bias_stride[0] = cs.hq * sq * rs;
      nbias = cs.b * cs.hq * sq * rs;
    } else {
      p.bias_stride[3] = 0;
      p.bias_stride[2] = 1;
      p.bias_stride[1] = 0;
      p.bias_stride[0] = 0;
      nbias = sq;
    }
    Bias = fill(nbias, 2.f);
  }
  std::vector<float> slopes(cs.hq);
  for (int64_t h = 0; h < cs.hq; ++h) slopes[h] = powf(2.f, -8.f * (h + 1) / cs.hq);
  // Layout
  std::vector<uint8_t> lay;
  if (cs.layout) {
    p.block_q = cs.block_q;
    p.block_k = cs.block_k;
    p.layout_heads = cs.layout_heads;
    p.n_row_blocks = (p.seqlen_q + cs.block_q - 1) / cs.block_q;
    p.n_col_blocks = (p.seqlen_k + cs.block_k - 1) / cs.block_k;
    lay.resize(p.layout_heads * p.n_row_blocks * p.n_col_blocks);
    std::uniform_real_distribution<float> ud(0.f, 1.f);
    for (auto& x : lay) x = ud(rng) < cs.density ? 1 : 0;
    if (p.n_row_blocks > 1)  // one fully empty row of blocks: fully masked rows
      for (int64_t c = 0; c < p.n_col_blocks; ++c) lay[1 * p.n_col_blocks + c] = 0;
  }

  // Device buffers
  auto up16 = [&](const std::vector<float>& v) {
    std::vector<uint16_t> hbuf(v.size());
    for (size_t i = 0; i < v.size(); ++i) hbuf[i] = f2h(v[i], cs.dtype);
    void* d;
    CK(cudaMalloc(&d, hbuf.size() * 2));
    CK(cudaMemcpy(d, hbuf.data(), hbuf.size() * 2, cudaMemcpyHostToDevice));
    return d;
  };
  void *dQ = up16(Q), *dK = up16(K), *dV = up16(V), *dO, *dBias = nullptr;
  CK(cudaMalloc(&dO, no * 2));
  CK(cudaMemset(dO, 0xFF, no * 2));  // NaN poison
  float* dL = nullptr;
  const int64_t nl = cs.varlen ? cs.hq * p.total_q : cs.b * cs.hq * p.seqlen_q;
  if (!cs.no_lse) {
    CK(cudaMalloc(&dL, std::max<int64_t>(nl, 1) * 4));
    CK(cudaMemset(dL, 0xFF, std::max<int64_t>(nl, 1) * 4));
  }
  if (cs.bias_kind == kBiasTensor) dBias = up16(Bias);
  float* dSlopes = nullptr;
  CK(cudaMalloc(&dSlopes, cs.hq * 4));
  CK(cudaMemcpy(dSlopes, slopes.data(), cs.hq * 4, cudaMemcpyHostToDevice));
  uint8_t* dLay = nullptr;
  if (cs.layout) {
    CK(cudaMalloc(&dLay, lay.size()));
    CK(cudaMemcpy(dLay, lay.data(), lay.size(), cudaMemcpyHostToDevice));
  }
  int32_t *dcuq = nullptr, *dcuk = nullptr;
  if (cs.varlen) {
    CK(cudaMalloc(&dcuq, cuq.size() * 4));
    CK(cudaMalloc(&dcuk, cuk.size() * 4));
    CK(cudaMemcpy(dcuq, cuq.data(), cuq.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dcuk, cuk.data(), cuk.size() * 4, cudaMemcpyHostToDevice));
  }
  AttnParams pd = p;
  pd.q = dQ;
  pd.k = dK;
  pd.v = dV;
  pd.o = dO;
  pd.lse = dL;
  pd.bias = dBias;
  pd.alibi_slopes = (cs.bias_kind == kBiasAlibi || cs.bias_kind == kBiasAlibiSymmetric) ? dSlopes : nullptr;
  pd.layout = dLay;
  pd.cu_seqlens_q = dcuq;
  pd.cu_seqlens_k = dcuk;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  flashattn_status_t st = gen1_check(pd, prop);
  if (st == FLASHATTN_STATUS_SUCCESS) st = gen1_fwd(pd, nullptr, 0, 0);
  if (st != FLASHATTN_STATUS_SUCCESS) {
    printf("  %-44s FAILED status %d: %s\n", cs.name.c_str(), int(st), last_error_message());
    return false;
  }
  CK(cudaDeviceSynchronize());
  std::vector<uint16_t> Oh(no);
  CK(cudaMemcpy(Oh.data(), dO, no * 2, cudaMemcpyDeviceToHost));
  std::vector<float> Lh(std::max<int64_t>(nl, 1));
  if (dL) CK(cudaMemcpy(Lh.data(), dL, std::max<int64_t>(nl, 1) * 4, cudaMemcpyDeviceToHost));

  // Reference (host pointers)
  AttnParams pr = p;
  pr.alibi_slopes = slopes.data();
  pr.layout = cs.layout ? lay.data() : nullptr;
  const int64_t nref = cs.b * cs.hq * p.seqlen_q * cs.dv;
  std::vector<double> Oref(nref, 0), Ostd(nref, 0), Lref(cs.b * cs.hq * p.seqlen_q, 0), Lstd = Lref;
  {
    std::vector<std::thread> th;
    const int nth = std::max(1u, std::thread::hardware_concurrency());
    for (int w = 0; w < nth; ++w)
      th.emplace_back([&, w] {
        for (int64_t bh = w; bh < cs.b * cs.hq; bh += nth) {
          const int64_t bi = bh / cs.hq, h = bh % cs.hq;
          const int64_t qo = cs.varlen ? cuq[bi] : 0, ko = cs.varlen ? cuk[bi] : 0;
          const int64_t lq = cs.varlen ? cs.lens_q[bi] : p.seqlen_q, lk = cs.varlen ? cs.lens_k[bi] : p.seqlen_k;
          reference(pr, Q, K, V, Bias, bi, h, qo, ko, lq, lk, false, Oref, Lref);
          reference(pr, Q, K, V, Bias, bi, h, qo, ko, lq, lk, true, Ostd, Lstd);
        }
      });
    for (auto& t : th) t.join();
  }
  // Compare
  std::vector<char> touched(no, 0);
  double sum_err = 0;
  long long cnt = 0;
  for (int64_t bi = 0; bi < cs.b; ++bi) {
    const int64_t lq = cs.varlen ? cs.lens_q[bi] : p.seqlen_q;
    for (int64_t h = 0; h < cs.hq; ++h)
      for (int64_t i = 0; i < lq; ++i) {
        const int64_t base =
            (cs.varlen ? (cuq[bi] + i) * p.o_stride.s : bi * p.o_stride.b + i * p.o_stride.s) + h * p.o_stride.h;
        const int64_t rbase = ((bi * cs.hq + h) * p.seqlen_q + i) * cs.dv;
        for (int64_t c = 0; c < cs.dv; ++c) {
          touched[base + c] = 1;
          const float o = h2f(Oh[base + c], cs.dtype);
          if (!std::isfinite(o)) {
            res->not_finite++;
            continue;
          }
          const double e = fabs(o - Oref[rbase + c]);
          res->max_err = std::max(res->max_err, e);
          res->std_max_err = std::max(res->std_max_err, fabs(Ostd[rbase + c] - Oref[rbase + c]));
          sum_err += e;
          cnt++;
        }
        if (dL) {
          const int64_t li = cs.varlen ? h * p.total_q + cuq[bi] + i : (bi * cs.hq + h) * p.seqlen_q + i;
          const double lr = Lref[(bi * cs.hq + h) * p.seqlen_q + i];
          const float lg = Lh[li];
          if (std::isinf(lr) || std::isinf(lg)) {
            if (!(std::isinf(lr) && std::isinf(lg) && lr < 0 && lg < 0)) res->inf_mismatch++;
          } else if (std::isnan(lg)) {
            res->not_finite++;
          } else {
            res->lse_max_err = std::max(res->lse_max_err, fabs(lg - lr));
          }
        }
      }
  }
  for (int64_t x = 0; x < no; ++x)
    if (!touched[x] && Oh[x] != 0xFFFF) res->outside_written++;
  res->mean_err = cnt ? sum_err / cnt : 0;
  cudaFree(dQ);
  cudaFree(dK);
  cudaFree(dV);
  cudaFree(dO);
  cudaFree(dL);
  cudaFree(dBias);
  cudaFree(dSlopes);
  cudaFree(dLay);
  cudaFree(dcuq);
  cudaFree(dcuk);
  // Pass: finite, nothing outside written, LSE -inf exactly where expected, error at most
  // 2x the same-precision standard attention's (plus a small absolute floor).
  const double floor_abs = cs.dtype == kBf16 ? 4e-3 : 6e-4;
  const bool ok = res->not_finite == 0 && res->outside_written == 0 && res->inf_mismatch == 0 &&
                  res->max_err <= 2.0 * res->std_max_err + floor_abs && res->lse_max_err < 1e-2;
  printf("  %-44s %s  max %.2e (std %.2e) mean %.2e  lse %.1e  nonfinite %lld outside %lld infmis %lld\n",
         cs.name.c_str(), ok ? "PASS" : "FAIL", res->max_err, res->std_max_err, res->mean_err, res->lse_max_err,
         res->not_finite, res->outside_written, res->inf_mismatch);
  return ok;
}

static int run_checks() {
  std::mt19937 rng(12345);
  std::vector<Case> cases;
  auto add = [&](Case c) { cases.push_back(c); };
  // Head dims (every config, padded dims, unequal pairs), both dtypes.
  for (int dt : {kBf16, kFp16})
    for (auto dd : std::vector<std::pair<int, int>>{{32, 32}, {64, 64}, {96, 96}, {128, 128}, {192, 192}, {256, 256},
                                                    {192, 128}, {40, 40}, {72, 72}, {200, 200}, {64, 128}, {8, 8}}) {
      Case c;
      c.dtype = dt;
      c.d = dd.first;
      c.dv = dd.second;
      c.sq = 197;
      c.sk = 261;
      c.name = std::string(dt == kBf16 ? "bf16" : "fp16") + " d=" + std::to_string(dd.first) + "/" +
               std::to_string(dd.second) + " sq197 sk261";
      add(c);
    }
  for (int d : {64, 128, 256}) {
    for (int align : {0, 1})
      for (auto sqk : std::vector<std::pair<int, int>>{{300, 300}, {200, 333}, {333, 200}}) {
        Case c;
        c.d = c.dv = d;
        c.sq = sqk.first;
        c.sk = sqk.second;
        c.wr = 0;
        c.align = align;
        c.name = "causal " + std::string(align ? "BR" : "TL") + " d=" + std::to_string(d) + " " +
                 std::to_string(c.sq) + "x" + std::to_string(c.sk);
        add(c);
      }
    Case c;
    c.d = c.dv = d;
    c.sq = 400;
    c.sk = 450;
    c.wl = 70;
    c.wr = 13;
    c.align = 1;
    c.name = "window(70,13) BR d=" + std::to_string(d);
    add(c);
    c.wl = 100;
    c.wr = -1;
    c.align = 0;
    c.name = "window(100,-) TL d=" + std::to_string(d);
    add(c);
  }
  {
    Case c;
    c.d = c.dv = 128;
    c.sq = 260;
    c.sk = 300;
    c.softcap = 5.f;
    c.scale = 0.3f;
    c.name = "softcap 5 d=128";
    add(c);
    c = Case();
    c.d = c.dv = 64;
    c.sq = 150;
    c.sk = 190;
    c.bias_kind = kBiasTensor;
    c.name = "bias full d=64";
    add(c);
    c.bias_stride_mode = 1;
    c.name = "bias bcast-b d=64";
    add(c);
    c.bias_stride_mode = 2;
    c.dtype = kFp16;
    c.name = "bias bcast-bh kstride0 fp16 d=64";
    add(c);
    for (int d : {64, 128, 256}) {
      c = Case();
      c.d = c.dv = d;
      c.sq = 150;
      c.sk = 190;
      c.bias_kind = kBiasTensor;
      c.bias_stride_mode = 3;
      c.wr = 0;
      c.align = 1;
      c.name = "bias aligned rows (smem) causal d=" + std::to_string(d);
      add(c);
    }
    c = Case();
    c.d = c.dv = 128;
    c.sq = 300;
    c.sk = 280;
    c.bias_kind = kBiasAlibi;
    c.wr = 0;
    c.align = 1;
    c.name = "alibi + causal BR d=128";
    add(c);
    c.bias_kind = kBiasAlibiSymmetric;
    c.wr = -1;
    c.name = "alibi symmetric d=128";
    add(c);
    c = Case();
    c.d = c.dv = 64;
    c.sq = 257;
    c.sk = 383;
    c.p_drop = 0.17f;
    c.name = "dropout 0.17 d=64";
    add(c);
    c.d = c.dv = 128;
    c.dtype = kFp16;
    c.wr = 0;
    c.name = "dropout 0.17 causal fp16 d=128";
    add(c);
    c = Case();
    c.d = c.dv = 128;
    c.sq = 512;
    c.sk = 640;
    c.layout = true;
    c.layout_heads = 4;
    c.name = "block-sparse 128x64 per-head d=128";
    add(c);
    c.block_q = 48;
    c.block_k = 40;
    c.layout_heads = 1;
    c.name = "block-sparse 48x40 (partial tiles) d=128";
    add(c);
    c.d = c.dv = 64;
    c.wr = 0;
    c.p_drop = 0.1f;
    c.name = "block-sparse 48x40 + causal + dropout d=64";
    add(c);
    c = Case();
    c.d = c.dv = 64;
    c.sq = 200;
    c.sk = 300;
    c.layout = true;
    c.block_q = 4;
    c.block_k = 4;
    c.density = 0.7f;
    c.name = "block-sparse 4x4 (>32 lookups/tile) d=64";
    add(c);
    c = Case();
    c.d = c.dv = 128;
    c.b = 1;
    c.hq = c.hkv = 2;
    c.sq = 384;
    c.sk = 4100;
    c.layout = true;
    c.block_q = 128;
    c.block_k = 64;
    c.density = 0.03f;
    c.name = "block-sparse density 0.03 sk=4100 d=128";
    add(c);
    c.d = c.dv = 32;
    c.block_k = 32;
    c.wr = 0;
    c.align = 1;
    c.name = "block-sparse 0.03 32-col blocks causal d=32";
    add(c);
    c = Case();
    c.varlen = true;
    c.b = 4;
    c.lens_q = {100, 0, 300, 17};
    c.lens_k = {150, 37, 211, 0};
    c.d = c.dv = 128;
    c.name = "varlen (empty seqs) d=128";
    add(c);
    c.wr = 0;
    c.align = 1;
    c.hkv = 2;
    c.p_drop = 0.2f;
    c.bias_kind = kBiasAlibi;
    c.name = "varlen causal BR gqa dropout alibi d=128";
    add(c);
    c = Case();
    c.hq = 8;
    c.hkv = 2;
    c.d = c.dv = 64;
    c.name = "gqa 8/2 d=64";
    add(c);
    c.hkv = 1;
    c.name = "mqa 8/1 d=64";
    add(c);
    c = Case();
    c.stride_mode = 1;
    c.d = c.dv = 96;
    c.name = "BHSD strides d=96";
    add(c);
    c.stride_mode = 2;
    c.d = c.dv = 128;
    c.wr = 0;
    c.name = "padded strides causal d=128";
    add(c);
    c.no_lse = true;
    c.name = "no lse d=128";
    add(c);
    c = Case();
    c.d = 192;
    c.dv = 128;
    c.sq = 333;
    c.sk = 333;
    c.wr = 0;
    c.softcap = 20.f;
    c.hq = 6;
    c.hkv = 3;
    c.name = "d=192/128 causal softcap gqa";
    add(c);
  }
  int fails = 0;
  const char* filter = getenv("FWD_FILTER");  // only cases whose name contains this
  size_t ran = 0;
  for (const Case& c : cases) {
    if (filter != nullptr && c.name.find(filter) == std::string::npos) continue;
    ++ran;
    Result r;
    if (!run_case(c, &r, rng)) ++fails;
  }
  printf("CHECKS: %d / %zu passed\n", int(ran) - fails, ran);
  return fails;
}

struct BenchCfg {
  std::string name;
  int d = 128, s = 16384;
  bool causal = false;
  float p_drop = 0.f, softcap = 0.f;
  int bias_kind = kBiasNone;
  float density = 1.f;  // block-sparse layout 128x64 blocks when < 1
  int64_t window = -1;  // sliding window (left, right 0)
  bool extras_only_check = false;
};

static void bench_one(const BenchCfg& bb) {
  const int64_t s = bb.s, bsz = 16384 / s, h = 2048 / bb.d, d = bb.d;
  AttnParams p{};
  p.batch = bsz;
  p.seqlen_q = p.seqlen_k = s;
  p.heads_q = p.heads_kv = h;
  p.head_dim_qk = p.head_dim_v = d;
  p.dtype = kBf16;
  p.direction = kForward;
  int64_t n;
  p.q_stride = p.k_stride = p.v_stride = p.o_stride = make_strides(0, bsz, s, h, d, &n);
  p.scale = 1.f / sqrtf(float(d));
  p.has_band = bb.causal || bb.window >= 0;
  p.window_left = bb.window;
  p.window_right = (bb.causal || bb.window >= 0) ? 0 : -1;
  p.softcap = bb.softcap;
  p.p_drop = bb.p_drop;
  p.rp_keep = 1.f / (1.f - bb.p_drop);
  p.drop_threshold = dropout_threshold(bb.p_drop);
  p.seed = 42;
  p.bias_kind = bb.bias_kind;
  std::vector<uint16_t> hbuf(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : hbuf) x = f2h(nd(rng), kBf16);
  void *q, *k, *v, *o, *bias = nullptr;
  float *lse, *slopes;
  uint8_t* lay = nullptr;
  CK(cudaMalloc(&q, n * 2));
  CK(cudaMalloc(&k, n * 2));
  CK(cudaMalloc(&v, n * 2));
  CK(cudaMalloc(&o, n * 2));
  CK(cudaMalloc(&lse, bsz * h * s * 4));
  CK(cudaMemcpy(q, hbuf.data(), n * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(k, hbuf.data(), n * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(v, hbuf.data(), n * 2, cudaMemcpyHostToDevice));
  std::vector<float> sl(h);
  for (int64_t i = 0; i < h; ++i) sl[i] = powf(2.f, -8.f * (i + 1) / h);
  CK(cudaMalloc(&slopes, h * 4));
  CK(cudaMemcpy(slopes, sl.data(), h * 4, cudaMemcpyHostToDevice));
  p.alibi_slopes = slopes;
  if (bb.bias_kind == kBiasTensor) {  // [sq, sk] broadcast over batch and heads
    CK(cudaMalloc(&bias, s * s * 2));
    std::vector<uint16_t> bh(s * s);
    for (auto& x : bh) x = f2h(nd(rng), kBf16);
    CK(cudaMemcpy(bias, bh.data(), s * s * 2, cudaMemcpyHostToDevice));
    p.bias = bias;
    p.bias_stride[0] = 0;
    p.bias_stride[1] = 0;
    p.bias_stride[2] = s;
    p.bias_stride[3] = 1;
  }
  double active = 1.0;
  if (bb.density < 1.f) {
    p.block_q = 128;
    p.block_k = 64;
    p.layout_heads = 1;
    p.n_row_blocks = (s + 127) / 128;
    p.n_col_blocks = (s + 63) / 64;
    std::vector<uint8_t> lh(p.n_row_blocks * p.n_col_blocks);
    std::uniform_real_distribution<float> ud(0.f, 1.f);
    size_t on = 0;
    for (auto& x : lh) on += (x = ud(rng) < bb.density ? 1 : 0);
    active = double(on) / lh.size();
    CK(cudaMalloc(&lay, lh.size()));
    CK(cudaMemcpy(lay, lh.data(), lh.size(), cudaMemcpyHostToDevice));
    p.layout = lay;
  }
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = o;
  p.lse = lse;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int w = 0; w < 3; ++w)
    if (gen1_fwd(p, nullptr, 0, 0) != FLASHATTN_STATUS_SUCCESS) printf("launch failed: %s\n", last_error_message());
  std::vector<float> ts;
  for (int r = 0; r < 30; ++r) {
    CK(cudaEventRecord(e0));
    gen1_fwd(p, nullptr, 0, 0);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ts.push_back(ms);
  }
  CK(cudaGetLastError());
  std::sort(ts.begin(), ts.end());
  const double ms = ts[ts.size() / 2];
  // FLOPs of the dense problem (causal halved), the peers' convention.
  double flops = 4.0 * bsz * h * double(s) * s * d;
  if (bb.causal) flops /= 2;
  printf("BENCH gen1 %-28s d=%d seq=%d: %.3f ms  %.1f TFLOP/s", bb.name.c_str(), bb.d, bb.s, ms, flops / ms / 1e9);
  if (bb.density < 1.f) printf("  (active blocks %.3f; %.1f TFLOP/s on active)", active, flops * active / ms / 1e9);
  if (bb.window >= 0) printf("  (window %lld)", (long long)bb.window);
  printf("\n");
  cudaFree(q);
  cudaFree(k);
  cudaFree(v);
  cudaFree(o);
  cudaFree(lse);
  cudaFree(slopes);
  cudaFree(bias);
  cudaFree(lay);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

static void bench(const std::string& which) {
  printf("\nBENCH gen1 fwd bf16, 16k tokens, h = 2048/d (TFLOP/s, median of 30)\n");
  std::vector<BenchCfg> bs;
  auto add = [&](BenchCfg b) { bs.push_back(b); };
  for (auto dsc : std::vector<std::tuple<int, int, bool>>{{64, 4096, false}, {64, 16384, false}, {128, 4096, false},
                                                          {128, 16384, false}, {128, 16384, true}, {256, 4096, false},
                                                          {256, 16384, false}, {128, 512, false}}) {
    BenchCfg b;
    b.d = std::get<0>(dsc);
    b.s = std::get<1>(dsc);
    b.causal = std::get<2>(dsc);
    b.name = b.causal ? "causal" : "noncausal";
    add(b);
  }
  if (which == "options" || which == "all") {
    for (int d : {64, 128}) {
      BenchCfg b;
      b.d = d;
      b.s = 4096;
      b.name = "opt:none";
      add(b);
      b.name = "opt:dropout0.1";
      b.p_drop = 0.1f;
      add(b);
      b.p_drop = 0;
      b.name = "opt:softcap30";
      b.softcap = 30.f;
      add(b);
      b.softcap = 0;
      b.name = "opt:alibi";
      b.bias_kind = kBiasAlibi;
      add(b);
      b.name = "opt:bias[sq,sk]";
      b.bias_kind = kBiasTensor;
      add(b);
      b.bias_kind = kBiasNone;
      b.name = "opt:blocksparse0.5";
      b.density = 0.5f;
      add(b);
      b.name = "opt:blocksparse0.25";
      b.density = 0.25f;
      add(b);
      b.density = 1.f;
      b.name = "opt:window(512,0)";
      b.window = 512;
      add(b);
      b.window = -1;
      b.name = "opt:causal";
      b.causal = true;
      add(b);
    }
  }
  for (const BenchCfg& b : bs) bench_one(b);
}

// Tile-shape experiments: other FwdTraits for the same head dims, launched directly.
template <typename Cfg>
static void bench_variant(const char* label, int d, int sq, bool causal) {
  const int64_t s = sq, bsz = 16384 / s, h = 2048 / d;
  AttnParams p{};
  p.batch = bsz;
  p.seqlen_q = p.seqlen_k = s;
  p.heads_q = p.heads_kv = h;
  p.head_dim_qk = p.head_dim_v = d;
  p.dtype = kBf16;
  p.direction = kForward;
  int64_t n;
  p.q_stride = p.k_stride = p.v_stride = p.o_stride = make_strides(0, bsz, s, h, d, &n);
  p.scale = 1.f / sqrtf(float(d));
  p.has_band = causal;
  p.window_left = -1;
  p.window_right = causal ? 0 : -1;
  p.rp_keep = 1.f;
  std::vector<uint16_t> hbuf(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : hbuf) x = f2h(nd(rng), kBf16);
  void *q, *k, *v, *o;
  float* lse;
  CK(cudaMalloc(&q, n * 2));
  CK(cudaMalloc(&k, n * 2));
  CK(cudaMalloc(&v, n * 2));
  CK(cudaMalloc(&o, n * 2));
  CK(cudaMalloc(&lse, bsz * h * s * 4));
  CK(cudaMemcpy(q, hbuf.data(), n * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(k, hbuf.data(), n * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(v, hbuf.data(), n * 2, cudaMemcpyHostToDevice));
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = o;
  p.lse = lse;
  auto kern = gen1::fwd_kernel<Cfg, __nv_bfloat16, false>;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  const dim3 grid((s + Cfg::kBlockM - 1) / Cfg::kBlockM, h, bsz);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int w = 0; w < 3; ++w) kern<<<grid, Cfg::kThreads, Cfg::kSmemBytes>>>(p, 0, 0, 0);
  CK(cudaGetLastError());
  std::vector<float> ts;
  for (int r = 0; r < 30; ++r) {
    CK(cudaEventRecord(e0));
    kern<<<grid, Cfg::kThreads, Cfg::kSmemBytes>>>(p, 0, 0, 0);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ts.push_back(ms);
  }
  std::sort(ts.begin(), ts.end());
  const double ms = ts[ts.size() / 2];
  double flops = 4.0 * bsz * h * double(s) * s * d / (causal ? 2 : 1);
  printf("BENCH variant %-18s d=%d seq=%d %s: %.3f ms  %.1f TFLOP/s\n", label, d, sq, causal ? "causal" : "noncausal", ms,
         flops / ms / 1e9);
  cudaFree(q);
  cudaFree(k);
  cudaFree(v);
  cudaFree(o);
  cudaFree(lse);
}

static void variants() {
  printf("\nBENCH tile-shape variants (bf16, 16k tokens)\n");
  using gen1::FwdTraits;
  bench_variant<FwdTraits<64, 64, 128, 128, 4>>("128x128w4(cur)", 64, 16384, false);
  bench_variant<FwdTraits<64, 64, 128, 64, 4>>("128x64w4", 64, 16384, false);
  bench_variant<FwdTraits<64, 64, 128, 128, 8>>("128x128w8", 64, 16384, false);
  bench_variant<FwdTraits<128, 128, 128, 64, 4>>("128x64w4(cur)", 128, 16384, false);
  bench_variant<FwdTraits<128, 128, 128, 128, 8>>("128x128w8", 128, 16384, false);
  bench_variant<FwdTraits<128, 128, 128, 32, 4>>("128x32w4", 128, 16384, false);
  bench_variant<FwdTraits<128, 128, 128, 64, 4>>("128x64w4(cur)", 128, 16384, true);
  bench_variant<FwdTraits<128, 128, 128, 128, 8>>("128x128w8", 128, 16384, true);
  bench_variant<FwdTraits<256, 256, 64, 64, 4>>("64x64w4(cur)", 256, 16384, false);
  bench_variant<FwdTraits<256, 256, 128, 64, 8>>("128x64w8", 256, 16384, false);
  bench_variant<FwdTraits<256, 256, 64, 32, 4>>("64x32w4", 256, 16384, false);
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  int fails = 0;
  if (mode == "check" || mode == "all" || mode == "checkopts") fails = run_checks();
  if (mode == "bench" || mode == "all" || mode == "options" || mode == "checkopts")
    bench(mode == "checkopts" ? "options" : mode);
  if (mode == "variants" || mode == "all") variants();
  return fails ? 1 : 0;
}
