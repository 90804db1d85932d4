// flashattn_plan_set_grad_accumulate on the CPU backend: the backward adds its gradients to
// dQ, dK, dV (grad_accumulate_check.hpp) for every option, both algorithms, every dtype and
// awkward shapes; dBias cannot be accumulated (INCOMPATIBLE_OPTIONS, nothing written).
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "grad_accumulate_check.hpp"
#include "harness.hpp"

using namespace fat;

namespace {

const flashattn_dtype_t kDtypes[3] = {FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP32};

}  // namespace

TEST_CASE("grad_accumulate adds the gradients to dQ, dK, dV with every option", "[bwd][accumulate]") {
  uint64_t seed = 2200;
  HostMem mem;
  for (flashattn_algorithm_t algo : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD})
    for (flashattn_dtype_t t : kDtypes) {
      for (const Config& c : grad_accumulate_configs(t, algo, seed)) check_grad_accumulate(c, mem, kCpuTolerance, true);
      seed += 20;
    }
}

TEST_CASE("grad_accumulate twice sums two backward runs", "[bwd][accumulate]") {
  // Two accumulating runs into zeroed gradients: fp32 gives the plain gradient plus itself,
  // bitwise (2 G is exact), i.e. the second run read what the first wrote.
  for (flashattn_algorithm_t algo : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
    Config c = base_config("accumulate twice", 21, 34, 24, FLASHATTN_DTYPE_FP32, 2300);
    c.algorithm = algo;
    c.hq = 4;
    c.hkv = 2;
    const Problem p = make_problem(c);
    const LibResult plain = run_cpu(p);
    REQUIRE(plain.ok());
    flashattn_plan_t plan = nullptr;
    REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(configure_plan(plan, p) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_grad_accumulate(plan, 1) == FLASHATTN_STATUS_SUCCESS);
    size_t ws = 0;
    REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_BACKWARD, &ws) == FLASHATTN_STATUS_SUCCESS);
    std::vector<float> work(ws / 4 + 1);  // operator new: 16-byte aligned
    const size_t nq = p.in.q.size(), nk = p.in.k.size(), nv = p.in.v.size();
    std::vector<float> fq(nq), fk(nk), fv(nv), fdo(p.in.dout.size()), dq(nq, 0.f), dk(nk, 0.f), dv(nv, 0.f);
    for (size_t n = 0; n < nq; ++n) fq[n] = static_cast<float>(p.in.q[n]);
    for (size_t n = 0; n < nk; ++n) fk[n] = static_cast<float>(p.in.k[n]);
    for (size_t n = 0; n < nv; ++n) fv[n] = static_cast<float>(p.in.v[n]);
    for (size_t n = 0; n < fdo.size(); ++n) fdo[n] = static_cast<float>(p.in.dout[n]);
    std::vector<float> o(plain.o.size()), lse(plain.lse.size());
    for (size_t n = 0; n < o.size(); ++n) o[n] = static_cast<float>(plain.o[n]);
    // The harness's LSE is [token][head]; the run takes [batch=1][head][seq].
    for (int64_t i = 0; i < c.sq; ++i)
      for (int64_t h = 0; h < c.hq; ++h) lse[h * c.sq + i] = static_cast<float>(plain.lse[i * c.hq + h]);
    const flashattn_bwd_args_t a =
        bwd_args(fq.data(), fk.data(), fv.data(), o.data(), lse.data(), fdo.data(), dq.data(), dk.data(), dv.data());
    for (int run = 0; run < 2; ++run)
      REQUIRE(flashattn_bwd(plan, &a, work.data(), ws, nullptr) == FLASHATTN_STATUS_SUCCESS);
    flashattn_plan_destroy(plan);
    const std::vector<float>* got[3] = {&dq, &dk, &dv};
    const std::vector<double>* want[3] = {&plain.dq, &plain.dk, &plain.dv};
    for (int t = 0; t < 3; ++t) {
      size_t bad = 0;
      for (size_t n = 0; n < got[t]->size(); ++n) bad += (*got[t])[n] != static_cast<float>(2.0 * (*want[t])[n]);
      INFO("algorithm " << algo << " gradient " << t);
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("grad_accumulate refuses args.dbias and writes nothing", "[bwd][accumulate][errors]") {
  for (flashattn_algorithm_t algo : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
    Config c = base_config("accumulate with dBias", 9, 13, 16, FLASHATTN_DTYPE_BF16, 2400);
    c.algorithm = algo;
    c.bias = FLASHATTN_BIAS_TENSOR;
    c.grad_accumulate = true;
    const LibResult r = run_cpu(make_problem(c));
    CHECK(std::string(flashattn_status_string(r.bwd)) == "FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS");
    CHECK(r.error.find("args.dbias=") != std::string::npos);
    CHECK(r.error.find("flashattn_plan_set_grad_accumulate") != std::string::npos);
    CHECK(r.outputs_untouched);
  }
}
