// Host launcher template of the generation-1 forward kernel; each generated translation
// unit (kernels/gen1/fwd_<cfg>_<dtype>.cu) explicitly instantiates one run_fwd.
#pragma once
#include <cuda_runtime.h>

#include "error.hpp"
#include "gen1/fwd.h"
#include "gen1/fwd_kernel.cuh"

namespace flashattn {
namespace gen1 {

template <int kDtype>
struct DtypeToElem;
template <> struct DtypeToElem<kFp16> { using type = __half; };
template <> struct DtypeToElem<kBf16> { using type = __nv_bfloat16; };

template <int D, int DV, int kDtype>
flashattn_status_t run_fwd(const AttnParams& p, cudaStream_t stream) {
  using Cfg = typename FwdTileFor<D, DV>::type;
  using T = typename DtypeToElem<kDtype>::type;
  const bool extras = p.softcap > 0.f || p.bias_kind != kBiasNone || p.p_drop > 0.f || p.layout != nullptr;
  static_assert(Cfg::kSmemBytes == fwd_config_smem(D, DV) && fwd_config_block_m(D, DV) == Cfg::kBlockM,
                "kFwdConfigs (fwd.h) disagrees with FwdTileFor (fwd_kernel.cuh)");
  auto kernel = extras ? fwd_kernel<Cfg, T, true> : fwd_kernel<Cfg, T, false>;
  // Idempotent and cheap; done on every call so it holds for whichever device is current.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess)
    return fail(FLASHATTN_STATUS_LAUNCH_FAILED,
                "gen1 forward (d=%d, dv=%d): cudaFuncSetAttribute(max dynamic shared memory = %d bytes) failed: %s",
                D, DV, Cfg::kSmemBytes, cudaGetErrorString(err));
  const dim3 grid(static_cast<unsigned>((p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM),
                  static_cast<unsigned>(p.heads_q), static_cast<unsigned>(p.batch));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess)
    return fail(FLASHATTN_STATUS_LAUNCH_FAILED, "gen1 forward kernel (d=%d, dv=%d, grid %ux%ux%u) launch failed: %s", D,
                DV, grid.x, grid.y, grid.z, cudaGetErrorString(err));
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace gen1
}  // namespace flashattn
