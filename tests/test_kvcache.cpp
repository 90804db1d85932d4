// flashattn_fwd_kvcache on the CPU against the fp64 reference (the keys each sequence
// attends to, materialized from the cache) under the same-precision bound, against the
// library's own dense path, and flashattn_combine. Awkward shapes are the default: pages
// of 1, 3, 16 and 256 tokens, used lengths 0 and full, chunked prefill, GQA 1..16, both
// rotary forms, NHD and HND pages, permuted cache rows, every slot no run may read NaN.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "dtype.hpp"
#include "harness.hpp"
#include "kvcache_case.hpp"

using namespace fat;

namespace {

// Runs c, checks O/LSE against the reference and the caches against the documented append.
KvResult run_and_check(const KvCase& c) {
  const KvRun r = make_kv_run(c);
  flashattn_plan_t plan = make_kv_plan(r);
  const KvResult k = run_kv(r, plan);
  flashattn_plan_destroy(plan);
  INFO(describe(r.c) << " | status " << flashattn_status_string(k.status) << ": " << k.error);
  REQUIRE(k.status == FLASHATTN_STATUS_SUCCESS);
  CHECK(same_bytes(k.k_cache, r.k_cache_after));
  CHECK(same_bytes(k.v_cache, r.v_cache_after));
  check_against_reference(kv_problem(r), kv_lib_result(r, k));
  return k;
}

KvCase decode_case(const char* name, int64_t page, uint64_t seed) {
  KvCase c;
  c.name = name;
  c.batch = 3;
  c.cap = 70;
  c.hq = 4;
  c.hkv = 2;
  c.page_size = page;
  c.used = {0, 70, 37};
  c.seed = seed;
  return c;
}

}  // namespace

TEST_CASE("kvcache decode over contiguous and paged caches, used lengths 0 and full") {
  for (int64_t page : {0, 1, 3, 16, 256}) {
    for (bool hnd : {false, true}) {
      KvCase c = decode_case("decode", page, static_cast<uint64_t>(page) + (hnd ? 100 : 0));
      c.heads_outer = hnd;
      run_and_check(c);
    }
  }
}

TEST_CASE("kvcache in every dtype, head dims with dqk != dv, permuted cache rows") {
  for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP32}) {
    KvCase c = decode_case("dtypes", 0, 7);
    c.dtype = t;
    c.dqk = 40;
    c.dv = 24;
    c.batch_idx = true;
    run_and_check(c);
  }
}

TEST_CASE("kvcache GQA ratios 1 to 16") {
  for (int64_t ratio : {1, 2, 3, 8, 16}) {
    KvCase c = decode_case("gqa", 16, static_cast<uint64_t>(ratio));
    c.hkv = 2;
    c.hq = 2 * ratio;
    c.sq = 2;
    run_and_check(c);
  }
}

TEST_CASE("kvcache append with both rotary forms and chunked prefill under a causal mask") {
  for (flashattn_rotary_t rot : {FLASHATTN_ROTARY_NONE, FLASHATTN_ROTARY_HALF, FLASHATTN_ROTARY_INTERLEAVED}) {
    for (int64_t page : {0, 3, 16}) {
      for (bool causal : {false, true}) {
        KvCase c = decode_case("append", page, 11 + static_cast<uint64_t>(page));
        c.cap = 150;
        c.seqlen_new = 5;
        c.sq = 5;  // the new tokens' queries: chunked prefill
        c.used = {0, 145, 61};
        c.rotary = rot;
        c.rotary_dim = rot == FLASHATTN_ROTARY_NONE ? 0 : 10;
        c.causal = causal;
        c.batch_idx = page == 0 && causal;
        run_and_check(c);
      }
    }
  }
}

TEST_CASE("kvcache long chunked prefill: q blocks, causal, windows, softcap, ALiBi") {
  KvCase c = decode_case("prefill", 16, 21);
  c.cap = 300;
  c.sq = 140;
  c.seqlen_new = 140;
  c.used = {0, 160, 77};
  c.causal = true;
  run_and_check(c);
  c.causal = false;
  c.wl = 50;
  c.wr = 3;
  c.softcap = 5.f;
  c.bias = FLASHATTN_BIAS_ALIBI;
  c.seed = 22;
  run_and_check(c);
  c.bias = FLASHATTN_BIAS_ALIBI_SYMMETRIC;
  c.rotary = FLASHATTN_ROTARY_HALF;
  c.rotary_dim = 16;
  c.seed = 23;
  run_and_check(c);
  c.alibi_batch_stride = c.hq + 3;  // slopes per (sequence, head), NaN between the rows
  c.seed = 24;
  run_and_check(c);
  c.bias = FLASHATTN_BIAS_ALIBI;
  c.alibi_batch_stride = 1;  // overlapping rows
  c.page_size = 7;
  c.seed = 25;
  run_and_check(c);
}

