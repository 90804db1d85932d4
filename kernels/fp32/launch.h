// The launchers of the fp32 family as the host calls them (their per-bucket
// instantiations and tables: fp32/launchers.h, generated).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/params.h"

namespace flashattn {
namespace fp32 {

// A launcher's outcome: the first failed CUDA call's error (cudaSuccess if none), the
// step it belongs to ("forward", "Delta", "dK/dV", "dQ", "dBias") and the dynamic shared
// memory of the instance it launched (the backward's steps without an instance of their
// own: the bucket's BwdTile).
struct LaunchResult {
  cudaError_t err;
  const char* step;
  int smem = 0;
};

// Enqueue the pass of head-dim bucket D on stream (fwd_launch.cuh, bwd_launch.cuh); the
// backward's Delta vector takes lse_row_count(p) floats (the LSE layout). The forward and
// the backward's dK/dV kernel pick their instance from smem_limit, the opt-in shared
// memory per block the host allows on the current device (src/cuda/launch.hpp,
// smem_limit).
template <int D>
LaunchResult launch_fwd(const AttnParams& p, int smem_limit, cudaStream_t stream);
template <int D>
LaunchResult launch_bwd(const AttnParams& p, float* delta, int smem_limit, cudaStream_t stream);
// The backward's first step for every bucket: Delta, and in the non-deterministic mode dQ
// zeroed (bwd_prep.cuh; defined in src/cuda/fp32_prep.cu).
cudaError_t launch_bwd_prep(const AttnParams& p, float* delta, cudaStream_t stream);

}  // namespace fp32
}  // namespace flashattn
