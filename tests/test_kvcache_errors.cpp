// Every bad input of the inference entry points gets its documented status, a message
// naming the argument, and changes nothing: runs leave O, LSE and both caches exactly as
// they were (O poisoned, LSE NaN, caches compared bytewise), and a refused configuration
// leaves the plan as it was (the next run gives bitwise the same result).
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

// Paged cache (pages of 3), two appended tokens with rotary, causal, ALiBi, GQA.
KvCase paged_fixture() {
  KvCase c;
  c.name = "paged fixture";
  c.batch = 3;
  c.sq = 2;
  c.cap = 20;
  c.hq = 4;
  c.hkv = 2;
  c.page_size = 3;
  c.seqlen_new = 2;
  c.used = {0, 18, 7};
  c.rotary = FLASHATTN_ROTARY_HALF;
  c.rotary_dim = 8;
  c.causal = true;
  c.bias = FLASHATTN_BIAS_ALIBI;
  return c;
}

// Contiguous cache with permuted rows and one appended token.
KvCase contiguous_fixture() {
  KvCase c = paged_fixture();
  c.name = "contiguous fixture";
  c.page_size = 0;
  c.batch_idx = true;
  c.seqlen_new = 1;
  c.rotary = FLASHATTN_ROTARY_NONE;
  c.rotary_dim = 0;
  return c;
}

bool mentions(const std::string& msg, const char* name) { return msg.find(name) != std::string::npos; }

bool untouched(const KvRun& r, const KvResult& k) {
  for (uint8_t x : k.o)
    if (x != kPoison) return false;
  for (float x : k.lse)
    if (x == x) return false;
  return k.k_cache == r.k_cache && k.v_cache == r.v_cache;
}

struct RunCase {
  const char* what;
  KvEdit edit;
  flashattn_status_t status;
  const char* name;  // the message must contain it
};

void check_run_cases(const KvCase& fixture, const std::vector<RunCase>& cases) {
  const KvRun r = make_kv_run(fixture);
  flashattn_plan_t plan = make_kv_plan(r);
  {
    const KvResult good = run_kv(r, plan);
    INFO(good.error);
    REQUIRE(good.status == FLASHATTN_STATUS_SUCCESS);  // the fixture itself is valid
  }
  for (const RunCase& c : cases) {
    const KvResult k = run_kv(r, plan, c.edit);
    INFO(fixture.name << ": " << c.what << " -> " << flashattn_status_string(k.status) << ": " << k.error);
    CHECK(k.status == c.status);
    CHECK(mentions(k.error, c.name));
    CHECK(untouched(r, k));
  }
  flashattn_plan_destroy(plan);
}

int32_t* writable(const int32_t* p) { return const_cast<int32_t*>(p); }

}  // namespace

