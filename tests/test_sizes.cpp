// Sizes derived from caller input never wrap (issue 14, F1). A workspace query for a huge
// shape either fails with INVALID_SHAPE naming the workspace, or returns a size at least
// an independently computed lower bound (128-bit arithmetic here); tensor and bias extents
// are checked in bytes, not elements. Only queries and refused runs: nothing is allocated
// at these sizes. The CUDA cases run where a CUDA device is present and are skipped
// otherwise.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "flashattn.h"

namespace {

using Wide = __int128;
constexpr Wide kMaxBytes = INT64_MAX;  // no object is larger (PTRDIFF_MAX)
constexpr size_t kUntouched = 0x5A5A5A5A;

// Sets an environment variable for the lifetime of the object.
class EnvVar {
 public:
  EnvVar(const char* name, const char* value) : name_(name) {
    const char* old = getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value, 1);
  }
  ~EnvVar() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

struct Shape {
  int64_t b, sq, sk, hq, hkv, dqk, dv;
};

// The issue's shape: the CPU STANDARD backward's three S-sized buffers wrapped to 17 MB.
constexpr Shape kIssueShape = {1, 1235713963, 1244000330, 1, 1, 1, 1};

struct Plan {
  flashattn_plan_t p = nullptr;
  flashattn_status_t created;
  explicit Plan(flashattn_backend_t backend) { created = flashattn_plan_create(&p, backend, 0); }
  ~Plan() { flashattn_plan_destroy(p); }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
};

// Options on top of a shape; each changes which buffers a workspace holds.
enum Option { kPlain, kSoftcap, kDropout, kBiasFull, kBiasBroadcast, kDeterministic, kVarlen, kOptionCount };
const char* const kOptionNames[] = {"plain", "softcap", "dropout", "bias", "broadcast bias", "deterministic", "varlen"};

// Packed tokens of a varlen plan: every sequence at its maximum length, within int32.
int64_t varlen_total(int64_t batch, int64_t seqlen) {
  const Wide n = Wide(batch) * seqlen;
  return n > INT32_MAX ? INT32_MAX : static_cast<int64_t>(n);
}

void configure(flashattn_plan_t p, const Shape& s, flashattn_algorithm_t alg, Option opt) {
  REQUIRE(flashattn_plan_set_shape(p, s.b, s.sq, s.sk, s.hq, s.hkv, s.dqk, s.dv) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_algorithm(p, alg) == FLASHATTN_STATUS_SUCCESS);
  switch (opt) {
    case kSoftcap: REQUIRE(flashattn_plan_set_softcap(p, 5.f) == FLASHATTN_STATUS_SUCCESS); break;
    case kDropout: REQUIRE(flashattn_plan_set_dropout(p, 0.1f, 1, 0) == FLASHATTN_STATUS_SUCCESS); break;
    case kBiasFull: {
      const int64_t bs[4] = {s.hq * s.sq * s.sk, s.sq * s.sk, s.sk, 1};
      REQUIRE(flashattn_plan_set_bias(p, FLASHATTN_BIAS_TENSOR, bs) == FLASHATTN_STATUS_SUCCESS);
      break;
    }
    case kBiasBroadcast: {
      const int64_t bs[4] = {0, 0, s.sk, 1};
      REQUIRE(flashattn_plan_set_bias(p, FLASHATTN_BIAS_TENSOR, bs) == FLASHATTN_STATUS_SUCCESS);
      break;
    }
    case kDeterministic: REQUIRE(flashattn_plan_set_deterministic(p, 1) == FLASHATTN_STATUS_SUCCESS); break;
    case kVarlen:
      REQUIRE(flashattn_plan_set_varlen(p, 1, varlen_total(s.b, s.sq), varlen_total(s.b, s.sk)) ==
              FLASHATTN_STATUS_SUCCESS);
      break;
    default: break;
  }
}

// A lower bound on the workspace of (backend, algorithm, pass, option), from the buffers
// the documented algorithms cannot do without: STANDARD materializes the fp32 scores of
// one (sequence, head) on the CPU and of all of them on CUDA (and dP too in the backward,
// and the softcap factor on the CPU); the CUDA flash backward keeps fp32 dQ accumulators
// and Delta for every query row and head; the CPU flash backward one fp32 dBias row.
Wide lower_bound(flashattn_backend_t backend, const Shape& s, flashattn_algorithm_t alg, bool bwd, Option opt) {
  const bool cuda = backend == FLASHATTN_BACKEND_CUDA;
  if (alg == FLASHATTN_ALGORITHM_STANDARD) {
    const Wide scores = Wide(4) * s.sq * s.sk * (cuda ? Wide(s.b) * s.hq : Wide(1));
    return scores * (bwd ? (!cuda && opt == kSoftcap ? 3 : 2) : 1);
  }
  if (!bwd) return 0;
  const Wide rows = opt == kVarlen ? varlen_total(s.b, s.sq) : Wide(s.b) * s.sq;
  if (cuda) return Wide(4) * rows * s.hq * (s.dqk + 1);
  return opt == kBiasFull ? Wide(4) * s.sk : Wide(0);
}

// The query either succeeds with a size >= bound, or fails with INVALID_SHAPE naming the
// pass's workspace and leaving *bytes alone; a bound beyond the largest object must fail.
void check_query(flashattn_plan_t p, flashattn_pass_t pass, Wide bound) {
  size_t bytes = kUntouched;
  const flashattn_status_t st = flashattn_plan_get_workspace_size(p, pass, &bytes);
  const std::string msg = flashattn_last_error();
  INFO("pass " << pass << ": " << flashattn_status_string(st) << " bytes=" << bytes << " bound=" << double(bound)
               << " message: " << msg);
  if (st == FLASHATTN_STATUS_SUCCESS) {
    CHECK(bound <= kMaxBytes);
    CHECK(Wide(bytes) >= bound);
    CHECK(Wide(bytes) <= kMaxBytes);
  } else {
    CHECK(st == FLASHATTN_STATUS_INVALID_SHAPE);
    CHECK(bytes == kUntouched);
    CHECK(msg.find(pass == FLASHATTN_PASS_BACKWARD ? "backward workspace" : "forward workspace") != std::string::npos);
    CHECK(msg.find("2^63-1 bytes") != std::string::npos);
  }
}

// A forward whose pointers are never read: the run must be refused before it uses any.
flashattn_status_t refused_fwd(flashattn_plan_t p, const int32_t* cu_seqlens) {
  static float unread[256];
  flashattn_fwd_args_t a = FLASHATTN_FWD_ARGS_INIT;
  a.q = a.k = a.v = unread;
  a.o = unread + 128;
  a.cu_seqlens_q = a.cu_seqlens_k = cu_seqlens;
  return flashattn_fwd(p, &a, nullptr, 0, nullptr);
}

// The call returned `want` and its message contains `needle`.
void expect(flashattn_status_t got, flashattn_status_t want, const std::string& needle) {
  const std::string msg = flashattn_last_error();
  INFO(flashattn_status_string(got) << ": " << msg);
  CHECK(got == want);
  CHECK(msg.find(needle) != std::string::npos);
}

bool cuda_available() { return flashattn_has_cuda_backend() && flashattn_cuda_device_count() > 0; }

}  // namespace