TEST_CASE("kvcache split-KV: long caches, forced and chosen split counts, LSE optional") {
  for (int64_t splits : {0, 1, 2, 7, 64}) {
    KvCase c = decode_case("splits", 16, 30 + static_cast<uint64_t>(splits));
    c.cap = 2000;
    c.used = {1999, 0, 1000};
    c.seqlen_new = splits == 2 ? 0 : 1;  // without an append sequence 1 attends to nothing
    c.num_splits = splits;
    c.with_lse = splits != 7;
    run_and_check(c);
  }
}

TEST_CASE("kvcache with one split equals the dense path bitwise") {
  KvCase c = decode_case("dense-equal", 3, 41);
  c.cap = 200;
  c.sq = 3;
  c.seqlen_new = 3;
  c.used = {100, 0, 197};
  c.causal = true;
  c.num_splits = 1;
  c.rotary = FLASHATTN_ROTARY_INTERLEAVED;
  c.rotary_dim = 8;
  const KvRun r = make_kv_run(c);
  flashattn_plan_t kvp = make_kv_plan(r);
  const KvResult k = run_kv(r, kvp);
  flashattn_plan_destroy(kvp);
  REQUIRE(k.status == FLASHATTN_STATUS_SUCCESS);

  // The same attention through flashattn_fwd: varlen with the materialized keys.
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_shape(plan, c.batch, c.sq, c.cap, c.hq, c.hkv, c.dqk, c.dv) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_dtype(plan, c.dtype) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_band_mask(plan, FLASHATTN_ALIGN_BOTTOM_RIGHT, -1, 0) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_varlen(plan, 1, r.spec.total_q(), r.spec.total_k()) == FLASHATTN_STATUS_SUCCESS);
  std::vector<int32_t> cu_q(r.spec.cu_q.begin(), r.spec.cu_q.end()), cu_k(r.spec.cu_k.begin(), r.spec.cu_k.end());
  std::vector<uint8_t> o(k.o.size(), kPoison);
  std::vector<float> lse(k.lse.size());
  flashattn_fwd_args_t a = FLASHATTN_FWD_ARGS_INIT;
  a.q = r.q_rotated.data();
  a.k = r.k_dense.data();
  a.v = r.v_dense.data();
  a.o = o.data();
  a.lse = lse.data();
  a.cu_seqlens_q = cu_q.data();
  a.cu_seqlens_k = cu_k.data();
  size_t ws_bytes = 0;
  REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &ws_bytes) == FLASHATTN_STATUS_SUCCESS);
  std::vector<uint8_t> ws(ws_bytes + 1);
  REQUIRE(flashattn_fwd(plan, &a, ws.data(), ws_bytes, nullptr) == FLASHATTN_STATUS_SUCCESS);
  flashattn_plan_destroy(plan);
  CHECK(same_bytes(o, k.o));
  // Varlen LSE is [heads_q, total_q]; the KV-cache LSE [batch, heads_q, seqlen_q].
  bool lse_same = true;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < c.sq; ++i)
        lse_same &= memcmp(&lse[h * r.spec.total_q() + b * c.sq + i], &k.lse[(b * c.hq + h) * c.sq + i], 4) == 0;
  CHECK(lse_same);
}