TEST_CASE("fwd_kvcache rejects missing, unneeded and misaligned pointers and writes nothing") {
  check_run_cases(
      paged_fixture(),
      {{"args.q NULL", [](flashattn_kvcache_args_t& a, const KvRun&) { a.q = nullptr; }, FLASHATTN_STATUS_NULL_POINTER,
        "args.q"},
       {"args.k_cache NULL", [](flashattn_kvcache_args_t& a, const KvRun&) { a.k_cache = nullptr; },
        FLASHATTN_STATUS_NULL_POINTER, "args.k_cache"},
       {"args.v_cache NULL", [](flashattn_kvcache_args_t& a, const KvRun&) { a.v_cache = nullptr; },
        FLASHATTN_STATUS_NULL_POINTER, "args.v_cache"},
       {"args.o NULL", [](flashattn_kvcache_args_t& a, const KvRun&) { a.o = nullptr; }, FLASHATTN_STATUS_NULL_POINTER,
        "args.o"},
       {"args.cache_seqlens NULL", [](flashattn_kvcache_args_t& a, const KvRun&) { a.cache_seqlens = nullptr; },
        FLASHATTN_STATUS_NULL_POINTER, "args.cache_seqlens"},
       {"args.block_table NULL", [](flashattn_kvcache_args_t& a, const KvRun&) { a.block_table = nullptr; },
        FLASHATTN_STATUS_NULL_POINTER, "args.block_table"},
       {"args.k_new NULL", [](flashattn_kvcache_args_t& a, const KvRun&) { a.k_new = nullptr; },
        FLASHATTN_STATUS_NULL_POINTER, "args.k_new"},
       {"args.v_new NULL", [](flashattn_kvcache_args_t& a, const KvRun&) { a.v_new = nullptr; },
        FLASHATTN_STATUS_NULL_POINTER, "args.v_new"},
       {"args.rotary_cos NULL", [](flashattn_kvcache_args_t& a, const KvRun&) { a.rotary_cos = nullptr; },
        FLASHATTN_STATUS_NULL_POINTER, "args.rotary_cos"},
       {"args.rotary_sin NULL", [](flashattn_kvcache_args_t& a, const KvRun&) { a.rotary_sin = nullptr; },
        FLASHATTN_STATUS_NULL_POINTER, "args.rotary_sin"},
       {"args.alibi_slopes NULL", [](flashattn_kvcache_args_t& a, const KvRun&) { a.alibi_slopes = nullptr; },
        FLASHATTN_STATUS_NULL_POINTER, "args.alibi_slopes"},
       {"cache_batch_idx with pages",
        [](flashattn_kvcache_args_t& a, const KvRun&) { a.cache_batch_idx = a.cache_seqlens; },
        FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS, "args.cache_batch_idx"},
       {"struct_size too small", [](flashattn_kvcache_args_t& a, const KvRun&) { a.struct_size = 8; },
        FLASHATTN_STATUS_INVALID_STRUCT_SIZE, "struct_size"},
       {"misaligned q", [](flashattn_kvcache_args_t& a, const KvRun&) { a.q = static_cast<const char*>(a.q) + 1; },
        FLASHATTN_STATUS_MISALIGNED_POINTER, "args.q"},
       {"misaligned block table",
        [](flashattn_kvcache_args_t& a, const KvRun&) {
          a.block_table = reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(a.block_table) + 2);
        },
        FLASHATTN_STATUS_MISALIGNED_POINTER, "args.block_table"}});
  check_run_cases(
      contiguous_fixture(),
      {{"block table for a contiguous cache",
        [](flashattn_kvcache_args_t& a, const KvRun&) { a.block_table = a.cache_seqlens; },
        FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS, "args.block_table"},
       {"rotary tables without a rotary form", [](flashattn_kvcache_args_t& a, const KvRun&) { a.rotary_cos = a.q; },
        FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS, "args.rotary_cos"}});
}

TEST_CASE("fwd_kvcache rejects used lengths, cache rows and block-table entries out of range") {
  check_run_cases(
      paged_fixture(),
      {{"negative used length", [](flashattn_kvcache_args_t& a, const KvRun&) { writable(a.cache_seqlens)[1] = -1; },
        FLASHATTN_STATUS_INVALID_SEQLENS, "cache_seqlens[1]=-1"},
       {"used + new past the capacity",
        [](flashattn_kvcache_args_t& a, const KvRun&) { writable(a.cache_seqlens)[2] = 19; },
        FLASHATTN_STATUS_INVALID_SEQLENS, "cache_seqlens[2]=19"},
       {"block-table entry past the pool",
        [](flashattn_kvcache_args_t& a, const KvRun& r) {
          writable(a.block_table)[2 * r.max_pages + 1] = static_cast<int32_t>(r.num_rows);
        },
        FLASHATTN_STATUS_INVALID_VALUE, "block_table[2][1]"},
       {"negative block-table entry",
        [](flashattn_kvcache_args_t& a, const KvRun& r) { writable(a.block_table)[1 * r.max_pages + 6] = -1; },
        FLASHATTN_STATUS_INVALID_VALUE, "block_table[1][6]=-1"},
       {"two sequences append into one page",
        [](flashattn_kvcache_args_t& a, const KvRun& r) {
          // Sequence 0 (used 0) appends into its page 0; sequence 2 (used 7) into its page 2.
          writable(a.block_table)[2 * r.max_pages + 2] = a.block_table[0];
        },
        FLASHATTN_STATUS_INVALID_VALUE, "block_table[0][0]"}});
  check_run_cases(
      contiguous_fixture(),
      {{"cache row past num_rows",
        [](flashattn_kvcache_args_t& a, const KvRun& r) {
          writable(a.cache_batch_idx)[1] = static_cast<int32_t>(r.num_rows);
        },
        FLASHATTN_STATUS_INVALID_VALUE, "cache_batch_idx[1]"},
       {"negative cache row", [](flashattn_kvcache_args_t& a, const KvRun&) { writable(a.cache_batch_idx)[0] = -3; },
        FLASHATTN_STATUS_INVALID_VALUE, "cache_batch_idx[0]=-3"},
       {"one cache row appended to twice",
        [](flashattn_kvcache_args_t& a, const KvRun&) { writable(a.cache_batch_idx)[2] = a.cache_batch_idx[0]; },
        FLASHATTN_STATUS_INVALID_VALUE, "cache_batch_idx[0]"}});
}

