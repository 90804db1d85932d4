// Head dims that are not a multiple of 8 on the fa2 kernels.
//
// The kernels move rows in 16-byte chunks (8 elements), so they serve head dims that are
// multiples of 8 (each configuration every such dim up to its own). A head dim d with
// d % 8 != 0 runs them at d rounded up to a multiple of 8, on copies in the workspace: the
// tensors of that head dim (Q, K, dQ, dK for head_dim_qk; V, O, dO, dV for head_dim_v) are
// copied into dense zero-padded buffers, and the outputs are copied back without the extra
// columns (gradients that accumulate are copied in first). This is exact: zero columns add
// nothing to Q K^T, P V, rowsum(dO * O), dS K, dS^T Q or P^T dO, and the columns they fill
// in the outputs are dropped. The copies cost
// O(tokens x heads x d) memory traffic against the kernels' O(seqlen^2 x d) work, and they
// free the staged tensors from the kernels' 16-byte alignment rule: any element-aligned
// pointer and stride is read and written, in the widest accesses (up to 8 bytes) that the
// pointer, the strides and the head dim allow.
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/launch.hpp"
#include "error.hpp"

namespace flashattn {
namespace {

// One staged tensor: the caller's (pointer, strides), the dense copy's shape, and the
// field of the kernels' params that points at the copy.
struct Staged {
  const void* src;         // the caller's input ...
  void* dst;               // ... or output
  Strides4 stride;         // its strides
  int64_t rows, heads;     // tokens per batch entry (all tokens in varlen mode), heads
  int64_t dim;             // the caller's head dim; the copy has fa2_kernel_dim(dim) columns
  const void** kernel_in;  // kp's pointer to the copy (inputs) ...
  void** kernel_out;       // ... (outputs)
  Strides4* kernel_stride;
};

// The tensors a pass stages, in a fixed order (that of their workspace copies), with their
// kernel-side fields in kp.
int staged_tensors(const AttnParams& p, AttnParams& kp, Staged out[8]) {
  const bool qk = p.head_dim_qk % 8 != 0, v = p.head_dim_v % 8 != 0, bwd = p.direction == kBackward;
  const int64_t rq = p.varlen ? p.total_q : p.seqlen_q, rk = p.varlen ? p.total_k : p.seqlen_k;
  const int64_t hq = p.heads_q, hk = p.heads_kv, dqk = p.head_dim_qk, dv = p.head_dim_v;
  int n = 0;
  auto in = [&](bool on, const void* src, Strides4 st, int64_t rows, int64_t heads, int64_t dim, const void** kptr,
                Strides4* kst) {
    if (on) out[n++] = Staged{src, nullptr, st, rows, heads, dim, kptr, nullptr, kst};
  };
  auto outp = [&](bool on, void* dst, Strides4 st, int64_t rows, int64_t heads, int64_t dim, void** kptr,
                  Strides4* kst) {
    if (on) out[n++] = Staged{nullptr, dst, st, rows, heads, dim, nullptr, kptr, kst};
  };
  in(qk, p.q, p.q_stride, rq, hq, dqk, &kp.q, &kp.q_stride);
  in(qk, p.k, p.k_stride, rk, hk, dqk, &kp.k, &kp.k_stride);
  in(v, p.v, p.v_stride, rk, hk, dv, &kp.v, &kp.v_stride);
  if (bwd) {
    in(v, p.o_in, p.o_stride, rq, hq, dv, &kp.o_in, &kp.o_stride);
    in(v, p.dout, p.do_stride, rq, hq, dv, &kp.dout, &kp.do_stride);
    outp(qk, p.dq, p.dq_stride, rq, hq, dqk, &kp.dq, &kp.dq_stride);
    outp(qk, p.dk, p.dk_stride, rk, hk, dqk, &kp.dk, &kp.dk_stride);
    outp(v, p.dv, p.dv_stride, rk, hk, dv, &kp.dv, &kp.dv_stride);
  } else {
    outp(v, p.o, p.o_stride, rq, hq, dv, &kp.o, &kp.o_stride);
  }
  return n;
}

// Tokens (batch entry, token) of a staged tensor.
CheckedSize copy_tokens(const AttnParams& p, const Staged& t) {
  return checked_product(p.varlen ? 1 : p.batch, t.rows);
}

// Workspace bytes of a staged copy: [batch extent, rows, heads, padded dim], 256-aligned.
CheckedSize copy_bytes(const AttnParams& p, const Staged& t) {
  return (copy_tokens(p, t) * checked_product(t.heads, fa2_kernel_dim(t.dim), 2)).round_up(256);
}

// Dense strides of a staged copy.
Strides4 copy_strides(const Staged& t) {
  const int64_t d8 = fa2_kernel_dim(t.dim);
  return Strides4{t.rows * t.heads * d8, t.heads * d8, d8, 1};
}

// Accesses of V 16-bit elements.
template <int V>
struct Vec;
template <>
struct Vec<1> {
  using type = uint16_t;
};
template <>
struct Vec<2> {
  using type = uint32_t;
};
template <>
struct Vec<4> {
  using type = uint2;
};

// One warp per token (batch entry b, token s; tok = b * rows + s): the rows of its heads
// h0 .. h0 + count - 1 in the caller's tensor to rows tok * heads + h of the dense copy (d8
// columns, zero past dim), or back (kOut: the first dim columns only), V elements an access
// (V divides dim, the strides and the caller's pointer's alignment: stage_width). The warp's
// lanes take the token's (head, access) pairs in turn, so every lane has work whatever the
// head dim, and the token index is split once per token, not per access.
template <bool kOut, int V>
__global__ void __launch_bounds__(256)
    stage_kernel(const uint16_t* __restrict__ from, uint16_t* __restrict__ to, Strides4 st, int64_t rows, int64_t heads,
                 int64_t h0, int count, int dim, int d8, int64_t n_tokens) {
  using T = typename Vec<V>::type;
  const int lane = threadIdx.x & 31;
  const int per_head = (kOut ? dim : d8) / V, per_token = count * per_head;  // < 2^31 (launch_stage)
  for (int64_t tok = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5); tok < n_tokens;
       tok += static_cast<int64_t>(gridDim.x) * 8) {
    const int64_t user0 = (tok / rows) * st.b + (tok % rows) * st.s + h0 * st.h, dense0 = (tok * heads + h0) * d8;
#pragma unroll 4
    for (int j = lane; j < per_token; j += 32) {
      const int h = j / per_head, c = (j - h * per_head) * V;
      const int64_t user = user0 + h * st.h + c, dense = dense0 + static_cast<int64_t>(h) * d8 + c;
      if (kOut) *reinterpret_cast<T*>(to + user) = *reinterpret_cast<const T*>(from + dense);
      else *reinterpret_cast<T*>(to + dense) = c < dim ? *reinterpret_cast<const T*>(from + user) : T{};
    }
  }
}

// A grid-stride grid of 8-warp blocks for n_tokens tokens (at least one block).
unsigned copy_grid(int64_t n_tokens) {
  const int64_t blocks = (n_tokens + 7) / 8;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));
}

