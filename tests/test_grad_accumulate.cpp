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

// One configuration per option (and a few together), on lengths and head dims that fill no tile.
std::vector<Config> option_configs(flashattn_dtype_t t, flashattn_algorithm_t algo, uint64_t seed) {
  std::vector<Config> out;
  auto add = [&](Config c) {
    c.algorithm = algo;
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

}  // namespace

TEST_CASE("grad_accumulate adds the gradients to dQ, dK, dV with every option", "[bwd][accumulate]") {
  uint64_t seed = 2200;
  HostMem mem;
  for (flashattn_algorithm_t algo : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD})
    for (flashattn_dtype_t t : kDtypes) {
      for (const Config& c : option_configs(t, algo, seed)) check_grad_accumulate(c, mem, kCpuTolerance, true);
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
