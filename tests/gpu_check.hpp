// The GPU test programs' check of one configuration: run on the CUDA backend and the CPU
// backend, both against the fp64 reference under the GPU tolerance (harness.hpp), and the
// exact facts (fully masked rows: LSE -inf) equal between them.
#pragma once
#include <math.h>

#include "catch_compat.hpp"
#include "gpu_mem.hpp"
#include "harness.hpp"

namespace fat {

// Every dtype of the CUDA flash path: fp16 and bf16 (fa2/fa3 kernels), fp32 (fp32 kernels).
// Cases that pick one by index take fp16/bf16 from the first two.
inline constexpr flashattn_dtype_t kGpuDtypes[3] = {FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP32};

// base_config with paddings that keep the CUDA kernels' 16-byte alignment.
inline Config gbase(const char* name, int64_t sq, int64_t sk, int64_t d, flashattn_dtype_t t, uint64_t seed) {
  Config c = base_config(name, sq, sk, d, t, seed);
  c.pad16 = true;
  return c;
}

// Runs c on the GPU and the CPU; the GPU's results must match the reference under tol, and
// the exact facts (fully masked rows) must agree between them.
inline void gpu_check(const Config& c, const Tolerance& tol = kGpuTolerance) {
  const Problem p = make_problem(c);
  DeviceMem dev;
  const LibResult g = run_library(p, dev, 0);
  INFO(describe(p.cfg));
  INFO("GPU status create/setup/fwd/bwd = " << g.create << "/" << g.setup << "/" << g.fwd << "/" << g.bwd
                                            << " error: " << g.error);
  REQUIRE(g.ok());
  const RefOutputs exact = reference_fp64(p.spec, p.in, p.cfg.backward);
  const RefOutputs lowp = reference_lowp(p.spec, p.in, rounder_for(p.cfg.dtype), p.cfg.backward);
  check_against_reference(p, g, exact, lowp, tol);
  const LibResult cpu = run_cpu(p);
  REQUIRE(cpu.ok());
  // LSE -inf exactly where the CPU has -inf.
  size_t lse_mismatch = 0;
  for (size_t n = 0; n < g.lse.size(); ++n) lse_mismatch += std::isinf(g.lse[n]) != std::isinf(cpu.lse[n]);
  CHECK(lse_mismatch == 0);
}

// Runs the deterministic backward of c `runs` times (at least 2): bitwise the same outputs
// and gradients every time, and right.
inline void gpu_check_deterministic(Config c, int runs = 2) {
  c.deterministic = true;
  const Problem p = make_problem(c);
  DeviceMem dev;
  const LibResult first = run_library(p, dev, 0);
  for (int r = 1; r < runs; ++r) {
    const LibResult again = run_library(p, dev, 0);
    INFO(describe(c) << ", run " << r + 1 << " of " << runs << ": " << first.error << " " << again.error);
    require_same_bits(first, again);
  }
  INFO(describe(c));
  check_against_reference(p, first, kGpuTolerance);
}

}  // namespace fat
