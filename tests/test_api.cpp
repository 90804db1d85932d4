// Public API behaviour that is not about numbers: versions, status names, the error
// message contract, plan lifetime, backend resolution, workspace queries, threading.
#include <string.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "catch_compat.hpp"
#include "harness.hpp"

using namespace fat;

TEST_CASE("flashattn_get_version matches the header macros", "[api]") {
  int major = -1, minor = -1, patch = -1;
  const int v = flashattn_get_version(&major, &minor, &patch);
  CHECK(major == FLASHATTN_VERSION_MAJOR);
  CHECK(minor == FLASHATTN_VERSION_MINOR);
  CHECK(patch == FLASHATTN_VERSION_PATCH);
  CHECK(v == FLASHATTN_VERSION_NUMBER);
  CHECK(v == major * 10000 + minor * 100 + patch);
  CHECK(flashattn_get_version(nullptr, nullptr, nullptr) == FLASHATTN_VERSION_NUMBER);
  int only_minor = -1;
  CHECK(flashattn_get_version(nullptr, &only_minor, nullptr) == FLASHATTN_VERSION_NUMBER);
  CHECK(only_minor == FLASHATTN_VERSION_MINOR);
}

TEST_CASE("flashattn_status_string names every status and flags unknown ones", "[api]") {
  struct S {
    flashattn_status_t s;
    const char* name;
  };
  const S all[] = {
      {FLASHATTN_STATUS_SUCCESS, "FLASHATTN_STATUS_SUCCESS"},
      {FLASHATTN_STATUS_INVALID_ARGUMENT, "FLASHATTN_STATUS_INVALID_ARGUMENT"},
      {FLASHATTN_STATUS_NULL_POINTER, "FLASHATTN_STATUS_NULL_POINTER"},
      {FLASHATTN_STATUS_INVALID_SHAPE, "FLASHATTN_STATUS_INVALID_SHAPE"},
      {FLASHATTN_STATUS_INVALID_HEADS, "FLASHATTN_STATUS_INVALID_HEADS"},
      {FLASHATTN_STATUS_INVALID_STRIDE, "FLASHATTN_STATUS_INVALID_STRIDE"},
      {FLASHATTN_STATUS_INVALID_ENUM, "FLASHATTN_STATUS_INVALID_ENUM"},
      {FLASHATTN_STATUS_INVALID_VALUE, "FLASHATTN_STATUS_INVALID_VALUE"},
      {FLASHATTN_STATUS_INVALID_LAYOUT, "FLASHATTN_STATUS_INVALID_LAYOUT"},
      {FLASHATTN_STATUS_INVALID_STRUCT_SIZE, "FLASHATTN_STATUS_INVALID_STRUCT_SIZE"},
      {FLASHATTN_STATUS_WORKSPACE_TOO_SMALL, "FLASHATTN_STATUS_WORKSPACE_TOO_SMALL"},
      {FLASHATTN_STATUS_PLAN_INCOMPLETE, "FLASHATTN_STATUS_PLAN_INCOMPLETE"},
      {FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS, "FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS"},
      {FLASHATTN_STATUS_INVALID_SEQLENS, "FLASHATTN_STATUS_INVALID_SEQLENS"},
      {FLASHATTN_STATUS_MISALIGNED_POINTER, "FLASHATTN_STATUS_MISALIGNED_POINTER"},
      {FLASHATTN_STATUS_NOT_SUPPORTED, "FLASHATTN_STATUS_NOT_SUPPORTED"},
      {FLASHATTN_STATUS_BACKEND_UNAVAILABLE, "FLASHATTN_STATUS_BACKEND_UNAVAILABLE"},
      {FLASHATTN_STATUS_HEAD_DIM_NOT_SUPPORTED, "FLASHATTN_STATUS_HEAD_DIM_NOT_SUPPORTED"},
      {FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED, "FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED"},
      {FLASHATTN_STATUS_LIBRARY_UNAVAILABLE, "FLASHATTN_STATUS_LIBRARY_UNAVAILABLE"},
      {FLASHATTN_STATUS_OUT_OF_MEMORY, "FLASHATTN_STATUS_OUT_OF_MEMORY"},
      {FLASHATTN_STATUS_CUDA_ERROR, "FLASHATTN_STATUS_CUDA_ERROR"},
      {FLASHATTN_STATUS_NO_DEVICE, "FLASHATTN_STATUS_NO_DEVICE"},
      {FLASHATTN_STATUS_LAUNCH_FAILED, "FLASHATTN_STATUS_LAUNCH_FAILED"},
      {FLASHATTN_STATUS_WRONG_MEMORY_SPACE, "FLASHATTN_STATUS_WRONG_MEMORY_SPACE"},
      {FLASHATTN_STATUS_INTERNAL_ERROR, "FLASHATTN_STATUS_INTERNAL_ERROR"},
  };
  for (const S& s : all) {
    const char* got = flashattn_status_string(s.s);
    REQUIRE(got != nullptr);
    CHECK(std::string(got) == s.name);
  }
  for (int unknown : {1, 99, 114, 205, 999, -1, 100000, static_cast<int>(FLASHATTN_STATUS_MAX_ENUM)}) {
    const char* got = flashattn_status_string(static_cast<flashattn_status_t>(unknown));
    REQUIRE(got != nullptr);
    CHECK(std::string(got) == "FLASHATTN_STATUS_UNKNOWN");
  }
}

