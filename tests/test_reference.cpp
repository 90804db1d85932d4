// Tests of the tests: the fp64 reference's backward is checked by central finite differences
// of its own forward loss sum(O * dO), for every option, so the gradients the library is
// held to are right. Also pins the host fp16/bf16 conversions the harness relies on.
#include <math.h>

#include <limits>
#include <sstream>

#include "catch_compat.hpp"
#include "harness.hpp"
#include "reference.hpp"

using namespace fat;

namespace {

// Central difference of reference_loss with respect to one scalar reached through `slot`.
template <class Setter>
double central_difference(const Problem& p0, Setter set, double x0, double h) {
  Problem p = p0;
  set(p, x0 + h);
  const double lp = reference_loss(p.spec, p.in);
  set(p, x0 - h);
  const double lm = reference_loss(p.spec, p.in);
  return (lp - lm) / (2 * h);
}

struct GradCheck {
  double max_err = 0;
  size_t checked = 0;
  std::string worst;
};

void check_tensor(const Problem& p, const char* name, std::vector<double> RefInputs::*field,
                  const std::vector<double>& analytic, GradCheck& g) {
  const double h = 1e-5;
  const std::vector<double>& x = p.in.*field;
  for (size_t n = 0; n < x.size(); ++n) {
    const double fd = central_difference(
        p, [&](Problem& q, double val) { (q.in.*field)[n] = val; }, x[n], h);
    const double err = fabs(fd - analytic[n]) / (1.0 + fabs(analytic[n]));
    ++g.checked;
    if (err > g.max_err) {
      g.max_err = err;
      std::ostringstream o;
      o << name << "[" << n << "]: finite difference " << fd << " vs reference gradient " << analytic[n];
      g.worst = o.str();
    }
  }
}

// dBias: perturbing one stored element moves its whole broadcast group.
void check_bias(const Problem& p, const std::vector<double>& analytic_expanded, GradCheck& g) {
  const RefSpec& s = p.spec;
  const Config& c = p.cfg;
  const int64_t nh = c.bias_bcast[1] ? 1 : c.hq, ni = c.bias_bcast[2] ? 1 : c.sq, nj = c.bias_bcast[3] ? 1 : c.sk;
  auto reduced_of = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    return (((c.bias_bcast[0] ? 0 : b) * nh + (c.bias_bcast[1] ? 0 : h)) * ni + (c.bias_bcast[2] ? 0 : i)) * nj +
           (c.bias_bcast[3] ? 0 : j);
  };
  for (size_t r = 0; r < p.bias_reduced.size(); ++r) {
    if (!std::isfinite(p.bias_reduced[r])) continue;
    auto set = [&](Problem& q, double val) {
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t h = 0; h < s.heads_q; ++h)
          for (int64_t i = 0; i < s.max_sq; ++i)
            for (int64_t j = 0; j < s.max_sk; ++j)
              if (reduced_of(b, h, i, j) == static_cast<int64_t>(r))
                q.spec.bias[((b * s.heads_q + h) * s.max_sq + i) * s.max_sk + j] = val;
    };
    const double fd = central_difference(p, set, p.bias_reduced[r], 1e-5);
    // Any expanded element of the group holds the group's sum; find one.
    double an = std::numeric_limits<double>::quiet_NaN();
    for (int64_t b = 0; b < s.batch && std::isnan(an); ++b)
      for (int64_t h = 0; h < s.heads_q && std::isnan(an); ++h)
        for (int64_t i = 0; i < s.max_sq && std::isnan(an); ++i)
          for (int64_t j = 0; j < s.max_sk; ++j)
            if (reduced_of(b, h, i, j) == static_cast<int64_t>(r)) {
              an = analytic_expanded[((b * s.heads_q + h) * s.max_sq + i) * s.max_sk + j];
              break;
            }
    const double err = fabs(fd - an) / (1.0 + fabs(an));
    ++g.checked;
    if (!(err <= g.max_err)) {
      g.max_err = std::isnan(err) ? 1e300 : err;
      std::ostringstream o;
      o << "bias[" << r << "]: finite difference " << fd << " vs reference dBias " << an;
      g.worst = o.str();
    }
  }
}

