// Device memory for the harness (MemOps over cudaMalloc/cudaMemcpy) and the device check of
// the GPU test programs: every [gpu] test case starts with REQUIRE_GPU(), which prints the
// skip marker when the library has no CUDA backend or the machine no device. Only for
// programs linked with the CUDA runtime (tests/CMakeLists.txt, FLASHATTN_ENABLE_CUDA).
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>

#include "catch_compat.hpp"
#include "harness.hpp"

namespace fat {

inline bool have_gpu() { return flashattn_has_cuda_backend() && flashattn_cuda_device_count() > 0; }

#define REQUIRE_GPU()                                                                            \
  do {                                                                                           \
    if (!::fat::have_gpu()) FA_SKIP_TEST("no CUDA device (flashattn_cuda_device_count() == 0)"); \
  } while (0)

struct DeviceMem : MemOps {
  flashattn_backend_t backend() const override { return FLASHATTN_BACKEND_CUDA; }
  void* alloc(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 16));
    INFO("cudaMalloc(" << bytes << "): " << cudaGetErrorString(e));
    REQUIRE(e == cudaSuccess);
    return p;
  }
  void release(void* p) override { cudaFree(p); }
  void upload(void* dst, const void* src, size_t bytes) override {
    REQUIRE(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  void download(void* dst, const void* src, size_t bytes) override {
    REQUIRE(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  }
  void sync() override {
    const cudaError_t e = cudaDeviceSynchronize();
    INFO("cudaDeviceSynchronize: " << cudaGetErrorString(e));
    REQUIRE(e == cudaSuccess);
  }
};

}  // namespace fat
