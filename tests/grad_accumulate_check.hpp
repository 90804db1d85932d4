// flashattn_plan_set_grad_accumulate on any backend (MemOps): the configurations that cover
// its options, and the check of one configuration.
//
// The check of one configuration
// (MemOps): the configuration runs without accumulation (checked against the fp64
// reference under the backend's tolerance) and with it, into dQ, dK, dV that start at
// random values g0 (same inputs otherwise). Each accumulated element must be g0 plus the
// gradient within the roundings the header documents: with G the plain run's element,
// ref the fp64 reference and u the dtype's unit roundoff,
//   |acc - (g0 + ref)| <= |G - ref| + u |g0 + G| + u |G| + 2^-22 (|g0| + |G|) + tiny,
// i.e. the plain run's error, one rounding of the sum, at most half an ulp between the
// fp32 gradient and its rounding G, and the fp32 arithmetic (tiny: the dtype's smallest
// subnormal). same_gradient (the CPU): both runs compute the same fp32 gradient, so fp32
// sums are bitwise float(g0) + float(G), and every run is bitwise reproducible. Otherwise
// (CUDA: dQ atomics, cuBLAS algorithms) the accumulating run's gradient may differ from G
// by as much as G from the reference: |G - ref| counts twice.
#pragma once
#include <math.h>

#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "harness.hpp"

namespace fat {

// One configuration per option (and a few together), on lengths and head dims that fill no
// tile; paddings keep 16-byte alignment (the CUDA kernels' rule, harmless on the CPU).
inline std::vector<Config> grad_accumulate_configs(flashattn_dtype_t t, flashattn_algorithm_t algo, uint64_t seed) {
  std::vector<Config> out;
  auto add = [&](Config c) {
    c.algorithm = algo;
    c.pad16 = true;
    out.push_back(c);
  };
  Config c = base_config("accumulate dense GQA", 17, 33, 40, t, ++seed);
  c.batch = 2;
  c.hq = 4;
  c.hkv = 2;
  add(c);
  c = base_config("accumulate causal bottom-right, softcap, dropout", 31, 65, 24, t, ++seed);
  c.band = true;
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wr = 0;
  c.softcap = 6.f;
  c.p_drop = 0.2f;
  c.seed = 11;
  add(c);
  c = base_config("accumulate window, ALiBi per (batch, head)", 40, 29, 16, t, ++seed);
  c.batch = 2;
  c.band = true;
  c.wl = 7;
  c.wr = 3;
  c.bias = FLASHATTN_BIAS_ALIBI;
  c.alibi_batch_stride = 3;
  add(c);
  c = base_config("accumulate bias tensor without dBias, fully masked row", 23, 19, 32, t, ++seed);
  c.bias = FLASHATTN_BIAS_TENSOR;
  c.bias_bcast[1] = true;
  c.want_dbias = false;
  c.bias_inf_row = 4;
  add(c);
  c = base_config("accumulate block-sparse", 37, 45, 16, t, ++seed);
  c.sparse = true;
  c.block_q = 8;
  c.block_k = 16;
  c.zero_row_block = 1;
  add(c);
  c = base_config("accumulate varlen with empty sequences and an unannounced tail", 1, 1, 32, t, ++seed);
  c.hq = 4;
  c.hkv = 2;
  c.seqlens_q = {7, 0, 20, 9, 0};
  c.seqlens_k = {12, 5, 0, 0, 6};
  c.unannounced_tail = 2;
  c.layout = Layout::Padded;
  add(c);
  c = base_config("accumulate mixed layouts, dqk != dv", 9, 70, 24, t, ++seed);
  c.dv = 40;
  c.hq = 3;
  c.hkv = 1;
  c.layout = Layout::Mixed;
  c.deterministic = true;
  add(c);
  c = base_config("accumulate odd head dims, batch-broadcast inputs", 5, 3, 3, t, ++seed);
  c.dv = 5;
  c.batch = 3;
  c.layout = Layout::BcastBatch;
  add(c);
  return out;
}

inline void check_grad_accumulate(Config c, MemOps& mem, const Tolerance& tol, bool same_gradient) {
  c.grad_accumulate = false;
  const Problem plain_p = make_problem(c);
  const LibResult plain = run_library(plain_p, mem, 0);
  const RefOutputs exact = reference_fp64(plain_p.spec, plain_p.in, true);
  const RefOutputs lowp = reference_lowp(plain_p.spec, plain_p.in, rounder_for(c.dtype), true);
  check_against_reference(plain_p, plain, exact, lowp, tol);

  c.grad_accumulate = true;
  const Problem p = make_problem(c);
  const LibResult acc = run_library(p, mem, 0);
  INFO(describe(p.cfg) << " error: " << acc.error);
  REQUIRE(acc.ok());
  INFO("padding: " << (acc.padding_intact ? "intact" : acc.padding_report));
  CHECK(acc.padding_intact);
  CHECK(acc.raw_o == plain.raw_o);  // the forward ignores the setting
  CHECK(acc.raw_lse == plain.raw_lse);
  const double u = dtype_eps(c.dtype);
  const double tiny = c.dtype == FLASHATTN_DTYPE_FP16 ? ldexp(1.0, -24) : ldexp(1.0, -126);
  const bool exact_bits = same_gradient && c.dtype == FLASHATTN_DTYPE_FP32;
  const double plain_err = same_gradient ? 1.0 : 2.0;
  const char* names[3] = {"dQ", "dK", "dV"};
  const std::vector<double>* got[3] = {&acc.dq, &acc.dk, &acc.dv};
  const std::vector<double>* base[3] = {&plain.dq, &plain.dk, &plain.dv};
  const std::vector<double>* ref[3] = {&exact.dq, &exact.dk, &exact.dv};
  for (int t = 0; t < 3; ++t) {
    const std::vector<double>& g0 = p.grad0[t];
    REQUIRE(got[t]->size() == g0.size());
    REQUIRE(base[t]->size() == g0.size());
    size_t bad = 0, first = 0;
    double worst = 0;
    for (size_t n = 0; n < g0.size(); ++n) {
      const double a = (*got[t])[n], G = (*base[t])[n], r = (*ref[t])[n];
      bool ok;
      if (exact_bits) {
        ok = a == static_cast<double>(static_cast<float>(g0[n]) + static_cast<float>(G));
      } else {
        const double bound = plain_err * fabs(G - r) + u * fabs(g0[n] + G) + u * fabs(G) +
                             ldexp(1.0, -22) * (fabs(g0[n]) + fabs(G)) + tiny;
        const double err = fabs(a - (g0[n] + r));
        ok = err <= bound;
        if (err - bound > worst) worst = err - bound;
      }
      if (!ok && bad++ == 0) first = n;
    }
    INFO(names[t] << ": " << bad << " of " << g0.size() << " elements off (first at " << first << ": got "
                  << (bad ? (*got[t])[first] : 0.0) << ", g0 " << (bad ? g0[first] : 0.0) << ", plain "
                  << (bad ? (*base[t])[first] : 0.0) << ", ref " << (bad ? (*ref[t])[first] : 0.0) << "), worst excess "
                  << worst);
    CHECK(bad == 0);
  }
  if (c.deterministic || same_gradient) require_same_bits(acc, run_library(p, mem, 0));
}

}  // namespace fat
