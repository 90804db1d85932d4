// The fp32 backward's preprocessing launch (kernels/fp32/bwd_prep.cuh), one definition
// for the launchers of every head-dim bucket.
#include "fp32/bwd_prep.cuh"
#include "fp32/launch.h"

namespace flashattn {
namespace fp32 {

cudaError_t launch_bwd_prep(const AttnParams& p, float* delta, cudaStream_t stream) {
  const int64_t rows = lse_row_count(p);
  if (rows == 0) return cudaSuccess;
  const int64_t ctas = (rows + 7) / 8 < 65536 ? (rows + 7) / 8 : 65536;  // a warp per row, grid-stride
  // The atomics add into dQ itself: zeroed first, unless the run accumulates into it.
  bwd_prep_kernel<<<static_cast<unsigned>(ctas), kPrepThreads, 0, stream>>>(p, delta,
                                                                            !p.deterministic && !p.grad_accumulate);
  return cudaGetLastError();
}

}  // namespace fp32
}  // namespace flashattn
