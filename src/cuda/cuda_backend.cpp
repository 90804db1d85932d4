// The CUDA backend's entry points (src/backends.hpp) for a build with CUDA.
//
// The CUDA runtime is linked statically, so this file is also what runs on a machine
// with no driver: every runtime error while probing devices counts as "no device" and
// the API layer falls back to (or reports) the CPU backend; nothing here aborts.
//
// Device discipline: every function that touches a device sets the plan's device for
// the duration of the call through DeviceGuard and restores the caller's current
// device afterwards, so a caller working on device 1 can run a plan of device 0.
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <new>

#include "backends.hpp"
#include "common/run_pointers.hpp"
#include "cuda/backward_path.hpp"
#include "cuda/forward_path.hpp"
#include "cuda/launch.hpp"
#include "error.hpp"

namespace flashattn {
namespace {

// Probed once per process: the runtime itself latches a "no driver" error, and the
// device count of a process never changes.
int probe_device_count() {
  static std::once_flag once;
  static int count = 0;
  std::call_once(once, [] {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      // cudaErrorNoDevice (100), cudaErrorInsufficientDriver (35), cudaErrorUnknown (999),
      // ...: no usable device. Clear the sticky per-thread error so later calls see none.
      (void)cudaGetLastError();
      n = 0;
    }
    count = n < 0 ? 0 : n;
  });
  return count;
}

// Sets `device` current while alive and restores the caller's device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : target_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device) {
      err_ = cudaSetDevice(device);
      if (err_ != cudaSuccess) (void)cudaGetLastError();
      switched_ = err_ == cudaSuccess;
    }
  }
  ~DeviceGuard() {
    if (switched_ && previous_ >= 0) {
      if (cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  // Fails with CUDA_ERROR when the device could not be made current.
  flashattn_status_t status() const {
    if (err_ == cudaSuccess) return FLASHATTN_STATUS_SUCCESS;
    return fail(FLASHATTN_STATUS_CUDA_ERROR, "cudaSetDevice(%d) failed: %s (%s)", target_, cudaGetErrorName(err_),
                cudaGetErrorString(err_));
  }

 private:
  int target_;
  int previous_ = -1;
  bool switched_ = false;
  cudaError_t err_ = cudaSuccess;
};

// cudaDeviceProp per device, queried once (cudaGetDeviceProperties is not free and
// runs on every cuda_check). Entries are never erased, so returned pointers stay valid.
// `device` has passed cuda_check_device, so it is below the process's device count.
flashattn_status_t device_prop(int device, const cudaDeviceProp** out) {
  static std::mutex mu;
  static std::unique_ptr<std::unique_ptr<cudaDeviceProp>[]> cache;  // [probe_device_count()]
  std::lock_guard<std::mutex> lock(mu);
  if (!cache) {
    const size_t count = static_cast<size_t>(probe_device_count());
    cache.reset(new (std::nothrow) std::unique_ptr<cudaDeviceProp>[count]);
    if (!cache)
      return fail_allocation("the CUDA device property cache (one pointer per device)",
                             count * sizeof(std::unique_ptr<cudaDeviceProp>));
  }
  std::unique_ptr<cudaDeviceProp>& entry = cache[static_cast<size_t>(device)];
  if (!entry) {
    std::unique_ptr<cudaDeviceProp> prop(new (std::nothrow) cudaDeviceProp());
    if (!prop)
      return fail_allocation("the cached properties of a CUDA device (cudaDeviceProp)", sizeof(cudaDeviceProp));
    const cudaError_t err = cudaGetDeviceProperties(prop.get(), device);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return fail(FLASHATTN_STATUS_CUDA_ERROR, "cudaGetDeviceProperties(device=%d) failed: %s (%s)", device,
                  cudaGetErrorName(err), cudaGetErrorString(err));
    }
    entry = std::move(prop);
  }
  *out = entry.get();
  return FLASHATTN_STATUS_SUCCESS;
}

// Whether ptr may be read/written by kernels on `device`: device memory of that
// device, managed memory, or page-locked host memory (mapped, reachable through UVA).
// Unregistered host memory and memory of another device are refused.
flashattn_status_t check_pointer(const void* ptr, const char* name, int device) {
  if (ptr == nullptr) return FLASHATTN_STATUS_SUCCESS;
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (err == cudaErrorInvalidValue) {
      // Older drivers report unregistered host memory this way.
      return fail(FLASHATTN_STATUS_WRONG_MEMORY_SPACE,
                  "%s=%p is host memory; the CUDA backend needs device memory of device %d", name, ptr, device);
    }
    return fail(FLASHATTN_STATUS_CUDA_ERROR, "cudaPointerGetAttributes(%s=%p) failed: %s (%s)", name, ptr,
                cudaGetErrorName(err), cudaGetErrorString(err));
  }
  switch (attr.type) {
    case cudaMemoryTypeUnregistered:
      return fail(FLASHATTN_STATUS_WRONG_MEMORY_SPACE,
                  "%s=%p is host memory; the CUDA backend needs device memory of device %d", name, ptr, device);
    case cudaMemoryTypeDevice:
      if (attr.device != device) {
        return fail(FLASHATTN_STATUS_WRONG_MEMORY_SPACE, "%s=%p is memory of device %d; the plan runs on device %d",
                    name, ptr, attr.device, device);
      }
      return FLASHATTN_STATUS_SUCCESS;
    case cudaMemoryTypeManaged: return FLASHATTN_STATUS_SUCCESS;
    case cudaMemoryTypeHost:
      // Page-locked host memory: reachable from the device only if mapped.
      if (attr.devicePointer == nullptr) {
        return fail(FLASHATTN_STATUS_WRONG_MEMORY_SPACE, "%s=%p is page-locked host memory not mapped into device %d",
                    name, ptr, device);
      }
      return FLASHATTN_STATUS_SUCCESS;
  }
  return fail(FLASHATTN_STATUS_WRONG_MEMORY_SPACE, "%s=%p has unknown CUDA memory type %d", name, ptr,
              static_cast<int>(attr.type));
}

}  // namespace

