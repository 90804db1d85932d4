// Host launcher template of the FA2-design backward main kernel; each generated translation
// unit (kernels/fa2/instances/bwd_<cfg>_<dtype>_<arch>.cu) explicitly instantiates one.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/device_once.h"
#include "fa2/bwd.h"
#include "fa2/bwd_kernel.cuh"

namespace flashattn {
namespace fa2 {

// Launcher body shared by the generated translation units.
template <class Arch, int D, int DV, int kDtype, int kVariant>
cudaError_t launch_bwd_main(const BwdArgs& args, int smem_bytes, cudaStream_t stream) {
  using Tr = typename BwdCfgFor<D, DV, kVariant>::type;
  using T = typename BwdElem<kDtype>::type;
  auto kernel = bwd_main_kernel<Arch, Tr, T>;
  // The attribute is per (function, device). It is set once per device, to the largest
  // size any call may pass there (2 stages if they fit the device's opt-in limit, else 1):
  // smem_bytes itself can vary between calls when FLASHATTN_CUDA_SMEM_LIMIT changes.
  // The value depends only on the device, so concurrent first calls need no lock.
  static std::atomic<uint64_t> attr_done{0};
  const cudaError_t err = once_per_device(attr_done, [&](int dev) {
    int optin = 0;
    const cudaError_t e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e != cudaSuccess) return e;
    const int two = Tr::smem_bytes(2, Arch::kSm90), one = Tr::smem_bytes(1, Arch::kSm90);
    int attr = two + kBwdStaticSmemSlack <= optin ? two : one;
    if (attr < smem_bytes) attr = smem_bytes;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, attr);
  });
  if (err != cudaSuccess) return err;
  const int64_t ctas = static_cast<int64_t>(args.n_kblocks) * args.p.heads_kv * args.p.batch;
  DqMapParam<Tr> map{};
  if constexpr (Tr::kDqBulk) {
    if (args.dq_map_ok) map = *args.dq_map;
  }
  QdoMapParam<Tr> qdo{};
  if constexpr (Tr::kTmaQdo) {
    if (args.qdo_map_ok) qdo = QdoMaps{args.qdo_maps[0], args.qdo_maps[1]};
  }
  kernel<<<dim3(static_cast<unsigned>(ctas)), dim3(Tr::kThreads), smem_bytes, stream>>>(args, map, qdo);
  return cudaGetLastError();
}

}  // namespace fa2
}  // namespace flashattn
