// The architecture policies of the FA2-design kernels. One kernel source serves both; a
// kernel template takes the policy as its first parameter and every architecture
// difference is an `if constexpr` on it. kernels/instances.json gives the CUDA targets of
// each policy (its instantiations are compiled for those only), and the host picks the
// policy by the device's compute capability in one place (src/cuda/launch.hpp).
#pragma once

namespace flashattn {
namespace fa2 {

// mma.sync m16n8k16 GEMMs, cp.async loads: sm_80 machine code, and compute_90 PTX that the
// driver compiles for GPUs newer than Hopper.
struct Sm80 {
  static constexpr bool kSm90 = false;   // Hopper instructions (TMA, mbarrier, vector reductions)
  static constexpr bool kWgmma = false;  // warpgroup MMA
};

// Hopper (sm_90a machine code only): wgmma GEMMs at d = 64/128/256, the copy engine (TMA)
// for the backward's Q/dO prefetch and dQ reductions, mbarriers, float2/float4 reductions,
// and the backward's sm_90 scheduling, addressing and epilogue paths, each measured on
// H100/H200 only (on sm_80 the same paths make ptxas spill 100+ bytes at d=64/128).
struct Sm90a {
  static constexpr bool kSm90 = true;
  static constexpr bool kWgmma = true;
};

}  // namespace fa2
}  // namespace flashattn