TEST_CASE("last_error is empty after a successful call and thread-local", "[api]") {
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  CHECK(std::string(flashattn_last_error()) == "");
  CHECK(flashattn_plan_set_shape(plan, 1, 4, 4, 1, 1, 300, 8) == FLASHATTN_STATUS_INVALID_SHAPE);
  const std::string msg = flashattn_last_error();
  CHECK(msg.find("head_dim_qk") != std::string::npos);
  CHECK(msg.find("300") != std::string::npos);  // the value is named too
  // Another thread sees its own (empty) message.
  std::string other = "unset";
  std::thread([&] { other = flashattn_last_error(); }).join();
  CHECK(other == "");
  CHECK(std::string(flashattn_last_error()) == msg);
  // Any successful call clears it.
  CHECK(flashattn_plan_set_shape(plan, 1, 4, 4, 1, 1, 8, 8) == FLASHATTN_STATUS_SUCCESS);
  CHECK(std::string(flashattn_last_error()) == "");
  CHECK(flashattn_plan_set_dtype(plan, static_cast<flashattn_dtype_t>(9)) == FLASHATTN_STATUS_INVALID_ENUM);
  CHECK(std::string(flashattn_last_error()) != "");
  size_t bytes = 0;
  CHECK(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &bytes) == FLASHATTN_STATUS_SUCCESS);
  CHECK(std::string(flashattn_last_error()) == "");
  flashattn_plan_destroy(plan);
}

TEST_CASE("destroy(NULL) is a no-op", "[api]") {
  flashattn_plan_destroy(nullptr);
  SUCCEED();
}

TEST_CASE("AUTO resolves to the CPU when no GPU is usable", "[api]") {
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_AUTO, 0) == FLASHATTN_STATUS_SUCCESS);
  flashattn_backend_t b = FLASHATTN_BACKEND_AUTO;
  REQUIRE(flashattn_plan_get_backend(plan, &b) == FLASHATTN_STATUS_SUCCESS);
  CHECK(b != FLASHATTN_BACKEND_AUTO);
  if (flashattn_has_cuda_backend() && flashattn_cuda_device_count() > 0) CHECK(b == FLASHATTN_BACKEND_CUDA);
  else CHECK(b == FLASHATTN_BACKEND_CPU);
  flashattn_plan_destroy(plan);
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_get_backend(plan, &b) == FLASHATTN_STATUS_SUCCESS);
  CHECK(b == FLASHATTN_BACKEND_CPU);
  flashattn_plan_destroy(plan);
}

