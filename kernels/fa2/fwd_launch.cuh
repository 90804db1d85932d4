// Host launcher template of the generation-1 forward kernel; each generated translation
// unit (kernels/fa2/instances/fwd_<cfg>_<dtype>_<arch>.cu) explicitly instantiates one run_fwd.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/philox.h"
#include "fa2/fwd.h"
#include "fa2/fwd_kernel.cuh"

namespace flashattn {
namespace fa2 {

template <int kDtype>
struct DtypeToElem;
template <>
struct DtypeToElem<kFp16> {
  using type = __half;
};
template <>
struct DtypeToElem<kBf16> {
  using type = __nv_bfloat16;
};

template <class Arch, typename Cfg, typename T, bool kExtras>
FwdLaunchResult launch_fwd(const AttnParams& p, cudaStream_t stream) {
  auto kernel = fwd_kernel<Arch, Cfg, T, kExtras>;
  FwdLaunchResult r{};
  // Bias tiles go through shared memory when the bias rows allow 16-byte copies and the
  // device has room for the extra tile; otherwise the kernel reads the bias directly.
  // seqlen_k % 8 == 0 too: else the last 16-byte chunk of the tensor's last row would name
  // bytes past the tensor (cp.async zero-fills them without reading, but compute-sanitizer
  // memcheck reports the copy as an out-of-bounds read, and the memory may not exist).
  // The Sm90a code's wgmma tiles start at the first 1024-byte boundary of the dynamic shared
  // memory (fwd_kernel.cuh): kFwdWgAlign bytes of slack.
  int device = 0;
  r.step = kFwdQueryDevice;
  r.err = cudaGetDevice(&device);
  if (r.err != cudaSuccess) return r;
  const int base = Cfg::kSmemBytes + (Arch::kWgmma ? kFwdWgAlign : 0);
  int bias_smem = 0;
  r.smem = base;
  if (p.bias_kind == kBiasTensor && p.seqlen_k % 8 == 0 && p.bias_stride[3] == 1 && p.bias_stride[2] % 8 == 0 &&
      p.bias_stride[1] % 8 == 0 && p.bias_stride[0] % 8 == 0 && (reinterpret_cast<uintptr_t>(p.bias) & 15u) == 0) {
    int optin = 0;
    r.step = kFwdQueryOptin;
    r.err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (r.err != cudaSuccess) return r;
    if (base + Cfg::kBiasSmemBytes <= optin) {
      bias_smem = 1;
      r.smem += Cfg::kBiasSmemBytes;
    }
  }
  // Idempotent and cheap; done on every call so it holds for whichever device is current.
  r.step = kFwdSetSmem;
  r.err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, r.smem);
  if (r.err != cudaSuccess) return r;
  // One CTA per (m block, query head, sequence): grid (m_blocks, heads, batch), m block
  // fastest. heads_q and batch beyond the grid's y/z limit of 65535 are split into
  // chunks, one launch each (a single launch unless one of them exceeds 65535); the
  // kernel adds the chunk's first head h0 and sequence b0.
  constexpr int64_t kMaxGridYZ = 65535;
  const int64_t m_blocks = (p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;  // < 2^30: fa2_check
  r.step = kFwdLaunch;
  for (r.b0 = 0; r.b0 < p.batch; r.b0 += kMaxGridYZ) {
    for (r.h0 = 0; r.h0 < p.heads_q; r.h0 += kMaxGridYZ) {
      r.grid = dim3(static_cast<unsigned>(m_blocks),
                    static_cast<unsigned>(p.heads_q - r.h0 < kMaxGridYZ ? p.heads_q - r.h0 : kMaxGridYZ),
                    static_cast<unsigned>(p.batch - r.b0 < kMaxGridYZ ? p.batch - r.b0 : kMaxGridYZ));
      kernel<<<r.grid, Cfg::kThreads, r.smem, stream>>>(p, bias_smem, static_cast<int>(r.b0), static_cast<int>(r.h0));
      r.err = cudaGetLastError();
      if (r.err != cudaSuccess) return r;
    }
  }
  return r;
}

template <class Arch, int D, int DV, int kDtype>
FwdLaunchResult run_fwd(const AttnParams& p, cudaStream_t stream) {
  using Cfg = typename FwdTileFor<D, DV>::type;
  using CfgX = typename FwdTileFor<D, DV>::extras_type;
  using T = typename DtypeToElem<kDtype>::type;
  static_assert(Cfg::kSmemBytes == fwd_tile(D, DV).smem_bytes() && CfgX::kSmemBytes <= Cfg::kSmemBytes,
                "FwdTile::smem_bytes (tile_size.h) disagrees with FwdTraits (fwd_kernel.cuh)");
  const bool extras =
      p.softcap > 0.f || p.bias_kind != kBiasNone || dropout_active(p.drop_threshold) || p.layout != nullptr;
  return extras ? launch_fwd<Arch, CfgX, T, true>(p, stream) : launch_fwd<Arch, Cfg, T, false>(p, stream);
}

}  // namespace fa2
}  // namespace flashattn
