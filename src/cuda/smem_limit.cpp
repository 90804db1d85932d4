// The shared memory a block may use on the calling thread's device, as the fp32 forward
// and backward query it to choose their instances.
#include "cuda/launch.hpp"
#include "error.hpp"

namespace flashattn {

flashattn_status_t device_smem_limit(const char* who, int* device, int* limit) {
  int dev = 0, optin = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(FLASHATTN_STATUS_CUDA_ERROR, "%s: querying the shared memory limit failed: %s (%s)", who,
                cudaGetErrorName(err), cudaGetErrorString(err));
  }
  *device = dev;
  *limit = smem_limit(optin);
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace flashattn
