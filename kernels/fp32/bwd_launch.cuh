// Launcher of the fp32 backward for head-dim bucket D, on the caller's stream:
//   0. once per device: every kernel's shared memory attribute (set_bwd_smem);
//   1. Delta = rowsum(dO * O) into `delta`, zeroing dQ in the non-deterministic mode
//      (launch_bwd_prep, src/cuda/fp32_prep.cu);
//   2. dK/dV kernel, which in the non-deterministic mode also adds dQ with atomics;
//   3. deterministic mode: the dQ kernel;
//   4. with a dbias output: the dBias kernel.
// Instantiated once per bucket by kernels/fp32/instances/.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

#include "common/device_once.h"
#include "fp32/bwd_dbias.cuh"
#include "fp32/bwd_dkdv.cuh"
#include "fp32/bwd_dq.cuh"
#include "fp32/launch.h"

namespace flashattn {
namespace fp32 {

// Every kernel of the bucket takes BwdTile<D>'s dynamic shared memory: set once per device,
// before the first launch, so that a failure leaves every output as it was. r.step names the
// kernel whose attribute failed.
template <int D>
LaunchResult set_bwd_smem() {
  static std::atomic<uint64_t> attr_done{0};
  LaunchResult r{cudaSuccess, "dK/dV"};
  r.err = once_per_device(attr_done, [&r](int) {
    const auto set = [](auto kernel) {
      return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, BwdTile<D>::smem_bytes);
    };
    r.step = "dK/dV";
    cudaError_t e = set(bwd_dkdv_kernel<D, false>);
    if (e == cudaSuccess) e = set(bwd_dkdv_kernel<D, true>);
    if (e != cudaSuccess) return e;
    r.step = "dQ";
    e = set(bwd_dq_kernel<D>);
    if (e != cudaSuccess) return e;
    r.step = "dBias";
    return set(bwd_dbias_kernel<D>);
  });
  return r;
}

// Launches kernel on `ctas` blocks (none when 0) of BwdTile<D>'s threads and shared memory.
template <int D, class Kernel>
cudaError_t launch_on(Kernel kernel, int64_t ctas, cudaStream_t stream, const AttnParams& p, const float* delta) {
  if (ctas == 0) return cudaSuccess;
  kernel<<<static_cast<unsigned>(ctas), BwdTile<D>::kThreads, BwdTile<D>::smem_bytes, stream>>>(p, delta);
  return cudaGetLastError();
}

template <int D>
LaunchResult launch_bwd(const AttnParams& p, float* delta, cudaStream_t stream) {
  using T = BwdTile<D>;
  LaunchResult r = set_bwd_smem<D>();
  if (r.err != cudaSuccess) return r;
  r = {launch_bwd_prep(p, delta, stream), "Delta"};
  if (r.err != cudaSuccess) return r;
  r.step = "dK/dV";
  const int64_t kv_ctas = (p.seqlen_k + T::Bc - 1) / T::Bc * p.heads_kv * p.batch;
  r.err = p.deterministic ? launch_on<D>(bwd_dkdv_kernel<D, false>, kv_ctas, stream, p, delta)
                          : launch_on<D>(bwd_dkdv_kernel<D, true>, kv_ctas, stream, p, delta);
  if (r.err != cudaSuccess) return r;
  if (p.deterministic) {
    r.step = "dQ";
    r.err = launch_on<D>(bwd_dq_kernel<D>, (p.seqlen_q + T::Br - 1) / T::Br * p.heads_q * p.batch, stream, p, delta);
    if (r.err != cudaSuccess) return r;
  }
  if (p.dbias != nullptr && p.bias_kind == kBiasTensor) {
    r.step = "dBias";
    const DbiasGrid g = dbias_grid<D>(p);
    r.err = launch_on<D>(bwd_dbias_kernel<D>, g.nb * g.nh * g.nrb * g.ncb, stream, p, delta);
  }
  return r;
}

}  // namespace fp32
}  // namespace flashattn
