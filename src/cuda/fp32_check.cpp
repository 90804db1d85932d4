// Support checks of the fp32 kernels (kernels/fp32): everything a valid fp32 plan may
// still ask for that they cannot run is refused here, before any launch. Head dims 1..256,
// any strides and 4-byte alignment (the API layer's element alignment) are all served.
#include <stdint.h>

#include "cuda/fa2_arch.hpp"
#include "cuda/launch.hpp"
#include "error.hpp"

namespace flashattn {

flashattn_status_t fp32_check(const AttnParams& p, const cudaDeviceProp& prop) {
  // The fp32 kernels are compiled for the same targets as the fa2 ones.
  if (fa2_arch_for(prop.major, prop.minor) < 0)
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                "device %s has compute capability %d.%d; this build has no fp32 CUDA kernels for it (they need 8.0 "
                "or later among FLASHATTN_CUDA_ARCHITECTURES)",
                prop.name, prop.major, prop.minor);
  if (p.seqlen_q >= (int64_t{1} << 30) || p.seqlen_k >= (int64_t{1} << 30))
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                "seqlen_q=%lld, seqlen_k=%lld: the fp32 CUDA kernels support sequence lengths below 2^30",
                static_cast<long long>(p.seqlen_q), static_cast<long long>(p.seqlen_k));
  const int bucket = fp32_bucket(p);
  if (bucket < 0)
    return fail(FLASHATTN_STATUS_HEAD_DIM_NOT_SUPPORTED,
                "head_dim_qk=%lld, head_dim_v=%lld: the fp32 CUDA kernels serve head dims up to %d",
                static_cast<long long>(p.head_dim_qk), static_cast<long long>(p.head_dim_v),
                fp32::kBuckets[fp32::kNumBuckets - 1].d);
  const bool bwd = p.direction == kBackward;
  const int smem = bwd ? fp32::kBuckets[bucket].bwd_smem : fp32::kBuckets[bucket].fwd_smem;
  if (static_cast<size_t>(smem) > prop.sharedMemPerBlockOptin)
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                "head_dim_qk=%lld, head_dim_v=%lld: the fp32 CUDA %s kernel needs %d bytes of shared memory per "
                "block, device %s allows %zu",
                static_cast<long long>(p.head_dim_qk), static_cast<long long>(p.head_dim_v),
                bwd ? "backward" : "forward", smem, prop.name, static_cast<size_t>(prop.sharedMemPerBlockOptin));
  // 1-D grids of (query or key block, head, sequence) and of dBias tiles (at most one per
  // pair of blocks); blocks have at least 32 rows.
  const auto blocks = [](int64_t len) { return static_cast<double>((len + 31) / 32); };
  const bool dbias = bwd && p.bias_kind == kBiasTensor && p.dbias != nullptr;
  const double grids[3] = {blocks(p.seqlen_q) * p.heads_q * p.batch, blocks(p.seqlen_k) * p.heads_kv * p.batch,
                           dbias ? blocks(p.seqlen_q) * blocks(p.seqlen_k) * p.heads_q * p.batch : 0.0};
  for (double g : grids)
    if (g > INT32_MAX)
      return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                  "batch=%lld, heads_q=%lld, seqlen_q=%lld, seqlen_k=%lld: a grid of the fp32 CUDA kernels would "
                  "exceed 2^31-1 thread blocks",
                  static_cast<long long>(p.batch), static_cast<long long>(p.heads_q),
                  static_cast<long long>(p.seqlen_q), static_cast<long long>(p.seqlen_k));
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace flashattn
