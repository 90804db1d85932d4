// Host side of the generation-1 forward pass: picks the (head_dim_qk, head_dim_v)
// configuration and dtype and calls its launcher (kernels/fa2/launchers.h); head dims that
// are not a multiple of 8 run on zero-padded workspace copies (fa2_staging.cu).
#include <stdint.h>
#include <stdio.h>

#include "cuda/fa2_arch.hpp"
#include "cuda/launch.hpp"
#include "error.hpp"
#include "fa2/launchers.h"

namespace flashattn {

// The staged copies (if any) start at the first 256-byte boundary of the caller's
// workspace, hence 255 bytes of slack.
CheckedSize fa2_fwd_workspace_size(const AttnParams& p) {
  const CheckedSize staging = fa2_staging_bytes(p);
  return staging.ok() && staging.value() == 0 ? staging : staging + CheckedSize(255);
}

namespace {
// The status and message of a failed launch of configuration (D, DV).
flashattn_status_t report(const fa2::FwdLaunchResult& r, int D, int DV, cudaStream_t stream) {
  switch (r.step) {
    case fa2::kFwdQueryDevice:
      return fail(FLASHATTN_STATUS_CUDA_ERROR, "fa2 forward: querying the current device failed: %s",
                  cudaGetErrorString(r.err));
    case fa2::kFwdQueryOptin:
      return fail(FLASHATTN_STATUS_CUDA_ERROR, "fa2 forward: querying the device's shared memory limit failed: %s",
                  cudaGetErrorString(r.err));
    case fa2::kFwdSetSmem:
      return fail(FLASHATTN_STATUS_LAUNCH_FAILED,
                  "fa2 forward (d=%d, dv=%d): cudaFuncSetAttribute(max dynamic shared memory = %d bytes) failed: %s", D,
                  DV, r.smem, cudaGetErrorString(r.err));
    case fa2::kFwdLaunch: break;
  }
  return fail(FLASHATTN_STATUS_LAUNCH_FAILED,
              "fa2 forward kernel (d=%d, dv=%d, grid %ux%ux%u from head %lld, sequence %lld, stream %p) launch "
              "failed: %s (%s)",
              D, DV, r.grid.x, r.grid.y, r.grid.z, static_cast<long long>(r.h0), static_cast<long long>(r.b0),
              static_cast<void*>(stream), cudaGetErrorName(r.err), cudaGetErrorString(r.err));
}

}  // namespace

flashattn_status_t fa2_fwd(const AttnParams& user, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  AttnParams p = fa2_kernel_shape(user);
  if (p.dtype != kFp16 && p.dtype != kBf16)
    return fail(FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED,
                "dtype=%d: the fa2 CUDA kernels take fp16/bf16 tensors (fp32 runs on the fp32 kernels)",
                static_cast<int>(p.dtype));
  const int cfg = fa2::select_fwd_config(p.head_dim_qk, p.head_dim_v);
  if (cfg < 0)
    return fail(FLASHATTN_STATUS_HEAD_DIM_NOT_SUPPORTED,
                "head_dim_qk=%lld, head_dim_v=%lld: no fa2 forward kernel (head dims must be at most 256)",
                static_cast<long long>(user.head_dim_qk), static_cast<long long>(user.head_dim_v));
  // Nothing to compute for empty problems (possible in varlen mode with total_q = 0).
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return FLASHATTN_STATUS_SUCCESS;
  int device = 0;
  int arch = -1;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = fa2_device_arch(device, &arch);
  if (err != cudaSuccess)
    return fail(FLASHATTN_STATUS_CUDA_ERROR, "fa2 forward: querying the device's compute capability failed: %s",
                cudaGetErrorString(err));
  if (arch < 0)
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                "fa2 forward: device %d: this build has no kernels for its compute capability "
                "(FLASHATTN_CUDA_ARCHITECTURES)",
                device);
  const size_t staging = static_cast<size_t>(fa2_staging_bytes(user).value());  // ok(): the API layer checked it
  if (staging > 0) {
    char who[96];
    snprintf(who, sizeof who, "the fa2 forward's zero-padded copies (head dims %lld, %lld) need", ll(user.head_dim_qk),
             ll(user.head_dim_v));
    char* ws = nullptr;
    if (const flashattn_status_t s = workspace_at_boundary(workspace, workspace_bytes, staging, who, &ws)) return s;
    if (const flashattn_status_t s = fa2_stage_in(user, ws, &p, stream)) return s;
  }
  const fa2::FwdLaunchResult r = fa2::kFwdRun[arch][cfg][p.dtype](p, stream);
  if (r.err != cudaSuccess) return report(r, fa2::kFwdInstances[cfg].d, fa2::kFwdInstances[cfg].dv, stream);
  return fa2_stage_out(user, p, stream);
}

}  // namespace flashattn
