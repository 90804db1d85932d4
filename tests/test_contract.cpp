// The documented return lists of include/flashattn.h are the contract: every status a
// function returns must be in its @return list, and every status in that list must be
// one it returns. The lists are read from the header itself (header_contract.hpp), so a
// status added to the code without the documentation, or to the documentation without a
// path that returns it, fails here; the one exception list below says why each
// documented status that this program cannot provoke on this machine is left out.
//
// Every function that returns a status is driven with every class of bad input the CPU
// backend (and a CUDA backend without a device) can be given, with good inputs, with
// allocations made to fail (failing_new.hpp), and with inputs that other checks may
// refuse in future (a workspace size that overflows, a misaligned workspace, an output
// overlapping an input): whatever they return must then be documented too.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "failing_new.hpp"
#include "flashattn.h"
#include "harness.hpp"
#include "header_contract.hpp"

namespace {

const fat::HeaderContract& header() {
  static const fat::HeaderContract c = fat::parse_header_contract(fat::read_text_file(FA_HEADER_PATH));
  return c;
}

std::string status_list(const std::set<int>& s) {
  std::string out;
  for (int v : s)
    out += (out.empty() ? "" : ", ") + std::string(flashattn_status_string(static_cast<flashattn_status_t>(v)));
  return out;
}

// Statuses a function returned in this process, by function.
std::map<std::string, std::set<int>>& observed() {
  static std::map<std::string, std::set<int>> o;
  return o;
}

// One call's status must be in the function's documented list.
flashattn_status_t record(const std::string& fn, const std::string& what, flashattn_status_t st) {
  const std::string msg = flashattn_last_error();
  const auto doc = header().documented.find(fn);
  INFO(fn << " (" << what << ") returned " << flashattn_status_string(st) << " \"" << msg << "\"");
  REQUIRE(doc != header().documented.end());
  INFO("documented: " << status_list(doc->second));
  CHECK(doc->second.count(st) == 1);
  observed()[fn].insert(st);
  return st;
}

#define CALL(fn, what, ...) record(#fn, what, fn(__VA_ARGS__))

template <class E>
E bad_enum(int v) {
  E e;
  static_assert(sizeof e == sizeof v, "enums of the C ABI are int-sized");
  memcpy(&e, &v, sizeof v);
  return e;
}

// A small problem with every tensor in host memory: 2 sequences, 9 queries, 11 keys, 4
// query heads on 2 KV heads, head dims 16 and 8, fp32.
struct Fixture {
  static constexpr int64_t B = 2, SQ = 9, SK = 11, HQ = 4, HKV = 2, DQK = 16, DV = 8;
  std::vector<float> q = buffer(B * SQ * HQ * DQK), k = buffer(B * SK * HKV * DQK), v = buffer(B * SK * HKV * DV),
                     o = buffer(B * SQ * HQ * DV), lse = buffer(B * HQ * SQ), dout = buffer(B * SQ * HQ * DV),
                     dq = buffer(B * SQ * HQ * DQK), dk = buffer(B * SK * HKV * DQK), dv = buffer(B * SK * HKV * DV),
                     bias = buffer(B * HQ * SQ * SK), slopes = buffer(HQ);
  std::vector<int32_t> cu_q = {0, 4, 9}, cu_k = {0, 5, 11}, seqlens = {5, 10};
  std::vector<double> workspace = std::vector<double>(1 << 16);  // 512 KiB, 8-byte aligned
  flashattn_plan_t plan = nullptr;

  static std::vector<float> buffer(int64_t n) { return std::vector<float>(static_cast<size_t>(n) + 8, 0.25f); }

  Fixture() {
    REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_shape(plan, B, SQ, SK, HQ, HKV, DQK, DV) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_dtype(plan, FLASHATTN_DTYPE_FP32) == FLASHATTN_STATUS_SUCCESS);
  }
  ~Fixture() { flashattn_plan_destroy(plan); }

  flashattn_fwd_args_t fwd() { return fat::fwd_args(q.data(), k.data(), v.data(), o.data(), lse.data()); }
  flashattn_bwd_args_t bwd() {
    return fat::bwd_args(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                         dv.data());
  }
  // A contiguous KV cache of one row per sequence: k and v hold [B, SK, HKV, D].
  flashattn_kvcache_config_t kv_config() const {
    flashattn_kvcache_config_t c = FLASHATTN_KVCACHE_CONFIG_INIT;
    c.num_rows = B;
    return c;
  }
  flashattn_kvcache_args_t kv_args() {
    flashattn_kvcache_args_t a = FLASHATTN_KVCACHE_ARGS_INIT;
    a.q = q.data(), a.k_cache = k.data(), a.v_cache = v.data(), a.o = o.data(), a.lse = lse.data();
    a.cache_seqlens = seqlens.data();
    return a;
  }
  void* ws() { return workspace.data(); }
  size_t ws_bytes() const { return workspace.size() * sizeof(double); }
};

// The status of call() made while every allocation fails (recorded afterwards: Catch2's
// own bookkeeping allocates).
template <class F>
flashattn_status_t with_failing_allocations(F&& call) {
  fat::AllocationsFail oom;
  return call();
}

// ---- drivers, one per function ------------------------------------------------------------

void drive_plan_create() {
  flashattn_plan_t p = nullptr;
  CALL(flashattn_plan_create, "plan NULL", nullptr, FLASHATTN_BACKEND_CPU, 0);
  for (int b : {-1, 3, 1000})
    CALL(flashattn_plan_create, "backend " + std::to_string(b), &p, bad_enum<flashattn_backend_t>(b), 0);
  CALL(flashattn_plan_create, "device -1", &p, FLASHATTN_BACKEND_CPU, -1);
  for (int d : {0, 1, 999}) {
    p = nullptr;
    CALL(flashattn_plan_create, "CUDA device " + std::to_string(d), &p, FLASHATTN_BACKEND_CUDA, d);
    flashattn_plan_destroy(p);
  }
  for (flashattn_backend_t b : {FLASHATTN_BACKEND_AUTO, FLASHATTN_BACKEND_CPU}) {
    p = nullptr;
    CALL(flashattn_plan_create, "good", &p, b, 0);
    flashattn_plan_destroy(p);
  }
  record("flashattn_plan_create", "allocations fail",
         with_failing_allocations([&] { return flashattn_plan_create(&p, FLASHATTN_BACKEND_CPU, 0); }));
  for (const char* isa : {"sse9", "AVX2", "", "avx512", "amx"}) {  // NOT_SUPPORTED where the CPU lacks it
    REQUIRE(setenv("FLASHATTN_CPU_ISA", isa, 1) == 0);
    p = nullptr;
    CALL(flashattn_plan_create, std::string("FLASHATTN_CPU_ISA=") + isa, &p, FLASHATTN_BACKEND_CPU, 0);
    flashattn_plan_destroy(p);
  }
  REQUIRE(unsetenv("FLASHATTN_CPU_ISA") == 0);
}

