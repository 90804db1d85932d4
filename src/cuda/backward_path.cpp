// FLASHATTN_CUDA_BACKWARD and the choice between the fa2 and fa3 backward (backward_path.hpp).
#include "cuda/backward_path.hpp"

#include "cuda/kernel_path.hpp"
#include "cuda/launch.hpp"
#include "error.hpp"

namespace flashattn {

flashattn_status_t cuda_flash_bwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const ForcedPath forced = forced_path(PathVar::kBackward);
  if (forced == ForcedPath::kInvalid)
    return fail(FLASHATTN_STATUS_INVALID_ARGUMENT,
                "FLASHATTN_CUDA_BACKWARD=%s: expected fa2 or fa3 (or unset: the library picks the backward kernels)",
                forced_path_value(PathVar::kBackward));
  if (fp32_serves(p)) return fp32_bwd(p, workspace, workspace_bytes, stream);
  // Unset, fa3 wherever it serves the run: on an H100 it measured 1.02-1.17x fa2's speed on
  // every configuration of bf16, d 64/128, causal or not, 1k-16k
  // (docs/internals/kernels-fa3-backward.md).
  if (forced != ForcedPath::kFa2) {
    char why[384];
    if (fa2_staging_bytes(p).value() > 0) {  // ok(): the API layer checked it
      flashattn_status_t status = FLASHATTN_STATUS_SUCCESS;
      if (fa3_bwd_staged(p, workspace, workspace_bytes, stream, &status, why, sizeof why)) return status;
    } else {
      Fa3Bwd fa3;
      if (fa3_bwd_prepare(p, &fa3, why, sizeof why)) return fa3_bwd(p, fa3, workspace, workspace_bytes, stream);
    }
    if (forced == ForcedPath::kFa3)
      return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                  "FLASHATTN_CUDA_BACKWARD=fa3: the fa3 backward does not serve this run: %s", why);
  }
  return fa2_bwd(p, workspace, workspace_bytes, stream);
}

CheckedSize cuda_flash_bwd_workspace_size(const AttnParams& p) {
  return fp32_serves(p) ? fp32_bwd_workspace_size(p) : fa2_bwd_workspace_size(p);
}

}  // namespace flashattn
