// FLASHATTN_CUDA_BACKWARD and the choice between the fa2 and fa3 backward (backward_path.hpp).
#include "cuda/backward_path.hpp"

#include "cuda/kernel_path.hpp"
#include "cuda/launch.hpp"
#include "error.hpp"

namespace flashattn {
namespace {

// Where both families serve a run, whether the library takes fa3.
bool fa3_is_default(const AttnParams&) { return true; }

}  // namespace

flashattn_status_t cuda_flash_bwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const ForcedPath forced = forced_path(PathVar::kBackward);
  if (forced == ForcedPath::kInvalid)
    return fail(FLASHATTN_STATUS_INVALID_ARGUMENT,
                "FLASHATTN_CUDA_BACKWARD=%s: expected fa2 or fa3 (or unset: the library picks the backward kernels)",
                forced_path_value(PathVar::kBackward));
  if (forced == ForcedPath::kFa3 || (forced == ForcedPath::kAuto && fa3_is_default(p))) {
    Fa3Bwd fa3;
    char why[256];
    if (fa3_bwd_prepare(p, &fa3, why, sizeof why)) return fa3_bwd(p, fa3, workspace, workspace_bytes, stream);
    if (forced == ForcedPath::kFa3)
      return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                  "FLASHATTN_CUDA_BACKWARD=fa3: the fa3 backward does not serve this run: %s", why);
  }
  return fa2_bwd(p, workspace, workspace_bytes, stream);
}

CheckedSize cuda_flash_bwd_workspace_size(const AttnParams& p) { return fa2_bwd_workspace_size(p); }

}  // namespace flashattn