// Whether this CPU has every instruction set of FLASHATTN_CPU_ISA (then forcing one
// cannot fail).
bool cpu_has_every_isa() { return fat::cpu_isa_usable("amx"); }

void drive_plan_get_backend() {
  Fixture f;
  flashattn_backend_t b;
  CALL(flashattn_plan_get_backend, "plan NULL", nullptr, &b);
  CALL(flashattn_plan_get_backend, "out NULL", f.plan, nullptr);
  CALL(flashattn_plan_get_backend, "good", f.plan, &b);
}

void drive_plan_set_shape() {
  Fixture f;
  const int64_t big = INT64_C(1) << 40;
  CALL(flashattn_plan_set_shape, "plan NULL", nullptr, 1, 1, 1, 1, 1, 8, 8);
  for (int i = 0; i < 7; ++i)
    for (int64_t bad :
         {INT64_C(0), INT64_C(-1), std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), big}) {
      int64_t d[7] = {2, 9, 11, 4, 2, 16, 8};
      d[i] = bad;
      CALL(flashattn_plan_set_shape, "dim " + std::to_string(i) + " = " + std::to_string(bad), f.plan, d[0], d[1], d[2],
           d[3], d[4], d[5], d[6]);
    }
  CALL(flashattn_plan_set_shape, "heads_q % heads_kv", f.plan, 2, 9, 11, 4, 3, 16, 8);
  CALL(flashattn_plan_set_shape, "elements beyond 64-bit offsets", f.plan, INT64_C(1) << 31, INT64_C(1) << 31,
       INT64_C(1) << 31, 1 << 24, 1, 256, 256);
  CALL(flashattn_plan_set_shape, "issue 14's F1 shape", f.plan, 1, 1235713963, 1244000330, 1, 1, 1, 1);
  // A block-sparse layout that no longer fits the new shape.
  const std::vector<uint8_t> layout(static_cast<size_t>(Fixture::HQ * 3 * 3), 1);
  REQUIRE(flashattn_plan_set_shape(f.plan, 2, 9, 11, 4, 2, 16, 8) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_block_sparse(f.plan, layout.data(), 1, 3, 3, 4, 4) == FLASHATTN_STATUS_SUCCESS);
  CALL(flashattn_plan_set_shape, "layout does not fit", f.plan, 2, 100, 11, 4, 2, 16, 8);
  CALL(flashattn_plan_set_shape, "layout fits", f.plan, 3, 12, 12, 4, 2, 8, 8);
  REQUIRE(flashattn_plan_set_block_sparse(f.plan, nullptr, 0, 0, 0, 0, 0) == FLASHATTN_STATUS_SUCCESS);
  // Bias strides that overflow 64-bit offsets once the batch grows.
  const int64_t bias_strides[4] = {INT64_C(1) << 40, 0, 0, 1};
  REQUIRE(flashattn_plan_set_bias(f.plan, FLASHATTN_BIAS_TENSOR, bias_strides) == FLASHATTN_STATUS_SUCCESS);
  CALL(flashattn_plan_set_shape, "bias strides overflow", f.plan, INT64_C(1) << 23, 9, 11, 4, 2, 16, 8);
  record("flashattn_plan_set_shape", "allocations fail",
         with_failing_allocations([&] { return flashattn_plan_set_shape(f.plan, 2, 9, 11, 4, 2, 16, 8); }));
}

void drive_plan_set_dtype() {
  Fixture f;
  CALL(flashattn_plan_set_dtype, "plan NULL", nullptr, FLASHATTN_DTYPE_FP16);
  for (int d : {-1, 3, 77})
    CALL(flashattn_plan_set_dtype, "dtype " + std::to_string(d), f.plan, bad_enum<flashattn_dtype_t>(d));
  for (auto d : {FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP32})
    CALL(flashattn_plan_set_dtype, "good", f.plan, d);
}

