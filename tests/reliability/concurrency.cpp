// One plan run from many threads at once must give every thread the single-threaded
// result, bit for bit (the header's threading contract). Built as a plain program so it
// also runs under ThreadSanitizer (preset `tsan`), where any data race fails the test.
#include <flashattn.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s (%s)\n", what, flashattn_last_error());
    ++failures;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int n_threads = argc > 1 ? std::atoi(argv[1]) : 8;
  const int64_t B = 2, SQ = 77, SK = 93, HQ = 4, HKV = 2, D = 40;
  flashattn_plan_t plan = nullptr;
  expect(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS, "plan_create");
  if (!plan) return 1;
  expect(flashattn_plan_set_shape(plan, B, SQ, SK, HQ, HKV, D, D) == FLASHATTN_STATUS_SUCCESS, "set_shape");
  expect(flashattn_plan_set_dtype(plan, FLASHATTN_DTYPE_FP32) == FLASHATTN_STATUS_SUCCESS, "set_dtype");
  expect(flashattn_plan_set_band_mask(plan, FLASHATTN_ALIGN_BOTTOM_RIGHT, -1, 0) == FLASHATTN_STATUS_SUCCESS,
         "set_band_mask");
  expect(flashattn_plan_set_dropout(plan, 0.25f, 1234, 0) == FLASHATTN_STATUS_SUCCESS, "set_dropout");
  expect(flashattn_plan_set_softcap(plan, 20.f) == FLASHATTN_STATUS_SUCCESS, "set_softcap");

  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  auto randn = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
  };
  const auto q = randn(B * SQ * HQ * D), k = randn(B * SK * HKV * D), v = randn(B * SK * HKV * D),
             dout = randn(B * SQ * HQ * D);

  size_t ws_fwd = 0, ws_bwd = 0;
  expect(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &ws_fwd) == FLASHATTN_STATUS_SUCCESS,
         "workspace fwd");
  expect(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_BACKWARD, &ws_bwd) == FLASHATTN_STATUS_SUCCESS,
         "workspace bwd");

  struct Result {
    std::vector<float> o, lse, dq, dk, dv;
  };
  auto run = [&](Result& r) -> bool {
    r.o.assign(q.size(), NAN);
    r.lse.assign(B * HQ * SQ, NAN);
    r.dq.assign(q.size(), NAN);
    r.dk.assign(k.size(), NAN);
    r.dv.assign(v.size(), NAN);
    std::vector<unsigned char> ws(ws_fwd > ws_bwd ? ws_fwd : ws_bwd);
    flashattn_fwd_args_t fa = FLASHATTN_FWD_ARGS_INIT;
    fa.q = q.data();
    fa.k = k.data();
    fa.v = v.data();
    fa.o = r.o.data();
    fa.lse = r.lse.data();
    if (flashattn_fwd(plan, &fa, ws.data(), ws.size(), nullptr) != FLASHATTN_STATUS_SUCCESS) return false;
    flashattn_bwd_args_t ba = FLASHATTN_BWD_ARGS_INIT;
    ba.q = q.data();
    ba.k = k.data();
    ba.v = v.data();
    ba.o = r.o.data();
    ba.lse = r.lse.data();
    ba.dout = dout.data();
    ba.dq = r.dq.data();
    ba.dk = r.dk.data();
    ba.dv = r.dv.data();
    return flashattn_bwd(plan, &ba, ws.data(), ws.size(), nullptr) == FLASHATTN_STATUS_SUCCESS;
  };
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };

  Result ref;
  expect(run(ref), "single-threaded run");
  std::vector<Result> results(n_threads);
  std::vector<int> ok(n_threads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < n_threads; ++t) threads.emplace_back([&, t] { ok[t] = run(results[t]) ? 1 : 0; });
  for (auto& th : threads) th.join();
  for (int t = 0; t < n_threads; ++t) {
    expect(ok[t] == 1, "concurrent run succeeded");
    expect(same(results[t].o, ref.o) && same(results[t].lse, ref.lse), "concurrent forward identical");
    expect(same(results[t].dq, ref.dq) && same(results[t].dk, ref.dk) && same(results[t].dv, ref.dv),
           "concurrent backward identical");
  }
  flashattn_plan_destroy(plan);
  if (failures == 0)
    std::printf("concurrency: %d threads, results bitwise identical to the single-threaded run\n", n_threads);
  return failures == 0 ? 0 : 1;
}
