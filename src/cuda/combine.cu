// Host side of flashattn_combine on CUDA: launches kernels/combine on the caller's stream
// (no allocation, no synchronization).
#include "combine/combine_kernel.cuh"
#include "cuda/launch.hpp"
#include "error.hpp"

namespace flashattn {

flashattn_status_t combine_launch(const CombineParams& c, cudaStream_t stream) {
  const int threads = 256;
  const int64_t n = c.batch * c.seqlen_q * c.heads * c.head_dim;
  // A grid-stride loop: enough blocks to fill any current GPU several times over.
  const int64_t want = (n + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(want < 65536 ? want : 65536);
  combine::combine_kernel<<<blocks, threads, 0, stream>>>(c);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return fail(FLASHATTN_STATUS_LAUNCH_FAILED, "combine kernel launch failed: %s (%s)", cudaGetErrorName(err),
                cudaGetErrorString(err));
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace flashattn
