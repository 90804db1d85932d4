// Host side of the fp32 SIMT forward: runs the launcher of the run's head-dim bucket
// (kernels/simt/launchers.h) and reports a failed launch.
#include <stdint.h>

#include "cuda/launch.hpp"
#include "error.hpp"

namespace flashattn {

flashattn_status_t simt_fwd(const AttnParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return FLASHATTN_STATUS_SUCCESS;
  const simt::Bucket& k = simt::kBuckets[simt_bucket(p)];  // simt_check found one
  const simt::LaunchResult r = k.fwd(p, stream);
  if (r.err == cudaSuccess) return FLASHATTN_STATUS_SUCCESS;
  (void)cudaGetLastError();
  return fail(FLASHATTN_STATUS_LAUNCH_FAILED,
              "fp32 SIMT forward kernel (head-dim bucket %d, %d bytes of shared memory, stream %p): launch failed: "
              "%s (%s)",
              k.d, k.fwd_smem, static_cast<void*>(stream), cudaGetErrorName(r.err), cudaGetErrorString(r.err));
}

}  // namespace flashattn