TEST_CASE("sizes: the issue 14 shape gives a correct forward size and a refused backward", "[sizes]") {
  const EnvVar threads("FLASHATTN_CPU_THREADS", "1");
  Plan plan(FLASHATTN_BACKEND_CPU);
  REQUIRE(plan.created == FLASHATTN_STATUS_SUCCESS);
  const Shape& s = kIssueShape;
  REQUIRE(flashattn_plan_set_shape(plan.p, s.b, s.sq, s.sk, s.hq, s.hkv, s.dqk, s.dv) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_dtype(plan.p, FLASHATTN_DTYPE_FP16) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_softcap(plan.p, 5.f) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_algorithm(plan.p, FLASHATTN_ALGORITHM_STANDARD) == FLASHATTN_STATUS_SUCCESS);
  // Forward: S of 4 * 1235713963 * 1244000330 bytes (6.1e18) and a few O(seqlen) buffers fit.
  size_t fwd = 0;
  REQUIRE(flashattn_plan_get_workspace_size(plan.p, FLASHATTN_PASS_FORWARD, &fwd) == FLASHATTN_STATUS_SUCCESS);
  const Wide scores = Wide(4) * s.sq * s.sk;
  CHECK(Wide(fwd) >= scores);
  CHECK(Wide(fwd) <= scores + scores / 100);
  // Backward: S, dS and the softcap factor, three times that: more than any object can be.
  REQUIRE(3 * scores > kMaxBytes);
  size_t bwd = kUntouched;
  const flashattn_status_t st = flashattn_plan_get_workspace_size(plan.p, FLASHATTN_PASS_BACKWARD, &bwd);
  INFO(flashattn_last_error() << " (bytes " << bwd << ")");
  REQUIRE(st == FLASHATTN_STATUS_INVALID_SHAPE);  // (a wrapped size would make the run below write out of bounds)
  CHECK(bwd == kUntouched);
  check_query(plan.p, FLASHATTN_PASS_BACKWARD, 3 * scores);
  // A run is refused the same way, before any pointer is used (none is dereferenced).
  std::vector<float> small(64);
  flashattn_bwd_args_t a = FLASHATTN_BWD_ARGS_INIT;
  a.q = a.k = a.v = a.o = a.dout = small.data();
  a.lse = small.data();
  a.dq = a.dk = a.dv = small.data() + 16;
  CHECK(flashattn_bwd(plan.p, &a, small.data(), 17182336, nullptr) == FLASHATTN_STATUS_INVALID_SHAPE);
  CHECK(std::string(flashattn_last_error()).find("backward workspace") != std::string::npos);
}