void fd_check(const Config& c) {
  const Problem p = make_problem(c);
  INFO(describe(p.cfg));
  const RefOutputs r = reference_fp64(p.spec, p.in, true);
  GradCheck g;
  check_tensor(p, "q", &RefInputs::q, r.dq, g);
  check_tensor(p, "k", &RefInputs::k, r.dk, g);
  check_tensor(p, "v", &RefInputs::v, r.dv, g);
  if (c.bias == FLASHATTN_BIAS_TENSOR) check_bias(p, r.dbias, g);
  INFO("checked " << g.checked << " partial derivatives; worst " << g.worst << " (relative error " << g.max_err << ")");
  CHECK(g.checked > 0);
  CHECK(g.max_err < 1e-6);
}

Config tiny(const char* name) {
  Config c;
  c.name = name;
  c.batch = 2;
  c.sq = 5;
  c.sk = 4;
  c.hq = 2;
  c.hkv = 1;
  c.dqk = 3;
  c.dv = 2;
  c.dtype = FLASHATTN_DTYPE_FP32;
  c.scale = 0.7f;
  c.data_seed = 11;
  return c;
}

}  // namespace

TEST_CASE("fp16 and bf16 conversions round to nearest even", "[reference]") {
  CHECK(f32_to_f16(1.0f) == 0x3c00);
  CHECK(f32_to_f16(-2.0f) == 0xc000);
  CHECK(f32_to_f16(65504.0f) == 0x7bff);
  CHECK(f32_to_f16(65520.0f) == 0x7c00);
  CHECK(f32_to_f16(ldexpf(1.0f, -24)) == 0x0001);
  CHECK(f32_to_f16(ldexpf(1.0f, -25)) == 0x0000);         // tie to even (0)
  CHECK(f32_to_f16(ldexpf(3.0f, -25)) == 0x0002);         // tie to even (2)
  CHECK(f32_to_f16(1.0f + ldexpf(1.0f, -11)) == 0x3c00);  // tie to even
  CHECK(f32_to_f16(1.0f + ldexpf(3.0f, -11)) == 0x3c02);  // tie to even
  CHECK(f32_to_f16(-INFINITY) == 0xfc00);
  CHECK(f16_to_f32(0x3555) == Approx(0.333251953125).margin(0));
  CHECK(f16_to_f32(0x0001) == ldexpf(1.0f, -24));
  CHECK(f16_to_f32(0xfc00) == -INFINITY);
  CHECK(f32_to_bf16(1.0f) == 0x3f80);
  CHECK(f32_to_bf16(1.0f + ldexpf(1.0f, -8)) == 0x3f80);  // tie to even
  CHECK(f32_to_bf16(1.0f + ldexpf(3.0f, -8)) == 0x3f82);
  CHECK(bf16_to_f32(0xc040) == -3.0f);
  for (uint32_t h = 0; h < 0x7c00; ++h) CHECK(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))) == h);
}

TEST_CASE("fp64 reference: closed forms", "[reference]") {
  // One key: O = V (every weight is 1) and LSE = the score.
  Config c = tiny("one key");
  c.sk = 1;
  Problem p = make_problem(c);
  RefOutputs r = reference_fp64(p.spec, p.in, false);
  for (int64_t t = 0; t < p.spec.total_q(); ++t)
    for (int64_t h = 0; h < c.hq; ++h) {
      const int64_t b = t / c.sq;
      double s = 0;
      for (int64_t d = 0; d < c.dqk; ++d) s += p.in.q[(t * c.hq + h) * c.dqk + d] * p.in.k[(b * c.hkv) * c.dqk + d];
      CHECK(r.lse[t * c.hq + h] == Approx(0.7f * s).margin(1e-12));
      for (int64_t d = 0; d < c.dv; ++d)
        CHECK(r.o[(t * c.hq + h) * c.dv + d] == Approx(p.in.v[b * c.dv + d]).margin(1e-12));
    }
  // Keys all zero: uniform weights, O = mean of V, LSE = log(sk).
  c = tiny("zero keys");
  p = make_problem(c);
  std::fill(p.in.k.begin(), p.in.k.end(), 0.0);
  r = reference_fp64(p.spec, p.in, false);
  for (int64_t t = 0; t < p.spec.total_q(); ++t)
    for (int64_t h = 0; h < c.hq; ++h) {
      const int64_t b = t / c.sq;
      CHECK(r.lse[t * c.hq + h] == Approx(log(4.0)).margin(1e-12));
      for (int64_t d = 0; d < c.dv; ++d) {
        double mean = 0;
        for (int64_t j = 0; j < c.sk; ++j) mean += p.in.v[(b * c.sk + j) * c.dv + d] / 4.0;
        CHECK(r.o[(t * c.hq + h) * c.dv + d] == Approx(mean).margin(1e-12));
      }
    }
  // Bottom-right causal with sq > sk: the first sq - sk rows see no key.
  c = tiny("bottom-right causal");
  c.band = true;
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wr = 0;
  p = make_problem(c);
  r = reference_fp64(p.spec, p.in, true);
  for (int64_t t = 0; t < p.spec.total_q(); ++t) {
    const bool masked = t % c.sq == 0;
    CHECK(static_cast<bool>(r.row_masked[t * c.hq]) == masked);
    if (masked) {
      CHECK(r.lse[t * c.hq] == -std::numeric_limits<double>::infinity());
      CHECK(r.o[t * c.hq * c.dv] == 0.0);
      CHECK(r.dq[t * c.hq * c.dqk] == 0.0);
    }
  }
}

