// Launcher of the fp32 backward for head-dim bucket D, on the caller's stream:
//   0. once per device: every kernel's shared memory attribute (set_bwd_smem);
//   1. Delta = rowsum(dO * O) into `delta`, zeroing dQ in the non-deterministic mode
//      (launch_bwd_prep, src/cuda/fp32_prep.cu);
//   2. dK/dV kernel, which in the non-deterministic mode also adds dQ with atomics: its
//      split instance (traits.h, BwdTile<D, true>) where the host allows blocks an H100's
//      shared memory and it fits (buckets 64 and 128), else the fp32 one;
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
  LaunchResult r{cudaSuccess, "dK/dV", BwdTile<D>::smem_bytes};
  r.err = once_per_device(attr_done, [&r](int) {
    const auto set = [](auto kernel) {
      return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, BwdTile<D>::smem_bytes);
    };
    r.step = "dK/dV";
    cudaError_t e = set(bwd_dkdv_kernel<D, false, false>);
    if (e == cudaSuccess) e = set(bwd_dkdv_kernel<D, true, false>);
    if (e != cudaSuccess) return e;
    r.step = "dQ";
    e = set(bwd_dq_kernel<D>);
    if (e != cudaSuccess) return e;
    r.step = "dBias";
    return set(bwd_dbias_kernel<D>);
  });
  return r;
}

// The split dK/dV instance's shared memory attribute (both modes), set once per device
// where it runs.
template <int D>
cudaError_t set_split_smem() {
  static std::atomic<uint64_t> attr_done{0};
  return once_per_device(attr_done, [](int) {
    constexpr int bytes = BwdTile<D, true>::smem_bytes;
    cudaError_t e =
        cudaFuncSetAttribute(bwd_dkdv_kernel<D, false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(bwd_dkdv_kernel<D, true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    return e;
  });
}

// Launches kernel on `ctas` blocks (none when 0) of BwdTile<D, kSplitKV>'s threads and
// shared memory.
template <int D, bool kSplitKV = false, class Kernel>
cudaError_t launch_on(Kernel kernel, int64_t ctas, cudaStream_t stream, const AttnParams& p, const float* delta) {
  using T = BwdTile<D, kSplitKV>;
  if (ctas == 0) return cudaSuccess;
  kernel<<<static_cast<unsigned>(ctas), T::kThreads, T::smem_bytes, stream>>>(p, delta);
  return cudaGetLastError();
}

// The dK/dV kernel of the mode (kSplitKV: the split instance).
template <int D, bool kSplitKV>
cudaError_t launch_dkdv(const AttnParams& p, const float* delta, cudaStream_t stream) {
  const int64_t ctas = (p.seqlen_k + BwdTile<D>::Bc - 1) / BwdTile<D>::Bc * p.heads_kv * p.batch;
  return p.deterministic ? launch_on<D, kSplitKV>(bwd_dkdv_kernel<D, false, kSplitKV>, ctas, stream, p, delta)
                         : launch_on<D, kSplitKV>(bwd_dkdv_kernel<D, true, kSplitKV>, ctas, stream, p, delta);
}

// smem_limit: the opt-in shared memory per block the host allows (src/cuda/launch.hpp);
// the split instance runs where it is an H100's (the same choice as the forward's wide
// instance) at the buckets whose split instance fits it. r.smem: the dK/dV kernel's.
template <int D>
LaunchResult launch_bwd(const AttnParams& p, float* delta, int smem_limit, cudaStream_t stream) {
  using T = BwdTile<D>;
  LaunchResult r = set_bwd_smem<D>();
  if (r.err != cudaSuccess) return r;
  r = {launch_bwd_prep(p, delta, stream), "Delta", T::smem_bytes};
  if (r.err != cudaSuccess) return r;
  r.step = "dK/dV";
  bool split = false;
  if constexpr (D <= 128) {  // BwdTile<256, true> would not fit an H100's block
    split = smem_limit >= kSm90SmemPerBlock;
    if (split) {
      r.smem = BwdTile<D, true>::smem_bytes;
      r.err = set_split_smem<D>();
      if (r.err == cudaSuccess) r.err = launch_dkdv<D, true>(p, delta, stream);
    }
  }
  if (!split) r.err = launch_dkdv<D, false>(p, delta, stream);
  if (r.err != cudaSuccess) return r;
  r.smem = T::smem_bytes;
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