TEST_CASE("fwd_kvcache rejects outputs overlapping inputs, streams, and small workspaces") {
  check_run_cases(paged_fixture(),
                  {{"o over q", [](flashattn_kvcache_args_t& a, const KvRun&) { a.o = const_cast<void*>(a.q); },
                    FLASHATTN_STATUS_INVALID_ARGUMENT, "args.o"},
                   {"lse over the block table",
                    [](flashattn_kvcache_args_t& a, const KvRun&) {
                      a.lse = reinterpret_cast<float*>(const_cast<int32_t*>(a.block_table));
                    },
                    FLASHATTN_STATUS_INVALID_ARGUMENT, "args.lse"},
                   {"appended cache over k_new",
                    [](flashattn_kvcache_args_t& a, const KvRun&) { a.k_cache = const_cast<void*>(a.k_new); },
                    FLASHATTN_STATUS_INVALID_ARGUMENT, "args.k_cache"},
                   {"appended V cache the same memory as the K cache",
                    [](flashattn_kvcache_args_t& a, const KvRun&) { a.v_cache = a.k_cache; },
                    FLASHATTN_STATUS_INVALID_ARGUMENT, "args.v_cache"}});
  const KvRun r = make_kv_run(paged_fixture());
  flashattn_plan_t plan = make_kv_plan(r);
  std::vector<uint8_t> o(static_cast<size_t>(r.c.batch * r.c.sq * r.c.hq * r.c.dv) * 2, kPoison);
  std::vector<uint8_t> kc = r.k_cache, vc = r.v_cache;
  std::vector<int32_t> used = r.used, table = r.block_table;
  flashattn_kvcache_args_t a = FLASHATTN_KVCACHE_ARGS_INIT;
  a.q = r.q.data();
  a.k_cache = kc.data();
  a.v_cache = vc.data();
  a.o = o.data();
  a.cache_seqlens = used.data();
  a.block_table = table.data();
  a.k_new = r.k_new.data();
  a.v_new = r.v_new.data();
  a.rotary_cos = r.cos.data();
  a.rotary_sin = r.sin.data();
  a.alibi_slopes = r.slopes.data();
  size_t bytes = 0;
  REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD_KVCACHE, &bytes) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(bytes > 0);
  std::vector<uint8_t> ws(bytes);
  CHECK(flashattn_fwd_kvcache(plan, &a, ws.data(), bytes - 1, nullptr) == FLASHATTN_STATUS_WORKSPACE_TOO_SMALL);
  CHECK(mentions(flashattn_last_error(), "workspace_bytes"));
  CHECK(flashattn_fwd_kvcache(plan, &a, nullptr, bytes, nullptr) == FLASHATTN_STATUS_WORKSPACE_TOO_SMALL);
  CHECK(flashattn_fwd_kvcache(plan, &a, ws.data(), bytes, reinterpret_cast<CUstream_st*>(&bytes)) ==
        FLASHATTN_STATUS_INVALID_ARGUMENT);
  CHECK(mentions(flashattn_last_error(), "stream"));
  CHECK(flashattn_fwd_kvcache(plan, nullptr, ws.data(), bytes, nullptr) == FLASHATTN_STATUS_NULL_POINTER);
  CHECK(flashattn_fwd_kvcache(nullptr, &a, ws.data(), bytes, nullptr) == FLASHATTN_STATUS_NULL_POINTER);
  CHECK(same_bytes(kc, r.k_cache));
  CHECK(same_bytes(vc, r.v_cache));
  CHECK(std::count(o.begin(), o.end(), kPoison) == static_cast<long>(o.size()));
  flashattn_plan_destroy(plan);
}

// A dropout probability below 2^-17 has the 16-bit threshold 0 (docs/dropout.md): nothing
// is dropped, so a KV-cache run takes it as p = 0, with p = 0's bits.
TEST_CASE("fwd_kvcache runs a dropout probability that drops nothing as p = 0") {
  const KvRun r = make_kv_run(contiguous_fixture());
  flashattn_plan_t plan = make_kv_plan(r);
  const KvResult base = run_kv(r, plan);
  REQUIRE(base.status == FLASHATTN_STATUS_SUCCESS);
  for (float p : {1e-45f, 7.62e-6f}) {
    INFO("p = " << p);
    REQUIRE(flashattn_plan_set_dropout(plan, p, 1, 0) == FLASHATTN_STATUS_SUCCESS);
    const KvResult k = run_kv(r, plan);
    INFO(k.error);
    REQUIRE(k.status == FLASHATTN_STATUS_SUCCESS);
    CHECK(same_bytes(k.o, base.o));
    CHECK(k.lse == base.lse);
  }
  flashattn_plan_destroy(plan);
}