TEST_CASE("same-precision standard attention in fp32 is close to fp64", "[reference]") {
  Config c = tiny("lowp fp32");
  c.sq = 17;
  c.sk = 23;
  c.dqk = 16;
  c.dv = 8;
  c.softcap = 3.f;
  c.bias = FLASHATTN_BIAS_TENSOR;
  c.p_drop = 0.2f;
  const Problem p = make_problem(c);
  const RefOutputs e = reference_fp64(p.spec, p.in, true);
  const RefOutputs l = reference_lowp(p.spec, p.in, rounder_for(FLASHATTN_DTYPE_FP32), true);
  for (auto pair : {std::make_pair(&e.o, &l.o), std::make_pair(&e.dq, &l.dq), std::make_pair(&e.dk, &l.dk),
                    std::make_pair(&e.dv, &l.dv), std::make_pair(&e.dbias, &l.dbias)}) {
    const ErrStats s = error_stats(*pair.second, *pair.first);
    CHECK(s.nonfinite_mismatch == 0);
    CHECK(s.max_abs < 1e-5 * (1 + s.max_ref));
  }
  // In fp16 the same computation must be visibly worse (it is the error yardstick).
  const RefOutputs h = reference_lowp(p.spec, p.in, rounder_for(FLASHATTN_DTYPE_FP16), true);
  CHECK(error_stats(h.o, e.o).mean_abs > 10 * error_stats(l.o, e.o).mean_abs);
}

TEST_CASE("fp64 reference gradients match finite differences: dense", "[reference][bwd]") {
  fd_check(tiny("dense GQA"));
  Config c = tiny("MHA dqk!=dv");
  c.hkv = 2;
  c.dqk = 4;
  c.dv = 3;
  fd_check(c);
}

TEST_CASE("fp64 reference gradients match finite differences: band masks", "[reference][bwd]") {
  for (int align = 0; align < 2; ++align) {
    Config c = tiny("causal");
    c.band = true;
    c.align = static_cast<flashattn_mask_align_t>(align);
    c.wr = 0;
    fd_check(c);
    c.name = "sliding window";
    c.wl = 1;
    c.wr = 1;
    fd_check(c);
  }
}

TEST_CASE("fp64 reference gradients match finite differences: softcap", "[reference][bwd]") {
  Config c = tiny("softcap");
  c.scale = 2.0f;
  c.softcap = 1.5f;
  fd_check(c);
}

TEST_CASE("fp64 reference gradients match finite differences: bias tensor with broadcasts", "[reference][bwd]") {
  const bool patterns[][4] = {{false, false, false, false}, {true, false, false, false}, {false, true, false, false},
                              {true, true, false, false},   {false, false, true, false}, {true, true, true, false},
                              {false, false, false, true}};
  for (const auto& pat : patterns) {
    Config c = tiny("bias");
    c.bias = FLASHATTN_BIAS_TENSOR;
    for (int d = 0; d < 4; ++d) c.bias_bcast[d] = pat[d];
    fd_check(c);
  }
  Config c = tiny("bias -inf row");
  c.bias = FLASHATTN_BIAS_TENSOR;
  c.bias_inf_row = 2;
  fd_check(c);
}

TEST_CASE("fp64 reference gradients match finite differences: ALiBi", "[reference][bwd]") {
  for (auto kind : {FLASHATTN_BIAS_ALIBI, FLASHATTN_BIAS_ALIBI_SYMMETRIC})
    for (auto align : {FLASHATTN_ALIGN_TOP_LEFT, FLASHATTN_ALIGN_BOTTOM_RIGHT}) {
      Config c = tiny("alibi");
      c.bias = kind;
      c.align = align;
      fd_check(c);
    }
}