// The widest access (elements) that the caller's tensor allows at every position a copy
// touches: V divides its head dim and every stride the copy applies (those of extents above
// 1: not the batch stride of a varlen run or of one sequence, nor the sequence or head stride
// of one row or head), and its pointer is aligned to V elements (the dense copy is 256-byte
// aligned with rows of a multiple of 8 elements). A staged head dim is not a multiple of 8,
// so V is at most 4.
int stage_width(const void* user, const Staged& t, int64_t n_tokens) {
  const Strides4& st = t.stride;
  const bool batches = n_tokens > t.rows, rows = t.rows > 1, heads = t.heads > 1;
  for (int v = 4; v > 1; v /= 2)
    if (reinterpret_cast<uintptr_t>(user) % (2 * v) == 0 && t.dim % v == 0 && (!batches || st.b % v == 0) &&
        (!rows || st.s % v == 0) && (!heads || st.h % v == 0))
      return v;
  return 1;
}

// Launches the copy of t (kOut: from the dense copy `dense` to the caller's tensor `user`;
// else from `user` into `dense`) at the widest access stage_width allows, in launches of as
// many heads as keep a token's accesses within 32 bits (all of them up to about 2^18
// heads); it stops at a failed launch, which launch_status then reports.
template <bool kOut>
void launch_stage(const Staged& t, const void* user, void* dense, int64_t n_tokens, cudaStream_t stream) {
  const uint16_t* from = static_cast<const uint16_t*>(kOut ? dense : user);
  uint16_t* to = static_cast<uint16_t*>(kOut ? const_cast<void*>(user) : dense);
  const int dim = static_cast<int>(t.dim), d8 = static_cast<int>(fa2_kernel_dim(t.dim));
  const int v = stage_width(user, t, n_tokens);
  const int64_t chunk = 2147483647 / 32 / ((kOut ? dim : d8) / v);  // heads a launch
  const unsigned grid = copy_grid(n_tokens);
  for (int64_t h0 = 0; h0 < t.heads; h0 += chunk) {
    const int count = static_cast<int>(t.heads - h0 < chunk ? t.heads - h0 : chunk);
    switch (v) {
      case 4:
        stage_kernel<kOut, 4>
            <<<grid, 256, 0, stream>>>(from, to, t.stride, t.rows, t.heads, h0, count, dim, d8, n_tokens);
        break;
      case 2:
        stage_kernel<kOut, 2>
            <<<grid, 256, 0, stream>>>(from, to, t.stride, t.rows, t.heads, h0, count, dim, d8, n_tokens);
        break;
      default:
        stage_kernel<kOut, 1>
            <<<grid, 256, 0, stream>>>(from, to, t.stride, t.rows, t.heads, h0, count, dim, d8, n_tokens);
    }
    if (cudaPeekAtLastError() != cudaSuccess) return;
  }
}

