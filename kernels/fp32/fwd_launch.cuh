// Launcher of the fp32 forward for head-dim bucket D: one CTA per (query block, query
// head, sequence) on a 1-D grid, of the instance the device's shared memory allows.
// Instantiated once per bucket by kernels/fp32/instances/.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

#include "common/device_once.h"
#include "fp32/fwd_kernel.cuh"
#include "fp32/launch.h"

namespace flashattn {
namespace fp32 {

// One instance (traits.h's FwdTile<D, kWide>), its shared memory attribute set once per
// device.
template <int D, bool kWide>
LaunchResult launch_fwd_tiles(const AttnParams& p, cudaStream_t stream) {
  using T = FwdTile<D, kWide>;
  const int64_t ctas = (p.seqlen_q + T::Br - 1) / T::Br * p.heads_q * p.batch;
  static std::atomic<uint64_t> attr_done{0};
  LaunchResult r{once_per_device(attr_done,
                                 [](int) {
                                   return cudaFuncSetAttribute(fwd_kernel<D, kWide>,
                                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                               T::smem_bytes);
                                 }),
                 "forward", T::smem_bytes};
  if (r.err == cudaSuccess && ctas > 0) {
    fwd_kernel<D, kWide><<<static_cast<unsigned>(ctas), T::kThreads, T::smem_bytes, stream>>>(p);
    r.err = cudaGetLastError();
  }
  return r;
}

// The wide instance where the host allows blocks an H100's shared memory (smem_limit:
// the device's opt-in limit, or less under FLASHATTN_CUDA_SMEM_LIMIT, so one H100 runs what
// smaller devices run), except at D = 64 under a band mask, whose partial diagonal tiles it
// computed slower than the narrow one (docs/internals/kernels-fp32.md, "Wide tiles"); else
// the narrow one, which fp32_check sizes against.
template <int D>
LaunchResult launch_fwd(const AttnParams& p, int smem_limit, cudaStream_t stream) {
  const bool wide = smem_limit >= kSm90SmemPerBlock && (D > 64 || !p.has_band);
  return wide ? launch_fwd_tiles<D, true>(p, stream) : launch_fwd_tiles<D, false>(p, stream);
}

}  // namespace fp32
}  // namespace flashattn
