// Host-side view of the FA3-design forward kernels (sm_90a): the tensor maps they load
// through and the launcher template (instantiated in fa3/instances/fwd_<cfg>_<dtype>_sm90a.cu).
#pragma once
#include <cuda_runtime.h>

#include "common/params.h"
#include "common/tensor_map.h"

namespace flashattn {
namespace fa3 {

// TMA maps of Q, K, V and O as 4-D tensors (head dim, seq, head, batch) over the plan's
// strides, boxes of FwdTraits<Dqk, Dv>::kCols columns x kBoxRows (Q, O) or kBlockN (K, V)
// rows in the kSwizzle-byte swizzle; loads zero-fill rows past the sequence,
// stores skip them (src/cuda/tensor_map.hpp encodes them).
struct FwdMaps {
  TensorMap128 q, k, v, o;
};

// What a launch takes besides the problem: the tensor maps; the grid, min(query tiles, SMs)
// persistent CTAs; and the tile counter, an int in device memory the host zeroed on the
// launch's stream, from which each CTA claims its next tile (set for causal runs with more
// tiles than CTAs; null otherwise: the CTAs take every gridDim.x-th tile).
struct FwdLaunch {
  FwdMaps maps;
  unsigned grid;
  int* next_tile;
};

// The outcome of a launch: err is cudaSuccess, or the error of the CUDA call made at `step`.
enum FwdLaunchStep : int {
  kFwdSetSmem,  // cudaFuncSetAttribute(max dynamic shared memory = smem)
  kFwdLaunch    // the launch
};
struct FwdLaunchResult {
  cudaError_t err;
  FwdLaunchStep step;
  int smem;
};

// Launches the kernel of head dims Dqk (Q, K) and Dv (V, O) for dtype kDtype (kFp16/kBf16).
template <int Dqk, int Dv, int kDtype>
FwdLaunchResult run_fwd(const AttnParams& p, const FwdLaunch& launch, cudaStream_t stream);

}  // namespace fa3
}  // namespace flashattn
