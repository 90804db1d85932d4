// FLASHATTN_CUDA_FORWARD and the choice between the fa2 and fa3 forward (forward_path.hpp).
#include "cuda/forward_path.hpp"

#include "cuda/kernel_path.hpp"
#include "cuda/launch.hpp"
#include "error.hpp"

namespace flashattn {
namespace {

// Where both families serve a run, fa3 is faster except under the causal mask at head dim 64
// with at most 512 keys, where the two are level (three 192-row tiles; fa3 0.98-1.02x of fa2
// on an H100), so fa2 keeps it; at 1024 keys fa3 runs 1.08x fa2 since its causal tiles are
// shifted by whole warpgroups and skip blocks above each warpgroup's diagonal
// (docs/internals/kernels-fa3-forward.md).
// Head dims up to 32 keep fa2's kernel of 32 columns: fa3's smallest instance would run twice
// the products on zero columns (not measured; the automatic choice stays what it was before
// fa3 served head dims below its instances).
bool fa2_is_faster(const AttnParams& p) {
  if (p.head_dim_qk <= 32 && p.head_dim_v <= 32) return true;
  return p.has_band && p.head_dim_qk <= 64 && p.seqlen_k <= 512;
}

}  // namespace

flashattn_status_t cuda_flash_fwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const ForcedPath forced = forced_path(PathVar::kForward);
  if (forced == ForcedPath::kInvalid)
    return fail(FLASHATTN_STATUS_INVALID_ARGUMENT,
                "FLASHATTN_CUDA_FORWARD=%s: expected fa2 or fa3 (or unset: the library picks the forward kernels)",
                forced_path_value(PathVar::kForward));
  if (fp32_serves(p)) return fp32_fwd(p, stream);
  if (forced == ForcedPath::kFa3 || (forced == ForcedPath::kAuto && !fa2_is_faster(p))) {
    char why[384];
    if (fa2_staging_bytes(p).value() > 0) {  // ok(): the API layer checked it
      flashattn_status_t status = FLASHATTN_STATUS_SUCCESS;
      if (fa3_fwd_staged(p, workspace, workspace_bytes, stream, &status, why, sizeof why)) return status;
    } else {
      Fa3Fwd fa3;
      if (fa3_fwd_prepare(p, &fa3, why, sizeof why)) return fa3_fwd(p, fa3, workspace, workspace_bytes, stream);
    }
    if (forced == ForcedPath::kFa3)
      return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                  "FLASHATTN_CUDA_FORWARD=fa3: the fa3 forward does not serve this run: %s", why);
  }
  return fa2_fwd(p, workspace, workspace_bytes, stream);
}

// fp32: the fp32 family's, none. Otherwise either family may run (the choice is made at run time, on
// the run's device): the larger of their workspaces.
CheckedSize cuda_flash_fwd_workspace_size(const AttnParams& p) {
  if (fp32_serves(p)) return CheckedSize(0);
  const CheckedSize fa2 = fa2_fwd_workspace_size(p);
  const int64_t fa3 = static_cast<int64_t>(fa3_fwd_workspace_size(p));
  return fa2.ok() && fa2.value() < fa3 ? CheckedSize(fa3) : fa2;
}

}  // namespace flashattn
