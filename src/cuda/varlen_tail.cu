// Varlen tokens past the last offset (cu_seqlens_q[batch] <= t < total_q, and the same for
// keys) belong to no sequence. Their output rows are defined (docs/varlen.md): the forward
// writes O = 0 and LSE = -inf, the backward zero dQ, dK and dV rows (or, accumulating,
// leaves them as they are), whichever algorithm ran. The offsets live on the device, so one
// small grid-stride kernel reads them and touches only the uncovered rows (no work at all
// when the offsets end at the totals).
#include <math.h>

#include "cuda/launch.hpp"
#include "error.hpp"

namespace flashattn {
namespace {

// First uncovered token: the last offset, clamped to [0, total] (validated offsets on the
// CPU side cannot be checked here; a kernel never writes outside the tensors).
__device__ int64_t tail_start(const int32_t* cu, int64_t batch, int64_t total) {
  const int64_t end = cu[batch];
  return end < 0 ? 0 : (end > total ? total : end);
}

// Zeroes rows [start, total) x heads x dim of a strided [tokens, heads, dim] tensor whose
// elements are E-sized (the zero bit pattern is 0.0 in fp16, bf16 and fp32).
template <typename E>
__device__ void zero_rows(void* base, const Strides4& st, int64_t start, int64_t total, int64_t heads, int64_t dim,
                          int64_t first, int64_t step) {
  const int64_t n = (total - start) * heads * dim;
  for (int64_t x = first; x < n; x += step) {
    const int64_t tok = start + x / (heads * dim), r = x % (heads * dim);
    static_cast<E*>(base)[tok * st.s + (r / dim) * st.h + (r % dim) * st.d] = E(0);
  }
}

template <typename E>
__global__ void __launch_bounds__(256) varlen_tail_kernel(const AttnParams p) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t q0 = tail_start(p.cu_seqlens_q, p.batch, p.total_q);
  if (p.direction == kForward) {
    zero_rows<E>(p.o, p.o_stride, q0, p.total_q, p.heads_q, p.head_dim_v, first, step);
    if (p.lse != nullptr)
      for (int64_t x = first; x < (p.total_q - q0) * p.heads_q; x += step)
        p.lse[(x % p.heads_q) * p.total_q + q0 + x / p.heads_q] = -INFINITY;
    return;
  }
  if (p.grad_accumulate) return;  // accumulated gradients keep their values there
  const int64_t k0 = tail_start(p.cu_seqlens_k, p.batch, p.total_k);
  zero_rows<E>(p.dq, p.dq_stride, q0, p.total_q, p.heads_q, p.head_dim_qk, first, step);
  zero_rows<E>(p.dk, p.dk_stride, k0, p.total_k, p.heads_kv, p.head_dim_qk, first, step);
  zero_rows<E>(p.dv, p.dv_stride, k0, p.total_k, p.heads_kv, p.head_dim_v, first, step);
}

}  // namespace

flashattn_status_t write_varlen_tail(const AttnParams& p, cudaStream_t stream) {
  if (!p.varlen || (p.total_q == 0 && p.total_k == 0) || p.heads_q == 0) return FLASHATTN_STATUS_SUCCESS;
  if (p.dtype == kFp32) varlen_tail_kernel<uint32_t><<<32, 256, 0, stream>>>(p);
  else varlen_tail_kernel<uint16_t><<<32, 256, 0, stream>>>(p);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return fail(FLASHATTN_STATUS_LAUNCH_FAILED,
                "launching the varlen tail kernel (tokens past the last offset) failed: %s (%s)", cudaGetErrorName(err),
                cudaGetErrorString(err));
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace flashattn
