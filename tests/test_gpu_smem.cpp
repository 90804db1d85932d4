// CUDA backward under a capped shared-memory limit. FLASHATTN_CUDA_SMEM_LIMIT (bytes, read
// by the backward's host code at every call) makes this GPU choose its backward kernel as
// a device with that opt-in limit per block would: 166912 is an A100 / sm_87 (sized for the sm_90 code running here,
// the d=64, d=128 and d=256 configs drop to 1 stage), 101376 an sm_86 / sm_89 / sm_120 GPU (RTX 3090/4090, A10, L4,
// L40S; the small-shared-memory variants). sm_80 SASS is what those GPUs run, so the kernels' code is the same; only
// the tile configuration and stage count differ. Tagged [gpu], labelled `gpu` in ctest; skipped without a device. The
// variable is set with setenv inside the process and restored after every case.
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "fa2/instances.h"
#include "gpu_mem.hpp"
#include "harness.hpp"

using namespace fat;

namespace {

constexpr const char* kVar = "FLASHATTN_CUDA_SMEM_LIMIT";
constexpr int kA100 = 166912;  // sm_80, sm_87 opt-in shared memory per block
constexpr int kSm86 = 101376;  // sm_86, sm_89, sm_120

// Sets the variable for its lifetime (nullptr: unset), then restores what was there (the
// GPU script also runs the whole suite with it set from outside).
class SmemCap {
 public:
  explicit SmemCap(const char* value) {
    if (const char* old = getenv(kVar)) {
      had_ = true;
      old_ = old;
    }
    if (value != nullptr) setenv(kVar, value, 1);
    else unsetenv(kVar);
  }
  explicit SmemCap(int bytes) : SmemCap(std::to_string(bytes).c_str()) {}
  ~SmemCap() {
    if (had_) setenv(kVar, old_.c_str(), 1);
    else unsetenv(kVar);
  }
  SmemCap(const SmemCap&) = delete;
  SmemCap& operator=(const SmemCap&) = delete;

 private:
  bool had_ = false;
  std::string old_;
};

int device_optin() {
  int optin = 0;
  REQUIRE(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) == cudaSuccess);
  return optin;
}

Config sbase(const char* name, int64_t sq, int64_t sk, int64_t dqk, int64_t dv, flashattn_dtype_t t, uint64_t seed) {
  Config c;
  c.name = name;
  c.sq = sq;
  c.sk = sk;
  c.dqk = dqk;
  c.dv = dv;
  c.hq = 4;
  c.hkv = 2;
  c.dtype = t;
  c.data_seed = seed;
  c.pad16 = true;
  return c;
}

// Number after "needs at least " in a refusal message, or -1.
long needed_bytes(const std::string& msg) {
  const char* key = "needs at least ";
  const size_t at = msg.find(key);
  if (at == std::string::npos) return -1;
  return strtol(msg.c_str() + at + strlen(key), nullptr, 10);
}

// The backward of p is refused: NOT_SUPPORTED after a successful forward, a message with
// the byte count, and no output written. Returns the bytes the message asks for.
long check_refused(const Problem& p, const LibResult& g) {
  INFO(describe(p.cfg) << " -> fwd " << flashattn_status_string(g.fwd) << ", bwd " << flashattn_status_string(g.bwd)
                       << ": " << g.error);
  CHECK(g.fwd == FLASHATTN_STATUS_SUCCESS);
  CHECK(g.bwd == FLASHATTN_STATUS_NOT_SUPPORTED);
  CHECK(g.outputs_untouched);
  const long need = needed_bytes(g.error);
  CHECK(need > 0);
  return need;
}