TEST_CASE("sizes: huge shapes on every workspace query path", "[sizes]") {
  const Shape shapes[] = {
      kIssueShape,
      {1, 1518500249, 1518500249, 1, 1, 256, 256},  // seqlen_q * seqlen_k * 4 just below 2^63
      {1, 262144, 262144, 16777216, 1, 1, 1},       // 2^24 query heads of 2^18 x 2^18 scores
      {1, 2147483647, 1, 1, 1, 256, 256},           // longest query, one key
      {2147483647, 1, 3, 1, 1, 256, 128},           // largest batch
  };
  for (flashattn_backend_t backend : {FLASHATTN_BACKEND_CPU, FLASHATTN_BACKEND_CUDA}) {
    if (backend == FLASHATTN_BACKEND_CUDA && !cuda_available()) continue;
    for (const Shape& s : shapes)
      for (flashattn_algorithm_t alg : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD})
        for (int o = 0; o < kOptionCount; ++o) {
          const Option opt = static_cast<Option>(o);
          INFO("backend " << backend << " shape " << s.b << "x" << s.sq << "x" << s.sk << "x" << s.hq << "/" << s.hkv
                          << "x" << s.dqk << "/" << s.dv << " algorithm " << alg << " " << kOptionNames[o]);
          Plan plan(backend);
          REQUIRE(plan.created == FLASHATTN_STATUS_SUCCESS);
          configure(plan.p, s, alg, opt);
          check_query(plan.p, FLASHATTN_PASS_FORWARD, lower_bound(backend, s, alg, false, opt));
          check_query(plan.p, FLASHATTN_PASS_BACKWARD, lower_bound(backend, s, alg, true, opt));
        }
  }
  if (!cuda_available()) std::cout << "CUDA cases of this test: no CUDA device, only the CPU ran\n";
}

// The shapes above whose size is known to exceed the largest object must be refused (the
// size a wrapping computation returns is small, which check_query's bound alone would not
// catch for the backends and options whose bound is small).
TEST_CASE("sizes: STANDARD workspaces beyond 2^63-1 bytes are refused", "[sizes]") {
  const Shape s = {1, 1518500249, 1518500249, 1, 1, 256, 256};
  for (flashattn_pass_t pass : {FLASHATTN_PASS_FORWARD, FLASHATTN_PASS_BACKWARD}) {
    Plan plan(FLASHATTN_BACKEND_CPU);
    configure(plan.p, s, FLASHATTN_ALGORITHM_STANDARD, kPlain);
    size_t bytes = kUntouched;
    CHECK(flashattn_plan_get_workspace_size(plan.p, pass, &bytes) == FLASHATTN_STATUS_INVALID_SHAPE);
    CHECK(bytes == kUntouched);
    const std::string msg = flashattn_last_error();
    INFO(msg);
    CHECK(msg.find("STANDARD algorithm on the CPU backend") != std::string::npos);
    CHECK(msg.find("seqlen_q=1518500249") != std::string::npos);
  }
}