TEST_CASE("a CUDA plan without a usable GPU fails cleanly", "[api]") {
  if (flashattn_has_cuda_backend() && flashattn_cuda_device_count() > 0) {
    // With a GPU, an ordinal past the last device is NO_DEVICE.
    flashattn_plan_t plan = reinterpret_cast<flashattn_plan_t>(static_cast<uintptr_t>(0x1234));
    CHECK(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CUDA, flashattn_cuda_device_count() + 7) ==
          FLASHATTN_STATUS_NO_DEVICE);
    const std::string msg = flashattn_last_error();
    CHECK(plan == reinterpret_cast<flashattn_plan_t>(static_cast<uintptr_t>(0x1234)));
    CHECK(msg.find("device") != std::string::npos);
    return;
  }
  if (!flashattn_has_cuda_backend()) CHECK(flashattn_cuda_device_count() == 0);
  flashattn_plan_t plan = reinterpret_cast<flashattn_plan_t>(static_cast<uintptr_t>(0x1234));
  const flashattn_status_t st = flashattn_plan_create(&plan, FLASHATTN_BACKEND_CUDA, 0);
  const std::string msg = flashattn_last_error();  // before any other library call
  CHECK((st == FLASHATTN_STATUS_BACKEND_UNAVAILABLE || st == FLASHATTN_STATUS_NO_DEVICE));
  CHECK(plan == reinterpret_cast<flashattn_plan_t>(static_cast<uintptr_t>(0x1234)));
  CHECK(msg != "");
  if (!flashattn_has_cuda_backend()) CHECK(st == FLASHATTN_STATUS_BACKEND_UNAVAILABLE);
}

TEST_CASE("workspace sizes: STANDARD materializes the score matrix", "[api]") {
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_shape(plan, 2, 100, 120, 2, 1, 32, 32) == FLASHATTN_STATUS_SUCCESS);
  size_t fwd_flash = 1, bwd_flash = 1, fwd_std = 0, bwd_std = 0;
  CHECK(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &fwd_flash) == FLASHATTN_STATUS_SUCCESS);
  CHECK(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_BACKWARD, &bwd_flash) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_algorithm(plan, FLASHATTN_ALGORITHM_STANDARD) == FLASHATTN_STATUS_SUCCESS);
  CHECK(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &fwd_std) == FLASHATTN_STATUS_SUCCESS);
  CHECK(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_BACKWARD, &bwd_std) == FLASHATTN_STATUS_SUCCESS);
  // "O(N^2) workspace": at least one head's fp32 score matrix.
  CHECK(fwd_std >= 100u * 120u * sizeof(float));
  CHECK(bwd_std >= 100u * 120u * sizeof(float));
  // The flash algorithm's workspace must not grow with seqlen_q * seqlen_k.
  REQUIRE(flashattn_plan_set_algorithm(plan, FLASHATTN_ALGORITHM_FLASH) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_shape(plan, 2, 1000, 1200, 2, 1, 32, 32) == FLASHATTN_STATUS_SUCCESS);
  size_t fwd_big = 0;
  CHECK(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &fwd_big) == FLASHATTN_STATUS_SUCCESS);
  CHECK(fwd_big < 1000u * 1200u * sizeof(float));
  flashattn_plan_destroy(plan);
}

TEST_CASE("a larger workspace than needed is fine", "[api][fwd]") {
  Config c;
  c.name = "big workspace";
  c.sq = 10;
  c.sk = 12;
  c.algorithm = FLASHATTN_ALGORITHM_STANDARD;
  const Problem p = make_problem(c);
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(configure_plan(plan, p) == FLASHATTN_STATUS_SUCCESS);
  size_t ws = 0;
  REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &ws) == FLASHATTN_STATUS_SUCCESS);
  std::vector<unsigned char> big(ws + 4096, 0xA5);
  std::vector<float> q(10 * 16), k(12 * 16), v(12 * 16), o(10 * 16), lse(10);
  for (size_t n = 0; n < q.size(); ++n) q[n] = static_cast<float>(p.in.q[n]);
  for (size_t n = 0; n < k.size(); ++n) k[n] = static_cast<float>(p.in.k[n]), v[n] = static_cast<float>(p.in.v[n]);
  flashattn_fwd_args_t a = FLASHATTN_FWD_ARGS_INIT;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.o = o.data();
  a.lse = lse.data();
  CHECK(flashattn_fwd(plan, &a, big.data(), big.size(), nullptr) == FLASHATTN_STATUS_SUCCESS);
  const RefOutputs r = reference_fp64(p.spec, p.in, false);
  for (size_t n = 0; n < o.size(); ++n) CHECK(o[n] == Approx(r.o[n]).margin(1e-5));
  flashattn_plan_destroy(plan);
}