// The problems every limit runs: each head-dim config (through the dims that share one)
// with the options spread over them.
std::vector<Config> problems() {
  std::vector<Config> v;
  const flashattn_dtype_t F = FLASHATTN_DTYPE_FP16, B = FLASHATTN_DTYPE_BF16;
  {
    Config c = sbase("smem d64 causal BR dropout", 130, 200, 64, 64, F, 7001);
    c.band = true;
    c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
    c.wr = 0;
    c.p_drop = 0.2f;
    c.seed = 77;
    v.push_back(c);
  }
  v.push_back(sbase("smem d32", 77, 93, 32, 32, B, 7002));
  v.push_back(sbase("smem d8", 65, 129, 8, 8, F, 7003));
  v.push_back(sbase("smem d40 dv24", 70, 140, 40, 24, B, 7004));
  {
    Config c = sbase("smem d96 bias broadcast(batch) dbias", 100, 150, 96, 96, F, 7005);
    c.batch = 2;
    c.bias = FLASHATTN_BIAS_TENSOR;
    c.bias_bcast[0] = true;
    v.push_back(c);
  }
  {
    Config c = sbase("smem d128 varlen alibi dropout", 1, 1, 128, 128, B, 7006);
    c.seqlens_q = {50, 0, 129, 7};
    c.seqlens_k = {70, 10, 130, 0};
    c.bias = FLASHATTN_BIAS_ALIBI;
    c.p_drop = 0.15f;
    c.seed = 5;
    v.push_back(c);
  }
  {
    Config c = sbase("smem d128 block-sparse", 300, 260, 128, 128, F, 7007);
    c.sparse = true;
    c.block_q = 128;
    c.block_k = 64;
    c.layout_heads = 4;
    c.density = 0.5;
    v.push_back(c);
  }
  {
    Config c = sbase("smem d192 dv128 softcap window", 150, 170, 192, 128, B, 7008);
    c.softcap = 8.f;
    c.band = true;
    c.wl = 40;
    c.wr = 10;
    v.push_back(c);
  }
  {
    Config c = sbase("smem d192 bias dbias dropout", 97, 140, 192, 192, F, 7009);
    c.bias = FLASHATTN_BIAS_TENSOR;
    c.p_drop = 0.1f;
    c.seed = 3;
    v.push_back(c);
  }
  v.push_back(sbase("smem d160 (config 192)", 80, 130, 160, 160, B, 7010));
  {
    Config c = sbase("smem d256 alibi causal", 90, 130, 256, 256, B, 7011);
    c.bias = FLASHATTN_BIAS_ALIBI_SYMMETRIC;
    c.band = true;
    c.wr = 0;
    v.push_back(c);
  }
  return v;
}

// Least opt-in shared memory per block the backward of p runs with: under a limit of 1
// byte nothing fits and the refusal names it.
long least_bytes(const Problem& p, MemOps& dev) {
  const SmemCap cap("1");
  return check_refused(p, run_library(p, dev, 0));
}

void run_under(const char* cap_text, int limit) {
  const SmemCap cap(cap_text);
  for (const Config& c : problems()) {
    const Problem p = make_problem(c);
    DeviceMem dev;
    const long need = least_bytes(p, dev);
    const LibResult g = run_library(p, dev, 0);
    INFO("limit " << limit << " (" << kVar << "=" << (cap_text ? cap_text : "unset") << "), least " << need
                  << " bytes: " << describe(p.cfg));
    INFO("status create/setup/fwd/bwd = " << g.create << "/" << g.setup << "/" << g.fwd << "/" << g.bwd
                                          << " error: " << g.error);
    // Head dims up to 192 fit an sm_86/sm_89 GPU; above (the d=256 config) only an A100's
    // 163 KB: the kernel template has no tiles small enough (bwd_kernel.cuh).
    CHECK(need <= (std::max(c.dqk, c.dv) <= 192 ? kSm86 : kA100));
    if (need > limit) {
      check_refused(p, g);  // had it run, the limit would not have been applied
      continue;
    }
    REQUIRE(g.ok());
    check_against_reference(p, g, kGpuTolerance);
  }
  // Deterministic mode (turn counters sized for the config's query tile) with a dBias
  // summed over heads (fixed-order slab), twice: bitwise equal and right.
  Config c = sbase("smem d128 deterministic causal dbias(h)", 200, 260, 128, 128, FLASHATTN_DTYPE_BF16, 7100);
  c.hq = 8;
  c.deterministic = true;
  c.band = true;
  c.wr = 0;
  c.bias = FLASHATTN_BIAS_TENSOR;
  c.bias_bcast[1] = true;
  const Problem p = make_problem(c);
  DeviceMem dev;
  const LibResult a = run_library(p, dev, 0), b = run_library(p, dev, 0);
  INFO("limit " << limit << ": " << describe(c) << " " << a.error << " " << b.error);
  require_same_bits(a, b);
  check_against_reference(p, a, kGpuTolerance);
}

}  // namespace

