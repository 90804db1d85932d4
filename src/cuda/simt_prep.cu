// The fp32 SIMT backward's preprocessing launch (kernels/simt/bwd_prep.cuh), one definition
// for the launchers of every head-dim bucket.
#include "simt/bwd_prep.cuh"
#include "simt/launch.h"

namespace flashattn {
namespace simt {

cudaError_t launch_bwd_prep(const AttnParams& p, float* delta, cudaStream_t stream) {
  const int64_t rows = delta_rows(p);
  if (rows == 0) return cudaSuccess;
  const int64_t ctas = (rows + 7) / 8 < 65536 ? (rows + 7) / 8 : 65536;  // a warp per row, grid-stride
  bwd_prep_kernel<<<static_cast<unsigned>(ctas), kThreads, 0, stream>>>(p, delta, !p.deterministic);
  return cudaGetLastError();
}

}  // namespace simt
}  // namespace flashattn