TEST_CASE("a struct_size that stops before lse: lse is never touched", "[api][fwd]") {
  // The header lets the library read only the fields that fit in struct_size. Whether a
  // struct shorter than this version's is accepted (lse treated as absent) or rejected as
  // INVALID_STRUCT_SIZE is the library's choice; either way lse must not be written, and a
  // rejection must write nothing at all.
  Config c;
  c.name = "short struct";
  c.sq = 6;
  c.sk = 9;
  c.dqk = c.dv = 8;
  const Problem p = make_problem(c);
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(configure_plan(plan, p) == FLASHATTN_STATUS_SUCCESS);
  size_t ws = 0;
  REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &ws) == FLASHATTN_STATUS_SUCCESS);
  std::vector<unsigned char> work(ws + 1);
  std::vector<float> q(6 * 8), k(9 * 8), v(9 * 8), o(6 * 8, 0.f), lse(6, 123.f);
  for (size_t n = 0; n < q.size(); ++n) q[n] = static_cast<float>(p.in.q[n]);
  for (size_t n = 0; n < k.size(); ++n) k[n] = static_cast<float>(p.in.k[n]), v[n] = static_cast<float>(p.in.v[n]);
  flashattn_fwd_args_t a = FLASHATTN_FWD_ARGS_INIT;
  a.struct_size = offsetof(flashattn_fwd_args_t, lse);  // a caller that knows only q, k, v, o
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.o = o.data();
  a.lse = lse.data();  // beyond struct_size
  const flashattn_status_t st = flashattn_fwd(plan, &a, ws ? work.data() : nullptr, ws, nullptr);
  const std::string msg = flashattn_last_error();
  INFO("status " << flashattn_status_string(st) << " message \"" << msg << "\"");
  CHECK((st == FLASHATTN_STATUS_SUCCESS || st == FLASHATTN_STATUS_INVALID_STRUCT_SIZE));
  for (float x : lse) CHECK(x == 123.f);
  if (st == FLASHATTN_STATUS_SUCCESS) {
    const RefOutputs r = reference_fp64(p.spec, p.in, false);
    for (size_t n = 0; n < o.size(); ++n) CHECK(o[n] == Approx(r.o[n]).margin(1e-5));
  } else {
    CHECK(msg.find("struct_size") != std::string::npos);
    for (float x : o) CHECK(x == 0.f);
  }
  flashattn_plan_destroy(plan);
}

TEST_CASE("one plan run from many threads at once gives identical results", "[api][fwd][bwd]") {
  Config c;
  c.name = "threads";
  c.batch = 2;
  c.sq = 40;
  c.sk = 50;
  c.hq = 4;
  c.hkv = 2;
  c.dqk = c.dv = 32;
  c.dtype = FLASHATTN_DTYPE_FP16;
  c.band = true;
  c.wr = 0;
  c.p_drop = 0.2f;
  c.seed = 5;
  const Problem p = make_problem(c);
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(configure_plan(plan, p) == FLASHATTN_STATUS_SUCCESS);
  HostMem mem;
  const LibResult first = run_on_plan(plan, p, mem);
  REQUIRE(first.ok());
  check_against_reference(p, first);
  std::atomic<int> mismatches{0}, failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&] {
      HostMem m;
      const LibResult r = run_on_plan(plan, p, m);
      if (!r.ok()) ++failures;
      else if (r.raw_o != first.raw_o || r.raw_lse != first.raw_lse || r.raw_dq != first.raw_dq ||
               r.raw_dk != first.raw_dk || r.raw_dv != first.raw_dv)
        ++mismatches;
    });
  for (auto& th : threads) th.join();
  CHECK(failures == 0);
  CHECK(mismatches == 0);
  flashattn_plan_destroy(plan);
}

