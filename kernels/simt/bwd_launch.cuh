// Launcher of the fp32 SIMT backward for head-dim bucket D, on the caller's stream:
//   1. Delta = rowsum(dO * O) into `delta`, zeroing dQ in the non-deterministic mode
//      (launch_bwd_prep, src/cuda/simt_prep.cu);
//   2. dK/dV kernel, which in the non-deterministic mode also adds dQ with atomics;
//   3. deterministic mode: the dQ kernel;
//   4. with a dbias output: the dBias kernel.
// Instantiated once per bucket by kernels/simt/instances/.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "simt/bwd_dbias.cuh"
#include "simt/bwd_dkdv.cuh"
#include "simt/bwd_dq.cuh"
#include "simt/launch.h"

namespace flashattn {
namespace simt {

// Launches kernel on `ctas` blocks (none when 0) with `smem` bytes of dynamic shared memory.
template <class Kernel>
cudaError_t launch_on(Kernel kernel, int64_t ctas, int smem, cudaStream_t stream, const AttnParams& p,
                      const float* delta) {
  if (ctas == 0) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(ctas), kThreads, smem, stream>>>(p, delta);
  return cudaGetLastError();
}

template <int D>
LaunchResult launch_bwd(const AttnParams& p, float* delta, cudaStream_t stream) {
  using T = BwdTile<D>;
  LaunchResult r{launch_bwd_prep(p, delta, stream), "Delta"};
  if (r.err != cudaSuccess) return r;
  r.step = "dK/dV";
  const int64_t kv_ctas = (p.seqlen_k + T::Bc - 1) / T::Bc * p.heads_kv * p.batch;
  r.err = p.deterministic ? launch_on(bwd_dkdv_kernel<D, false>, kv_ctas, T::smem_bytes, stream, p, delta)
                          : launch_on(bwd_dkdv_kernel<D, true>, kv_ctas, T::smem_bytes, stream, p, delta);
  if (r.err != cudaSuccess) return r;
  if (p.deterministic) {
    r.step = "dQ";
    r.err = launch_on(bwd_dq_kernel<D>, (p.seqlen_q + T::Br - 1) / T::Br * p.heads_q * p.batch, T::smem_bytes, stream,
                      p, delta);
    if (r.err != cudaSuccess) return r;
  }
  if (p.dbias != nullptr && p.bias_kind == kBiasTensor) {
    r.step = "dBias";
    const DbiasGrid g = dbias_grid<D>(p);
    r.err = launch_on(bwd_dbias_kernel<D>, g.nb * g.nh * g.nrb * g.ncb, T::smem_bytes, stream, p, delta);
  }
  return r;
}

}  // namespace simt
}  // namespace flashattn
