// What the tests of the CUDA kernel families (test_gpu_forward_paths.cpp,
// test_gpu_backward_paths.cpp) share: the forced family of the process, the device fa3
// needs, and the check that a forced fa3 refuses a run it does not serve.
#pragma once
#include <cuda_runtime_api.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "gpu_check.hpp"
#include "gpu_mem.hpp"
#include "harness.hpp"

namespace fat {

// The value of the forcing variable `var` in this process ("" when unset).
inline std::string forced_value(const char* var) {
  const char* v = getenv(var);
  return v != nullptr ? v : "";
}

// fa3 runs on compute capability 9.0 only: elsewhere its cases are skipped.
inline bool fa3_device() {
  int dev = 0;
  cudaDeviceProp prop{};
  return cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess && prop.major == 9 &&
         prop.minor == 0;
}

#define REQUIRE_PATH()                                                                                            \
  do {                                                                                                            \
    REQUIRE_GPU();                                                                                                \
    if (forced_path() == "fa3" && !fa3_device()) FA_SKIP_TEST("fa3 runs on compute capability 9.0 devices only"); \
  } while (0)

// With `var`=fa3 forcing the pass (the forward, or with backward the backward after a
// forward on any family): the run of c fails with NOT_SUPPORTED naming the variable (and
// each of `mentions`), and writes nothing.
inline void check_fa3_refuses(const Config& c, const char* var, bool backward,
                              const std::vector<std::string>& mentions = {}) {
  const Problem p = make_problem(c);
  DeviceMem dev;
  const LibResult g = run_library(p, dev, 0);
  const flashattn_status_t st = backward ? g.bwd : g.fwd;
  INFO(describe(p.cfg) << " -> status " << flashattn_status_string(st) << ": " << g.error);
  CHECK(g.setup == FLASHATTN_STATUS_SUCCESS);
  if (backward) CHECK(g.fwd == FLASHATTN_STATUS_SUCCESS);
  CHECK(st == FLASHATTN_STATUS_NOT_SUPPORTED);
  CHECK(g.error.find(std::string(var) + "=fa3") != std::string::npos);
  for (const std::string& m : mentions) CHECK(g.error.find(m) != std::string::npos);
  CHECK(g.outputs_untouched);
}

// 2 sequences, 4 query heads on 2 KV heads, head dims d and dv, whose inputs Q, K, V (and
// dO) are shared across the batch (batch stride 0, which no TMA map addresses: its strides
// are positive); the backward too if `backward`.
inline Config shared_inputs_case(const char* name, int64_t d, int64_t dv, bool backward, uint64_t seed) {
  Config c = gbase(name, 150, 170, d, FLASHATTN_DTYPE_BF16, seed);
  c.dv = dv;
  c.batch = 2;
  c.hq = 4;
  c.hkv = 2;
  c.layout = Layout::BcastBatch;
  c.backward = backward;
  return c;
}

// Inputs shared across the batch at head dim 128: with `var`=fa2 or unset the pass runs and
// matches the reference; with `var`=fa3 it is refused naming q (the first of fa3's maps)
// and its strides.
inline void check_fa3_unmappable(const char* var, bool backward, uint64_t seed) {
  const Config c = shared_inputs_case("paths inputs shared across the batch", 128, 128, backward, seed);
  if (forced_value(var) != "fa3") gpu_check(c);
  else check_fa3_refuses(c, var, backward, {"q=", "element strides (batch, seq, head) (0, 512, 128)"});
}

// The same at head dims 100 and 120: Q and K run on zero-padded copies (100 is no multiple of
// 8), V stays the caller's. fa3 stages the copies, then cannot map V: unset, fa2 runs the
// pass (staging again) and it matches the reference; forced, the pass is refused naming v,
// and no output is written.
inline void check_fa3_unmappable_after_staging(const char* var, bool backward, uint64_t seed) {
  const Config c =
      shared_inputs_case("paths staged Q and K beside a V shared across the batch", 100, 120, backward, seed);
  if (forced_value(var) != "fa3") gpu_check(c);
  else check_fa3_refuses(c, var, backward, {"v="});
}

// One case per option that neither fa3 pass implements (a window, softcap, ALiBi, dropout,
// a varlen batch), seeds seed + 1 .. seed + 5; the backward too if `backward`.
inline std::vector<Config> fa3_unserved_option_cases(bool backward, uint64_t seed) {
  auto make = [&](const char* name, int64_t d, flashattn_dtype_t t) {
    Config c = gbase(name, 150, 170, d, t, ++seed);
    c.backward = backward;
    return c;
  };
  std::vector<Config> cases;
  Config c = make("paths window", 128, FLASHATTN_DTYPE_FP16);
  c.band = true;
  c.wl = 32;
  c.wr = 0;
  cases.push_back(c);
  c = make("paths softcap", 128, FLASHATTN_DTYPE_BF16);
  c.softcap = 5.f;
  cases.push_back(c);
  c = make("paths alibi", 64, FLASHATTN_DTYPE_FP16);
  c.bias = FLASHATTN_BIAS_ALIBI;
  cases.push_back(c);
  c = make("paths dropout", 64, FLASHATTN_DTYPE_BF16);
  c.p_drop = 0.1f;
  c.seed = 5;
  cases.push_back(c);
  c = make("paths varlen", 128, FLASHATTN_DTYPE_FP16);
  c.sq = c.sk = 1;
  c.seqlens_q = {5, 130, 0};
  c.seqlens_k = {17, 129, 40};
  cases.push_back(c);
  return cases;
}

}  // namespace fat
