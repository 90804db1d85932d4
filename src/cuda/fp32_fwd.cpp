// Host side of the fp32 forward: runs the launcher of the run's head-dim bucket
// (kernels/fp32/launchers.h) with the shared memory the device allows (smem_limit) and
// reports a failed launch.
#include <stdint.h>

#include "cuda/launch.hpp"
#include "error.hpp"

namespace flashattn {

flashattn_status_t fp32_fwd(const AttnParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return FLASHATTN_STATUS_SUCCESS;
  const fp32::Bucket& k = fp32::kBuckets[fp32_bucket(p)];  // fp32_check found one
  int dev = 0, limit = 0;
  if (const flashattn_status_t s = device_smem_limit("fp32 forward", &dev, &limit)) return s;
  const fp32::LaunchResult r = k.fwd(p, limit, stream);
  if (r.err == cudaSuccess) return FLASHATTN_STATUS_SUCCESS;
  (void)cudaGetLastError();
  return fail(FLASHATTN_STATUS_LAUNCH_FAILED,
              "fp32 forward kernel (head-dim bucket %d, %d bytes of shared memory, stream %p): launch failed: %s (%s)",
              k.d, r.smem, static_cast<void*>(stream), cudaGetErrorName(r.err), cudaGetErrorString(r.err));
}

}  // namespace flashattn
