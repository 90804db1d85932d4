// The one place that picks the architecture policy of the fa2 kernels (kernels/fa2/arch.h)
// for a device. sm_90a machine code runs only on compute capability 9.0 (H100, H200); the
// Sm80 code (sm_80 machine code, compute_90 PTX that the driver compiles for newer GPUs)
// serves every other device from 8.0 on, and 9.0 too in a build without the Sm90a policy
// (e.g. FLASHATTN_CUDA_ARCHITECTURES=80-virtual runs the Sm80 code on an H100).
#pragma once
#include <cuda_runtime.h>

#include "fa2/launchers.h"

namespace flashattn {

// The ArchId whose code runs on compute capability (cc_major, cc_minor), or -1 when this
// build compiled no policy for it.
inline int fa2_arch_for(int cc_major, int cc_minor) {
  if (cc_major == 9 && cc_minor == 0 && fa2::kArchBuilt[fa2::kArchSm90a]) return fa2::kArchSm90a;
  if (cc_major >= 8 && fa2::kArchBuilt[fa2::kArchSm80]) return fa2::kArchSm80;
  return -1;
}

// fa2_arch_for of device `device` (*arch untouched when a query fails).
inline cudaError_t fa2_device_arch(int device, int* arch) {
  int major = 0, minor = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err == cudaSuccess) *arch = fa2_arch_for(major, minor);
  return err;
}

}  // namespace flashattn