TEST_CASE("gpu smem: backward with every option under the A100 and sm_86/sm_89 limits", "[gpu][bwd][smem]") {
  REQUIRE_GPU();
  const int optin = device_optin();
  run_under(nullptr, optin);
  run_under("166912", std::min(optin, kA100));
  run_under("101376", std::min(optin, kSm86));
}

TEST_CASE("gpu smem: each head-dim config runs at exactly its least shared memory", "[gpu][bwd][smem]") {
  REQUIRE_GPU();
  const int optin = device_optin();
  // Each backward config of the instantiation list; the fp16/bf16 alternate.
  uint64_t seed = 7200;
  for (int i = 0; i < flashattn::fa2::kNumBwdConfigs; ++i) {
    const flashattn::fa2::BwdInstance& d = flashattn::fa2::kBwdInstances[i];
    ++seed;
    Config c =
        sbase("smem threshold", 130, 150, d.d, d.dv, seed % 2 ? FLASHATTN_DTYPE_FP16 : FLASHATTN_DTYPE_BF16, seed);
    c.band = true;
    c.wr = 0;
    const Problem p = make_problem(c);
    DeviceMem dev;
    long need = -1;
    {
      const SmemCap cap("1");  // nothing fits: the message names the least the config needs
      need = check_refused(p, run_library(p, dev, 0));
    }
    INFO(describe(c) << ": least shared memory " << need << " bytes");
    REQUIRE(need > 0);
    // Every config fits an A100, and every config up to d=192 an sm_86/sm_89 GPU.
    CHECK(need <= kA100);
    if (std::max(d.d, d.dv) <= 192) CHECK(need <= kSm86);
    if (need > optin) continue;  // this GPU cannot run it either
    {
      const SmemCap cap(static_cast<int>(need - 1));
      check_refused(p, run_library(p, dev, 0));
    }
    {
      const SmemCap cap(static_cast<int>(need));
      const LibResult g = run_library(p, dev, 0);
      INFO("at the limit: status fwd/bwd = " << g.fwd << "/" << g.bwd << " error: " << g.error);
      REQUIRE(g.ok());
      check_against_reference(p, g, kGpuTolerance);
    }
  }
}

TEST_CASE("gpu smem: values that are not a positive byte count are ignored", "[gpu][bwd][smem]") {
  REQUIRE_GPU();
  Config c = sbase("smem invalid values", 70, 90, 64, 64, FLASHATTN_DTYPE_FP16, 7300);
  const Problem p = make_problem(c);
  DeviceMem dev;
  {
    const SmemCap cap("4096");  // a valid value this small refuses every config
    check_refused(p, run_library(p, dev, 0));
  }
  for (const char* bad : {"", "abc", "4096x", "-4096", "0", "99999999999999999999"}) {
    const SmemCap cap(bad);
    const LibResult g = run_library(p, dev, 0);
    INFO(kVar << "=\"" << bad << "\": status fwd/bwd = " << g.fwd << "/" << g.bwd << " error: " << g.error);
    REQUIRE(g.ok());
    check_against_reference(p, g, kGpuTolerance);
  }
}
