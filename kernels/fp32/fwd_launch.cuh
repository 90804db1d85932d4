// Launcher of the fp32 forward for head-dim bucket D: one CTA per (query block, query
// head, sequence) on a 1-D grid. Instantiated once per bucket by kernels/fp32/instances/.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

#include "common/device_once.h"
#include "fp32/fwd_kernel.cuh"
#include "fp32/launch.h"

namespace flashattn {
namespace fp32 {

template <int D>
LaunchResult launch_fwd(const AttnParams& p, cudaStream_t stream) {
  using T = FwdTile<D>;
  const int64_t ctas = (p.seqlen_q + T::Br - 1) / T::Br * p.heads_q * p.batch;
  static std::atomic<uint64_t> attr_done{0};  // the shared memory attribute, once per device
  LaunchResult r{once_per_device(attr_done,
                                 [](int) {
                                   return cudaFuncSetAttribute(
                                       fwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, T::smem_bytes);
                                 }),
                 "forward"};
  if (r.err == cudaSuccess && ctas > 0) {
    fwd_kernel<D><<<static_cast<unsigned>(ctas), T::kThreads, T::smem_bytes, stream>>>(p);
    r.err = cudaGetLastError();
  }
  return r;
}

}  // namespace fp32
}  // namespace flashattn
