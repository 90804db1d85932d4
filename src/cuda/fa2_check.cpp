// Support checks of the generation-1 CUDA kernels (forward and backward): everything a
// valid plan may still ask for that fa2 cannot run is refused here, before any launch.
#include <stdint.h>

#include <utility>

#include "cuda/fa2_arch.hpp"
#include "cuda/launch.hpp"
#include "error.hpp"
#include "fa2/fwd.h"

namespace flashattn {

namespace {

constexpr int64_t kMaxSeqlen = int64_t{1} << 30;  // positions are int32 in the kernels
// Sequence and head indices are int32 in the kernels. The grids have no other limit of
// their own: the forward's (query blocks, heads_q, batch) grid is launched in chunks of at
// most 65535 heads and sequences (the y/z limit), the backward's is 1-D (fa2_bwd checks
// its key blocks x heads_kv x batch <= 2^31 - 1), and offsets are 64-bit.
constexpr int64_t kMaxIndex = 2147483647;

flashattn_status_t check_ptr(const void* ptr, const char* name) {
  if (ptr != nullptr && (reinterpret_cast<uintptr_t>(ptr) & 15u) != 0)
    return fail(FLASHATTN_STATUS_MISALIGNED_POINTER,
                "%s=%p is not 16-byte aligned (the fa2 CUDA kernels use 16-byte vector loads/stores)", name, ptr);
  return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status_t check_strides(const Strides4& st, bool varlen, const char* name) {
  const int64_t v[3] = {st.b, st.s, st.h};
  const char* which[3] = {"batch", "seq", "head"};
  for (int i = varlen ? 1 : 0; i < 3; ++i)
    if (v[i] % 8 != 0)
      return fail(FLASHATTN_STATUS_MISALIGNED_POINTER,
                  "%s %s stride=%lld is not a multiple of 8 elements (the fa2 CUDA kernels use 16-byte vector "
                  "loads/stores)",
                  name, which[i], static_cast<long long>(v[i]));
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace

flashattn_status_t fa2_check(const AttnParams& p, const cudaDeviceProp& prop) {
  if (prop.major < 8)
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                "device %s has compute capability %d.%d; the fa2 CUDA kernels need 8.0 (Ampere) or later", prop.name,
                prop.major, prop.minor);
  if (fa2_arch_for(prop.major, prop.minor) < 0)
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                "device %s has compute capability %d.%d; this build has no fa2 kernels for it "
                "(FLASHATTN_CUDA_ARCHITECTURES)",
                prop.name, prop.major, prop.minor);
  if (p.dtype != kFp16 && p.dtype != kBf16)
    return fail(FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED,
                "dtype=%s: the fa2 CUDA kernels take fp16/bf16 tensors (fp32 runs on the fp32 kernels)",
                p.dtype == kFp32 ? "FP32" : "unknown");
  // Head dims 1..256 (the plan's limit); one that is not a multiple of 8 runs the kernels of
  // the next multiple on zero-padded workspace copies (fa2_staging.cu).
  const AttnParams kp = fa2_kernel_shape(p);
  if (fa2::select_fwd_config(kp.head_dim_qk, kp.head_dim_v) < 0)
    return fail(FLASHATTN_STATUS_HEAD_DIM_NOT_SUPPORTED,
                "head_dim_qk=%lld, head_dim_v=%lld: no fa2 kernel configuration", static_cast<long long>(p.head_dim_qk),
                static_cast<long long>(p.head_dim_v));
  if (p.seqlen_q >= kMaxSeqlen || p.seqlen_k >= kMaxSeqlen)
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                "seqlen_q=%lld, seqlen_k=%lld: the fa2 CUDA kernels support sequence lengths below 2^30",
                static_cast<long long>(p.seqlen_q), static_cast<long long>(p.seqlen_k));
  if (p.batch > kMaxIndex || p.heads_q > kMaxIndex)
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                "batch=%lld, heads_q=%lld: the fa2 CUDA kernels index sequences and heads with 32-bit integers "
                "(at most %lld each)",
                static_cast<long long>(p.batch), static_cast<long long>(p.heads_q), static_cast<long long>(kMaxIndex));

  // The kernels' 16-byte vector loads and stores: tensors they access directly need 16-byte
  // aligned pointers and strides; staged ones are copied in accesses as wide as their own
  // alignment allows (element by element at worst: fa2_staging.cu).
  const bool varlen = p.varlen != 0;
  const bool qk_direct = !fa2_staged_dim(p.head_dim_qk), v_direct = !fa2_staged_dim(p.head_dim_v);
  const bool bwd = p.direction == kBackward;
  const struct {
    bool direct;
    const void* ptr;
    const Strides4& stride;
    const char* name;
  } tensors[] = {{qk_direct, p.q, p.q_stride, "q"},
                 {qk_direct, p.k, p.k_stride, "k"},
                 {v_direct, p.v, p.v_stride, "v"},
                 {v_direct, bwd ? p.o_in : p.o, p.o_stride, "o"},
                 {v_direct && bwd, p.dout, p.do_stride, "dout"},
                 {qk_direct && bwd, p.dq, p.dq_stride, "dq"},
                 {qk_direct && bwd, p.dk, p.dk_stride, "dk"},
                 {v_direct && bwd, p.dv, p.dv_stride, "dv"}};
  // Inputs q, k, v, then the pass's other tensors; pointers of a group before its strides.
  for (const auto& group : {std::make_pair(0, 3), std::make_pair(3, 8)}) {
    for (int i = group.first; i < group.second; ++i)
      if (tensors[i].direct)
        if (const flashattn_status_t st = check_ptr(tensors[i].ptr, tensors[i].name)) return st;
    for (int i = group.first; i < group.second; ++i)
      if (tensors[i].direct)
        if (const flashattn_status_t st = check_strides(tensors[i].stride, varlen, tensors[i].name)) return st;
  }
  if (!bwd) {
    const int cfg = fa2::select_fwd_config(kp.head_dim_qk, kp.head_dim_v);
    const int smem = fa2::fwd_tile(fa2::kFwdInstances[cfg].d, fa2::kFwdInstances[cfg].dv).smem_bytes();
    if (static_cast<size_t>(smem) > prop.sharedMemPerBlockOptin)
      return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                  "head_dim_qk=%lld, head_dim_v=%lld: the fa2 forward kernel needs %d bytes of shared memory per "
                  "block, device %s allows %zu",
                  static_cast<long long>(p.head_dim_qk), static_cast<long long>(p.head_dim_v), smem, prop.name,
                  static_cast<size_t>(prop.sharedMemPerBlockOptin));
  }
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace flashattn
