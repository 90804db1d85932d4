// Host side of the fp32 SIMT forward (kernels/simt/fwd_kernel.cuh): picks the head-dim
// bucket and launches one CTA per (query block, query head, sequence) on a 1-D grid.
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/launch.hpp"
#include "error.hpp"
#include "simt/fwd_kernel.cuh"

namespace flashattn {
namespace {

template <int D>
flashattn_status_t launch_fwd(const AttnParams& p, cudaStream_t stream) {
  using T = simt::FwdTile<D>;
  const int64_t ctas = (p.seqlen_q + T::Br - 1) / T::Br * p.heads_q * p.batch;
  cudaError_t err = cudaFuncSetAttribute(simt::fwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         T::smem_bytes);
  if (err == cudaSuccess) {
    simt::fwd_kernel<D><<<static_cast<unsigned>(ctas), simt::kThreads, T::smem_bytes, stream>>>(p);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(FLASHATTN_STATUS_LAUNCH_FAILED,
                "fp32 SIMT forward kernel (head-dim bucket %d, %lld blocks, %d bytes of shared memory, stream %p) "
                "launch failed: %s (%s)",
                D, static_cast<long long>(ctas), T::smem_bytes, static_cast<void*>(stream), cudaGetErrorName(err),
                cudaGetErrorString(err));
  }
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace

flashattn_status_t simt_fwd(const AttnParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return FLASHATTN_STATUS_SUCCESS;
  switch (simt_bucket(p)) {
    case 64: return launch_fwd<64>(p, stream);
    case 128: return launch_fwd<128>(p, stream);
    default: return launch_fwd<256>(p, stream);
  }
}

}  // namespace flashattn
