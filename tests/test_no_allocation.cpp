// A CPU run allocates nothing: every scratch buffer comes from the caller's workspace and
// the worker threads come from the pool the plan's creation started. Each run below is
// made once normally and once while every allocation of the process fails (this
// program's operator new, failing_new.hpp): the second must not even try to allocate,
// and must give the same bits. The problems are large enough for teams of two (the
// pool's workers are used, not just the calling thread).
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <functional>
#include <vector>

#include "catch_compat.hpp"
#include "failing_new.hpp"
#include "flashattn.h"
#include "harness.hpp"

namespace {

// Runs call() with every allocation failing: it must succeed without trying one.
void allocates_nothing(const std::function<flashattn_status_t()>& call) {
  flashattn_status_t st;
  size_t refused = 0;
  {
    fat::AllocationsFail oom;
    st = call();
    refused = oom.refused();
  }
  INFO(flashattn_last_error());
  CHECK(st == FLASHATTN_STATUS_SUCCESS);
  CHECK(refused == 0);
}

std::vector<float> ramp(size_t n, float step) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = sinf(static_cast<float>(i) * step);
  return v;
}

flashattn_plan_t cpu_plan(const char* threads) {
  REQUIRE(setenv("FLASHATTN_CPU_THREADS", threads, 1) == 0);
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(unsetenv("FLASHATTN_CPU_THREADS") == 0);
  return plan;
}

// Bits of x rounded toward zero to bf16 (the inputs need only be deterministic).
uint16_t to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return static_cast<uint16_t>(u >> 16);
}
template <typename E>
std::vector<E> ramp_of(size_t n, float step) {
  const std::vector<float> f = ramp(n, step);
  if constexpr (sizeof(E) == 4) {
    return f;
  } else {
    std::vector<E> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = to_bf16(f[i]);
    return out;
  }
}

// B x S x H x D attention in E (float: fp32, uint16_t: bf16) with a dBias-producing bias
// tensor (broadcast over batch), a causal mask, dropout and softcap: every per-thread buffer
// of both algorithms (bf16: the conversions' too, and the amx set's tiles where the host
// has it).
template <typename E>
struct Dense {
  static constexpr int64_t B = 2, S = 150, H = 2, D = 40;
  std::vector<E> q = ramp_of<E>(B * S * H * D, 0.37f), k = ramp_of<E>(B * S * H * D, 0.21f),
                 v = ramp_of<E>(B * S * H * D, 0.13f), dout = ramp_of<E>(B * S * H * D, 0.05f),
                 bias = ramp_of<E>(H * S * S, 0.011f);
  flashattn_plan_t plan;
  std::vector<char> ws;
  struct Out {
    std::vector<E> o = std::vector<E>(B * S * H * D), dq = o, dk = o, dv = o, dbias = std::vector<E>(H * S * S);
    std::vector<float> lse = std::vector<float>(B * H * S);
  };
  explicit Dense(flashattn_algorithm_t alg) : plan(cpu_plan("2")) {
    const flashattn_dtype_t dtype = sizeof(E) == 4 ? FLASHATTN_DTYPE_FP32 : FLASHATTN_DTYPE_BF16;
    REQUIRE(flashattn_plan_set_shape(plan, B, S, S, H, H, D, D) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_dtype(plan, dtype) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_algorithm(plan, alg) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_band_mask(plan, FLASHATTN_ALIGN_TOP_LEFT, -1, 0) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_dropout(plan, 0.2f, 99, 0) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_softcap(plan, 15.f) == FLASHATTN_STATUS_SUCCESS);
    const int64_t strides[4] = {0, S * S, S, 1};
    REQUIRE(flashattn_plan_set_bias(plan, FLASHATTN_BIAS_TENSOR, strides) == FLASHATTN_STATUS_SUCCESS);
    size_t f = 0, b = 0;
    REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &f) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_BACKWARD, &b) == FLASHATTN_STATUS_SUCCESS);
    ws.resize(f > b ? f : b);
  }
  ~Dense() { flashattn_plan_destroy(plan); }
  flashattn_status_t fwd(Out& r) {
    flashattn_fwd_args_t a = fat::fwd_args(q.data(), k.data(), v.data(), r.o.data(), r.lse.data());
    a.bias = bias.data();
    return flashattn_fwd(plan, &a, ws.data(), ws.size(), nullptr);
  }
  flashattn_status_t bwd(Out& r) {
    flashattn_bwd_args_t a = fat::bwd_args(q.data(), k.data(), v.data(), r.o.data(), r.lse.data(), dout.data(),
                                           r.dq.data(), r.dk.data(), r.dv.data());
    a.bias = bias.data();
    a.dbias = r.dbias.data();
    return flashattn_bwd(plan, &a, ws.data(), ws.size(), nullptr);
  }
};

