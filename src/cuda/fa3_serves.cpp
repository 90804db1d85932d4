// The checks the fa3 forward and backward share (fa3_serves.hpp).
#include "cuda/fa3_serves.hpp"

#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>

#include "fa3/launchers.h"

namespace flashattn {

bool fa3_refuse(char* why, size_t why_size, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, why_size, fmt, ap);
  va_end(ap);
  return false;
}

bool fa3_serves_options(const AttnParams& p, char* why, size_t why_size) {
  const auto ll = [](int64_t v) { return static_cast<long long>(v); };
  if (!fa3::kBuilt) return fa3_refuse(why, why_size, "this build has no sm_90a kernels (FLASHATTN_CUDA_ARCHITECTURES)");
  int device = 0, major = 0, minor = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fa3_refuse(why, why_size, "querying the device's compute capability failed: %s", cudaGetErrorString(err));
  }
  if (major != 9 || minor != 0)
    return fa3_refuse(why, why_size, "device %d has compute capability %d.%d; fa3 runs on 9.0 only", device, major,
                      minor);
  if (p.dtype != kFp16 && p.dtype != kBf16)
    return fa3_refuse(why, why_size, "dtype=%d: fa3 takes fp16 and bf16", static_cast<int>(p.dtype));
  if (p.varlen) return fa3_refuse(why, why_size, "variable-length batches run on fa2");
  if (p.kv_enabled) return fa3_refuse(why, why_size, "KV-cache runs run on fa2");
  if (p.bias_kind != kBiasNone)
    return fa3_refuse(why, why_size, "bias_kind=%d: bias tensors and ALiBi (any batch stride) run on fa2",
                      static_cast<int>(p.bias_kind));
  if (p.softcap > 0.f) return fa3_refuse(why, why_size, "softcap=%g runs on fa2", static_cast<double>(p.softcap));
  if (p.p_drop > 0.f) return fa3_refuse(why, why_size, "dropout p=%g runs on fa2", static_cast<double>(p.p_drop));
  if (p.layout != nullptr) return fa3_refuse(why, why_size, "block-sparse layouts run on fa2");
  if (p.has_band && !(p.window_right == 0 && p.window_left < 0))
    return fa3_refuse(why, why_size,
                      "window_left=%lld, window_right=%lld: fa3 serves the causal mask only (right 0, left unbounded)",
                      ll(p.window_left), ll(p.window_right));
  return true;
}

}  // namespace flashattn
