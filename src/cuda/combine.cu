// Host side of flashattn_combine on CUDA: launches kernels/combine on the caller's stream
// (no allocation, no synchronization).
#include "combine/combine_kernel.cuh"
#include "cuda/launch.hpp"
#include "error.hpp"

#include <atomic>

namespace flashattn {

namespace {

// Whether the combine kernel's code for the current device holds the grid-dependency wait
// (compiled for compute capability 9.0 or later: the device may run PTX of an older one),
// asked once per device (each time beyond the first 64 device ordinals).
bool combine_waits_for_its_grid() {
  constexpr int kKnownDevices = 64;
  static std::atomic<int> known[kKnownDevices];  // 0 not asked yet, 1 no wait, 2 waits
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const bool cached = dev >= 0 && dev < kKnownDevices;
  int k = cached ? known[dev].load(std::memory_order_relaxed) : 0;
  if (k == 0) {
    cudaFuncAttributes fa;
    const bool asked = cudaFuncGetAttributes(&fa, combine::combine_kernel) == cudaSuccess;
    if (!asked) (void)cudaGetLastError();
    k = asked && fa.ptxVersion >= 90 ? 2 : 1;
    if (cached && asked) known[dev].store(k, std::memory_order_relaxed);
  }
  return k == 2;
}

}  // namespace

// after_decode: the launch follows the split-KV decode kernel on the stream. Where the
// kernel's code holds the wait, it is then launched as a programmatic dependent of that
// grid: its CTAs may be resident before the decode ends (the decode lets them start once all
// of its CTAs have) and wait in the kernel for its end, so the split-KV decode pays no launch
// gap between its two kernels. A public flashattn_combine (anything may come before it on
// the caller's stream) is a plain launch.
flashattn_status_t combine_launch(const CombineParams& c, cudaStream_t stream, bool after_decode) {
  const int threads = 256;
  const int64_t n = c.batch * c.seqlen_q * c.heads * c.head_dim;
  // A grid-stride loop: enough blocks to fill any current GPU several times over.
  const int64_t want = (n + threads - 1) / threads;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(want < 65536 ? want : 65536));
  cfg.blockDim = dim3(threads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  if (after_decode && combine_waits_for_its_grid()) {
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
