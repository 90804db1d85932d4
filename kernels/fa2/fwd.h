// Host-side view of the generation-1 forward kernels: how a problem maps onto one of the
// instantiated (head_dim_qk, head_dim_v) configurations (instances.h; their tiles are in
// tile_size.h), and the launcher template (instantiated in instances/fwd_<cfg>_<dtype>.cu).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/params.h"
#include "fa2/instances.h"
#include "fa2/tile_size.h"

namespace flashattn {
namespace fa2 {

// Index into kFwdInstances for the problem's head dims, or -1 when none fits.
inline int select_fwd_config(int64_t dqk, int64_t dv) {
  for (int i = 0; i < kNumFwdInstances; ++i) {
    const HeadDims& c = kFwdInstances[i];
    // Unequal configs only serve problems that need them (dv clearly below dqk);
    // otherwise the square config of max(dqk, dv) is used.
    if (c.d != c.dv && !(dqk > 128 && dv <= c.dv)) continue;
    if (dqk <= c.d && dv <= c.dv) return i;
  }
  return -1;
}

// The outcome of a forward launch: err is cudaSuccess, or the error of the CUDA call made at
// `step` (with the values that call used), which the host reports.
enum FwdLaunchStep : int {
  kFwdQueryDevice,  // the current device
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

// Launches the forward kernel of configuration (D, DV) for dtype kDtype (kFp16/kBf16) in the
// code of architecture policy Arch (arch.h).
template <class Arch, int D, int DV, int kDtype>
FwdLaunchResult run_fwd(const AttnParams& p, cudaStream_t stream);

}  // namespace fa2
}  // namespace flashattn
