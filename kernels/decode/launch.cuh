// The launch of the decode kernel (decode_kernel.cuh) for one architecture policy, over the
// dtype, padded head dim and ring depth of a run and, on Sm90a, whether its splits merge in
// clusters. src/cuda/decode.cu instantiates it for
// Sm80 and kernels/decode/instances/decode_sm90a.cu for Sm90a (declared extern below), each
// unit compiled for its policy's CUDA targets (kernels/instances.json), so sm_90
// instructions never reach sm_80 code.
#pragma once
#include <cuda_runtime.h>

#include "decode/decode_kernel.cuh"

namespace flashattn {
namespace decode {

// One decode launch: the kernel (padded head dim `dim` of 64, 128 or 256, `stages` of 2 or
// kStages<Arch, dim>), its grid, CTAs per cluster (Sm90a: `splits` where the splits merge
// in the cluster, else 1) and dynamic shared memory, and its arguments.
template <typename Arch>
struct Launch {
  int dim, stages;
  size_t smem;
  unsigned blocks, cluster;
  Parts parts;
  int splits, chunks;
  bool vec;
  MapsOf<Arch> maps;
};

template <typename Arch>
using KernelFn = void (*)(AttnParams, Parts, int, int, bool, MapsOf<Arch>);

template <typename Arch, typename T, int D, bool Cluster>
KernelFn<Arch> kernel_staged(int stages) {
  return stages == 2 ? decode_kernel<Arch, T, D, 2, Cluster> : decode_kernel<Arch, T, D, kStages<Arch, D>, Cluster>;
}

template <typename Arch, typename T, bool Cluster>
KernelFn<Arch> kernel_dims(int dim, int stages) {
  switch (dim) {
    case 64: return kernel_staged<Arch, T, 64, Cluster>(stages);
    case 128: return kernel_staged<Arch, T, 128, Cluster>(stages);
    default: return kernel_staged<Arch, T, 256, Cluster>(stages);
  }
}

template <typename Arch, typename T>
KernelFn<Arch> kernel_typed(int dim, int stages, bool cluster) {
  if constexpr (Arch::kSm90)
    if (cluster) return kernel_dims<Arch, T, true>(dim, stages);
  return kernel_dims<Arch, T, false>(dim, stages);
}

template <typename Arch>
KernelFn<Arch> kernel_of(const AttnParams& p, const Launch<Arch>& l) {
  return p.dtype == kBf16 ? kernel_typed<Arch, __nv_bfloat16>(l.dim, l.stages, l.cluster > 1)
                          : kernel_typed<Arch, __half>(l.dim, l.stages, l.cluster > 1);
}

// The threads of a CTA of the kernel of padded head dim `dim` (kBlockThreads: with the
// producer warp, 160).
template <typename Arch>
constexpr unsigned block_threads(int dim) {
  return dim == 64 ? kBlockThreads<Arch, 64> : dim == 128 ? kBlockThreads<Arch, 128> : kBlockThreads<Arch, 256>;
}

// Clusters of more than 8 CTAs (at most kMaxCluster on sm_90) are opted into per kernel.
constexpr unsigned kPortableCluster = 8, kMaxCluster = 16;

// Grants the kernel of l its dynamic shared memory, and clusters of l.cluster CTAs (before
// anything is enqueued).
template <typename Arch>
cudaError_t reserve(const AttnParams& p, const Launch<Arch>& l) {
  const cudaError_t err =
      cudaFuncSetAttribute(kernel_of(p, l), cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(l.smem));
  if (err != cudaSuccess || l.cluster <= kPortableCluster) return err;
  return cudaFuncSetAttribute(kernel_of(p, l), cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
}

// The launch configuration of l on st, its cluster dimension in *attr.
template <typename Arch>
cudaLaunchConfig_t launch_config(const Launch<Arch>& l, cudaStream_t st, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(l.blocks);
  cfg.blockDim = dim3(block_threads<Arch>(l.dim));
  cfg.dynamicSmemBytes = l.smem;
  cfg.stream = st;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = l.cluster;
  attr->val.clusterDim.y = attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// The most clusters of l.cluster CTAs of the kernel of l resident at once on the current
// device (after reserve).
template <typename Arch>
cudaError_t resident_clusters(const AttnParams& p, const Launch<Arch>& l, int* n) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = launch_config(l, nullptr, &attr);
  return cudaOccupancyMaxActiveClusters(n, kernel_of(p, l), &cfg);
}

// Enqueues the kernel of l on st.
template <typename Arch>
cudaError_t enqueue(const AttnParams& p, const Launch<Arch>& l, cudaStream_t st) {
  if (l.cluster > 1) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = launch_config(l, st, &attr);
    return cudaLaunchKernelEx(&cfg, kernel_of(p, l), p, l.parts, l.splits, l.chunks, l.vec, l.maps);
  }
  kernel_of(p, l)<<<l.blocks, block_threads<Arch>(l.dim), l.smem, st>>>(p, l.parts, l.splits, l.chunks, l.vec, l.maps);
  return cudaGetLastError();
}

// The Sm90a instances live in kernels/decode/instances/decode_sm90a.cu (compiled for the
// Sm90a targets only); every other unit that includes this header links to them.
extern template cudaError_t reserve<fa2::Sm90a>(const AttnParams& p, const Launch<fa2::Sm90a>& l);
extern template cudaError_t resident_clusters<fa2::Sm90a>(const AttnParams& p, const Launch<fa2::Sm90a>& l, int* n);
extern template cudaError_t enqueue<fa2::Sm90a>(const AttnParams& p, const Launch<fa2::Sm90a>& l, cudaStream_t st);

}  // namespace decode
}  // namespace flashattn
