// The rule of flashattn_last_error (include/flashattn.h): every function that returns a
// status clears the calling thread's message when it starts and sets it when it fails;
// the functions that cannot fail leave it alone; messages are per thread.
#include <stdlib.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "catch_compat.hpp"
#include "flashattn.h"
#include "harness.hpp"

namespace {

std::string last() { return flashattn_last_error(); }

// Fails on purpose and returns the message it left.
std::string fail_once() {
  flashattn_plan_t p = nullptr;
  REQUIRE(flashattn_plan_create(&p, FLASHATTN_BACKEND_CPU, -3) == FLASHATTN_STATUS_INVALID_VALUE);
  const std::string msg = last();
  REQUIRE(msg.find("device=-3") != std::string::npos);
  return msg;
}

struct PlanGuard {
  flashattn_plan_t p = nullptr;
  PlanGuard() {
    REQUIRE(flashattn_plan_create(&p, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_shape(p, 1, 4, 4, 1, 1, 8, 8) == FLASHATTN_STATUS_SUCCESS);
  }
  ~PlanGuard() { flashattn_plan_destroy(p); }
};

}  // namespace

TEST_CASE("functions that cannot fail leave the last error message as it was", "[last_error]") {
  const std::string msg = fail_once();
  int major = 0;
  flashattn_get_version(&major, nullptr, nullptr);
  CHECK(last() == msg);
  CHECK(std::string(flashattn_status_string(FLASHATTN_STATUS_INVALID_VALUE)) == "FLASHATTN_STATUS_INVALID_VALUE");
  CHECK(last() == msg);
  (void)flashattn_status_string(static_cast<flashattn_status_t>(12345));  // unknown value
  CHECK(last() == msg);
  CHECK(last() == msg);  // flashattn_last_error itself
  (void)flashattn_cuda_device_count();
  CHECK(last() == msg);
  (void)flashattn_has_cuda_backend();
  CHECK(last() == msg);
  flashattn_plan_destroy(nullptr);
  CHECK(last() == msg);
  flashattn_plan_t p = nullptr;
  REQUIRE(flashattn_plan_create(&p, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  const std::string again = fail_once();
  flashattn_plan_destroy(p);
  CHECK(last() == again);
}

TEST_CASE("the documented error check reads the message whatever the evaluation order", "[last_error]") {
  const std::string msg = fail_once();
  // errors.md: fprintf(stderr, "%s: %s", flashattn_status_string(st), flashattn_last_error());
  // the arguments may be evaluated in either order.
  const char* first = flashattn_status_string(FLASHATTN_STATUS_INVALID_VALUE);
  const std::string second = last();
  CHECK(second == msg);
  CHECK(std::string(first) == "FLASHATTN_STATUS_INVALID_VALUE");
}

TEST_CASE("every status-returning function clears the message when it succeeds", "[last_error]") {
  PlanGuard g;
  const flashattn_plan_t p = g.p;
  const int64_t strides[4] = {4 * 8, 8, 8, 1};
  const int64_t bias_strides[4] = {0, 0, 4, 1};
  const uint8_t layout[1] = {1};
  std::vector<float> q(64, 0.5f), k(64, 0.5f), v(64, 0.5f), o(64), lse(4), dout(64, 0.1f), dq(64), dk(64), dv(64);
  size_t fwd_bytes = 0, bwd_bytes = 0;
  REQUIRE(flashattn_plan_get_workspace_size(p, FLASHATTN_PASS_FORWARD, &fwd_bytes) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_get_workspace_size(p, FLASHATTN_PASS_BACKWARD, &bwd_bytes) == FLASHATTN_STATUS_SUCCESS);
  std::vector<double> ws((fwd_bytes > bwd_bytes ? fwd_bytes : bwd_bytes) / sizeof(double) + 1);
  flashattn_backend_t backend;
  size_t bytes = 0;
  struct Call {
    const char* name;
    std::function<flashattn_status_t()> run;
  };
  const std::vector<Call> calls = {
      {"plan_create",
       [&] {
         flashattn_plan_t extra = nullptr;
         const flashattn_status_t st = flashattn_plan_create(&extra, FLASHATTN_BACKEND_CPU, 0);
         const std::string after = last();  // before destroy, which must not matter anyway
         flashattn_plan_destroy(extra);
         return after.empty() ? st : FLASHATTN_STATUS_INTERNAL_ERROR;
       }},
      {"plan_get_backend", [&] { return flashattn_plan_get_backend(p, &backend); }},
      {"plan_set_shape", [&] { return flashattn_plan_set_shape(p, 1, 4, 4, 1, 1, 8, 8); }},
      {"plan_set_dtype", [&] { return flashattn_plan_set_dtype(p, FLASHATTN_DTYPE_FP32); }},
      {"plan_set_strides", [&] { return flashattn_plan_set_strides(p, FLASHATTN_TENSOR_Q, strides); }},
      {"plan_set_softmax_scale", [&] { return flashattn_plan_set_softmax_scale(p, 0.f); }},
      {"plan_set_algorithm", [&] { return flashattn_plan_set_algorithm(p, FLASHATTN_ALGORITHM_FLASH); }},
      {"plan_set_varlen", [&] { return flashattn_plan_set_varlen(p, 0, 0, 0); }},
      {"plan_set_deterministic", [&] { return flashattn_plan_set_deterministic(p, 1); }},
      {"plan_set_grad_accumulate", [&] { return flashattn_plan_set_grad_accumulate(p, 0); }},
      {"plan_set_band_mask", [&] { return flashattn_plan_set_band_mask(p, FLASHATTN_ALIGN_TOP_LEFT, -1, -1); }},
      {"plan_set_softcap", [&] { return flashattn_plan_set_softcap(p, 0.f); }},
      {"plan_set_bias (TENSOR)", [&] { return flashattn_plan_set_bias(p, FLASHATTN_BIAS_TENSOR, bias_strides); }},
      {"plan_set_bias (ALIBI)", [&] { return flashattn_plan_set_bias(p, FLASHATTN_BIAS_ALIBI, nullptr); }},
      {"plan_set_alibi_batch_stride", [&] { return flashattn_plan_set_alibi_batch_stride(p, 1); }},
      {"plan_set_bias (NONE)", [&] { return flashattn_plan_set_bias(p, FLASHATTN_BIAS_NONE, nullptr); }},
      {"plan_set_dropout", [&] { return flashattn_plan_set_dropout(p, 0.f, 0, 0); }},
      {"plan_set_block_sparse", [&] { return flashattn_plan_set_block_sparse(p, layout, 1, 1, 1, 4, 4); }},
      {"plan_set_block_sparse (clear)", [&] { return flashattn_plan_set_block_sparse(p, nullptr, 0, 0, 0, 0, 0); }},
      {"plan_get_workspace_size", [&] { return flashattn_plan_get_workspace_size(p, FLASHATTN_PASS_FORWARD, &bytes); }},
      {"fwd",
       [&] {
         const flashattn_fwd_args_t a = fat::fwd_args(q.data(), k.data(), v.data(), o.data(), lse.data());
         return flashattn_fwd(p, &a, ws.data(), ws.size() * sizeof(double), nullptr);
       }},
      {"bwd",
       [&] {
         const flashattn_bwd_args_t a = fat::bwd_args(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(),
                                                      dq.data(), dk.data(), dv.data());
         return flashattn_bwd(p, &a, ws.data(), ws.size() * sizeof(double), nullptr);
       }},
  };
  for (const Call& c : calls) {
    INFO(c.name);
    fail_once();
    CHECK(c.run() == FLASHATTN_STATUS_SUCCESS);
    CHECK(last().empty());
  }
}

TEST_CASE("every failure sets a message, and the next failure replaces it", "[last_error]") {
  PlanGuard g;
  CHECK(flashattn_plan_set_shape(g.p, 0, 4, 4, 1, 1, 8, 8) == FLASHATTN_STATUS_INVALID_SHAPE);
  const std::string first = last();
  CHECK(first.find("batch=0") != std::string::npos);
  CHECK(flashattn_plan_set_dtype(g.p, static_cast<flashattn_dtype_t>(9)) == FLASHATTN_STATUS_INVALID_ENUM);
  CHECK(last().find("dtype=9") != std::string::npos);
  CHECK(last().find("batch") == std::string::npos);
}

TEST_CASE("messages are per thread", "[last_error]") {
  const std::string mine = fail_once();
  std::string theirs_before, theirs_after;
  std::thread t([&] {
    theirs_before = last();  // a new thread starts with no message
    flashattn_plan_t p = nullptr;
    (void)flashattn_plan_create(&p, FLASHATTN_BACKEND_CPU, -7);
    theirs_after = last();
  });
  t.join();
  CHECK(theirs_before.empty());
  CHECK(theirs_after.find("device=-7") != std::string::npos);
  CHECK(last() == mine);
}