void drive_plan_set_strides() {
  Fixture f;
  flashattn_plan_t no_shape = nullptr;
  REQUIRE(flashattn_plan_create(&no_shape, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  const int64_t good[4] = {9 * 4 * 16, 4 * 16, 16, 1};
  CALL(flashattn_plan_set_strides, "plan NULL", nullptr, FLASHATTN_TENSOR_Q, good);
  CALL(flashattn_plan_set_strides, "no shape", no_shape, FLASHATTN_TENSOR_Q, good);
  flashattn_plan_destroy(no_shape);
  for (int t : {-1, 8, 100})
    CALL(flashattn_plan_set_strides, "tensor " + std::to_string(t), f.plan, bad_enum<flashattn_tensor_t>(t), good);
  CALL(flashattn_plan_set_strides, "strides NULL", f.plan, FLASHATTN_TENSOR_Q, nullptr);
  const int64_t bad[][4] = {
      {576, 64, 16, 2}, {-1, 64, 16, 1}, {576, -64, 16, 1}, {576, 64, -16, 1}, {INT64_C(1) << 62, 64, 16, 1},
      {0, 0, 0, 1},     {8, 8, 8, 1}};
  for (int t = 0; t < 8; ++t)
    for (const auto& s : bad)
      CALL(flashattn_plan_set_strides, "bad strides of tensor " + std::to_string(t), f.plan,
           static_cast<flashattn_tensor_t>(t), s);
  CALL(flashattn_plan_set_strides, "good", f.plan, FLASHATTN_TENSOR_Q, good);
  // Varlen extents beyond 2^63-1 bytes: total_q x heads_q x head_dim at their maxima (set_shape
  // bounds batch x seqlen_q x ..., not the varlen totals).
  REQUIRE(flashattn_plan_set_shape(f.plan, 1, 1, 1, 16777216, 1, 256, 256) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_varlen(f.plan, 1, 2147483647, 1) == FLASHATTN_STATUS_SUCCESS);
  const int64_t huge[4] = {0, INT64_C(256) * 16777216, 256, 1};
  CALL(flashattn_plan_set_strides, "varlen extent over 2^63-1 bytes", f.plan, FLASHATTN_TENSOR_Q, huge);
}

void drive_scalar_setters() {
  Fixture f;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  CALL(flashattn_plan_set_softmax_scale, "plan NULL", nullptr, 1.f);
  for (float s : {nan, inf, -inf, -1.f, 0.f, 0.5f})
    CALL(flashattn_plan_set_softmax_scale, std::to_string(s), f.plan, s);
  CALL(flashattn_plan_set_softcap, "plan NULL", nullptr, 1.f);
  for (float s : {nan, inf, -1.f, 0.f, 5.f}) CALL(flashattn_plan_set_softcap, std::to_string(s), f.plan, s);
  CALL(flashattn_plan_set_dropout, "plan NULL", nullptr, 0.1f, 1, 2);
  for (float p : {nan, -0.1f, 1.f, 2.f, 0.f, 0.2f})
    CALL(flashattn_plan_set_dropout, std::to_string(p), f.plan, p, 1, 2);
  REQUIRE(flashattn_plan_set_dropout(f.plan, 0.f, 0, 0) == FLASHATTN_STATUS_SUCCESS);
  CALL(flashattn_plan_set_algorithm, "plan NULL", nullptr, FLASHATTN_ALGORITHM_FLASH);
  for (int a : {-1, 2})
    CALL(flashattn_plan_set_algorithm, "algorithm " + std::to_string(a), f.plan, bad_enum<flashattn_algorithm_t>(a));
  for (auto a : {FLASHATTN_ALGORITHM_STANDARD, FLASHATTN_ALGORITHM_FLASH})
    CALL(flashattn_plan_set_algorithm, "good", f.plan, a);
  CALL(flashattn_plan_set_deterministic, "plan NULL", nullptr, 1);
  for (int e : {0, 1, -5}) CALL(flashattn_plan_set_deterministic, "good", f.plan, e);
  CALL(flashattn_plan_set_grad_accumulate, "plan NULL", nullptr, 1);
  for (int e : {1, -5, 0}) CALL(flashattn_plan_set_grad_accumulate, "good", f.plan, e);
  CALL(flashattn_plan_set_band_mask, "plan NULL", nullptr, FLASHATTN_ALIGN_TOP_LEFT, -1, 0);
  for (int a : {-1, 2})
    CALL(flashattn_plan_set_band_mask, "align " + std::to_string(a), f.plan, bad_enum<flashattn_mask_align_t>(a), -1,
         0);
  for (auto a : {FLASHATTN_ALIGN_TOP_LEFT, FLASHATTN_ALIGN_BOTTOM_RIGHT})
    CALL(flashattn_plan_set_band_mask, "good", f.plan, a, 3, -7);
  REQUIRE(flashattn_plan_set_band_mask(f.plan, FLASHATTN_ALIGN_TOP_LEFT, -1, -1) == FLASHATTN_STATUS_SUCCESS);
  CALL(flashattn_plan_set_varlen, "plan NULL", nullptr, 1, 9, 11);
  const int64_t totals[][2] = {{-1, 5}, {5, -1}, {INT64_C(1) << 31, 5}, {5, INT64_C(1) << 31}, {9, 11}, {0, 0}};
  for (const auto& t : totals) CALL(flashattn_plan_set_varlen, "totals", f.plan, 1, t[0], t[1]);
  CALL(flashattn_plan_set_varlen, "off", f.plan, 0, -1, -1);
}

void drive_plan_set_bias() {
  Fixture f;
  const int64_t good[4] = {4 * 9 * 11, 9 * 11, 11, 1};
  CALL(flashattn_plan_set_bias, "plan NULL", nullptr, FLASHATTN_BIAS_TENSOR, good);
  for (int k : {-1, 4})
    CALL(flashattn_plan_set_bias, "kind " + std::to_string(k), f.plan, bad_enum<flashattn_bias_t>(k), nullptr);
  CALL(flashattn_plan_set_bias, "TENSOR without strides", f.plan, FLASHATTN_BIAS_TENSOR, nullptr);
  const int64_t bad[][4] = {
      {-1, 99, 11, 1}, {396, 99, 11, 2}, {396, 99, 0, 0}, {0, 0, 1, 1}, {INT64_C(1) << 61, 0, 0, 1}};
  for (const auto& s : bad) CALL(flashattn_plan_set_bias, "bad strides", f.plan, FLASHATTN_BIAS_TENSOR, s);
  for (auto k : {FLASHATTN_BIAS_NONE, FLASHATTN_BIAS_ALIBI, FLASHATTN_BIAS_ALIBI_SYMMETRIC})
    CALL(flashattn_plan_set_bias, "strides for a kind without", f.plan, k, good);
  for (auto k : {FLASHATTN_BIAS_ALIBI, FLASHATTN_BIAS_ALIBI_SYMMETRIC, FLASHATTN_BIAS_NONE})
    CALL(flashattn_plan_set_bias, "good", f.plan, k, nullptr);
  const int64_t broadcast[4] = {0, 0, 0, 0};
  CALL(flashattn_plan_set_bias, "good", f.plan, FLASHATTN_BIAS_TENSOR, good);
  CALL(flashattn_plan_set_bias, "good", f.plan, FLASHATTN_BIAS_TENSOR, broadcast);
}

void drive_plan_set_alibi_batch_stride() {
  Fixture f;
  CALL(flashattn_plan_set_alibi_batch_stride, "plan NULL", nullptr, 4);
  const int64_t strides[4] = {4 * 9 * 11, 9 * 11, 11, 1};
  REQUIRE(flashattn_plan_set_bias(f.plan, FLASHATTN_BIAS_TENSOR, strides) == FLASHATTN_STATUS_SUCCESS);
  CALL(flashattn_plan_set_alibi_batch_stride, "bias TENSOR", f.plan, 4);
  REQUIRE(flashattn_plan_set_bias(f.plan, FLASHATTN_BIAS_NONE, nullptr) == FLASHATTN_STATUS_SUCCESS);
  CALL(flashattn_plan_set_alibi_batch_stride, "bias NONE", f.plan, 0);
  for (auto k : {FLASHATTN_BIAS_ALIBI, FLASHATTN_BIAS_ALIBI_SYMMETRIC}) {
    REQUIRE(flashattn_plan_set_bias(f.plan, k, nullptr) == FLASHATTN_STATUS_SUCCESS);
    for (int64_t s : {INT64_C(-1), std::numeric_limits<int64_t>::min(), INT64_C(1) << 62})
      CALL(flashattn_plan_set_alibi_batch_stride, "bad stride " + std::to_string(s), f.plan, s);
    for (int64_t s : {INT64_C(0), INT64_C(1), INT64_C(4), INT64_C(1) << 60})
      CALL(flashattn_plan_set_alibi_batch_stride, "good " + std::to_string(s), f.plan, s);
  }
}

void drive_plan_set_block_sparse() {
  Fixture f;
  flashattn_plan_t no_shape = nullptr;
  REQUIRE(flashattn_plan_create(&no_shape, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  const std::vector<uint8_t> layout(static_cast<size_t>(Fixture::HQ * 3 * 3), 1);
  CALL(flashattn_plan_set_block_sparse, "plan NULL", nullptr, layout.data(), 1, 3, 3, 4, 4);
  CALL(flashattn_plan_set_block_sparse, "no shape", no_shape, layout.data(), 1, 3, 3, 4, 4);
  CALL(flashattn_plan_set_block_sparse, "clear without shape", no_shape, nullptr, 0, 0, 0, 0, 0);
  flashattn_plan_destroy(no_shape);
  const int64_t bad[][5] = {{1, 3, 3, 0, 4},
                            {1, 3, 3, 4, 0},
                            {1, 3, 3, -4, 4},
                            {2, 3, 3, 4, 4},
                            {0, 3, 3, 4, 4},
                            {1, 2, 3, 4, 4},
                            {1, 3, 4, 4, 4},
                            {1, -1, 3, 4, 4},
                            {1, 1, 1, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max()}};
  for (const auto& b : bad)
    CALL(flashattn_plan_set_block_sparse, "bad dims", f.plan, layout.data(), b[0], b[1], b[2], b[3], b[4]);
  CALL(flashattn_plan_set_block_sparse, "good", f.plan, layout.data(), 1, 3, 3, 4, 4);
  CALL(flashattn_plan_set_block_sparse, "good, per head", f.plan, layout.data(), 4, 3, 3, 4, 4);
  record("flashattn_plan_set_block_sparse", "allocations fail", with_failing_allocations([&] {
           return flashattn_plan_set_block_sparse(f.plan, layout.data(), 1, 3, 3, 4, 4);
         }));
  CALL(flashattn_plan_set_block_sparse, "clear", f.plan, nullptr, 0, 0, 0, 0, 0);
}

void drive_plan_get_workspace_size() {
  Fixture f;
  flashattn_plan_t no_shape = nullptr;
  REQUIRE(flashattn_plan_create(&no_shape, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  size_t bytes = 0;
  CALL(flashattn_plan_get_workspace_size, "plan NULL", nullptr, FLASHATTN_PASS_FORWARD, &bytes);
  CALL(flashattn_plan_get_workspace_size, "no shape", no_shape, FLASHATTN_PASS_FORWARD, &bytes);
  flashattn_plan_destroy(no_shape);
  for (int p : {-1, 3})
    CALL(flashattn_plan_get_workspace_size, "pass " + std::to_string(p), f.plan, bad_enum<flashattn_pass_t>(p), &bytes);
  CALL(flashattn_plan_get_workspace_size, "bytes NULL", f.plan, FLASHATTN_PASS_FORWARD, nullptr);
  for (auto alg : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
    REQUIRE(flashattn_plan_set_algorithm(f.plan, alg) == FLASHATTN_STATUS_SUCCESS);
    for (auto pass : {FLASHATTN_PASS_FORWARD, FLASHATTN_PASS_BACKWARD}) {
      CALL(flashattn_plan_get_workspace_size, "good", f.plan, pass, &bytes);
      // Issue 14's F1 shape: sizes that overflow when computed unchecked.
      REQUIRE(flashattn_plan_set_shape(f.plan, 1, 1235713963, 1244000330, 1, 1, 1, 1) == FLASHATTN_STATUS_SUCCESS);
      REQUIRE(flashattn_plan_set_softcap(f.plan, 5.f) == FLASHATTN_STATUS_SUCCESS);
      CALL(flashattn_plan_get_workspace_size, "huge shape", f.plan, pass, &bytes);
      REQUIRE(flashattn_plan_set_shape(f.plan, Fixture::B, Fixture::SQ, Fixture::SK, Fixture::HQ, Fixture::HKV,
                                       Fixture::DQK, Fixture::DV) == FLASHATTN_STATUS_SUCCESS);
    }
  }
  // FORWARD_KVCACHE: without a configuration, with one, and with one the shape no longer
  // fits (set_shape after set_kvcache; the configuration is checked again).
  REQUIRE(flashattn_plan_set_algorithm(f.plan, FLASHATTN_ALGORITHM_FLASH) == FLASHATTN_STATUS_SUCCESS);
  CALL(flashattn_plan_get_workspace_size, "FORWARD_KVCACHE without configuration", f.plan,
       FLASHATTN_PASS_FORWARD_KVCACHE, &bytes);
  flashattn_kvcache_config_t c = f.kv_config();
  REQUIRE(flashattn_plan_set_kvcache(f.plan, &c) == FLASHATTN_STATUS_SUCCESS);
  CALL(flashattn_plan_get_workspace_size, "FORWARD_KVCACHE", f.plan, FLASHATTN_PASS_FORWARD_KVCACHE, &bytes);
  c.seqlen_new = 1, c.rotary = FLASHATTN_ROTARY_HALF, c.rotary_dim = Fixture::DQK, c.rotary_rows = Fixture::SK;
  REQUIRE(flashattn_plan_set_kvcache(f.plan, &c) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_shape(f.plan, Fixture::B, Fixture::SQ, Fixture::SK, Fixture::HQ, Fixture::HKV, 8,
                                   Fixture::DV) == FLASHATTN_STATUS_SUCCESS);
  CALL(flashattn_plan_get_workspace_size, "rotary_dim beyond a smaller head_dim_qk", f.plan,
       FLASHATTN_PASS_FORWARD_KVCACHE, &bytes);
  const int64_t k_strides[4] = {8 * Fixture::HKV * Fixture::SK, 8 * Fixture::HKV, 8, 1};  // packed for head_dim_qk 8
  c = f.kv_config();
  c.seqlen_new = 1, c.k_cache_strides = k_strides;
  REQUIRE(flashattn_plan_set_kvcache(f.plan, &c) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_shape(f.plan, Fixture::B, Fixture::SQ, Fixture::SK, Fixture::HQ, Fixture::HKV,
                                   Fixture::DQK, Fixture::DV) == FLASHATTN_STATUS_SUCCESS);
  CALL(flashattn_plan_get_workspace_size, "written cache strides aliasing a larger head_dim_qk", f.plan,
       FLASHATTN_PASS_FORWARD_KVCACHE, &bytes);
}

void drive_plan_set_kvcache() {
  Fixture f;
  flashattn_plan_t no_shape = nullptr;
  REQUIRE(flashattn_plan_create(&no_shape, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  const flashattn_kvcache_config_t good = f.kv_config();
  CALL(flashattn_plan_set_kvcache, "plan NULL", nullptr, &good);
  CALL(flashattn_plan_set_kvcache, "no shape", no_shape, &good);
  flashattn_plan_destroy(no_shape);
  auto with = [&](const std::string& what, const std::function<void(flashattn_kvcache_config_t&)>& edit) {
    flashattn_kvcache_config_t c = good;
    edit(c);
    CALL(flashattn_plan_set_kvcache, what, f.plan, &c);
  };
  const int64_t bad_strides[4] = {Fixture::SK * Fixture::HKV * Fixture::DQK, Fixture::HKV * Fixture::DQK, Fixture::DQK,
                                  2};
  with("struct_size 0", [](flashattn_kvcache_config_t& c) { c.struct_size = 0; });
  with("page_size -1", [](flashattn_kvcache_config_t& c) { c.page_size = -1; });
  with("k cache dim stride 2", [&](flashattn_kvcache_config_t& c) { c.k_cache_strides = bad_strides; });
  with("rotary 7", [](flashattn_kvcache_config_t& c) { c.rotary = bad_enum<flashattn_rotary_t>(7); });
  with("num_splits -1", [](flashattn_kvcache_config_t& c) { c.num_splits = -1; });
  with("rotary without appended keys",
       [](flashattn_kvcache_config_t& c) { c.rotary = FLASHATTN_ROTARY_HALF, c.rotary_dim = 2, c.rotary_rows = 1; });
  with("good", [](flashattn_kvcache_config_t&) {});
  CALL(flashattn_plan_set_kvcache, "leave KV-cache mode", f.plan, nullptr);
}

void drive_fwd_kvcache() {
  Fixture f;
  const flashattn_kvcache_args_t good = f.kv_args();
  CALL(flashattn_fwd_kvcache, "no configuration", f.plan, &good, f.ws(), f.ws_bytes(), nullptr);
  const flashattn_kvcache_config_t c = f.kv_config();
  REQUIRE(flashattn_plan_set_kvcache(f.plan, &c) == FLASHATTN_STATUS_SUCCESS);
  auto call = [&](const std::string& what, flashattn_plan_t plan, const flashattn_kvcache_args_t* a, void* ws,
                  size_t bytes,
                  struct CUstream_st* stream) { return CALL(flashattn_fwd_kvcache, what, plan, a, ws, bytes, stream); };
  auto with = [&](const std::string& what, const std::function<void(flashattn_kvcache_args_t&)>& edit) {
    flashattn_kvcache_args_t a = good;
    edit(a);
    return call(what, f.plan, &a, f.ws(), f.ws_bytes(), nullptr);
  };
  std::vector<int32_t> negative = {-1, 3}, bad_row = {0, 5};
  call("plan NULL", nullptr, &good, f.ws(), f.ws_bytes(), nullptr);
  call("args NULL", f.plan, nullptr, f.ws(), f.ws_bytes(), nullptr);
  with("struct_size 0", [](flashattn_kvcache_args_t& a) { a.struct_size = 0; });
  with("q NULL", [](flashattn_kvcache_args_t& a) { a.q = nullptr; });
  with("q misaligned", [](flashattn_kvcache_args_t& a) { a.q = static_cast<const char*>(a.q) + 1; });
  with("k_new without appended keys", [&](flashattn_kvcache_args_t& a) { a.k_new = f.q.data(); });
  with("cache_seqlens negative", [&](flashattn_kvcache_args_t& a) { a.cache_seqlens = negative.data(); });
  with("cache_batch_idx out of range", [&](flashattn_kvcache_args_t& a) { a.cache_batch_idx = bad_row.data(); });
  with("o overlaps q", [&](flashattn_kvcache_args_t& a) { a.o = const_cast<void*>(a.q); });
  call("stream on CPU", f.plan, &good, f.ws(), f.ws_bytes(), reinterpret_cast<struct CUstream_st*>(&f));
  call("workspace NULL", f.plan, &good, nullptr, f.ws_bytes(), nullptr);
  call("workspace 1 byte", f.plan, &good, f.ws(), 1, nullptr);
  call("workspace misaligned", f.plan, &good, static_cast<char*>(f.ws()) + 1, f.ws_bytes() - 1, nullptr);
  call("good", f.plan, &good, f.ws(), f.ws_bytes(), nullptr);
  record("flashattn_fwd_kvcache", "allocations fail",
         with_failing_allocations([&] { return flashattn_fwd_kvcache(f.plan, &good, f.ws(), f.ws_bytes(), nullptr); }));
  // Appending: the list of written rows is sorted in the workspace.
  flashattn_kvcache_config_t append = c;
  append.seqlen_new = 1;
  REQUIRE(flashattn_plan_set_kvcache(f.plan, &append) == FLASHATTN_STATUS_SUCCESS);
  flashattn_kvcache_args_t a = good;
  a.k_new = f.dq.data(), a.v_new = f.dout.data();
  call("appending", f.plan, &a, f.ws(), f.ws_bytes(), nullptr);
  record("flashattn_fwd_kvcache", "allocations fail while appending",
         with_failing_allocations([&] { return flashattn_fwd_kvcache(f.plan, &a, f.ws(), f.ws_bytes(), nullptr); }));
  // A configuration the shape no longer fits: seqlen_new beyond a smaller seqlen_k.
  append.seqlen_new = Fixture::SK;
  REQUIRE(flashattn_plan_set_kvcache(f.plan, &append) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_shape(f.plan, Fixture::B, Fixture::SQ, 4, Fixture::HQ, Fixture::HKV, Fixture::DQK,
                                   Fixture::DV) == FLASHATTN_STATUS_SUCCESS);
  call("seqlen_new beyond a smaller seqlen_k", f.plan, &a, f.ws(), f.ws_bytes(), nullptr);
  // O strides valid only in varlen mode (batch stride 0), then varlen off.
  Fixture g;
  REQUIRE(flashattn_plan_set_varlen(g.plan, 1, 9, 11) == FLASHATTN_STATUS_SUCCESS);
  const int64_t packed_o[4] = {0, 4 * 8, 8, 1};
  REQUIRE(flashattn_plan_set_strides(g.plan, FLASHATTN_TENSOR_O, packed_o) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_varlen(g.plan, 0, 0, 0) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_kvcache(g.plan, &c) == FLASHATTN_STATUS_SUCCESS);
  const flashattn_kvcache_args_t ga = g.kv_args();
  call("strides of varlen mode with varlen off", g.plan, &ga, g.ws(), g.ws_bytes(), nullptr);
}

void drive_combine() {
  Fixture f;
  // Two parts of [B, SQ, HQ, DV] (o_partial) and [B, HQ, SQ] (lse_partial), merged into f.o.
  flashattn_combine_args_t good = FLASHATTN_COMBINE_ARGS_INIT;
  good.num_splits = 2, good.batch = Fixture::B, good.seqlen_q = Fixture::SQ, good.heads = Fixture::HQ;
  good.head_dim = Fixture::DV, good.dtype = FLASHATTN_DTYPE_FP32;
  good.o_partial = f.dq.data();  // 2 x B*SQ*HQ*DV fits in B*SQ*HQ*DQK
  good.lse_partial = f.bias.data();
  good.o = f.o.data(), good.lse = f.lse.data();
  const flashattn_backend_t cpu = FLASHATTN_BACKEND_CPU;
  auto with = [&](const std::string& what, const std::function<void(flashattn_combine_args_t&)>& edit) {
    flashattn_combine_args_t a = good;
    edit(a);
    return CALL(flashattn_combine, what, cpu, 0, &a, nullptr);
  };
  const int64_t bad_o_strides[4] = {Fixture::SQ * Fixture::HQ * Fixture::DV, Fixture::HQ * Fixture::DV, Fixture::DV, 2};
  CALL(flashattn_combine, "backend 7", bad_enum<flashattn_backend_t>(7), 0, &good, nullptr);
  CALL(flashattn_combine, "device -1", cpu, -1, &good, nullptr);
  CALL(flashattn_combine, "args NULL", cpu, 0, nullptr, nullptr);
  CALL(flashattn_combine, "stream on CPU", cpu, 0, &good, reinterpret_cast<struct CUstream_st*>(&f));
  with("struct_size 0", [](flashattn_combine_args_t& a) { a.struct_size = 0; });
  with("num_splits 0", [](flashattn_combine_args_t& a) { a.num_splits = 0; });
  with("o_strides dim stride 2", [&](flashattn_combine_args_t& a) { a.o_strides = bad_o_strides; });
  with("o misaligned", [](flashattn_combine_args_t& a) { a.o = static_cast<char*>(a.o) + 1; });
  with("o overlaps o_partial", [](flashattn_combine_args_t& a) { a.o = const_cast<float*>(a.o_partial); });
  with("good", [](flashattn_combine_args_t&) {});
  // The CUDA backend: absent from this build, or host pointers / a missing device.
  for (int d : {0, 999})
    CALL(flashattn_combine, "CUDA device " + std::to_string(d), FLASHATTN_BACKEND_CUDA, d, &good, nullptr);
}

// The bad inputs shared by both passes; run(args-editor, workspace, bytes, stream) calls one pass.
template <class Args>
void drive_run(
    const std::string& fn, Fixture& f, Args good,
    const std::function<flashattn_status_t(flashattn_plan_t, const Args*, void*, size_t, struct CUstream_st*)>& run) {
  auto call = [&](const std::string& what, flashattn_plan_t plan, const Args* a, void* ws, size_t bytes,
                  struct CUstream_st* stream) { return record(fn, what, run(plan, a, ws, bytes, stream)); };
  auto with = [&](const std::string& what, const std::function<void(Args&)>& edit) {
    Args a = good;
    edit(a);
    return call(what, f.plan, &a, f.ws(), f.ws_bytes(), nullptr);
  };
  call("plan NULL", nullptr, &good, f.ws(), f.ws_bytes(), nullptr);
  call("args NULL", f.plan, nullptr, f.ws(), f.ws_bytes(), nullptr);
  with("struct_size 0", [](Args& a) { a.struct_size = 0; });
  with("struct_size - 1", [](Args& a) { a.struct_size = sizeof(Args) - 1; });
  with("q NULL", [](Args& a) { a.q = nullptr; });
  with("o NULL", [](Args& a) { a.o = nullptr; });
  with("q misaligned", [](Args& a) { a.q = static_cast<const char*>(a.q) + 1; });
  with("lse misaligned", [](Args& a) { a.lse = reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(a.lse) + 2); });
  with("bias without bias kind", [&](Args& a) { a.bias = f.bias.data(); });
  with("slopes without ALiBi", [&](Args& a) { a.alibi_slopes = f.slopes.data(); });
  with("cu_seqlens without varlen", [&](Args& a) { a.cu_seqlens_q = f.cu_q.data(); });
  // Inputs another check may refuse some day: an output overlapping an input.
  with("o overlaps q", [&](Args& a) { a.o = const_cast<void*>(a.q); });
  call("stream on CPU", f.plan, &good, f.ws(), f.ws_bytes(), reinterpret_cast<struct CUstream_st*>(&f));
  call("workspace NULL", f.plan, &good, nullptr, f.ws_bytes(), nullptr);
  call("workspace 1 byte", f.plan, &good, f.ws(), 1, nullptr);
  call("workspace misaligned", f.plan, &good, static_cast<char*>(f.ws()) + 1, f.ws_bytes() - 1, nullptr);
  call("good", f.plan, &good, f.ws(), f.ws_bytes(), nullptr);
  record(fn, "allocations fail",
         with_failing_allocations([&] { return run(f.plan, &good, f.ws(), f.ws_bytes(), nullptr); }));
  // Option/pointer mismatches.
  REQUIRE(flashattn_plan_set_bias(f.plan, FLASHATTN_BIAS_ALIBI, nullptr) == FLASHATTN_STATUS_SUCCESS);
  with("ALiBi without slopes", [](Args&) {});
  with("ALiBi", [&](Args& a) { a.alibi_slopes = f.slopes.data(); });
  const int64_t bias_strides[4] = {4 * 9 * 11, 9 * 11, 11, 1};
  REQUIRE(flashattn_plan_set_bias(f.plan, FLASHATTN_BIAS_TENSOR, bias_strides) == FLASHATTN_STATUS_SUCCESS);
  with("bias TENSOR without bias", [](Args&) {});
  with("bias TENSOR", [&](Args& a) { a.bias = f.bias.data(); });
  REQUIRE(flashattn_plan_set_bias(f.plan, FLASHATTN_BIAS_NONE, nullptr) == FLASHATTN_STATUS_SUCCESS);
  // Varlen: missing and bad offsets, and strides valid only with varlen on.
  REQUIRE(flashattn_plan_set_varlen(f.plan, 1, 9, 11) == FLASHATTN_STATUS_SUCCESS);
  with("varlen without cu_seqlens", [](Args&) {});
  std::vector<int32_t> bad_q = {0, 6, 3}, bad_k = {1, 5, 11}, long_q = {0, 0, 10};
  with("cu_seqlens_q decreasing", [&](Args& a) { a.cu_seqlens_q = bad_q.data(), a.cu_seqlens_k = f.cu_k.data(); });
  with("cu_seqlens_k not from 0", [&](Args& a) { a.cu_seqlens_q = f.cu_q.data(), a.cu_seqlens_k = bad_k.data(); });
  with("cu_seqlens_q beyond total", [&](Args& a) { a.cu_seqlens_q = long_q.data(), a.cu_seqlens_k = f.cu_k.data(); });
  with("varlen", [&](Args& a) { a.cu_seqlens_q = f.cu_q.data(), a.cu_seqlens_k = f.cu_k.data(); });
  // [token, head, dim] strides of the outputs o and dq: the batch stride is ignored in varlen mode.
  const int64_t packed_o[4] = {0, 4 * 8, 8, 1}, packed_dq[4] = {0, 4 * 16, 16, 1};
  REQUIRE(flashattn_plan_set_strides(f.plan, FLASHATTN_TENSOR_O, packed_o) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_strides(f.plan, FLASHATTN_TENSOR_DQ, packed_dq) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_varlen(f.plan, 0, 0, 0) == FLASHATTN_STATUS_SUCCESS);
  with("strides of varlen mode with varlen off", [](Args&) {});
  REQUIRE(flashattn_plan_set_shape(f.plan, Fixture::B, Fixture::SQ, Fixture::SK, Fixture::HQ, Fixture::HKV,
                                   Fixture::DQK, Fixture::DV) == FLASHATTN_STATUS_SUCCESS);
  // A plan without a shape.
  flashattn_plan_t no_shape = nullptr;
  REQUIRE(flashattn_plan_create(&no_shape, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  call("no shape", no_shape, &good, f.ws(), f.ws_bytes(), nullptr);
  flashattn_plan_destroy(no_shape);
  // A STANDARD plan whose workspace for this pass exceeds 2^63-1 bytes (the scores of
  // 2^31-1 x 2^30 keys): refused before any pointer is read, so none needs to be real.
  flashattn_plan_t huge = nullptr;
  REQUIRE(flashattn_plan_create(&huge, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_shape(huge, 1, 2147483647, INT64_C(1) << 30, 1, 1, 1, 1) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_algorithm(huge, FLASHATTN_ALGORITHM_STANDARD) == FLASHATTN_STATUS_SUCCESS);
  call("workspace size over 2^63-1 bytes", huge, &good, f.ws(), f.ws_bytes(), nullptr);
  flashattn_plan_destroy(huge);
}

void drive_fwd() {
  Fixture f;
  drive_run<flashattn_fwd_args_t>("flashattn_fwd", f, f.fwd(), flashattn_fwd);
  REQUIRE(flashattn_plan_set_algorithm(f.plan, FLASHATTN_ALGORITHM_STANDARD) == FLASHATTN_STATUS_SUCCESS);
  drive_run<flashattn_fwd_args_t>("flashattn_fwd", f, f.fwd(), flashattn_fwd);
}

void drive_bwd() {
  Fixture f;
  for (auto alg : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
    REQUIRE(flashattn_plan_set_algorithm(f.plan, alg) == FLASHATTN_STATUS_SUCCESS);
    drive_run<flashattn_bwd_args_t>("flashattn_bwd", f, f.bwd(), flashattn_bwd);
    flashattn_bwd_args_t a = f.bwd();
    a.lse = nullptr;
    record("flashattn_bwd", "lse NULL", flashattn_bwd(f.plan, &a, f.ws(), f.ws_bytes(), nullptr));
    a = f.bwd();
    a.dout = nullptr;
    record("flashattn_bwd", "dout NULL", flashattn_bwd(f.plan, &a, f.ws(), f.ws_bytes(), nullptr));
    a = f.bwd();
    for (void** p : {&a.dq, &a.dk, &a.dv}) {
      void* keep = *p;
      *p = nullptr;
      record("flashattn_bwd", "a gradient NULL", flashattn_bwd(f.plan, &a, f.ws(), f.ws_bytes(), nullptr));
      *p = keep;
    }
    a.dbias = f.bias.data();
    record("flashattn_bwd", "dbias without a bias tensor", flashattn_bwd(f.plan, &a, f.ws(), f.ws_bytes(), nullptr));
    a.dbias = nullptr;
    a.dk = a.dq;  // two outputs overlapping (dk's extent fits inside dq's buffer)
    record("flashattn_bwd", "dk overlaps dq", flashattn_bwd(f.plan, &a, f.ws(), f.ws_bytes(), nullptr));
  }
}

// Documented statuses this program cannot provoke here, each with the reason; anything
// else documented must have been returned above.
std::set<int> cannot_provoke(const std::string& fn) {
  const bool gpu = flashattn_cuda_device_count() > 0;
  std::set<int> s = {FLASHATTN_STATUS_INTERNAL_ERROR};  // a library bug, never on purpose
  if (fn == "flashattn_plan_create") {
    s.insert(gpu ? FLASHATTN_STATUS_BACKEND_UNAVAILABLE  // CUDA plans succeed
                 : FLASHATTN_STATUS_NO_DEVICE);          // needs a CUDA device
    if (cpu_has_every_isa()) s.insert(FLASHATTN_STATUS_NOT_SUPPORTED);
  }
  if (fn == "flashattn_plan_set_block_sparse") s.insert(FLASHATTN_STATUS_CUDA_ERROR);  // a CUDA plan's upload failing
  if (fn == "flashattn_fwd" || fn == "flashattn_bwd") {
    // CUDA-only refusals and failures (the runs here are CPU runs; tests/test_gpu*.cpp cover them).
    for (flashattn_status_t st :
         {FLASHATTN_STATUS_NOT_SUPPORTED, FLASHATTN_STATUS_HEAD_DIM_NOT_SUPPORTED, FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED,
          FLASHATTN_STATUS_LIBRARY_UNAVAILABLE, FLASHATTN_STATUS_CUDA_ERROR, FLASHATTN_STATUS_LAUNCH_FAILED})
      s.insert(st);
    // Device memory passed to a CPU run: needs a loaded CUDA driver (tests/test_host_memory.cpp).
    s.insert(FLASHATTN_STATUS_WRONG_MEMORY_SPACE);
    // CUDA runs' host bookkeeping (property cache, cuBLAS handles); a CPU run allocates
    // nothing (tests/test_no_allocation.cpp).
    s.insert(FLASHATTN_STATUS_OUT_OF_MEMORY);
  }
  if (fn == "flashattn_fwd_kvcache") {
    // CUDA-only refusals and failures: fp32 (tests/test_gpu_inference.cpp), a device before
    // sm_80 or with too little shared memory, the grid limit, launch and runtime errors.
    for (flashattn_status_t st :
         {FLASHATTN_STATUS_NOT_SUPPORTED, FLASHATTN_STATUS_HEAD_DIM_NOT_SUPPORTED, FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED,
          FLASHATTN_STATUS_CUDA_ERROR, FLASHATTN_STATUS_LAUNCH_FAILED})
      s.insert(st);
    s.insert(FLASHATTN_STATUS_WRONG_MEMORY_SPACE);  // as for flashattn_fwd
    s.insert(FLASHATTN_STATUS_OUT_OF_MEMORY);       // as for flashattn_fwd: CUDA runs' property cache
  }
  if (fn == "flashattn_combine") {
    // Launch failures need a device (tests/test_gpu_inference.cpp).
    s.insert(FLASHATTN_STATUS_CUDA_ERROR);
    s.insert(FLASHATTN_STATUS_LAUNCH_FAILED);
    if (gpu) {
      s.insert(FLASHATTN_STATUS_BACKEND_UNAVAILABLE);  // CUDA is built in and a device is present
    } else {
      // Without a device (CPU-only build, or CUDA built in but no GPU) every CUDA combine is
      // BACKEND_UNAVAILABLE: no ordinal is out of range and no memory can be told apart.
      s.insert(FLASHATTN_STATUS_NO_DEVICE);
      s.insert(FLASHATTN_STATUS_WRONG_MEMORY_SPACE);
    }
  }
  return s;
}

}  // namespace

TEST_CASE("the header documents a return list for every function that returns a status", "[contract]") {
  const fat::HeaderContract& h = header();
  const std::set<std::string> expected = {"flashattn_plan_create",
                                          "flashattn_plan_get_backend",
                                          "flashattn_plan_set_shape",
                                          "flashattn_plan_set_dtype",
                                          "flashattn_plan_set_strides",
                                          "flashattn_plan_set_softmax_scale",
                                          "flashattn_plan_set_algorithm",
                                          "flashattn_plan_set_varlen",
                                          "flashattn_plan_set_deterministic",
                                          "flashattn_plan_set_grad_accumulate",
                                          "flashattn_plan_set_band_mask",
                                          "flashattn_plan_set_softcap",
                                          "flashattn_plan_set_bias",
                                          "flashattn_plan_set_alibi_batch_stride",
                                          "flashattn_plan_set_dropout",
                                          "flashattn_plan_set_block_sparse",
                                          "flashattn_plan_get_workspace_size",
                                          "flashattn_fwd",
                                          "flashattn_bwd",
                                          "flashattn_plan_set_kvcache",
                                          "flashattn_fwd_kvcache",
                                          "flashattn_combine"};
  std::set<std::string> parsed;
  for (const auto& d : h.documented) parsed.insert(d.first);
  // A new status-returning function needs a driver in this file (and this list).
  CHECK(parsed == expected);
  CHECK(h.non_status_functions == std::set<std::string>{"flashattn_get_version", "flashattn_status_string",
                                                        "flashattn_last_error", "flashattn_plan_destroy",
                                                        "flashattn_cuda_device_count", "flashattn_has_cuda_backend"});
  for (const auto& v : h.status_values) {  // the header's enum, as the library names it
    INFO(v.first << " = " << v.second);
    CHECK(std::string(flashattn_status_string(static_cast<flashattn_status_t>(v.second))) ==
          "FLASHATTN_STATUS_" + v.first);
  }
  CHECK(h.documented.at("flashattn_bwd") == h.documented.at("flashattn_fwd"));  // "As ::flashattn_fwd."
  for (const auto& d : h.documented) {
    INFO(d.first);
    CHECK(d.second.count(FLASHATTN_STATUS_SUCCESS) == 1);
  }
}

TEST_CASE("the parser reads status names only from the @return paragraph", "[contract]") {
  const std::string text =
      "typedef enum flashattn_status_t {\n FLASHATTN_STATUS_SUCCESS = 0,\n FLASHATTN_STATUS_NULL_POINTER = 101,\n"
      " FLASHATTN_STATUS_INVALID_SHAPE = 102,\n FLASHATTN_STATUS_INTERNAL_ERROR = 900\n} flashattn_status_t;\n"
      "/**\n * @brief Mentions INVALID_SHAPE here, not in its list.\n * @param plan NULL_POINTER-free prose.\n"
      " * @return SUCCESS; NULL_POINTER.\n */\nFLASHATTN_API flashattn_status_t flashattn_a(int x);\n"
      "/**\n * @brief Same as a.\n * @return As ::flashattn_a.\n */\nFLASHATTN_API flashattn_status_t flashattn_b(int "
      "x);\n"
      "/** @brief No status. */\nFLASHATTN_API int flashattn_c(void);\n";
  const fat::HeaderContract h = fat::parse_header_contract(text);
  const std::set<int> want = {FLASHATTN_STATUS_SUCCESS, FLASHATTN_STATUS_NULL_POINTER, FLASHATTN_STATUS_INTERNAL_ERROR};
  CHECK(h.documented.at("flashattn_a") == want);
  CHECK(h.documented.at("flashattn_b") == want);
  CHECK(h.non_status_functions == std::set<std::string>{"flashattn_c"});
  const std::string no_return =
      text.substr(0, text.find("/**")) + "/** @brief x */\nFLASHATTN_API flashattn_status_t flashattn_d(void);\n";
  CHECK_THROWS(fat::parse_header_contract(no_return));
}

TEST_CASE("every status a function returns is documented, and every documented one is returned", "[contract]") {
  // Plans read the variable at creation: two threads keep the fixture's 512 KiB workspace
  // large enough on any machine.
  REQUIRE(setenv("FLASHATTN_CPU_THREADS", "2", 1) == 0);
  drive_plan_create();
  drive_plan_get_backend();
  drive_plan_set_shape();
  drive_plan_set_dtype();
  drive_plan_set_strides();
  drive_scalar_setters();
  drive_plan_set_bias();
  drive_plan_set_alibi_batch_stride();
  drive_plan_set_block_sparse();
  drive_plan_get_workspace_size();
  drive_fwd();
  drive_bwd();
  drive_plan_set_kvcache();
  drive_fwd_kvcache();
  drive_combine();
  for (const auto& d : header().documented) {
    const std::set<int>& seen = observed()[d.first];
    std::set<int> excused = cannot_provoke(d.first);
    // Where the library carries its own C++ runtime (libstdc++ linked statically), its
    // allocations do not reach this program's operator new: nothing can fail them.
    if (!fat::injection_reaches_library() && d.second.count(FLASHATTN_STATUS_OUT_OF_MEMORY) == 1)
      excused.insert(FLASHATTN_STATUS_OUT_OF_MEMORY);
    std::set<int> missing;
    for (int st : d.second)
      if (seen.count(st) == 0 && excused.count(st) == 0) missing.insert(st);
    INFO(d.first << " documents " << status_list(missing)
                 << " but never returned it here (returned: " << status_list(seen) << ")");
    CHECK(missing.empty());
    for (int st : excused) {
      INFO(d.first << ": " << flashattn_status_string(static_cast<flashattn_status_t>(st))
                   << " is excused as not provokable but is not documented");
      CHECK(d.second.count(st) == 1);
    }
  }
}