bool cuda_built() { return true; }

int cuda_device_count() { return probe_device_count(); }

flashattn_status_t cuda_check_device(int device) {
  const int count = probe_device_count();
  if (count == 0) {
    return fail(FLASHATTN_STATUS_BACKEND_UNAVAILABLE,
                "backend=CUDA, device=%d: no CUDA device is usable (no driver or 0 devices)", device);
  }
  if (device < 0 || device >= count) {
    return fail(FLASHATTN_STATUS_NO_DEVICE, "device=%d is out of range: %d CUDA device%s present (valid 0..%d)", device,
                count, count == 1 ? " is" : "s are", count - 1);
  }
  return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status_t cuda_upload(int device, const void* host, size_t bytes, void** device_copy) {
  if (device_copy == nullptr) return fail(FLASHATTN_STATUS_INTERNAL_ERROR, "cuda_upload: device_copy is NULL");
  if (host == nullptr && bytes > 0) return fail(FLASHATTN_STATUS_INTERNAL_ERROR, "cuda_upload: host is NULL");
  if (const flashattn_status_t s = cuda_check_device(device)) return s;
  DeviceGuard guard(device);
  if (const flashattn_status_t s = guard.status()) return s;
  void* d = nullptr;
  cudaError_t err = cudaMalloc(&d, bytes > 0 ? bytes : 1);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(FLASHATTN_STATUS_CUDA_ERROR,
                "cudaMalloc(%zu bytes) on device %d for the block-sparse layout failed: %s (%s)", bytes, device,
                cudaGetErrorName(err), cudaGetErrorString(err));
  }
  if (bytes > 0) {
    err = cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      (void)cudaFree(d);
      (void)cudaGetLastError();
      return fail(FLASHATTN_STATUS_CUDA_ERROR,
                  "cudaMemcpy of the block-sparse layout (%zu bytes) to device %d failed: %s (%s)", bytes, device,
                  cudaGetErrorName(err), cudaGetErrorString(err));
    }
  }
  *device_copy = d;
  return FLASHATTN_STATUS_SUCCESS;
}

void cuda_free(int device, void* device_ptr) {
  if (device_ptr == nullptr) return;
  DeviceGuard guard(device);
  if (cudaFree(device_ptr) != cudaSuccess) (void)cudaGetLastError();
}

CheckedSize cuda_workspace_size(const AttnParams& p, int device) {
  if (p.kv_enabled) {
    // A device that cannot be queried fails the run's checks before the workspace is read.
    const cudaDeviceProp* prop = nullptr;
    if (cuda_check_device(device) != FLASHATTN_STATUS_SUCCESS || device_prop(device, &prop) != FLASHATTN_STATUS_SUCCESS)
      return 0;
    return decode_workspace_size(p, *prop);
  }
  if (p.algorithm == FLASHATTN_ALGORITHM_STANDARD) return standard_workspace_size(p);
  return p.direction == kBackward ? cuda_flash_bwd_workspace_size(p) : cuda_flash_fwd_workspace_size(p);
}

