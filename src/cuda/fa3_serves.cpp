// The checks the fa3 forward and backward share (fa3_serves.hpp).
#include "cuda/fa3_serves.hpp"

#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>

#include "common/philox.h"
#include "cuda/tensor_map.hpp"
#include "error.hpp"

namespace flashattn {

bool fa3_refuse(char* why, size_t why_size, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, why_size, fmt, ap);
  va_end(ap);
  return false;
}

bool fa3_serves_options(const AttnParams& p, char* why, size_t why_size) {
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
  if (dropout_active(p.drop_threshold))
    return fa3_refuse(why, why_size, "dropout p=%g runs on fa2", static_cast<double>(p.p_drop));
  if (p.layout != nullptr) return fa3_refuse(why, why_size, "block-sparse layouts run on fa2");
  if (p.has_band && !(p.window_right == 0 && p.window_left < 0))
    return fa3_refuse(why, why_size,
                      "window_left=%lld, window_right=%lld: fa3 serves the causal mask only (right 0, left unbounded)",
                      ll(p.window_left), ll(p.window_right));
  return true;
}

void fa3_dims_text(char* text, size_t size, int n, Fa3HeadDims (*dims)(int)) {
  size_t used = 0;
  for (int i = 0; i < n && used < size; ++i) {
    const char* sep = i == 0 ? "" : i + 1 == n ? " and " : ", ";
    const Fa3HeadDims d = dims(i);
    used += static_cast<size_t>(snprintf(text + used, size - used, "%s%d/%d", sep, d.qk, d.v));
  }
}

bool fa3_encode_maps(const AttnParams& p, const Fa3Map* maps, int n, int swizzle_bytes, char* why, size_t why_size) {
  if (const char* missing = tensor_map_encoder_missing())
    return fa3_refuse(why, why_size, "the driver has no tensor-map encoder: %s", missing);
  for (int i = 0; i < n; ++i) {
    const Fa3Map& t = maps[i];
    if (!encode_rows_map_16bit(t.map, t.base, t.cols, t.rows, t.heads, p.batch, t.strides, t.box_rows, swizzle_bytes))
      return fa3_refuse(why, why_size,
                        "%s=%p, element strides (batch, seq, head) (%lld, %lld, %lld), %lld x %lld rows x %lld heads "
                        "x %lld: the copy engine refuses it (16-byte aligned pointer, byte strides multiples of 16 in "
                        "(0, 2^40)) or the driver refused the map",
                        t.name, t.base, ll(t.strides.b), ll(t.strides.s), ll(t.strides.h), ll(p.batch), ll(t.rows),
                        ll(t.heads), ll(t.cols));
  }
  return true;
}

}  // namespace flashattn
