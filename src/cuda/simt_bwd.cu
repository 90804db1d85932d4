// Host side of the fp32 SIMT backward (kernels/simt/bwd_*.cuh). Sequence on the caller's
// stream (no allocation, no synchronization):
//   1. Delta = rowsum(dO * O) into the workspace, zeroing dQ in the non-deterministic mode;
//   2. dK/dV kernel, which in the non-deterministic mode also adds dQ with atomics;
//   3. deterministic mode: the dQ kernel;
//   4. with a dbias output: the dBias kernel.
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/launch.hpp"
#include "error.hpp"
#include "simt/bwd_dbias.cuh"
#include "simt/bwd_dkdv.cuh"
#include "simt/bwd_dq.cuh"
#include "simt/bwd_prep.cuh"

namespace flashattn {
namespace {

// Delta rows: the LSE layout of the run.
CheckedSize delta_rows(const AttnParams& p) {
  return p.varlen ? checked_product(p.heads_q, p.total_q) : checked_product(p.batch, p.heads_q, p.seqlen_q);
}

// Launches kernel on `ctas` blocks (none when 0) with `smem` bytes of dynamic shared memory.
template <class Kernel>
cudaError_t launch(Kernel kernel, int64_t ctas, int smem, cudaStream_t stream, const AttnParams& p,
                   const float* delta) {
  if (ctas == 0) return cudaSuccess;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(ctas), simt::kThreads, smem, stream>>>(p, delta);
  return cudaGetLastError();
}

template <int D>
flashattn_status_t launch_bwd(const AttnParams& p, float* delta, cudaStream_t stream) {
  using T = simt::BwdTile<D>;
  const char* step = "Delta";
  const int64_t rows = delta_rows(p).value();  // ok(): part of the workspace size the API layer checked
  const int64_t prep_ctas = rows == 0 ? 0 : ((rows + 7) / 8 < 65536 ? (rows + 7) / 8 : 65536);
  cudaError_t err = cudaSuccess;
  if (prep_ctas > 0) {
    simt::bwd_prep_kernel<<<static_cast<unsigned>(prep_ctas), simt::kThreads, 0, stream>>>(p, delta,
                                                                                           !p.deterministic);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    step = "dK/dV";
    const int64_t ctas = (p.seqlen_k + T::Bc - 1) / T::Bc * p.heads_kv * p.batch;
    err = p.deterministic ? launch(simt::bwd_dkdv_kernel<D, false>, ctas, T::smem_bytes, stream, p, delta)
                          : launch(simt::bwd_dkdv_kernel<D, true>, ctas, T::smem_bytes, stream, p, delta);
  }
  if (err == cudaSuccess && p.deterministic) {
    step = "dQ";
    err = launch(simt::bwd_dq_kernel<D>, (p.seqlen_q + T::Br - 1) / T::Br * p.heads_q * p.batch, T::smem_bytes,
                 stream, p, delta);
  }
  if (err == cudaSuccess && p.dbias != nullptr && p.bias_kind == kBiasTensor) {
    step = "dBias";
    const simt::DbiasGrid g = simt::dbias_grid<D>(p);
    err = launch(simt::bwd_dbias_kernel<D>, g.nb * g.nh * g.nrb * g.ncb, T::smem_bytes, stream, p, delta);
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(FLASHATTN_STATUS_LAUNCH_FAILED,
                "fp32 SIMT backward, %s kernel (head-dim bucket %d, stream %p): launch failed: %s (%s)", step, D,
                static_cast<void*>(stream), cudaGetErrorName(err), cudaGetErrorString(err));
  }
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace

// Delta from the first 256-byte boundary of the workspace.
CheckedSize simt_bwd_workspace_size(const AttnParams& p) {
  return delta_rows(p) * CheckedSize(sizeof(float)) + CheckedSize(255);
}

flashattn_status_t simt_bwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (p.batch == 0 || p.heads_q == 0) return FLASHATTN_STATUS_SUCCESS;
  const size_t pad = (256 - reinterpret_cast<uintptr_t>(workspace) % 256) % 256;
  const size_t need = static_cast<size_t>(simt_bwd_workspace_size(p).value()) - 255;  // ok(): the API layer checked it
  if (need > 0 && (workspace == nullptr || workspace_bytes < pad || workspace_bytes - pad < need))
    return fail(FLASHATTN_STATUS_WORKSPACE_TOO_SMALL,
                "workspace=%p with workspace_bytes=%zu: the fp32 SIMT backward needs %zu bytes from the first "
                "256-byte boundary (%zu bytes in)",
                workspace, workspace_bytes, need, pad);
  float* delta = reinterpret_cast<float*>(static_cast<char*>(workspace) + pad);
  switch (simt_bucket(p)) {
    case 64: return launch_bwd<64>(p, delta, stream);
    case 128: return launch_bwd<128>(p, delta, stream);
    default: return launch_bwd<256>(p, delta, stream);
  }
}

}  // namespace flashattn
