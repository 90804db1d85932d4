// Where the CUDA paths lay out their buffers in the caller's workspace: from its first
// 256-byte boundary (their sizes include the slack to reach it).
#include <stdint.h>

#include "cuda/launch.hpp"
#include "error.hpp"

namespace flashattn {

flashattn_status_t workspace_at_boundary(void* workspace, size_t workspace_bytes, size_t need, const char* who,
                                         char** at) {
  const size_t pad = (256 - reinterpret_cast<uintptr_t>(workspace) % 256) % 256;
  if (need > 0 && (workspace == nullptr || workspace_bytes < pad || workspace_bytes - pad < need))
    return fail(FLASHATTN_STATUS_WORKSPACE_TOO_SMALL,
                "workspace=%p with workspace_bytes=%zu: %s %zu bytes from the first 256-byte boundary (%zu bytes in)",
                workspace, workspace_bytes, who, need, pad);
  *at = workspace == nullptr ? nullptr : static_cast<char*>(workspace) + pad;
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace flashattn
