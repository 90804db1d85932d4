// dev:: on the CUDA runtime (linked statically: the tool needs no libcudart, and with no
// driver cudaGetDeviceCount simply reports an error that query() turns into "none").
#include <cuda_runtime.h>

#include "cli.hpp"
#include "device.hpp"

namespace facli {
namespace dev {

static void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw RuntimeError(strf("CUDA runtime: %s failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e)));
}

bool built() { return true; }

std::vector<Props> query(std::string* why, bool free_memory) {
  std::vector<Props> out;
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = strf("cudaGetDeviceCount: %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
    (void)cudaGetLastError();
    return out;
  }
  if (n == 0 && why) *why = "the CUDA driver reports 0 devices";
  int current = 0;
  (void)cudaGetDevice(&current);
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    Props p;
    p.name = prop.name;
    p.cc_major = prop.major;
    p.cc_minor = prop.minor;
    p.sm_count = prop.multiProcessorCount;
    p.total_bytes = prop.totalGlobalMem;
    if (free_memory && cudaSetDevice(i) == cudaSuccess) {
      size_t f = 0, t = 0;
      if (cudaMemGetInfo(&f, &t) == cudaSuccess) p.free_bytes = f;
    }
    (void)cudaGetLastError();
    out.push_back(p);
  }
  (void)cudaSetDevice(current);
  return out;
}

void set_device(int device) { check(cudaSetDevice(device), strf("cudaSetDevice(%d)", device).c_str()); }

void* malloc(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes ? bytes : 1), strf("cudaMalloc(%zu bytes)", bytes).c_str());
  return p;
}

void free(void* p) noexcept {
  if (p) (void)cudaFree(p);
}

void upload(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy host to device");
}

void download(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy device to host");
}

void fill_bytes(void* dst, int value, size_t bytes) { check(cudaMemset(dst, value, bytes), "cudaMemset"); }

void synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

Timer::Timer() {
  cudaEvent_t a = nullptr, b = nullptr;
  check(cudaEventCreate(&a), "cudaEventCreate");
  const cudaError_t e = cudaEventCreate(&b);
  if (e != cudaSuccess) {
    (void)cudaEventDestroy(a);
    check(e, "cudaEventCreate");
  }
  start_ = a;
  stop_ = b;
}

Timer::~Timer() {
  (void)cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  (void)cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}

void Timer::start() { check(cudaEventRecord(static_cast<cudaEvent_t>(start_), nullptr), "cudaEventRecord"); }

double Timer::stop() {
  check(cudaEventRecord(static_cast<cudaEvent_t>(stop_), nullptr), "cudaEventRecord");
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)), "cudaEventSynchronize");
  float ms = 0.f;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)),
        "cudaEventElapsedTime");
  return ms;
}

}  // namespace dev
}  // namespace facli
