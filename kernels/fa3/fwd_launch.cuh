// Host launcher template of the FA3-design forward kernel; each generated translation unit
// (kernels/fa3/instances/fwd_<cfg>_<dtype>_sm90a.cu) explicitly instantiates one run_fwd.
#pragma once
#include <cuda_runtime.h>

#include "fa2/fwd_launch.cuh"
#include "fa3/fwd.h"
#include "fa3/fwd_kernel.cuh"

namespace flashattn {
namespace fa3 {

template <int Dqk, int Dv, int kDtype>
FwdLaunchResult run_fwd(const AttnParams& p, const FwdLaunch& launch, cudaStream_t stream) {
  using Cfg = FwdTraits<Dqk, Dv>;
  using T = typename fa2::DtypeToElem<kDtype>::type;
  auto kernel = fwd_kernel<Cfg, T>;
  FwdLaunchResult r{};
  r.smem = Cfg::kSmemBytes;
  // Idempotent and cheap; done on every call so it holds for whichever device is current.
  r.step = kFwdSetSmem;
  r.err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, r.smem);
  if (r.err != cudaSuccess) return r;
  r.step = kFwdLaunch;
  kernel<<<launch.grid, Cfg::kThreads, r.smem, stream>>>(p, launch.maps, launch.next_tile);
  r.err = cudaGetLastError();
  return r;
}

}  // namespace fa3
}  // namespace flashattn
