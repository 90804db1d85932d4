// Host side of the generation-1 forward pass: picks the (head_dim_qk, head_dim_v)
// configuration and dtype and calls its launcher (kernels/gen1/fwd_<cfg>_<dtype>.cu).
#include "cuda/launch.hpp"
#include "error.hpp"
#include "gen1/fwd.h"

namespace flashattn {

CheckedSize gen1_fwd_workspace_size(const AttnParams&) { return 0; }

namespace {
template <int D, int DV>
flashattn_status_t run_dtype(const AttnParams& p, cudaStream_t stream) {
  if (p.dtype == kBf16) return gen1::run_fwd<D, DV, kBf16>(p, stream);
  return gen1::run_fwd<D, DV, kFp16>(p, stream);
}
}  // namespace

flashattn_status_t gen1_fwd(const AttnParams& p, void* /*workspace*/, size_t /*workspace_bytes*/,
                            cudaStream_t stream) {
  if (p.dtype != kFp16 && p.dtype != kBf16)
    return fail(FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED,
                "dtype=%d: the gen1 CUDA kernels take fp16/bf16 tensors (fp32 runs on the CPU backend; or convert)",
                static_cast<int>(p.dtype));
  const int cfg = gen1::select_fwd_config(p.head_dim_qk, p.head_dim_v);
  if (cfg < 0)
    return fail(FLASHATTN_STATUS_HEAD_DIM_NOT_SUPPORTED,
                "head_dim_qk=%lld, head_dim_v=%lld: no gen1 forward kernel (head dims must be multiples of 8, <= 256)",
                static_cast<long long>(p.head_dim_qk), static_cast<long long>(p.head_dim_v));
  // Nothing to compute for empty problems (possible in varlen mode with total_q = 0).
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return FLASHATTN_STATUS_SUCCESS;
  switch (cfg) {
    case 0: return run_dtype<32, 32>(p, stream);
    case 1: return run_dtype<64, 64>(p, stream);
    case 2: return run_dtype<96, 96>(p, stream);
    case 3: return run_dtype<128, 128>(p, stream);
    case 4: return run_dtype<192, 128>(p, stream);
    case 5: return run_dtype<192, 192>(p, stream);
    case 6: return run_dtype<256, 256>(p, stream);
    default: break;
  }
  return fail(FLASHATTN_STATUS_INTERNAL_ERROR, "gen1 forward: configuration index %d has no launcher", cfg);
}

}  // namespace flashattn
