// The one place that picks the architecture policy of the fa2 kernels (kernels/fa2/arch.h)
// for a device: sm_90a machine code runs only on compute capability 9.0 (H100, H200);
// every other device from 8.0 on runs the Sm80 code (sm_80 machine code on 8.x, the
// compute_90 PTX that the driver compiles on newer GPUs).
#pragma once
#include <cuda_runtime.h>

#include "fa2/instances.h"

namespace flashattn {

inline fa2::ArchId fa2_arch_for(int cc_major, int cc_minor) {
  return cc_major == 9 && cc_minor == 0 ? fa2::kArchSm90a : fa2::kArchSm80;
}

// The policy of device `device` (*arch untouched when a query fails).
inline cudaError_t fa2_device_arch(int device, fa2::ArchId* arch) {
  int major = 0, minor = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err == cudaSuccess) *arch = fa2_arch_for(major, minor);
  return err;
}

}  // namespace flashattn