flashattn_status_t cuda_check(const AttnParams& p, int device) {
  if (const flashattn_status_t s = cuda_check_device(device)) return s;
  for (const NamedPointer& n : run_pointers(p)) {
    if (const flashattn_status_t s = check_pointer(n.ptr, n.name, device)) return s;
  }
  if (p.algorithm == FLASHATTN_ALGORITHM_STANDARD) {
    DeviceGuard guard(device);  // standard_check may create a cuBLAS handle on this device
    if (const flashattn_status_t s = guard.status()) return s;
    return standard_check(p);
  }
  const cudaDeviceProp* prop = nullptr;
  if (const flashattn_status_t s = device_prop(device, &prop)) return s;
  if (p.kv_enabled) return decode_check(p, *prop);
  return fp32_serves(p) ? fp32_check(p, *prop) : fa2_check(p, *prop);
}

namespace {

// Before a launch on `st` (the device already current): clears a non-sticky error the
// caller left pending (e.g. a failed cudaMalloc nobody checked), which this call's launch
// checks would read back as their own, and refuses a stream of another device, which
// fails every launch on it, before anything is written. (A destroyed stream is undefined
// behaviour in CUDA, not detectable.) The special handles need no check. While the stream
// is being captured into a CUDA graph the runtime refuses the device query
// (cudaErrorStreamCaptureUnsupported, which would also invalidate the capture), so a
// capturing stream is not asked; a stream of another device then fails the capture.
flashattn_status_t prepare_stream(cudaStream_t st, int device) {
  (void)cudaGetLastError();
  if (st == nullptr || st == cudaStreamLegacy || st == cudaStreamPerThread) return FLASHATTN_STATUS_SUCCESS;
  const auto unusable = [st](cudaError_t e) {
    (void)cudaGetLastError();
    return fail(FLASHATTN_STATUS_CUDA_ERROR, "stream=%p is not a usable CUDA stream: %s (%s)", static_cast<void*>(st),
                cudaGetErrorName(e), cudaGetErrorString(e));
  };
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (const cudaError_t e = cudaStreamIsCapturing(st, &capture)) return unusable(e);
  if (capture == cudaStreamCaptureStatusNone) {
    int stream_device = -1;
    if (const cudaError_t e = cudaStreamGetDevice(st, &stream_device)) return unusable(e);
    if (stream_device != device)
      return fail(FLASHATTN_STATUS_INVALID_ARGUMENT, "stream=%p belongs to CUDA device %d; the plan runs on device %d",
                  static_cast<void*>(st), stream_device, device);
  }
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace

flashattn_status_t cuda_combine(const CombineParams& c, int device, struct CUstream_st* stream) {
  if (const flashattn_status_t s = cuda_check_device(device)) return s;
  const struct {
    const void* ptr;
    const char* name;
  } ptrs[] = {
      {c.o_partial, "args.o_partial"}, {c.lse_partial, "args.lse_partial"}, {c.o, "args.o"}, {c.lse, "args.lse"}};
  for (const auto& n : ptrs)
    if (const flashattn_status_t s = check_pointer(n.ptr, n.name, device)) return s;
  DeviceGuard guard(device);
  if (const flashattn_status_t s = guard.status()) return s;
  if (const flashattn_status_t s = prepare_stream(stream, device)) return s;
  return combine_launch(c, stream, false);
}

flashattn_status_t cuda_run(const AttnParams& p, int device, void* workspace, size_t workspace_bytes,
                            struct CUstream_st* stream) {
  if (workspace != nullptr) {
    if (const flashattn_status_t s = check_pointer(workspace, "workspace", device)) return s;
  }
  DeviceGuard guard(device);
  if (const flashattn_status_t s = guard.status()) return s;
  const cudaStream_t st = stream;
  if (const flashattn_status_t s = prepare_stream(st, device)) return s;
  if (p.kv_enabled) {
    const cudaDeviceProp* prop = nullptr;
    if (const flashattn_status_t s = device_prop(device, &prop)) return s;
    return decode_fwd(p, *prop, workspace, workspace_bytes, st);
  }
  flashattn_status_t s;
  if (p.algorithm == FLASHATTN_ALGORITHM_STANDARD)
    s = p.direction == kBackward ? standard_bwd(p, workspace, workspace_bytes, st)
                                 : standard_fwd(p, workspace, workspace_bytes, st);
  else
    s = p.direction == kBackward ? cuda_flash_bwd(p, workspace, workspace_bytes, st)
                                 : cuda_flash_fwd(p, workspace, workspace_bytes, st);
  return s == FLASHATTN_STATUS_SUCCESS ? write_varlen_tail(p, st) : s;
}

}  // namespace flashattn