TEST_CASE("sizes: tensor strides are checked in bytes, not elements", "[sizes][strides]") {
  Plan plan(FLASHATTN_BACKEND_CPU);
  REQUIRE(flashattn_plan_set_shape(plan.p, 2, 3, 3, 1, 1, 4, 4) == FLASHATTN_STATUS_SUCCESS);
  // Batch stride 2^61 elements: 2^62 bytes in fp16 (fits), 2^63 in fp32 (does not).
  const int64_t huge[4] = {INT64_C(1) << 61, 4, 4, 1};
  REQUIRE(flashattn_plan_set_strides(plan.p, FLASHATTN_TENSOR_Q, huge) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_dtype(plan.p, FLASHATTN_DTYPE_FP32) == FLASHATTN_STATUS_SUCCESS);
  expect(flashattn_plan_set_strides(plan.p, FLASHATTN_TENSOR_K, huge), FLASHATTN_STATUS_INVALID_STRIDE, "strides of k");
  REQUIRE(flashattn_plan_set_strides(plan.p, FLASHATTN_TENSOR_O, huge) == FLASHATTN_STATUS_INVALID_STRIDE);
  // Q's strides, set under fp16, are re-checked at the run under fp32 (no pointer is used).
  expect(refused_fwd(plan.p, nullptr), FLASHATTN_STATUS_INVALID_STRIDE, "strides of q");
}

TEST_CASE("sizes: bias strides are checked in bytes, not elements", "[sizes][strides]") {
  Plan plan(FLASHATTN_BACKEND_CPU);
  REQUIRE(flashattn_plan_set_shape(plan.p, 2, 3, 3, 1, 1, 4, 4) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_dtype(plan.p, FLASHATTN_DTYPE_FP32) == FLASHATTN_STATUS_SUCCESS);
  const int64_t huge[4] = {INT64_C(1) << 61, 0, 0, 1};
  expect(flashattn_plan_set_bias(plan.p, FLASHATTN_BIAS_TENSOR, huge), FLASHATTN_STATUS_INVALID_STRIDE,
         "strides (2305843009213693952, 0, 0, 1)");
}

TEST_CASE("sizes: varlen tensors whose bytes overflow are refused", "[sizes][varlen]") {
  // 2^31-1 packed tokens of 2^23 heads of 256 fp32: under 2^62 elements, over 2^63 bytes.
  Plan plan(FLASHATTN_BACKEND_CPU);
  REQUIRE(flashattn_plan_set_shape(plan.p, 1, 1, 1, INT64_C(1) << 23, 1, 256, 256) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_dtype(plan.p, FLASHATTN_DTYPE_FP32) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_varlen(plan.p, 1, INT64_C(2147483647), 1) == FLASHATTN_STATUS_SUCCESS);
  const int64_t contiguous[4] = {256 * (INT64_C(1) << 23), 256 * (INT64_C(1) << 23), 256, 1};
  REQUIRE(flashattn_plan_set_strides(plan.p, FLASHATTN_TENSOR_Q, contiguous) == FLASHATTN_STATUS_INVALID_SHAPE);
  CHECK(std::string(flashattn_last_error()).find("(1, 2147483647, 8388608, 256)") != std::string::npos);
  const int32_t cu[2] = {0, 1};
  expect(refused_fwd(plan.p, cu), FLASHATTN_STATUS_INVALID_SHAPE, "tensor q");
}

TEST_CASE("sizes: set_shape names the tensor whose size overflows", "[sizes]") {
  Plan plan(FLASHATTN_BACKEND_CPU);
  // 2^31 x 2^31 scores of 2^3 heads: the bias would have 2^65 elements.
  expect(flashattn_plan_set_shape(plan.p, 1, 2147483647, 2147483647, 8, 8, 1, 1), FLASHATTN_STATUS_INVALID_SHAPE,
         "the bias (batch x heads_q x seqlen_q x seqlen_k)");
  // k: batch 2^31 x seqlen_k 2^31-1 x 1 head x 256 dims (q and o have one query each).
  expect(flashattn_plan_set_shape(plan.p, INT64_C(1) << 31, 1, 2147483647, 1, 1, 256, 1),
         FLASHATTN_STATUS_INVALID_SHAPE, "k (batch x seqlen_k x heads_kv x head_dim_qk)");
}
