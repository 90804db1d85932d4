// Host launcher template of the FA3-design forward kernel; each generated translation unit
// (kernels/fa3/instances/fwd_<cfg>_<dtype>_sm90a.cu) explicitly instantiates one run_fwd.
#pragma once
#include <cuda_runtime.h>

#include "fa2/fwd_launch.cuh"
#include "fa3/fwd.h"
#include "fa3/fwd_kernel.cuh"

namespace flashattn {
namespace fa3 {

template <int D, int kDtype>
FwdLaunchResult run_fwd(const AttnParams& p, const FwdMaps& maps, cudaStream_t stream) {
  using Cfg = FwdTraits<D>;
  using T = typename fa2::DtypeToElem<kDtype>::type;
  auto kernel = fwd_kernel<Cfg, T>;
  FwdLaunchResult r{};
  r.smem = Cfg::kSmemBytes;
  // Idempotent and cheap; done on every call so it holds for whichever device is current.
  r.step = kFwdSetSmem;
  r.err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, r.smem);
  if (r.err != cudaSuccess) return r;
  // Without a mask every tile is as long: one persistent CTA per SM (or per tile where there
  // are fewer). Causal tiles differ in length, and the hardware's CTA dispatch balances them
  // best: one CTA per tile. (The host sends problems of more than 2^31 - 1 tiles to fa2.)
  r.step = kFwdSmCount;
  int device = 0, sms = 0;
  r.err = cudaGetDevice(&device);
  if (r.err == cudaSuccess) r.err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (r.err != cudaSuccess) return r;
  r.step = kFwdLaunch;
  const int64_t tiles = (p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM * p.heads_q * p.batch;
  r.grid = dim3(static_cast<unsigned>(p.has_band || tiles < sms ? tiles : sms));
  kernel<<<r.grid, Cfg::kThreads, r.smem, stream>>>(p, maps);
  r.err = cudaGetLastError();
  return r;
}

}  // namespace fa3
}  // namespace flashattn
