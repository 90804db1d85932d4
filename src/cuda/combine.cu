// Host side of flashattn_combine on CUDA: launches kernels/combine on the caller's stream
// (no allocation, no synchronization).
#include "combine/combine_kernel.cuh"
#include "cuda/launch.hpp"
#include "error.hpp"

namespace flashattn {

// Where the kernel's code for this device was compiled for compute capability 9.0 or later
// (so it holds the wait below), it is launched as a programmatic dependent of the grid
// before it: its CTAs may be resident before that grid ends (the decode kernel lets them
// start once all of its CTAs have) and wait in the kernel for its end, so the split-KV
// decode pays no launch gap between its two kernels. Otherwise, a plain launch.
flashattn_status_t combine_launch(const CombineParams& c, cudaStream_t stream) {
  const int threads = 256;
  const int64_t n = c.batch * c.seqlen_q * c.heads * c.head_dim;
  // A grid-stride loop: enough blocks to fill any current GPU several times over.
  const int64_t want = (n + threads - 1) / threads;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(want < 65536 ? want : 65536));
  cfg.blockDim = dim3(threads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  cudaFuncAttributes fa;
  if (cudaFuncGetAttributes(&fa, combine::combine_kernel) == cudaSuccess && fa.ptxVersion >= 90) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  const cudaError_t err = cudaLaunchKernelEx(&cfg, combine::combine_kernel, c);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(FLASHATTN_STATUS_LAUNCH_FAILED, "combine kernel launch failed: %s (%s)", cudaGetErrorName(err),
                cudaGetErrorString(err));
  }
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace flashattn
