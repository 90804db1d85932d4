// A C++17 program using the *installed* libflashattn: the C header from C++, a plan
// owned by a unique_ptr, tensors in BHSD layout (set through strides) and a causal
// bottom-right mask. One CPU forward pass in fp32; O and LSE are checked against a
// naive double-precision reference computed here. When the installed headers include
// the optional C++ wrapper flashattn.hpp, it is exercised too. Exits nonzero on any
// failure.
#include <flashattn.h>
#if __has_include(<flashattn.hpp>)
#include <flashattn.hpp>
#define FA_HAVE_HPP 1
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

namespace {

struct PlanDeleter {
  void operator()(flashattn_plan_s* plan) const { flashattn_plan_destroy(plan); }
};
using Plan = std::unique_ptr<flashattn_plan_s, PlanDeleter>;

void require(flashattn_status_t status, const char* call) {
  if (status == FLASHATTN_STATUS_SUCCESS) return;
  std::fprintf(stderr, "consumer.cpp: %s returned %s: %s\n", call, flashattn_status_string(status),
               flashattn_last_error());
  std::exit(1);
}

}  // namespace

int main() {
  constexpr int64_t batch = 1, heads = 3, seq_q = 4, seq_k = 9, dim = 8;
  // BHSD: element (b, s, h, d) at ((b * heads + h) * seq + s) * dim + d.
  const int64_t q_strides[4] = {heads * seq_q * dim, dim, seq_q * dim, 1};
  const int64_t kv_strides[4] = {heads * seq_k * dim, dim, seq_k * dim, 1};
  auto at = [](int64_t seq, int64_t h, int64_t s) { return (h * seq + s) * dim; };

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  auto random_tensor = [&](int64_t seq) {
    std::vector<float> t(batch * heads * seq * dim);
    std::generate(t.begin(), t.end(), [&] { return dist(rng); });
    return t;
  };
  const std::vector<float> q = random_tensor(seq_q), k = random_tensor(seq_k), v = random_tensor(seq_k);
  std::vector<float> o(q.size(), NAN), lse(batch * heads * seq_q, NAN);

  Plan plan([] {
    flashattn_plan_t p = nullptr;
    require(flashattn_plan_create(&p, FLASHATTN_BACKEND_CPU, 0), "flashattn_plan_create");
    return p;
  }());
  require(flashattn_plan_set_shape(plan.get(), batch, seq_q, seq_k, heads, heads, dim, dim), "set_shape");
  require(flashattn_plan_set_dtype(plan.get(), FLASHATTN_DTYPE_FP32), "set_dtype");
  require(flashattn_plan_set_strides(plan.get(), FLASHATTN_TENSOR_Q, q_strides), "set_strides(Q)");
  require(flashattn_plan_set_strides(plan.get(), FLASHATTN_TENSOR_K, kv_strides), "set_strides(K)");
  require(flashattn_plan_set_strides(plan.get(), FLASHATTN_TENSOR_V, kv_strides), "set_strides(V)");
  require(flashattn_plan_set_strides(plan.get(), FLASHATTN_TENSOR_O, q_strides), "set_strides(O)");
  require(flashattn_plan_set_band_mask(plan.get(), FLASHATTN_ALIGN_BOTTOM_RIGHT, FLASHATTN_WINDOW_UNBOUNDED, 0),
          "set_band_mask");

  size_t bytes = 0;
  require(flashattn_plan_get_workspace_size(plan.get(), FLASHATTN_PASS_FORWARD, &bytes), "get_workspace_size");
  std::vector<unsigned char> workspace(bytes);
  flashattn_fwd_args_t args = FLASHATTN_FWD_ARGS_INIT;
  args.q = q.data();
  args.k = k.data();
  args.v = v.data();
  args.o = o.data();
  args.lse = lse.data();
  require(flashattn_fwd(plan.get(), &args, bytes ? workspace.data() : nullptr, bytes, nullptr), "flashattn_fwd");

  // Reference: causal bottom-right keeps key j for query i iff j <= i + seq_k - seq_q.
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  double err_o = 0.0, err_lse = 0.0;
  bool finite = true;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < seq_q; ++i) {
      const int64_t keys = i + seq_k - seq_q + 1;
      std::vector<double> s(keys);
      for (int64_t j = 0; j < keys; ++j)
        s[j] = scale * std::inner_product(&q[at(seq_q, h, i)], &q[at(seq_q, h, i)] + dim, &k[at(seq_k, h, j)], 0.0);
      const double m = *std::max_element(s.begin(), s.end());
      const double ref_lse = m + std::log(std::accumulate(s.begin(), s.end(), 0.0,
                                                          [m](double acc, double x) { return acc + std::exp(x - m); }));
      const float got_lse = lse[h * seq_q + i];
      finite = finite && std::isfinite(got_lse);
      err_lse = std::max(err_lse, std::fabs(got_lse - ref_lse));
      for (int64_t d = 0; d < dim; ++d) {
        double ref = 0.0;
        for (int64_t j = 0; j < keys; ++j) ref += std::exp(s[j] - ref_lse) * v[at(seq_k, h, j) + d];
        const float got = o[at(seq_q, h, i) + d];
        finite = finite && std::isfinite(got);
        err_o = std::max(err_o, std::fabs(got - ref));
      }
    }
  }
  std::printf("consumer.cpp: max |O - ref| = %.3g, max |LSE - ref| = %.3g\n", err_o, err_lse);

#ifdef FA_HAVE_HPP
  // The installed C++ wrapper: a valid plan resolves to the CPU, a bad one throws
  // flashattn::Error carrying the status.
  bool wrapper_ok = false;
  try {
    flashattn::Plan good({batch, seq_q, seq_k, heads, heads, dim, dim}, FLASHATTN_DTYPE_FP32, FLASHATTN_BACKEND_CPU);
    wrapper_ok = good.backend() == FLASHATTN_BACKEND_CPU;
    flashattn::Plan bad({batch, seq_q, seq_k, 3, 2, dim, dim}, FLASHATTN_DTYPE_FP32, FLASHATTN_BACKEND_CPU);
    wrapper_ok = false;  // heads_q=3, heads_kv=2 must have thrown
  } catch (const flashattn::Error& e) {
    wrapper_ok = wrapper_ok && e.status() == FLASHATTN_STATUS_INVALID_HEADS;
  }
  std::printf("consumer.cpp: flashattn.hpp wrapper %s\n", wrapper_ok ? "ok" : "FAILED");
  if (!wrapper_ok) return 1;
#endif
  if (!finite || err_o > 1e-4 || err_lse > 1e-4) {
    std::fprintf(stderr, "consumer.cpp: FAILED (finite=%d)\n", static_cast<int>(finite));
    return 1;
  }
  return 0;
}
