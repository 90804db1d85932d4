// Host launcher template of the FA3-design backward kernel; each generated translation unit
// (kernels/fa3/instances/bwd_<cfg>_<dtype>_sm90a.cu) explicitly instantiates one run_bwd.
#pragma once
#include <cuda_runtime.h>

#include "fa2/fwd_launch.cuh"
#include "fa3/bwd.h"
#include "fa3/bwd_kernel.cuh"

namespace flashattn {
namespace fa3 {

// The kernel of traits Cfg for element type T.
template <class Cfg, typename T>
BwdLaunchResult launch_bwd(const AttnParams& p, const BwdMaps& maps, const BwdScratch& scratch, cudaStream_t stream) {
  auto kernel = bwd_kernel<Cfg, T>;
  BwdLaunchResult r{};
  r.smem = Cfg::kSmemBytes;
  // Idempotent and cheap; done on every call so it holds for whichever device is current.
  r.step = kBwdSetSmem;
  r.err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, r.smem);
  if (r.err != cudaSuccess) return r;
  // One CTA per (key block, key head, sequence); the host checks the count fits 2^31 - 1.
  r.step = kBwdLaunch;
  const int64_t blocks = (p.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN * p.heads_kv * p.batch;
  r.grid = dim3(static_cast<unsigned>(blocks));
  kernel<<<r.grid, Cfg::kThreads, r.smem, stream>>>(p, maps, scratch);
  r.err = cudaGetLastError();
  return r;
}

// Head dim D's kernel for the run's mask: its step (bwd_block_m) differs under the causal
// mask at d = 128 only, where both kernels are instantiated.
template <int D, int kDtype>
BwdLaunchResult run_bwd(const AttnParams& p, const BwdMaps& maps, const BwdScratch& scratch, cudaStream_t stream) {
  using T = typename fa2::DtypeToElem<kDtype>::type;
  constexpr int kM = bwd_block_m(D, false), kBandM = bwd_block_m(D, true);
  if constexpr (kBandM != kM)
    if (p.has_band) return launch_bwd<BwdTraits<D, kBandM>, T>(p, maps, scratch, stream);
  return launch_bwd<BwdTraits<D, kM>, T>(p, maps, scratch, stream);
}

}  // namespace fa3
}  // namespace flashattn
