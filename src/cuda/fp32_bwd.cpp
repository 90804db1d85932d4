// Host side of the fp32 backward: its workspace (the Delta vector), and the launcher
// of the run's head-dim bucket (kernels/fp32/launchers.h; the steps: bwd_launch.cuh) with
// the shared memory the device allows (smem_limit).
#include <stdint.h>

#include "cuda/launch.hpp"
#include "error.hpp"

namespace flashattn {

// Delta from the first 256-byte boundary of the workspace.
CheckedSize fp32_bwd_workspace_size(const AttnParams& p) {
  // Q's validated byte size bounds the row count (one row per query token and head).
  return CheckedSize(lse_row_count(p)) * CheckedSize(sizeof(float)) + CheckedSize(255);
}

flashattn_status_t fp32_bwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (p.batch == 0 || p.heads_q == 0) return FLASHATTN_STATUS_SUCCESS;
  const size_t need = static_cast<size_t>(lse_row_count(p)) * sizeof(float);  // the API layer checked the size
  char* ws = nullptr;
  if (const flashattn_status_t s =
          workspace_at_boundary(workspace, workspace_bytes, need, "the fp32 backward needs", &ws))
    return s;
  float* delta = reinterpret_cast<float*>(ws);
  const fp32::Bucket& k = fp32::kBuckets[fp32_bucket(p)];  // fp32_check found one
  int dev = 0, limit = 0;
  if (const flashattn_status_t s = device_smem_limit("fp32 backward", &dev, &limit)) return s;
  const fp32::LaunchResult r = k.bwd(p, delta, limit, stream);
  if (r.err == cudaSuccess) return FLASHATTN_STATUS_SUCCESS;
  (void)cudaGetLastError();
  return fail(FLASHATTN_STATUS_LAUNCH_FAILED,
              "fp32 backward, %s kernel (head-dim bucket %d, %d bytes of shared memory, stream %p): launch "
              "failed: %s (%s)",
              r.step, k.d, r.smem, static_cast<void*>(stream), cudaGetErrorName(r.err), cudaGetErrorString(r.err));
}

}  // namespace flashattn