TEST_CASE("options can be switched off again and set_shape resets strides", "[api][fwd][bwd]") {
  // A plain plan, and a plan that had every option (and explicit strides) and then had them
  // all switched off with the documented "off" values: bitwise identical results.
  Config plain;
  plain.name = "plain";
  plain.batch = 2;
  plain.sq = 13;
  plain.sk = 21;
  plain.hq = 4;
  plain.hkv = 2;
  plain.dqk = plain.dv = 16;
  plain.dtype = FLASHATTN_DTYPE_BF16;
  const Problem p = make_problem(plain);
  const LibResult want = run_cpu(p);
  REQUIRE(want.ok());

  Config busy = plain;
  busy.layout = Layout::Mixed;
  busy.softcap = 3.f;
  busy.band = true;
  busy.wr = 0;
  busy.bias = FLASHATTN_BIAS_ALIBI;
  busy.p_drop = 0.4f;
  busy.sparse = true;
  busy.block_q = busy.block_k = 4;
  const Problem pb = make_problem(busy);
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(configure_plan(plan, pb) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_varlen(plan, 1, 26, 42) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_softmax_scale(plan, 3.f) == FLASHATTN_STATUS_SUCCESS);
  // Off again: shape (resets strides), varlen 0, scale 0, softcap 0, band (-1,-1), bias NONE,
  // dropout p 0, layout NULL.
  CHECK(flashattn_plan_set_shape(plan, 2, 13, 21, 4, 2, 16, 16) == FLASHATTN_STATUS_SUCCESS);
  CHECK(flashattn_plan_set_varlen(plan, 0, 0, 0) == FLASHATTN_STATUS_SUCCESS);
  CHECK(flashattn_plan_set_softmax_scale(plan, 0.f) == FLASHATTN_STATUS_SUCCESS);
  CHECK(flashattn_plan_set_softcap(plan, 0.f) == FLASHATTN_STATUS_SUCCESS);
  CHECK(flashattn_plan_set_band_mask(plan, FLASHATTN_ALIGN_TOP_LEFT, FLASHATTN_WINDOW_UNBOUNDED, -7) ==
        FLASHATTN_STATUS_SUCCESS);
  CHECK(flashattn_plan_set_bias(plan, FLASHATTN_BIAS_NONE, nullptr) == FLASHATTN_STATUS_SUCCESS);
  CHECK(flashattn_plan_set_dropout(plan, 0.f, 123, 456) == FLASHATTN_STATUS_SUCCESS);
  CHECK(flashattn_plan_set_block_sparse(plan, nullptr, 1, 1, 1, 1, 1) == FLASHATTN_STATUS_SUCCESS);
  HostMem mem;
  const LibResult got = run_on_plan(plan, p, mem);  // p: default BSHD strides, no options
  flashattn_plan_destroy(plan);
  require_same_bits(got, want);
}

TEST_CASE("the plan keeps its own copy of the block-sparse layout", "[api][fwd]") {
  Config c;
  c.name = "layout copy";
  c.sq = 40;
  c.sk = 40;
  c.hq = 2;
  c.dqk = c.dv = 16;
  c.sparse = true;
  c.block_q = c.block_k = 8;
  c.density = 0.5;
  const Problem p = make_problem(c);
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(configure_plan(plan, p) == FLASHATTN_STATUS_SUCCESS);  // without the layout below
  std::vector<uint8_t>* layout = new std::vector<uint8_t>(p.spec.layout);
  REQUIRE(flashattn_plan_set_block_sparse(plan, layout->data(), 1, 5, 5, 8, 8) == FLASHATTN_STATUS_SUCCESS);
  std::fill(layout->begin(), layout->end(), 0);  // the caller reuses its buffer...
  delete layout;                                 // ...and frees it
  HostMem mem;
  const LibResult r = run_on_plan(plan, p, mem);
  flashattn_plan_destroy(plan);
  REQUIRE(r.ok());
  check_against_reference(p, r);
}