// Decode against a paged bf16 cache of 4 splits, appending one rotated token per sequence.
struct Decode {
  static constexpr int64_t B = 2, SK = 1024, HQ = 8, HKV = 2, D = 64, PAGE = 64, PAGES = SK / PAGE;
  std::vector<uint16_t> q = ramp_of<uint16_t>(B * HQ * D, 0.3f),
                        kc = ramp_of<uint16_t>(B * PAGES * PAGE * HKV * D, 0.7f), vc = kc,
                        knew = ramp_of<uint16_t>(B * HKV * D, 0.9f), vnew = knew,
                        cos_t = ramp_of<uint16_t>(SK * D / 2, 0.01f), sin_t = ramp_of<uint16_t>(SK * D / 2, 0.02f);
  std::vector<int32_t> used = {700, 1000}, table;
  flashattn_plan_t plan;
  std::vector<char> ws;
  Decode() : plan(cpu_plan("2")) {
    for (int64_t i = 0; i < B * PAGES; ++i) table.push_back(static_cast<int32_t>((i * 7) % (B * PAGES)));
    REQUIRE(flashattn_plan_set_shape(plan, B, 1, SK, HQ, HKV, D, D) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_dtype(plan, FLASHATTN_DTYPE_BF16) == FLASHATTN_STATUS_SUCCESS);
    flashattn_kvcache_config_t c = FLASHATTN_KVCACHE_CONFIG_INIT;
    c.page_size = PAGE;
    c.num_rows = B * PAGES;
    c.max_pages_per_seq = PAGES;
    c.seqlen_new = 1;
    c.rotary = FLASHATTN_ROTARY_HALF;
    c.rotary_dim = D;
    c.rotary_rows = SK;
    c.num_splits = 4;
    REQUIRE(flashattn_plan_set_kvcache(plan, &c) == FLASHATTN_STATUS_SUCCESS);
    size_t bytes = 0;
    REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD_KVCACHE, &bytes) ==
            FLASHATTN_STATUS_SUCCESS);
    ws.resize(bytes);
  }
  ~Decode() { flashattn_plan_destroy(plan); }
  // Appends to copies of the caches, so that both runs start from the same cache.
  flashattn_status_t run(std::vector<uint16_t>& o, std::vector<uint16_t>& k, std::vector<uint16_t>& v) {
    flashattn_kvcache_args_t a = FLASHATTN_KVCACHE_ARGS_INIT;
    a.q = q.data(), a.k_cache = k.data(), a.v_cache = v.data(), a.o = o.data();
    a.cache_seqlens = used.data(), a.block_table = table.data();
    a.k_new = knew.data(), a.v_new = vnew.data(), a.rotary_cos = cos_t.data(), a.rotary_sin = sin_t.data();
    return flashattn_fwd_kvcache(plan, &a, ws.data(), ws.size(), nullptr);
  }
};

}  // namespace

template <typename E>
void dense_allocates_nothing() {
  for (auto alg : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
    INFO("algorithm " << alg);
    Dense<E> d(alg);
    typename Dense<E>::Out want, got;
    REQUIRE(d.fwd(want) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(d.bwd(want) == FLASHATTN_STATUS_SUCCESS);
    allocates_nothing([&] { return d.fwd(got); });
    allocates_nothing([&] { return d.bwd(got); });
    CHECK(got.o == want.o);
    CHECK(got.lse == want.lse);
    CHECK(got.dq == want.dq);
    CHECK(got.dk == want.dk);
    CHECK(got.dv == want.dv);
    CHECK(got.dbias == want.dbias);
  }
}

TEST_CASE("CPU forward and backward runs allocate nothing, both algorithms", "[oom][alloc]") {
  FA_REQUIRE_INJECTION();
  SECTION("fp32") { dense_allocates_nothing<float>(); }
  SECTION("bf16") { dense_allocates_nothing<uint16_t>(); }
}

TEST_CASE("CPU KV-cache runs (paged, appending, rotary, split) allocate nothing", "[oom][alloc][kvcache]") {
  FA_REQUIRE_INJECTION();
  Decode d;
  std::vector<uint16_t> o_want(Decode::B * Decode::HQ * Decode::D), o_got = o_want;
  std::vector<uint16_t> k_want = d.kc, v_want = d.vc, k_got = d.kc, v_got = d.vc;
  const flashattn_status_t st = d.run(o_want, k_want, v_want);
  INFO(flashattn_last_error());
  REQUIRE(st == FLASHATTN_STATUS_SUCCESS);
  allocates_nothing([&] { return d.run(o_got, k_got, v_got); });
  CHECK(o_got == o_want);
  CHECK(k_got == k_want);
  CHECK(v_got == v_want);
}

TEST_CASE("CPU combine allocates nothing once the worker pool is started", "[oom][alloc][kvcache]") {
  FA_REQUIRE_INJECTION();
  const int64_t S = 4, B = 2, Q = 256, H = 4, D = 64;
  const std::vector<float> o_part = ramp(S * B * Q * H * D, 0.03f), lse_part = ramp(S * B * H * Q, 0.7f);
  const int64_t o_part_strides[5] = {B * Q * H * D, Q * H * D, H * D, D, 1}, lse_strides[4] = {B * H * Q, H * Q, Q, 1};
  const int64_t o_strides[4] = {Q * H * D, H * D, D, 1};
  std::vector<float> o_want(B * Q * H * D), lse_want(B * H * Q), o_got = o_want, lse_got = lse_want;
  auto combine = [&](std::vector<float>& o, std::vector<float>& lse) {
    flashattn_combine_args_t a = FLASHATTN_COMBINE_ARGS_INIT;
    a.num_splits = S, a.batch = B, a.seqlen_q = Q, a.heads = H, a.head_dim = D;
    a.o_partial = o_part.data(), a.o_partial_strides = o_part_strides;
    a.lse_partial = lse_part.data(), a.lse_partial_strides = lse_strides;
    a.dtype = FLASHATTN_DTYPE_FP32, a.o = o.data(), a.o_strides = o_strides, a.lse = lse.data();
    return flashattn_combine(FLASHATTN_BACKEND_CPU, 0, &a, nullptr);
  };
  REQUIRE(setenv("FLASHATTN_CPU_THREADS", "2", 1) == 0);
  REQUIRE(combine(o_want, lse_want) == FLASHATTN_STATUS_SUCCESS);  // may start the pool's worker
  allocates_nothing([&] { return combine(o_got, lse_got); });
  REQUIRE(unsetenv("FLASHATTN_CPU_THREADS") == 0);
  CHECK(o_got == o_want);
  CHECK(lse_got == lse_want);
}
