// Host-side view of the generation-1 forward kernels: which (head_dim_qk, head_dim_v)
// configurations exist, how a problem maps onto one, and the per-instantiation launchers
// (defined in the generated kernels/gen1/fwd_<cfg>_<dtype>.cu translation units).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/params.h"

namespace flashattn {
namespace gen1 {

// Instantiated (head_dim_qk, head_dim_v) configurations. A problem runs on the first
// one whose dims are >= its own (zero-filled loads and masked stores cover the rest).
// Tile shapes must match FwdTileFor in fwd_kernel.cuh (static_assert'ed in fwd_launch.cuh).
struct FwdConfigId {
  int d, dv, block_m, block_n, warps;
  // Dynamic shared memory: Q, K, V tiles, widths rounded up to 64 columns, 2-byte elements.
  constexpr int smem_bytes() const {
    return 2 * ((block_m + block_n) * ((d + 63) / 64 * 64) + block_n * ((dv + 63) / 64 * 64));
  }
};
inline constexpr FwdConfigId kFwdConfigs[] = {
    {32, 32, 128, 128, 4},   {64, 64, 128, 128, 4},  {96, 96, 128, 64, 4},   {128, 128, 128, 64, 4},
    {192, 128, 128, 64, 8}, {192, 192, 128, 64, 8}, {256, 256, 64, 64, 4}};

// Index into kFwdConfigs for the problem's head dims, or -1 when none fits.
inline int select_fwd_config(int64_t dqk, int64_t dv) {
  for (int i = 0; i < static_cast<int>(sizeof(kFwdConfigs) / sizeof(kFwdConfigs[0])); ++i) {
    const FwdConfigId& c = kFwdConfigs[i];
    // Unequal configs only serve problems that need them (dv clearly below dqk);
    // otherwise the square config of max(dqk, dv) is used.
    if (c.d != c.dv && !(dqk > 128 && dv <= c.dv)) continue;
    if (dqk <= c.d && dv <= c.dv) return i;
  }
  return -1;
}

constexpr int fwd_config_smem(int d, int dv) {
  for (const FwdConfigId& c : kFwdConfigs)
    if (c.d == d && c.dv == dv) return c.smem_bytes();
  return -1;
}
constexpr int fwd_config_block_m(int d, int dv) {
  for (const FwdConfigId& c : kFwdConfigs)
    if (c.d == d && c.dv == dv) return c.block_m;
  return -1;
}

// The outcome of a forward launch: err is cudaSuccess, or the error of the CUDA call made at
// `step` (with the values that call used), which the host reports.
enum FwdLaunchStep : int {
  kFwdQueryDevice,  // the device's compute capability
  kFwdQueryOptin,   // its opt-in shared memory per block (bias tile staging)
  kFwdSetSmem,      // cudaFuncSetAttribute(max dynamic shared memory = smem)
  kFwdLaunch        // the launch of grid chunk (grid, from head h0, sequence b0)
};
struct FwdLaunchResult {
  cudaError_t err;
  FwdLaunchStep step;
  int smem;
  dim3 grid;
  int64_t h0, b0;
};

// Launches the forward kernel of configuration (D, DV) for dtype kDtype (kFp16/kBf16).
template <int D, int DV, int kDtype>
FwdLaunchResult run_fwd(const AttnParams& p, cudaStream_t stream);

}  // namespace gen1
}  // namespace flashattn