// A decode reads contiguous caches in place (fp32 rows, or 16-bit rows converted as the
// kernels read them) and paged ones through fp32 tiles converted first (flash_fwd.cpp):
// the same logical cache gives the same bits either way.
TEST_CASE("kvcache contiguous and paged caches give the same bits in every dtype") {
  for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP32})
    for (int64_t dv : {48, 40}) {  // V in place, and V through the slot (not whole vectors)
      std::vector<KvResult> runs;
      for (int64_t page : {0, 16, 1}) {
        KvCase c = decode_case("in-place", page, 61);
        c.dtype = t;
        c.cap = 300;
        c.used = {300, 5, 170};
        c.hq = 6;
        c.hkv = 2;
        c.dqk = 40;  // a tail past the last 16-element vector of the dot products
        c.dv = dv;
        runs.push_back(run_and_check(c));
      }
      for (size_t i = 1; i < runs.size(); ++i) {
        INFO("dtype " << t << " dv " << dv << " run " << i);
        CHECK(same_bytes(runs[i].o, runs[0].o));
        CHECK(memcmp(runs[i].lse.data(), runs[0].lse.data(), runs[0].lse.size() * 4) == 0);
      }
    }
}

TEST_CASE("kvcache results are bitwise independent of the thread count") {
  KvCase c = decode_case("threads", 16, 51);
  c.cap = 1500;
  c.used = {1400, 3, 1499};
  c.seqlen_new = 1;
  c.rotary = FLASHATTN_ROTARY_HALF;
  c.rotary_dim = 16;
  const char* old = getenv("FLASHATTN_CPU_THREADS");
  const std::string saved = old ? old : "";
  std::vector<KvResult> runs;
  for (const char* n : {"1", "3", "8"}) {
    setenv("FLASHATTN_CPU_THREADS", n, 1);
    runs.push_back(run_and_check(c));
  }
  if (old) setenv("FLASHATTN_CPU_THREADS", saved.c_str(), 1);
  else unsetenv("FLASHATTN_CPU_THREADS");
  for (size_t i = 1; i < runs.size(); ++i) {
    CHECK(same_bytes(runs[i].o, runs[0].o));
    CHECK(memcmp(runs[i].lse.data(), runs[0].lse.data(), runs[0].lse.size() * 4) == 0);
  }
}

// ---- flashattn_combine ----------------------------------------------------------------------

TEST_CASE("combine merges split attention into the unsplit result, skipping -inf parts") {
  // Attention of one row over 3 key groups, computed per group in fp64; one group empty.
  const int64_t S = 4, B = 2, Q = 3, H = 2, D = 5;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  std::vector<float> o_part(static_cast<size_t>(S * B * Q * H * D)), lse_part(static_cast<size_t>(S * B * H * Q));
  std::vector<double> want_o(static_cast<size_t>(B * Q * H * D)), want_lse(static_cast<size_t>(B * H * Q));
  uint64_t state = 5;
  auto rnd = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(state >> 11) / 9007199254740992.0 * 4.0 - 2.0;
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Q; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const bool all_empty = b == 1 && i == 2 && h == 1;
        double m = -INFINITY, total = 0;
        std::vector<double> lse_s(S), acc(static_cast<size_t>(D), 0.0);
        for (int64_t s = 0; s < S; ++s) {
          const bool empty = all_empty || s == 2 || (s == 0 && b == 0 && i == 1);
          float* o = &o_part[static_cast<size_t>((((s * B + b) * Q + i) * H + h) * D)];
          float& l = lse_part[static_cast<size_t>(((s * B + b) * H + h) * Q + i)];
          if (empty) {
            l = kNegInf;
            for (int64_t d = 0; d < D; ++d) o[d] = std::numeric_limits<float>::quiet_NaN();  // never read
            lse_s[s] = -INFINITY;
            continue;
          }
          l = static_cast<float>(rnd() * 3);
          lse_s[s] = l;
          for (int64_t d = 0; d < D; ++d) o[d] = static_cast<float>(rnd());
          m = std::max(m, lse_s[s]);
        }
        for (int64_t s = 0; s < S; ++s)
          if (lse_s[s] != -INFINITY) total += exp(lse_s[s] - m);
        const double lse = all_empty ? -INFINITY : m + log(total);
        for (int64_t s = 0; s < S; ++s) {
          if (lse_s[s] == -INFINITY) continue;
          const float* o = &o_part[static_cast<size_t>((((s * B + b) * Q + i) * H + h) * D)];
          for (int64_t d = 0; d < D; ++d) acc[d] += exp(lse_s[s] - lse) * o[d];
        }
        want_lse[static_cast<size_t>((b * H + h) * Q + i)] = lse;
        for (int64_t d = 0; d < D; ++d) want_o[static_cast<size_t>(((b * Q + i) * H + h) * D + d)] = acc[d];
      }
  for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_BF16}) {
    flashattn_combine_args_t a = FLASHATTN_COMBINE_ARGS_INIT;
    a.num_splits = S;
    a.batch = B;
    a.seqlen_q = Q;
    a.heads = H;
    a.head_dim = D;
    a.o_partial = o_part.data();
    a.lse_partial = lse_part.data();
    a.dtype = t;
    std::vector<uint8_t> o(want_o.size() * dtype_size(t), kPoison);
    std::vector<float> lse(want_lse.size(), 7.f);
    a.o = o.data();
    a.lse = lse.data();
    REQUIRE(flashattn_combine(FLASHATTN_BACKEND_CPU, 0, &a, nullptr) == FLASHATTN_STATUS_SUCCESS);
    const double tol = t == FLASHATTN_DTYPE_FP32 ? 1e-5 : 1e-2;
    for (size_t n = 0; n < want_o.size(); ++n) {
      INFO("o[" << n << "] " << dtype_name(t));
      CHECK(fabs(load_elem(t, &o[n * dtype_size(t)]) - want_o[n]) <= tol * (1 + fabs(want_o[n])));
    }
    for (size_t n = 0; n < want_lse.size(); ++n) {
      INFO("lse[" << n << "]");
      if (want_lse[n] == -INFINITY) {
        CHECK(lse[n] == kNegInf);
      } else {
        CHECK(fabs(lse[n] - want_lse[n]) <= 1e-5 * (1 + fabs(want_lse[n])));
      }
    }
    // The all-empty row is exactly 0.
    for (int64_t d = 0; d < D; ++d)
      CHECK(load_elem(t, &o[static_cast<size_t>(((1 * Q + 2) * H + 1) * D + d) * dtype_size(t)]) == 0.0);
  }
}

