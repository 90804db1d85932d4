// Plans run from many threads at once must give every thread the result of a run made
// alone, bit for bit (the header's threading contract): one plan shared by all threads,
// and several plans (flash and standard, different thread counts, each created on its
// own thread) whose runs overlap and so share the CPU backend's one worker pool. Built
// as a plain program so it also runs under ThreadSanitizer (preset `tsan`), where any
// data race fails the test.
#include <flashattn.h>
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace {

std::mutex failures_mu;
int failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::lock_guard<std::mutex> lock(failures_mu);
    std::fprintf(stderr, "FAILED: %s (%s)\n", what, flashattn_last_error());
    ++failures;
  }
}

const int64_t B = 2, SQ = 77, SK = 93, HQ = 4, HKV = 2, D = 40;

struct Inputs {
  std::vector<float> q, k, v, dout;
  Inputs() {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd;
    auto randn = [&](size_t n) {
      std::vector<float> x(n);
      for (auto& e : x) e = nd(rng);
      return x;
    };
    q = randn(B * SQ * HQ * D);
    k = randn(B * SK * HKV * D);
    v = randn(B * SK * HKV * D);
    dout = randn(B * SQ * HQ * D);
  }
};

struct Result {
  std::vector<float> o, lse, dq, dk, dv;
  bool ok = false;
};

// A masked, dropout and softcapped plan of `algorithm` with FLASHATTN_CPU_THREADS=threads
// (setenv is not thread-safe: plans are created one at a time, under a lock).
flashattn_plan_t make_plan(flashattn_algorithm_t algorithm, const char* threads) {
  static std::mutex env_mu;
  std::lock_guard<std::mutex> lock(env_mu);
  setenv("FLASHATTN_CPU_THREADS", threads, 1);
  flashattn_plan_t plan = nullptr;
  expect(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS, "plan_create");
  if (!plan) return nullptr;
  expect(flashattn_plan_set_shape(plan, B, SQ, SK, HQ, HKV, D, D) == FLASHATTN_STATUS_SUCCESS, "set_shape");
  expect(flashattn_plan_set_dtype(plan, FLASHATTN_DTYPE_FP32) == FLASHATTN_STATUS_SUCCESS, "set_dtype");
  expect(flashattn_plan_set_algorithm(plan, algorithm) == FLASHATTN_STATUS_SUCCESS, "set_algorithm");
  expect(flashattn_plan_set_band_mask(plan, FLASHATTN_ALIGN_BOTTOM_RIGHT, -1, 0) == FLASHATTN_STATUS_SUCCESS,
         "set_band_mask");
  expect(flashattn_plan_set_dropout(plan, 0.25f, 1234, 0) == FLASHATTN_STATUS_SUCCESS, "set_dropout");
  expect(flashattn_plan_set_softcap(plan, 20.f) == FLASHATTN_STATUS_SUCCESS, "set_softcap");
  return plan;
}

// Forward then backward of `plan`, in a workspace of the run's own.
Result run(flashattn_plan_t plan, const Inputs& in) {
  Result r;
  size_t ws_fwd = 0, ws_bwd = 0;
  if (flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &ws_fwd) != FLASHATTN_STATUS_SUCCESS ||
      flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_BACKWARD, &ws_bwd) != FLASHATTN_STATUS_SUCCESS)
    return r;
  r.o.assign(in.q.size(), NAN);
  r.lse.assign(B * HQ * SQ, NAN);
  r.dq.assign(in.q.size(), NAN);
  r.dk.assign(in.k.size(), NAN);
  r.dv.assign(in.v.size(), NAN);
  std::vector<unsigned char> ws(ws_fwd > ws_bwd ? ws_fwd : ws_bwd);
  flashattn_fwd_args_t fa = FLASHATTN_FWD_ARGS_INIT;
  fa.q = in.q.data();
  fa.k = in.k.data();
  fa.v = in.v.data();
  fa.o = r.o.data();
  fa.lse = r.lse.data();
  if (flashattn_fwd(plan, &fa, ws.data(), ws.size(), nullptr) != FLASHATTN_STATUS_SUCCESS) return r;
  flashattn_bwd_args_t ba = FLASHATTN_BWD_ARGS_INIT;
  ba.q = in.q.data();
  ba.k = in.k.data();
  ba.v = in.v.data();
  ba.o = r.o.data();
  ba.lse = r.lse.data();
  ba.dout = in.dout.data();
  ba.dq = r.dq.data();
  ba.dk = r.dk.data();
  ba.dv = r.dv.data();
  r.ok = flashattn_bwd(plan, &ba, ws.data(), ws.size(), nullptr) == FLASHATTN_STATUS_SUCCESS;
  return r;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_same(const Result& got, const Result& want) {
  expect(got.ok, "concurrent run succeeded");
  expect(same(got.o, want.o) && same(got.lse, want.lse), "concurrent forward identical");
  expect(same(got.dq, want.dq) && same(got.dk, want.dk) && same(got.dv, want.dv), "concurrent backward identical");
}

// One plan, run by n_threads threads at once.
void one_plan_many_threads(const Inputs& in, int n_threads) {
  flashattn_plan_t plan = make_plan(FLASHATTN_ALGORITHM_FLASH, "4");
  if (!plan) return;
  const Result ref = run(plan, in);
  expect(ref.ok, "run alone");
  std::vector<Result> results(n_threads);
  std::vector<std::thread> threads;
  for (int t = 0; t < n_threads; ++t) threads.emplace_back([&, t] { results[t] = run(plan, in); });
  for (auto& th : threads) th.join();
  for (const Result& r : results) expect_same(r, ref);
  flashattn_plan_destroy(plan);
}

// n_threads threads, each creating its own plan (alternately flash and standard, 1 to 4
// threads) and running it three times while the others run theirs.
void many_plans_many_threads(const Inputs& in, int n_threads) {
  const char* counts[] = {"1", "2", "3", "4"};
  std::vector<Result> want(2);
  for (int a = 0; a < 2; ++a) {
    flashattn_plan_t plan = make_plan(a == 0 ? FLASHATTN_ALGORITHM_FLASH : FLASHATTN_ALGORITHM_STANDARD, "1");
    if (!plan) return;
    want[a] = run(plan, in);
    expect(want[a].ok, "run alone");
    flashattn_plan_destroy(plan);
  }
  std::vector<std::vector<Result>> results(n_threads, std::vector<Result>(3));
  std::vector<std::thread> threads;
  for (int t = 0; t < n_threads; ++t) {
    threads.emplace_back([&, t] {
      flashattn_plan_t plan =
          make_plan(t % 2 == 0 ? FLASHATTN_ALGORITHM_FLASH : FLASHATTN_ALGORITHM_STANDARD, counts[t % 4]);
      if (!plan) return;
      for (Result& r : results[t]) r = run(plan, in);
      flashattn_plan_destroy(plan);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < n_threads; ++t)
    for (const Result& r : results[t]) expect_same(r, want[t % 2]);
}

}  // namespace

int main(int argc, char** argv) {
  const int n_threads = argc > 1 ? std::atoi(argv[1]) : 8;
  const Inputs in;
  one_plan_many_threads(in, n_threads);
  many_plans_many_threads(in, n_threads);
  if (failures == 0)
    std::printf("concurrency: %d threads on one plan and on %d plans, results bitwise identical to runs alone\n",
                n_threads, n_threads);
  return failures == 0 ? 0 : 1;
}