TEST_CASE("fwd_kvcache refuses options a KV cache does not take, and fwd/bwd refuse KV-cache plans") {
  const KvRun r = make_kv_run(contiguous_fixture());
  struct Opt {
    const char* what;
    flashattn_status_t (*apply)(flashattn_plan_t);
    const char* name;
  };
  const Opt opts[] = {
      {"varlen", [](flashattn_plan_t p) { return flashattn_plan_set_varlen(p, 1, 6, 40); }, "varlen"},
      {"dropout", [](flashattn_plan_t p) { return flashattn_plan_set_dropout(p, 0.1f, 1, 0); }, "dropout"},
      {"STANDARD", [](flashattn_plan_t p) { return flashattn_plan_set_algorithm(p, FLASHATTN_ALGORITHM_STANDARD); },
       "STANDARD"},
      {"top-left causal",
       [](flashattn_plan_t p) { return flashattn_plan_set_band_mask(p, FLASHATTN_ALIGN_TOP_LEFT, -1, 0); }, "align"},
      {"bias tensor",
       [](flashattn_plan_t p) {
         const int64_t st[4] = {0, 0, 0, 1};
         return flashattn_plan_set_bias(p, FLASHATTN_BIAS_TENSOR, st);
       },
       "bias tensor"},
      {"block-sparse",
       [](flashattn_plan_t p) {
         const uint8_t layout[2] = {1, 1};
         return flashattn_plan_set_block_sparse(p, layout, 1, 1, 2, 16, 16);
       },
       "block-sparse"}};
  for (const Opt& o : opts) {
    flashattn_plan_t plan = make_kv_plan(r);
    REQUIRE(o.apply(plan) == FLASHATTN_STATUS_SUCCESS);
    const KvResult k = run_kv(r, plan, [](flashattn_kvcache_args_t& a, const KvRun&) { a.alibi_slopes = nullptr; });
    INFO(o.what << ": " << k.error);
    CHECK(k.status == FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS);
    CHECK(mentions(k.error, o.name));
    CHECK(untouched(r, k));
    flashattn_plan_destroy(plan);
  }
  flashattn_plan_t plan = make_kv_plan(r);
  flashattn_fwd_args_t f = FLASHATTN_FWD_ARGS_INIT;
  CHECK(flashattn_fwd(plan, &f, nullptr, 0, nullptr) == FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS);
  CHECK(mentions(flashattn_last_error(), "flashattn_fwd_kvcache"));
  flashattn_bwd_args_t b = FLASHATTN_BWD_ARGS_INIT;
  CHECK(flashattn_bwd(plan, &b, nullptr, 0, nullptr) == FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS);
  // Leaving the mode: the KV-cache pass has no configuration any more.
  REQUIRE(flashattn_plan_set_kvcache(plan, nullptr) == FLASHATTN_STATUS_SUCCESS);
  size_t bytes = 7;
  CHECK(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD_KVCACHE, &bytes) ==
        FLASHATTN_STATUS_PLAN_INCOMPLETE);
  CHECK(bytes == 7);
  flashattn_kvcache_args_t a = FLASHATTN_KVCACHE_ARGS_INIT;
  CHECK(flashattn_fwd_kvcache(plan, &a, nullptr, 0, nullptr) == FLASHATTN_STATUS_PLAN_INCOMPLETE);
  CHECK(mentions(flashattn_last_error(), "flashattn_plan_set_kvcache"));
  flashattn_plan_destroy(plan);
}