TEST_CASE("combine with strided parts and output, a NaN part propagates") {
  // Parts [head, split, dim] interleaved, output with a padded head stride.
  const int64_t S = 3, H = 2, D = 4;
  std::vector<float> o_part(static_cast<size_t>(H * S * (D + 1))), lse_part(static_cast<size_t>(H * S));
  for (size_t n = 0; n < o_part.size(); ++n) o_part[n] = static_cast<float>(n % 7) - 3.f;
  for (size_t n = 0; n < lse_part.size(); ++n) lse_part[n] = static_cast<float>(n) * 0.5f;
  lse_part[static_cast<size_t>(1 * S + 1)] = std::numeric_limits<float>::quiet_NaN();  // head 1, split 1
  flashattn_combine_args_t a = FLASHATTN_COMBINE_ARGS_INIT;
  a.num_splits = S;
  a.batch = 1;
  a.seqlen_q = 1;
  a.heads = H;
  a.head_dim = D;
  a.o_partial = o_part.data();
  const int64_t ops[5] = {D + 1, 0, 0, S * (D + 1), 1};
  a.o_partial_strides = ops;
  a.lse_partial = lse_part.data();
  const int64_t lps[4] = {1, 0, S, 0};
  a.lse_partial_strides = lps;
  a.dtype = FLASHATTN_DTYPE_FP32;
  std::vector<float> o(static_cast<size_t>(H * (D + 3)), 99.f);
  const int64_t os[4] = {0, 0, D + 3, 1};
  a.o_strides = os;
  a.o = o.data();
  REQUIRE(flashattn_combine(FLASHATTN_BACKEND_CPU, 0, &a, nullptr) == FLASHATTN_STATUS_SUCCESS);
  // Head 0: weights exp(lse_s - lse) over its 3 parts.
  double m = 1.0, tot = 0;
  for (int64_t s = 0; s < S; ++s) tot += exp(lse_part[s] - m);
  const double lse0 = m + log(tot);
  for (int64_t d = 0; d < D; ++d) {
    double want = 0;
    for (int64_t s = 0; s < S; ++s) want += exp(lse_part[s] - lse0) * o_part[static_cast<size_t>(s * (D + 1) + d)];
    CHECK(fabs(o[d] - want) <= 1e-5 * (1 + fabs(want)));
    CHECK(std::isnan(o[static_cast<size_t>(D + 3 + d)]));
  }
  for (int64_t d = D; d < D + 3; ++d) CHECK(o[d] == 99.f);  // padding untouched
}
