// Launcher of the fp32 SIMT forward for head-dim bucket D: one CTA per (query block, query
// head, sequence) on a 1-D grid. Instantiated once per bucket by kernels/simt/instances/.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "simt/fwd_kernel.cuh"
#include "simt/launch.h"

namespace flashattn {
namespace simt {

template <int D>
LaunchResult launch_fwd(const AttnParams& p, cudaStream_t stream) {
  using T = FwdTile<D>;
  const int64_t ctas = (p.seqlen_q + T::Br - 1) / T::Br * p.heads_q * p.batch;
  LaunchResult r{cudaFuncSetAttribute(fwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, T::smem_bytes),
                 "forward"};
  if (r.err == cudaSuccess && ctas > 0) {
    fwd_kernel<D><<<static_cast<unsigned>(ctas), kThreads, T::smem_bytes, stream>>>(p);
    r.err = cudaGetLastError();
  }
  return r;
}

}  // namespace simt
}  // namespace flashattn
