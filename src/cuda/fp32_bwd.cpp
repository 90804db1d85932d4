// Host side of the fp32 backward: its workspace (the Delta vector), and the launcher
// of the run's head-dim bucket (kernels/fp32/launchers.h; the steps: bwd_launch.cuh).
#include <stdint.h>

#include "cuda/launch.hpp"
#include "error.hpp"

namespace flashattn {

// Delta from the first 256-byte boundary of the workspace.
CheckedSize fp32_bwd_workspace_size(const AttnParams& p) {
  const CheckedSize rows =
      p.varlen ? checked_product(p.heads_q, p.total_q) : checked_product(p.batch, p.heads_q, p.seqlen_q);
  return rows * CheckedSize(sizeof(float)) + CheckedSize(255);
}

flashattn_status_t fp32_bwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (p.batch == 0 || p.heads_q == 0) return FLASHATTN_STATUS_SUCCESS;
  const size_t pad = (256 - reinterpret_cast<uintptr_t>(workspace) % 256) % 256;
  const size_t need = static_cast<size_t>(fp32::delta_rows(p)) * sizeof(float);  // the API layer checked the size
  if (need > 0 && (workspace == nullptr || workspace_bytes < pad || workspace_bytes - pad < need))
    return fail(FLASHATTN_STATUS_WORKSPACE_TOO_SMALL,
                "workspace=%p with workspace_bytes=%zu: the fp32 backward needs %zu bytes from the first "
                "256-byte boundary (%zu bytes in)",
                workspace, workspace_bytes, need, pad);
  float* delta = reinterpret_cast<float*>(static_cast<char*>(workspace) + pad);
  const fp32::Bucket& k = fp32::kBuckets[fp32_bucket(p)];  // fp32_check found one
  const fp32::LaunchResult r = k.bwd(p, delta, stream);
  if (r.err == cudaSuccess) return FLASHATTN_STATUS_SUCCESS;
  (void)cudaGetLastError();
  return fail(FLASHATTN_STATUS_LAUNCH_FAILED,
              "fp32 backward, %s kernel (head-dim bucket %d, %d bytes of shared memory, stream %p): launch "
              "failed: %s (%s)",
              r.step, k.d, k.bwd_smem, static_cast<void*>(stream), cudaGetErrorName(r.err), cudaGetErrorString(r.err));
}

}  // namespace flashattn