flashattn_status_t launch_status(const char* what, const Staged& t) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return FLASHATTN_STATUS_SUCCESS;
  return fail(FLASHATTN_STATUS_LAUNCH_FAILED,
              "launching the fa2 head-dim %s copy (head dim %lld padded to %lld) failed: %s (%s)", what,
              static_cast<long long>(t.dim), static_cast<long long>(fa2_kernel_dim(t.dim)), cudaGetErrorName(err),
              cudaGetErrorString(err));
}

}  // namespace

AttnParams fa2_kernel_shape(const AttnParams& p) {
  AttnParams kp = p;
  kp.head_dim_qk = fa2_kernel_dim(p.head_dim_qk);
  kp.head_dim_v = fa2_kernel_dim(p.head_dim_v);
  return kp;
}

CheckedSize fa2_staging_bytes(const AttnParams& p) {
  AttnParams kp = p;
  Staged t[8];
  const int n = staged_tensors(p, kp, t);
  CheckedSize total = 0;
  for (int i = 0; i < n; ++i) total = total + copy_bytes(p, t[i]);
  return total;
}

flashattn_status_t fa2_stage_in(const AttnParams& p, char* staging, AttnParams* kp, cudaStream_t stream) {
  Staged t[8];
  const int n = staged_tensors(p, *kp, t);
  size_t off = 0;
  for (int i = 0; i < n; ++i) {  // sizes are ok(): the API layer checked the workspace size
    uint16_t* copy = reinterpret_cast<uint16_t*>(staging + off);
    off += static_cast<size_t>(copy_bytes(p, t[i]).value());
    *t[i].kernel_stride = copy_strides(t[i]);
    // Outputs start uninitialized, or, accumulating gradients, as copies of the caller's.
    const void* src = t[i].src;
    if (t[i].kernel_out != nullptr) {
      *t[i].kernel_out = copy;
      if (!p.grad_accumulate) continue;
      src = t[i].dst;
    } else {
      *t[i].kernel_in = copy;
    }
    const int64_t n_tokens = copy_tokens(p, t[i]).value();
    if (n_tokens == 0) continue;
    launch_stage<false>(t[i], src, copy, n_tokens, stream);
    if (const flashattn_status_t s = launch_status("input", t[i])) return s;
  }
  return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status_t fa2_stage_out(const AttnParams& p, const AttnParams& kp, cudaStream_t stream) {
  AttnParams fields = kp;  // staged_tensors points into it; its fields hold kp's copies
  Staged t[8];
  const int n = staged_tensors(p, fields, t);
  for (int i = 0; i < n; ++i) {
    const int64_t n_tokens = copy_tokens(p, t[i]).value();
    if (t[i].kernel_out == nullptr || n_tokens == 0) continue;
    launch_stage<true>(t[i], t[i].dst, *t[i].kernel_out, n_tokens, stream);
    if (const flashattn_status_t s = launch_status("output", t[i])) return s;
  }
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace flashattn
