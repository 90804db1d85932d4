// FLASHATTN_CUDA_FORWARD and the choice between the fa2 and fa3 forward (forward_path.hpp).
#include "cuda/forward_path.hpp"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/launch.hpp"
#include "error.hpp"

namespace flashattn {
namespace {

enum class ForcedPath { kAuto, kFa2, kFa3, kInvalid };

// The variable's value ("" when unset), copied at the first forward of the process (no
// allocation: a longer value is cut to the buffer, which keeps it invalid).
struct PathValue {
  char text[64];
};
const char* forced_path_value() {
  static const PathValue value = [] {
    PathValue v{};
    const char* e = secure_getenv("FLASHATTN_CUDA_FORWARD");
    snprintf(v.text, sizeof v.text, "%s", e != nullptr ? e : "");
    return v;
  }();
  return value.text;
}

ForcedPath forced_path() {
  const char* v = forced_path_value();
  if (v[0] == '\0') return ForcedPath::kAuto;
  if (strcmp(v, "fa2") == 0) return ForcedPath::kFa2;
  if (strcmp(v, "fa3") == 0) return ForcedPath::kFa3;
  return ForcedPath::kInvalid;
}

// Where both families serve a run, fa3 is faster except at head dim 64 with at most 1024
// keys (0.89-0.99x of fa2 on an H200; docs/internals/kernels-fa3-forward.md).
bool fa2_is_faster(const AttnParams& p) { return p.head_dim_qk <= 64 && p.seqlen_k <= 1024; }

}  // namespace

flashattn_status_t cuda_flash_fwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const ForcedPath forced = forced_path();
  if (forced == ForcedPath::kInvalid)
    return fail(FLASHATTN_STATUS_INVALID_ARGUMENT,
                "FLASHATTN_CUDA_FORWARD=%s: expected fa2 or fa3 (or unset: the library picks the forward kernels)",
                forced_path_value());
  if (simt_serves(p)) return simt_fwd(p, stream);
  if (forced == ForcedPath::kFa3 || (forced == ForcedPath::kAuto && !fa2_is_faster(p))) {
    Fa3Fwd fa3;
    char why[256];
    if (fa3_fwd_prepare(p, &fa3, why, sizeof why)) return fa3_fwd(p, fa3, stream);
    if (forced == ForcedPath::kFa3)
      return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                  "FLASHATTN_CUDA_FORWARD=fa3: the fa3 forward does not serve this run: %s", why);
  }
  return fa2_fwd(p, workspace, workspace_bytes, stream);
}

CheckedSize cuda_flash_fwd_workspace_size(const AttnParams& p) {
  return simt_serves(p) ? CheckedSize(0) : fa2_fwd_workspace_size(p);
}

}  // namespace flashattn
