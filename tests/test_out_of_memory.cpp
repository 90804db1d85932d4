// A host allocation that fails inside the library returns OUT_OF_MEMORY with a message
// naming the buffer and its size in bytes, and changes nothing. The failures are made by
// this program's operator new (failing_new.hpp), which the library's allocations use too.
#include <stdint.h>
#include <string.h>

#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "failing_new.hpp"
#include "flashattn.h"
#include "harness.hpp"

namespace {

// The status and message of call() made while every allocation fails.
template <class F>
std::pair<flashattn_status_t, std::string> failing(F&& call) {
  flashattn_status_t st;
  size_t refused = 0;
  {
    fat::AllocationsFail oom;
    st = call();
    refused = oom.refused();
  }
  const std::string msg = flashattn_last_error();
  INFO(flashattn_status_string(st) << ": " << msg);
  CHECK(refused > 0);  // the call did try to allocate
  return {st, msg};
}

// The N of the first "(N bytes)" in a message, or 0.
uint64_t bytes_named(const std::string& msg) {
  const size_t end = msg.find(" bytes)");
  if (end == std::string::npos) return 0;
  const size_t open = msg.rfind('(', end);
  if (open == std::string::npos || open + 1 == end) return 0;
  const std::string digits = msg.substr(open + 1, end - open - 1);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return 0;
  return std::stoull(digits);
}

struct Run {
  static constexpr int64_t B = 1, S = 70, H = 2, D = 8;
  std::vector<float> q = std::vector<float>(B * S * H * D, 0.5f), k = q, v = q,
                     o = std::vector<float>(B * S * H * D, -7.f), lse = std::vector<float>(B * H * S, -7.f), dout = q,
                     dq = o, dk = o, dv = o;
  std::vector<char> ws;
  flashattn_plan_t plan = nullptr;
  explicit Run(flashattn_algorithm_t alg) {
    REQUIRE(setenv("FLASHATTN_CPU_THREADS", "2", 1) == 0);
    REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_shape(plan, B, S, S, H, H, D, D) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_dtype(plan, FLASHATTN_DTYPE_FP32) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_algorithm(plan, alg) == FLASHATTN_STATUS_SUCCESS);
    size_t f = 0, b = 0;
    REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &f) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_BACKWARD, &b) == FLASHATTN_STATUS_SUCCESS);
    ws.resize(f > b ? f : b);
  }
  ~Run() { flashattn_plan_destroy(plan); }
  flashattn_status_t fwd() {
    const flashattn_fwd_args_t a = fat::fwd_args(q.data(), k.data(), v.data(), o.data(), lse.data());
    return flashattn_fwd(plan, &a, ws.data(), ws.size(), nullptr);
  }
  flashattn_status_t bwd() {
    const flashattn_bwd_args_t a =
        fat::bwd_args(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(), dv.data());
    return flashattn_bwd(plan, &a, ws.data(), ws.size(), nullptr);
  }
};

}  // namespace

TEST_CASE("plan_create out of memory names the plan state and its size", "[oom]") {
  FA_REQUIRE_INJECTION();
  flashattn_plan_t plan = reinterpret_cast<flashattn_plan_t>(uintptr_t{0x1234});
  const auto r = failing([&] { return flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0); });
  CHECK(r.first == FLASHATTN_STATUS_OUT_OF_MEMORY);
  CHECK(r.second.find("the plan state") != std::string::npos);
  CHECK(bytes_named(r.second) > 0);
  CHECK(plan == reinterpret_cast<flashattn_plan_t>(uintptr_t{0x1234}));  // untouched
}

TEST_CASE("set_block_sparse out of memory names the layout copy and its size, and keeps the plan", "[oom]") {
  FA_REQUIRE_INJECTION();
  Run run(FLASHATTN_ALGORITHM_FLASH);
  // 2 heads x 5 x 3 blocks of 16 x 32.
  std::vector<uint8_t> layout(2 * 5 * 3, 1);
  layout[4] = 0;
  const auto r = failing([&] { return flashattn_plan_set_block_sparse(run.plan, layout.data(), 2, 5, 3, 16, 32); });
  CHECK(r.first == FLASHATTN_STATUS_OUT_OF_MEMORY);
  CHECK(r.second.find("block-sparse layout") != std::string::npos);
  CHECK(bytes_named(r.second) == layout.size());
  // The plan has no layout: a dense run gives the same bits as a fresh dense plan.
  REQUIRE(run.fwd() == FLASHATTN_STATUS_SUCCESS);
  Run fresh(FLASHATTN_ALGORITHM_FLASH);
  REQUIRE(fresh.fwd() == FLASHATTN_STATUS_SUCCESS);
  CHECK(run.o == fresh.o);
  CHECK(flashattn_plan_set_block_sparse(run.plan, layout.data(), 2, 5, 3, 16, 32) == FLASHATTN_STATUS_SUCCESS);
}

TEST_CASE("set_shape allocates nothing, even with a block-sparse layout set", "[oom]") {
  FA_REQUIRE_INJECTION();
  Run run(FLASHATTN_ALGORITHM_FLASH);
  std::vector<uint8_t> layout(2 * 5 * 3, 1);
  REQUIRE(flashattn_plan_set_block_sparse(run.plan, layout.data(), 2, 5, 3, 16, 32) == FLASHATTN_STATUS_SUCCESS);
  flashattn_status_t st;
  size_t refused = 0;
  {
    fat::AllocationsFail oom;
    st = flashattn_plan_set_shape(run.plan, 1, 80, 90, 2, 2, 8, 8);  // 5 x 3 blocks still
    refused = oom.refused();
  }
  INFO(flashattn_last_error());
  CHECK(st == FLASHATTN_STATUS_SUCCESS);
  CHECK(refused == 0);
}