TEST_CASE("set_kvcache rejects bad geometry and leaves the plan unchanged") {
  const KvRun r = make_kv_run(paged_fixture());
  flashattn_plan_t plan = make_kv_plan(r);
  const KvResult before = run_kv(r, plan);
  REQUIRE(before.status == FLASHATTN_STATUS_SUCCESS);
  struct Bad {
    const char* what;
    void (*edit)(flashattn_kvcache_config_t&);
    flashattn_status_t status;
    const char* name;
  };
  const Bad bad[] = {
      {"struct_size", [](flashattn_kvcache_config_t& k) { k.struct_size = 16; }, FLASHATTN_STATUS_INVALID_STRUCT_SIZE,
       "config.struct_size"},
      {"page_size < 0", [](flashattn_kvcache_config_t& k) { k.page_size = -1; }, FLASHATTN_STATUS_INVALID_SHAPE,
       "config.page_size=-1"},
      {"num_rows 0", [](flashattn_kvcache_config_t& k) { k.num_rows = 0; }, FLASHATTN_STATUS_INVALID_SHAPE,
       "config.num_rows=0"},
      {"block table too narrow", [](flashattn_kvcache_config_t& k) { k.max_pages_per_seq = 6; },
       FLASHATTN_STATUS_INVALID_SHAPE, "config.max_pages_per_seq=6"},
      {"max_pages_per_seq for a contiguous cache",
       [](flashattn_kvcache_config_t& k) {
         k.page_size = 0;
         k.max_pages_per_seq = 3;
       },
       FLASHATTN_STATUS_INVALID_SHAPE, "config.max_pages_per_seq=3"},
      {"seqlen_new past the capacity", [](flashattn_kvcache_config_t& k) { k.seqlen_new = 21; },
       FLASHATTN_STATUS_INVALID_SHAPE, "config.seqlen_new=21"},
      {"unknown rotary form", [](flashattn_kvcache_config_t& k) { k.rotary = static_cast<flashattn_rotary_t>(7); },
       FLASHATTN_STATUS_INVALID_ENUM, "config.rotary=7"},
      {"odd rotary_dim", [](flashattn_kvcache_config_t& k) { k.rotary_dim = 7; }, FLASHATTN_STATUS_INVALID_VALUE,
       "config.rotary_dim=7"},
      {"rotary_dim past head_dim_qk", [](flashattn_kvcache_config_t& k) { k.rotary_dim = 18; },
       FLASHATTN_STATUS_INVALID_VALUE, "config.rotary_dim=18"},
      {"rotary form with rotary_dim 0", [](flashattn_kvcache_config_t& k) { k.rotary_dim = 0; },
       FLASHATTN_STATUS_INVALID_VALUE, "config.rotary_dim=0"},
      {"rotary_rows 0", [](flashattn_kvcache_config_t& k) { k.rotary_rows = 0; }, FLASHATTN_STATUS_INVALID_VALUE,
       "config.rotary_rows=0"},
      {"rotary_dim without a form",
       [](flashattn_kvcache_config_t& k) {
         k.rotary = FLASHATTN_ROTARY_NONE;
         k.rotary_rows = 0;
       },
       FLASHATTN_STATUS_INVALID_VALUE, "config.rotary_dim"},
      {"rotary without appended keys", [](flashattn_kvcache_config_t& k) { k.seqlen_new = 0; },
       FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS, "config.rotary"},
      {"negative num_splits", [](flashattn_kvcache_config_t& k) { k.num_splits = -1; }, FLASHATTN_STATUS_INVALID_VALUE,
       "config.num_splits=-1"},
      {"huge num_splits", [](flashattn_kvcache_config_t& k) { k.num_splits = 5000; }, FLASHATTN_STATUS_INVALID_VALUE,
       "config.num_splits=5000"},
      {"cache dim stride 2",
       [](flashattn_kvcache_config_t& k) {
         static const int64_t st[4] = {3 * 2 * 16 * 2, 2 * 16 * 2, 16 * 2, 2};
         k.k_cache_strides = st;
       },
       FLASHATTN_STATUS_INVALID_STRIDE, "config.k_cache_strides"},
      {"negative cache stride",
       [](flashattn_kvcache_config_t& k) {
         static const int64_t st[4] = {96, -4, 16, 1};
         k.v_cache_strides = st;
       },
       FLASHATTN_STATUS_INVALID_STRIDE, "config.v_cache_strides"},
      {"appended cache aliasing itself",
       [](flashattn_kvcache_config_t& k) {
         static const int64_t st[4] = {96, 32, 1, 1};
         k.k_cache_strides = st;
       },
       FLASHATTN_STATUS_INVALID_STRIDE, "config.k_cache_strides"},
      {"k_new dim stride 0",
       [](flashattn_kvcache_config_t& k) {
         static const int64_t st[4] = {1, 1, 1, 0};
         k.k_new_strides = st;
       },
       FLASHATTN_STATUS_INVALID_STRIDE, "config.k_new_strides"},
  };
  for (const Bad& b : bad) {
    flashattn_kvcache_config_t k = kv_config(r);
    b.edit(k);
    const flashattn_status_t st = flashattn_plan_set_kvcache(plan, &k);
    const std::string msg = flashattn_last_error();
    INFO(b.what << " -> " << flashattn_status_string(st) << ": " << msg);
    CHECK(st == b.status);
    CHECK(mentions(msg, b.name));
  }
  CHECK(flashattn_plan_set_kvcache(nullptr, nullptr) == FLASHATTN_STATUS_NULL_POINTER);
  const KvResult after = run_kv(r, plan);
  REQUIRE(after.status == FLASHATTN_STATUS_SUCCESS);
  CHECK(same_bytes(after.o, before.o));
  CHECK(memcmp(after.lse.data(), before.lse.data(), after.lse.size() * 4) == 0);
  flashattn_plan_destroy(plan);

  flashattn_plan_t bare = nullptr;
  REQUIRE(flashattn_plan_create(&bare, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  const flashattn_kvcache_config_t k = kv_config(r);
  CHECK(flashattn_plan_set_kvcache(bare, &k) == FLASHATTN_STATUS_PLAN_INCOMPLETE);
  flashattn_plan_destroy(bare);
}

TEST_CASE("fwd_kvcache re-checks the geometry against a changed shape and positions against the rotary tables") {
  const KvRun r = make_kv_run(paged_fixture());
  flashattn_plan_t plan = make_kv_plan(r);
  // A larger capacity: the block table is now too narrow.
  REQUIRE(flashattn_plan_set_shape(plan, r.c.batch, r.c.sq, 40, r.c.hq, r.c.hkv, r.c.dqk, r.c.dv) ==
          FLASHATTN_STATUS_SUCCESS);
  size_t bytes = 3;
  CHECK(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD_KVCACHE, &bytes) ==
        FLASHATTN_STATUS_INVALID_SHAPE);
  CHECK(bytes == 3);
  flashattn_plan_destroy(plan);
  // Rotary tables shorter than the positions used: 18 used + 2 new needs position 19.
  plan = make_kv_plan(r);
  flashattn_kvcache_config_t k = kv_config(r);
  k.rotary_rows = 19;
  REQUIRE(flashattn_plan_set_kvcache(plan, &k) == FLASHATTN_STATUS_SUCCESS);
  const KvResult res = run_kv(r, plan);
  INFO(res.error);
  CHECK(res.status == FLASHATTN_STATUS_INVALID_SEQLENS);
  CHECK(mentions(res.error, "cache_seqlens[1]=18"));
  CHECK(mentions(res.error, "rotary_rows=19"));
  CHECK(untouched(r, res));
  flashattn_plan_destroy(plan);
}

TEST_CASE("combine rejects bad arguments and writes nothing") {
  std::vector<float> o_part(2 * 3 * 4, 1.f), lse_part(2 * 3, 0.f);
  std::vector<float> o(3 * 4, 5.f), lse(3, 5.f);
  auto fresh = [&] {
    flashattn_combine_args_t a = FLASHATTN_COMBINE_ARGS_INIT;
    a.num_splits = 2;
    a.batch = 1;
    a.seqlen_q = 1;
    a.heads = 3;
    a.head_dim = 4;
    a.o_partial = o_part.data();
    a.lse_partial = lse_part.data();
    a.dtype = FLASHATTN_DTYPE_FP32;
    a.o = o.data();
    a.lse = lse.data();
    return a;
  };
  {
    const flashattn_combine_args_t a = fresh();
    REQUIRE(flashattn_combine(FLASHATTN_BACKEND_CPU, 0, &a, nullptr) == FLASHATTN_STATUS_SUCCESS);
    CHECK(o[0] == 1.f);
    std::fill(o.begin(), o.end(), 5.f);
    std::fill(lse.begin(), lse.end(), 5.f);
  }
  struct Bad {
    const char* what;
    void (*edit)(flashattn_combine_args_t&);
    flashattn_status_t status;
    const char* name;
  };
  const Bad bad[] = {
      {"struct_size", [](flashattn_combine_args_t& a) { a.struct_size = 8; }, FLASHATTN_STATUS_INVALID_STRUCT_SIZE,
       "struct_size"},
      {"num_splits 0", [](flashattn_combine_args_t& a) { a.num_splits = 0; }, FLASHATTN_STATUS_INVALID_SHAPE,
       "args.num_splits=0"},
      {"batch 0", [](flashattn_combine_args_t& a) { a.batch = 0; }, FLASHATTN_STATUS_INVALID_SHAPE, "args.batch=0"},
      {"seqlen_q -1", [](flashattn_combine_args_t& a) { a.seqlen_q = -1; }, FLASHATTN_STATUS_INVALID_SHAPE,
       "args.seqlen_q=-1"},
      {"heads 0", [](flashattn_combine_args_t& a) { a.heads = 0; }, FLASHATTN_STATUS_INVALID_SHAPE, "args.heads=0"},
      {"head_dim 257", [](flashattn_combine_args_t& a) { a.head_dim = 257; }, FLASHATTN_STATUS_INVALID_SHAPE,
       "args.head_dim=257"},
      {"dtype 9", [](flashattn_combine_args_t& a) { a.dtype = static_cast<flashattn_dtype_t>(9); },
       FLASHATTN_STATUS_INVALID_ENUM, "args.dtype=9"},
      {"o_partial NULL", [](flashattn_combine_args_t& a) { a.o_partial = nullptr; }, FLASHATTN_STATUS_NULL_POINTER,
       "args.o_partial"},
      {"lse_partial NULL", [](flashattn_combine_args_t& a) { a.lse_partial = nullptr; }, FLASHATTN_STATUS_NULL_POINTER,
       "args.lse_partial"},
      {"o NULL", [](flashattn_combine_args_t& a) { a.o = nullptr; }, FLASHATTN_STATUS_NULL_POINTER, "args.o"},
      {"misaligned o_partial",
       [](flashattn_combine_args_t& a) {
         a.o_partial = reinterpret_cast<const float*>(reinterpret_cast<const char*>(a.o_partial) + 2);
       },
       FLASHATTN_STATUS_MISALIGNED_POINTER, "args.o_partial"},
      {"o_partial dim stride 3",
       [](flashattn_combine_args_t& a) {
         static const int64_t st[5] = {12, 12, 12, 4, 3};
         a.o_partial_strides = st;
       },
       FLASHATTN_STATUS_INVALID_STRIDE, "args.o_partial_strides"},
      {"negative lse stride",
       [](flashattn_combine_args_t& a) {
         static const int64_t st[4] = {-3, 3, 1, 1};
         a.lse_partial_strides = st;
       },
       FLASHATTN_STATUS_INVALID_STRIDE, "args.lse_partial_strides"},
      {"output aliasing itself",
       [](flashattn_combine_args_t& a) {
         static const int64_t st[4] = {12, 4, 1, 1};
         a.o_strides = st;
       },
       FLASHATTN_STATUS_INVALID_STRIDE, "args.o_strides"},
      {"o over o_partial", [](flashattn_combine_args_t& a) { a.o = const_cast<float*>(a.o_partial) + 4; },
       FLASHATTN_STATUS_INVALID_ARGUMENT, "args.o"},
      {"lse over lse_partial", [](flashattn_combine_args_t& a) { a.lse = const_cast<float*>(a.lse_partial); },
       FLASHATTN_STATUS_INVALID_ARGUMENT, "args.lse"},
  };
  for (const Bad& b : bad) {
    flashattn_combine_args_t a = fresh();
    b.edit(a);
    const flashattn_status_t st = flashattn_combine(FLASHATTN_BACKEND_CPU, 0, &a, nullptr);
    const std::string msg = flashattn_last_error();
    INFO(b.what << " -> " << flashattn_status_string(st) << ": " << msg);
    CHECK(st == b.status);
    CHECK(mentions(msg, b.name));
  }
  const flashattn_combine_args_t a = fresh();
  CHECK(flashattn_combine(FLASHATTN_BACKEND_CPU, 0, nullptr, nullptr) == FLASHATTN_STATUS_NULL_POINTER);
  CHECK(flashattn_combine(static_cast<flashattn_backend_t>(5), 0, &a, nullptr) == FLASHATTN_STATUS_INVALID_ENUM);
  CHECK(mentions(flashattn_last_error(), "backend=5"));
  CHECK(flashattn_combine(FLASHATTN_BACKEND_CPU, -1, &a, nullptr) == FLASHATTN_STATUS_INVALID_VALUE);
  CHECK(mentions(flashattn_last_error(), "device=-1"));
  CHECK(flashattn_combine(FLASHATTN_BACKEND_CPU, 0, &a, reinterpret_cast<CUstream_st*>(&o[0])) ==
        FLASHATTN_STATUS_INVALID_ARGUMENT);
  CHECK(mentions(flashattn_last_error(), "stream"));
  // CUDA: not built in or no device here, or host memory refused by a CUDA build.
  const flashattn_status_t cuda = flashattn_combine(FLASHATTN_BACKEND_CUDA, 0, &a, nullptr);
  CHECK((cuda == FLASHATTN_STATUS_BACKEND_UNAVAILABLE || cuda == FLASHATTN_STATUS_NO_DEVICE ||
         cuda == FLASHATTN_STATUS_WRONG_MEMORY_SPACE));
  CHECK(std::count(o.begin(), o.end(), 5.f) == static_cast<long>(o.size()));
  CHECK(std::count(lse.begin(), lse.end(), 5.f) == static_cast<long>(lse.size()));
}

TEST_CASE("CUDA plans: KV-cache workspace covers the split parts and host memory is refused") {
  if (flashattn_cuda_device_count() == 0) FA_SKIP_TEST("no CUDA device");
  const KvRun r = make_kv_run(paged_fixture());
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CUDA, 0) == FLASHATTN_STATUS_SUCCESS);
  const KvCase& c = r.c;
  REQUIRE(flashattn_plan_set_shape(plan, c.batch, c.sq, c.cap, c.hq, c.hkv, c.dqk, c.dv) == FLASHATTN_STATUS_SUCCESS);
  flashattn_kvcache_config_t kv = kv_config(r);
  // One split writes O directly: no workspace. Five: fp32 O and LSE parts of every row.
  kv.num_splits = 1;
  REQUIRE(flashattn_plan_set_kvcache(plan, &kv) == FLASHATTN_STATUS_SUCCESS);
  size_t bytes = 1;
  REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD_KVCACHE, &bytes) == FLASHATTN_STATUS_SUCCESS);
  CHECK(bytes == 0);
  kv.num_splits = 5;
  REQUIRE(flashattn_plan_set_kvcache(plan, &kv) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD_KVCACHE, &bytes) == FLASHATTN_STATUS_SUCCESS);
  CHECK(bytes >= static_cast<size_t>(5 * c.batch * c.hq * c.sq * (c.dv + 1)) * sizeof(float));
  // Host-side checks still run: a missing pointer is reported as such.
  flashattn_kvcache_args_t a = FLASHATTN_KVCACHE_ARGS_INIT;
  CHECK(flashattn_fwd_kvcache(plan, &a, nullptr, 0, nullptr) == FLASHATTN_STATUS_NULL_POINTER);
  // Valid-looking pointers, one buffer each so that no output overlaps another argument:
  // host memory, refused before any launch.
  std::vector<std::vector<uint8_t>> bufs(9, std::vector<uint8_t>(size_t{1} << 16));
  a.q = bufs[0].data();
  a.k_cache = bufs[1].data();
  a.v_cache = bufs[2].data();
  a.o = bufs[3].data();
  a.k_new = bufs[4].data();
  a.v_new = bufs[5].data();
  a.rotary_cos = bufs[6].data();
  a.rotary_sin = bufs[7].data();
  std::vector<int32_t> seqlens(static_cast<size_t>(c.batch)), table(static_cast<size_t>(c.batch * r.max_pages));
  a.cache_seqlens = seqlens.data();
  a.block_table = table.data();
  std::vector<uint8_t> ws(bytes);
  const flashattn_status_t st = flashattn_fwd_kvcache(plan, &a, ws.data(), bytes, nullptr);
  INFO(flashattn_last_error());
  CHECK(st == FLASHATTN_STATUS_WRONG_MEMORY_SPACE);
  CHECK(mentions(flashattn_last_error(), "args.q"));
  flashattn_plan_destroy(plan);
  std::vector<float> part(8, 0.f), o(4, 0.f);
  flashattn_combine_args_t ca = FLASHATTN_COMBINE_ARGS_INIT;
  ca.num_splits = 2;
  ca.batch = ca.seqlen_q = ca.heads = 1;
  ca.head_dim = 4;
  ca.o_partial = part.data();
  ca.lse_partial = part.data();
  ca.dtype = FLASHATTN_DTYPE_FP32;
  ca.o = o.data();
  CHECK(flashattn_combine(FLASHATTN_BACKEND_CUDA, 0, &ca, nullptr) == FLASHATTN_STATUS_WRONG_MEMORY_SPACE);
  CHECK(mentions(flashattn_last_error(), "args.o_partial"));
}
