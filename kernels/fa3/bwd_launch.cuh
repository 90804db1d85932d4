// Host launcher template of the FA3-design backward kernel; each generated translation unit
// (kernels/fa3/instances/bwd_<cfg>_<dtype>_sm90a.cu) explicitly instantiates one run_bwd.
#pragma once
#include <cuda_runtime.h>

#include "fa2/fwd_launch.cuh"
#include "fa3/bwd.h"
#include "fa3/bwd_kernel.cuh"

namespace flashattn {
namespace fa3 {

template <int D, int kDtype>
BwdLaunchResult run_bwd(const AttnParams& p, const BwdMaps& maps, const BwdScratch& scratch, cudaStream_t stream) {
  using Cfg = BwdTraits<D>;
  using T = typename fa2::DtypeToElem<kDtype>::type;
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

}  // namespace fa3
}  // namespace flashattn