TEST_CASE("fp64 reference gradients match finite differences: dropout with a fixed mask", "[reference][bwd][dropout]") {
  Config c = tiny("dropout");
  c.p_drop = 0.3f;
  c.seed = 42;
  c.offset = 7;
  fd_check(c);
}

TEST_CASE("fp64 reference gradients match finite differences: block-sparse and varlen", "[reference][bwd]") {
  Config c = tiny("sparse");
  c.sparse = true;
  c.block_q = 2;
  c.block_k = 3;
  c.layout_heads = 2;
  c.zero_row_block = 1;
  fd_check(c);
  c = tiny("varlen with empty sequences");
  c.seqlens_q = {3, 0, 4, 2};
  c.seqlens_k = {2, 3, 0, 5};
  c.band = true;
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wr = 0;
  fd_check(c);
}

TEST_CASE("fp64 reference gradients match finite differences: everything combined", "[reference][bwd]") {
  Config c = tiny("combined");
  c.hq = 4;
  c.hkv = 2;
  c.softcap = 2.f;
  c.band = true;
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wl = 3;
  c.wr = 1;
  c.bias = FLASHATTN_BIAS_TENSOR;
  c.bias_bcast[0] = true;
  c.p_drop = 0.25f;
  c.seed = 3;
  c.sparse = true;
  c.block_q = 2;
  c.block_k = 2;
  c.density = 0.8;
  c.seqlens_q = {4, 1, 5};
  c.seqlens_k = {5, 3, 2};
  fd_check(c);
  c.bias = FLASHATTN_BIAS_ALIBI_SYMMETRIC;
  c.bias_bcast[0] = false;
  fd_check(c);
}

TEST_CASE("fp64 reference: threads and RefSpec::magnitudes do not change the results", "[reference]") {
  // `flashattn check` runs the reference on every core, without the condition magnitudes.
  // Every element is summed in the same order, so the outputs are bitwise those of one
  // thread, except dBias under a batch or head broadcast (per-thread partial sums).
  const bool patterns[][4] = {{false, false, false, false},
                              {true, false, false, false},
                              {false, true, true, false},
                              {false, false, false, true}};
  for (const auto& pat : patterns) {
    Config c = tiny("threads");
    c.hq = 4;
    c.hkv = 2;
    c.seqlens_q = {9, 0, 4, 6};
    c.seqlens_k = {4, 11, 0, 7};
    c.bias = FLASHATTN_BIAS_TENSOR;
    for (int d = 0; d < 4; ++d) c.bias_bcast[d] = pat[d];
    c.softcap = 2.f;
    c.p_drop = 0.2f;
    c.seed = 5;
    c.band = true;
    c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
    c.wl = 3;
    c.wr = 1;
    const Problem p = make_problem(c);
    const RefOutputs one = reference_fp64(p.spec, p.in, true, 1);
    const bool partial_sums = pat[0] || pat[1];
    REQUIRE(!one.dbias.empty());
    for (int threads : {2, 3, 8}) {
      INFO("broadcast " << pat[0] << pat[1] << pat[2] << pat[3] << ", threads " << threads);
      const RefOutputs many = reference_fp64(p.spec, p.in, true, threads);
      CHECK(many.o == one.o);
      CHECK(many.lse == one.lse);
      CHECK(many.row_masked == one.row_masked);
      CHECK(many.dq == one.dq);
      CHECK(many.dk == one.dk);
      CHECK(many.dv == one.dv);
      CHECK(many.o_mag == one.o_mag);
      CHECK(many.dq_mag == one.dq_mag);
      if (partial_sums) {
        CHECK(error_stats(many.dbias, one.dbias).max_abs <= 1e-13 * (1 + error_stats(many.dbias, one.dbias).max_ref));
      } else {
        CHECK(many.dbias == one.dbias);
        CHECK(many.dbias_mag == one.dbias_mag);
      }
    }
    RefSpec lean_spec = p.spec;
    lean_spec.magnitudes = false;
    const RefOutputs lean = reference_fp64(lean_spec, p.in, true, 1);
    CHECK(lean.o == one.o);
    CHECK(lean.lse == one.lse);
    CHECK(lean.dq == one.dq);
    CHECK(lean.dk == one.dk);
    CHECK(lean.dv == one.dv);
    CHECK(lean.dbias == one.dbias);
    CHECK((lean.o_mag.empty() && lean.dq_mag.empty() && lean.dk_mag.empty() && lean.dv_mag.empty() &&
           lean.dbias_mag.empty()));
  }
}
