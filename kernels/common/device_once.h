// Once-per-device host set-up of the kernel launchers (cudaFuncSetAttribute: the attribute
// is per function and device).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

namespace flashattn {

// Runs set(dev) (returning a cudaError_t) for the current device dev unless it already succeeded
// there: bit dev of done records it for the first 64 devices, later ones run it every call.
// set must give the same result whichever thread runs it, so concurrent first calls need
// no lock.
template <class Set>
cudaError_t once_per_device(std::atomic<uint64_t>& done, Set set) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const uint64_t bit = dev < 64 ? (uint64_t{1} << dev) : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  err = set(dev);
  if (err == cudaSuccess && bit != 0) done.fetch_or(bit, std::memory_order_acq_rel);
  return err;
}

}  // namespace flashattn
