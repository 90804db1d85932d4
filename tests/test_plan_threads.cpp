// FLASHATTN_CPU_THREADS is read once per plan, when it is created: a workspace queried
// from a plan always serves that plan's runs, whatever the variable says later.
#include <math.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "flashattn.h"
#include "harness.hpp"

namespace {

flashattn_plan_t make_plan(const char* threads) {
  REQUIRE(setenv("FLASHATTN_CPU_THREADS", threads, 1) == 0);
  flashattn_plan_t p = nullptr;
  REQUIRE(flashattn_plan_create(&p, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  // 8 query blocks of 64 rows per head: enough tasks for every thread of the tests.
  REQUIRE(flashattn_plan_set_shape(p, 2, 512, 96, 2, 1, 32, 32) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_dtype(p, FLASHATTN_DTYPE_FP32) == FLASHATTN_STATUS_SUCCESS);
  return p;
}

size_t workspace(flashattn_plan_t p, flashattn_pass_t pass) {
  size_t bytes = 0;
  REQUIRE(flashattn_plan_get_workspace_size(p, pass, &bytes) == FLASHATTN_STATUS_SUCCESS);
  return bytes;
}

struct Tensors {
  std::vector<float> q = std::vector<float>(2 * 512 * 2 * 32, 0.3f), k = std::vector<float>(2 * 96 * 32, -0.2f),
                     v = std::vector<float>(2 * 96 * 32, 0.7f), o = std::vector<float>(2 * 512 * 2 * 32),
                     lse = std::vector<float>(2 * 2 * 512), dout = std::vector<float>(2 * 512 * 2 * 32, 0.1f),
                     dq = std::vector<float>(2 * 512 * 2 * 32), dk = std::vector<float>(2 * 96 * 32),
                     dv = std::vector<float>(2 * 96 * 32);
  flashattn_status_t fwd(flashattn_plan_t p, std::vector<char>& ws) {
    const flashattn_fwd_args_t a = fat::fwd_args(q.data(), k.data(), v.data(), o.data(), lse.data());
    return flashattn_fwd(p, &a, ws.data(), ws.size(), nullptr);
  }
  flashattn_status_t bwd(flashattn_plan_t p, std::vector<char>& ws) {
    const flashattn_bwd_args_t a =
        fat::bwd_args(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(), dv.data());
    return flashattn_bwd(p, &a, ws.data(), ws.size(), nullptr);
  }
};

}  // namespace

TEST_CASE("FLASHATTN_CPU_THREADS changed between the workspace query and the run", "[threads]") {
  for (auto alg : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
    INFO("algorithm " << alg);
    flashattn_plan_t p = make_plan("1");
    REQUIRE(flashattn_plan_set_algorithm(p, alg) == FLASHATTN_STATUS_SUCCESS);
    std::vector<char> ws_fwd(workspace(p, FLASHATTN_PASS_FORWARD)), ws_bwd(workspace(p, FLASHATTN_PASS_BACKWARD));
    REQUIRE(setenv("FLASHATTN_CPU_THREADS", "4", 1) == 0);
    // The plan keeps its one thread: same sizes, and the queried workspace is enough.
    CHECK(workspace(p, FLASHATTN_PASS_FORWARD) == ws_fwd.size());
    CHECK(workspace(p, FLASHATTN_PASS_BACKWARD) == ws_bwd.size());
    Tensors t;
    const flashattn_status_t fwd = t.fwd(p, ws_fwd);
    INFO(flashattn_last_error());
    CHECK(fwd == FLASHATTN_STATUS_SUCCESS);
    const flashattn_status_t bwd = t.bwd(p, ws_bwd);
    INFO(flashattn_last_error());
    CHECK(bwd == FLASHATTN_STATUS_SUCCESS);
    // A plan created now has four threads, so its workspace is larger (one slot each).
    flashattn_plan_t four = make_plan("4");
    REQUIRE(flashattn_plan_set_algorithm(four, alg) == FLASHATTN_STATUS_SUCCESS);
    CHECK(workspace(four, FLASHATTN_PASS_FORWARD) > ws_fwd.size());
    CHECK(workspace(four, FLASHATTN_PASS_BACKWARD) > ws_bwd.size());
    // ... and it keeps them when the variable drops back to one.
    REQUIRE(setenv("FLASHATTN_CPU_THREADS", "1", 1) == 0);
    std::vector<char> ws4(workspace(four, FLASHATTN_PASS_FORWARD));
    CHECK(ws4.size() > ws_fwd.size());
    Tensors t4;
    CHECK(t4.fwd(four, ws4) == FLASHATTN_STATUS_SUCCESS);
    CHECK(t4.o == t.o);  // results do not depend on the thread count
    CHECK(t4.lse == t.lse);
    flashattn_plan_destroy(four);
    flashattn_plan_destroy(p);
  }
  REQUIRE(unsetenv("FLASHATTN_CPU_THREADS") == 0);
}

// The backward runs one pass per (batch, kv head) when there are at least as many of them
// as threads, else two passes over tiles (flash_bwd.cpp): both give the same bits, so
// the gradients do not depend on the thread count. Two (batch, kv head) pairs: 1 and 2
// threads take the one pass, 3 and 4 the two.
TEST_CASE("CPU backward gradients are bitwise independent of the thread count", "[threads][bwd]") {
  std::vector<Tensors> runs;
  for (const char* threads : {"1", "2", "3", "4"}) {
    INFO("threads " << threads);
    flashattn_plan_t p = make_plan(threads);
    REQUIRE(flashattn_plan_set_band_mask(p, FLASHATTN_ALIGN_BOTTOM_RIGHT, 200, 0) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_softcap(p, 5.f) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_dropout(p, 0.2f, 11, 0) == FLASHATTN_STATUS_SUCCESS);
    std::vector<char> ws_fwd(workspace(p, FLASHATTN_PASS_FORWARD)), ws_bwd(workspace(p, FLASHATTN_PASS_BACKWARD));
    Tensors t;
    for (size_t i = 0; i < t.q.size(); ++i) t.q[i] = 0.5f * sinf(0.37f * static_cast<float>(i));
    for (size_t i = 0; i < t.k.size(); ++i) t.k[i] = cosf(0.11f * static_cast<float>(i));
    for (size_t i = 0; i < t.v.size(); ++i) t.v[i] = sinf(0.23f * static_cast<float>(i) + 1.f);
    for (size_t i = 0; i < t.dout.size(); ++i) t.dout[i] = cosf(0.07f * static_cast<float>(i) + 2.f);
    REQUIRE(t.fwd(p, ws_fwd) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(t.bwd(p, ws_bwd) == FLASHATTN_STATUS_SUCCESS);
    runs.push_back(t);
    flashattn_plan_destroy(p);
  }
  REQUIRE(unsetenv("FLASHATTN_CPU_THREADS") == 0);
  for (size_t r = 1; r < runs.size(); ++r) {
    INFO("run " << r);
    CHECK(runs[r].dq == runs[0].dq);
    CHECK(runs[r].dk == runs[0].dk);
    CHECK(runs[r].dv == runs[0].dv);
  }
}

// A decode forward (one query row) splits its keys by the shape alone (cpu_impl.hpp), so O
// and LSE do not depend on the thread count: 2 sequences, 8 query heads on 2 kv heads and
// 1500 keys make 2 tasks of 8 heads, each split in 5 key ranges.
TEST_CASE("CPU decode forward is bitwise independent of the thread count", "[threads][fwd]") {
  const int64_t b = 2, sk = 1500, hq = 8, hkv = 2, d = 40;
  std::vector<float> q(b * hq * d), k(b * sk * hkv * d), v(b * sk * hkv * d);
  for (size_t i = 0; i < q.size(); ++i) q[i] = sinf(0.37f * static_cast<float>(i));
  for (size_t i = 0; i < k.size(); ++i) k[i] = cosf(0.11f * static_cast<float>(i));
  for (size_t i = 0; i < v.size(); ++i) v[i] = sinf(0.23f * static_cast<float>(i) + 1.f);
  std::vector<std::vector<float>> outs;
  for (const char* threads : {"1", "2", "3", "5"}) {
    INFO("threads " << threads);
    REQUIRE(setenv("FLASHATTN_CPU_THREADS", threads, 1) == 0);
    flashattn_plan_t p = nullptr;
    REQUIRE(flashattn_plan_create(&p, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_shape(p, b, 1, sk, hq, hkv, d, d) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_dtype(p, FLASHATTN_DTYPE_FP32) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_softcap(p, 5.f) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_dropout(p, 0.2f, 11, 0) == FLASHATTN_STATUS_SUCCESS);
    std::vector<char> ws(workspace(p, FLASHATTN_PASS_FORWARD));
    std::vector<float> o(q.size()), lse(b * hq);
    const flashattn_fwd_args_t a = fat::fwd_args(q.data(), k.data(), v.data(), o.data(), lse.data());
    REQUIRE(flashattn_fwd(p, &a, ws.data(), ws.size(), nullptr) == FLASHATTN_STATUS_SUCCESS);
    o.insert(o.end(), lse.begin(), lse.end());
    outs.push_back(o);
    flashattn_plan_destroy(p);
  }
  REQUIRE(unsetenv("FLASHATTN_CPU_THREADS") == 0);
  for (size_t r = 1; r < outs.size(); ++r) {
    INFO("run " << r);
    CHECK(outs[r] == outs[0]);
  }
}

namespace {

// Runs c at 1, 2, 3 and 5 threads: the same bits each time.
void require_thread_independent(const fat::Config& c) {
  INFO(c.name);
  const fat::Problem pr = fat::make_problem(c);
  std::vector<fat::LibResult> runs;
  for (const char* threads : {"1", "2", "3", "5"}) {
    INFO("threads " << threads);
    REQUIRE(setenv("FLASHATTN_CPU_THREADS", threads, 1) == 0);
    runs.push_back(fat::run_cpu(pr));
    fat::require_same_bits(runs.front(), runs.back());
  }
  REQUIRE(unsetenv("FLASHATTN_CPU_THREADS") == 0);
}

}  // namespace

// bf16 forward and backward (16-bit tiles converted as they load) do not depend on the
// thread count either: 2 sequences x 2 kv heads, so 1-4 threads take the backward's one
// pass and 5 the two passes.
TEST_CASE("CPU bf16 forward and backward are bitwise independent of the thread count", "[threads][fwd][bwd]") {
  fat::Config c = fat::base_config("bf16 threads", 300, 333, 72, FLASHATTN_DTYPE_BF16, 61);
  c.batch = 2;
  c.hq = 4;
  c.hkv = 2;
  c.band = true;
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wl = 200;
  c.wr = 0;
  c.softcap = 5.f;
  c.p_drop = 0.2f;
  c.seed = 11;
  require_thread_independent(c);
}

// The bf16 backward's partial tiles (odd head dims, dqk != dv, lengths off every tile, the
// dot rows of a 257-row sequence) and its two-pass schedule with dBias (a bias tensor, rows
// broadcast) give the same bits for any thread count too: on the amx set they run on AMX
// tiles (cpu_isa.amx.threads), elsewhere on the fp32 kernels.
TEST_CASE("CPU bf16 backward on partial tiles and with dBias is bitwise independent of the thread count",
          "[threads][bwd]") {
  fat::Config one = fat::base_config("bf16 threads, partial tiles", 257, 95, 33, FLASHATTN_DTYPE_BF16, 62);
  one.dv = 20;
  one.batch = 2;
  one.hq = 4;
  one.hkv = 1;
  one.p_drop = 0.1f;
  one.seed = 4;
  fat::Config two = fat::base_config("bf16 threads, dBias", 130, 77, 40, FLASHATTN_DTYPE_BF16, 63);
  two.bias = FLASHATTN_BIAS_TENSOR;
  two.bias_bcast[2] = true;
  two.hq = 3;
  two.hkv = 3;
  require_thread_independent(one);
  require_thread_independent(two);
}
