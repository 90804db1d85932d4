// Standard attention on cuBLAS: the baseline that materializes S and P (O(N^2) memory),
// and the GPU reference of `flashattn check --backend cuda`.
//
// Forward, per (batch b, query head h), with g = heads_q / heads_kv and kv head h / g:
//   S = scale * Q K^T          cuBLAS, fp32 output in the workspace          [Sq, ldS] fp32
//   P = softmax(options(S))    one CTA per row; every option elementwise through
//                              common/mask.h and common/philox.h, the same semantics as
//                              the CPU backend; P (input dtype, dropout applied, like a
//                              PyTorch implementation) overwrites S in place; LSE out
//   O = P V                    cuBLAS, written with the plan's O strides (fp32; for
//                              fp16/bf16 see below)
// For fp16/bf16 the forward keeps P to twice the dtype's precision (22 significant bits
// for fp16, 16 for bf16), far below the output's rounding: the softmax stores each p as
// P_hi = rd(p) over S and P_lo = rd(2^11 (p - P_hi)), and O = P_hi V + 2^-11 P_lo V
// accumulates in an fp32 buffer (two GEMMs, the second with beta = 1) converted once
// into the caller's O. A same-precision standard attention rounds S, P and O; this one
// in effect rounds O alone, so it is at least as accurate. The factor 2^11 keeps P_lo
// clear of fp16's subnormals (|p - P_hi| <= 2^-11 |p| in fp16, 2^-8 |p| in bf16, so P_lo
// cannot overflow where P_hi does not). P_lo lives in the
// second half of P's row (a row of ldS fp32 scores holds 2 ldS 16-bit elements, P_hi
// takes the first Sk) when the row fits the cached softmax, which reads S only before it
// writes; the uncached softmax (seqlen_k > kCachedRowMax) still reads S while it writes
// P, and P_lo would overwrite unread scores there, so it gets a region of its own.
// Backward, recomputing S and P from the forward's LSE:
//   dP = dO V^T (fp32, second N^2 region); Delta_i = sum_j Pdrop_ij dP_ij (= dO_i . O_i);
//   dS = P * (dP * keep/(1-p) - Delta) (* softcap derivative); dBias = dS before the
//   softcap derivative; Pdrop and dS overwrite their regions in the input dtype;
//   dV = Pdrop^T dO, dQ = scale dS K, dK = scale dS^T Q (cuBLAS; for GQA dK and dV are
//   accumulated over the group's query heads in fp32 and converted afterwards).
//
// Layouts: when every tensor's seq stride can serve as a cuBLAS leading dimension, the
// GEMMs read and write the caller's tensors in place (one strided-batched call per batch
// and group member, batched over kv heads; the 16-bit forward's O is always converted
// from its fp32 buffer, so its strides never matter). Otherwise, and always in varlen
// mode, the tensors are first gathered into zero-padded [batch, heads, max_len, dim]
// buffers in the workspace and results scattered back: cu_seqlens live in device memory
// and a run may not synchronize, so the per-sequence lengths are only read by these
// kernels and by the softmax kernels, which mask padded rows and columns. Varlen is
// therefore fully supported, at the cost of batch * max_len padding (the plan's
// seqlen_q/k are the max lengths).
//
// Workspace (standard_workspace_size): the fp32 score rows, 4 * batch * heads_q * Sq * ldS
// bytes (ldS = Sk rounded up to 8) forward and twice that backward, plus the padded copies
// (gathered mode), for the 16-bit forward the fp32 O, 4 * batch * heads_q * Sq * Dv bytes
// (in place of the padded O copy), and when seqlen_k > kCachedRowMax the P_lo rows,
// 2 * batch * heads_q * Sq * ldS bytes, fp32 dK/dV accumulators (GQA or gathered), a
// per-element fp32 dBias buffer when the bias broadcasts, and 32 MiB handed to cuBLAS
// (cublasSetWorkspace) so that nothing is allocated during a run. Our kernels use no
// atomics, and cuBLAS GEMMs are bitwise reproducible on one GPU model (its documented
// guarantee), so the gradients are reproducible run to run whatever the plan's
// deterministic flag.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "common/mask.h"
#include "common/params.h"
#include "common/philox.h"
#include "common/varlen.h"
#include "cuda/cublas_loader.hpp"
#include "cuda/launch.hpp"
#include "error.hpp"

namespace flashattn {
namespace {

// cuBLAS gets a slice of our workspace (cublasSetWorkspace) so that it never allocates
// during a run; 32 MiB is NVIDIA's recommended size on Hopper.
constexpr size_t kCublasWorkspace = size_t(32) << 20;
constexpr size_t kAlign = 256;  // cublasSetWorkspace requires 256-byte alignment
constexpr int kRowThreads = 256;
constexpr int64_t kMaxGemmBatch = 32768;  // matrices per cublasGemmStridedBatchedEx call
constexpr int64_t kCachedRowMax = 16384;  // longest row the cached forward softmax takes: 64 KiB of fp32 scores
constexpr float kLoScale = 2048.f;        // P_lo = rd(kLoScale * (p - P_hi)), see the header comment

int64_t elem_bytes(int32_t dtype) { return dtype == kFp32 ? 4 : 2; }

cudaDataType cuda_type(int32_t dtype) {
  return dtype == kFp16 ? CUDA_R_16F : dtype == kBf16 ? CUDA_R_16BF : CUDA_R_32F;
}

// ---------------------------------------------------------------- element conversion
template <typename T>
__device__ __forceinline__ float to_f(T x);
template <>
__device__ __forceinline__ float to_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float to_f<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_f<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// ---------------------------------------------------------------- plan geometry
// Where everything lives in the workspace, and how the GEMMs see each tensor.
struct Geometry {
  bool gathered = false;   // tensors copied to padded BHSD buffers (varlen or unusable strides)
  bool acc_dkv = false;    // dK/dV accumulated in fp32 buffers, then converted
  bool dt_buffer = false;  // dBias over broadcast dims: per-element fp32 gradient, then reduced
  bool split = false;      // 16-bit forward: P stored as P_hi + P_lo, O accumulated in fp32
  bool cached = false;     // forward rows fit the cached softmax (Sk <= kCachedRowMax)
  int64_t B = 0, Hq = 0, Hkv = 0, G = 0, Sq = 0, Sk = 0, Dqk = 0, Dv = 0;
  int64_t ldS = 0;  // fp32 elements per row of S / dP
  size_t off_s = 0, off_dp = 0, off_plo = 0, off_q = 0, off_k = 0, off_v = 0, off_o = 0, off_dq = 0, off_dk = 0,
         off_dv = 0, off_dt = 0, off_cublas = 0;
  CheckedSize total;
};

// cuBLAS can use a tensor in place if its seq stride is a valid leading dimension.
bool ld_ok(int64_t seq_stride, int64_t len, int64_t dim) {
  if (seq_stride > INT_MAX) return false;
  return len <= 1 || seq_stride >= dim;
}

Geometry geometry(const AttnParams& p) {
  Geometry g;
  const bool bwd = p.direction == kBackward;
  g.B = p.batch;
  g.Hq = p.heads_q;
  g.Hkv = p.heads_kv;
  g.G = p.heads_q / p.heads_kv;
  g.Sq = p.seqlen_q;
  g.Sk = p.seqlen_k;
  g.Dqk = p.head_dim_qk;
  g.Dv = p.head_dim_v;
  g.ldS = (g.Sk + 7) / 8 * 8;  // 16-bit P rows then start 32-byte aligned too
  g.split = !bwd && p.dtype != kFp32;
  g.cached = g.Sk <= kCachedRowMax;
  bool direct = !p.varlen && ld_ok(p.q_stride.s, g.Sq, g.Dqk) && ld_ok(p.k_stride.s, g.Sk, g.Dqk) &&
                ld_ok(p.v_stride.s, g.Sk, g.Dv);
  if (!bwd) {
    direct = direct && (g.split || ld_ok(p.o_stride.s, g.Sq, g.Dv));  // a split O is converted, never a GEMM operand
  } else {
    direct = direct && ld_ok(p.do_stride.s, g.Sq, g.Dv) && ld_ok(p.dq_stride.s, g.Sq, g.Dqk) &&
             ld_ok(p.dk_stride.s, g.Sk, g.Dqk) && ld_ok(p.dv_stride.s, g.Sk, g.Dv);
  }
  g.gathered = !direct;
  g.acc_dkv = bwd && (g.gathered || g.G > 1);
  g.dt_buffer = bwd && p.bias_kind == kBiasTensor &&
                (p.bias_stride[0] == 0 || p.bias_stride[1] == 0 || p.bias_stride[2] == 0 || p.bias_stride[3] == 0);

  // Sizes from caller input, in checked arithmetic: the offsets are meaningful only when
  // total.ok() (the API layer refuses the run or query otherwise).
  const int64_t eb = elem_bytes(p.dtype);
  const CheckedSize rows = checked_product(g.B, g.Hq, g.Sq);
  const CheckedSize n_s = rows * checked_product(g.ldS, 4);
  CheckedSize off = 0;
  auto take = [&off](CheckedSize bytes) {
    const size_t at = static_cast<size_t>(off.value());
    off += bytes.round_up(kAlign);
    return at;
  };
  g.off_s = take(n_s);
  if (bwd) g.off_dp = take(n_s);
  if (g.split && !g.cached) g.off_plo = take(rows * checked_product(g.ldS, 2));
  if (g.gathered) {
    g.off_q = take(checked_product(g.B, g.Hq, g.Sq, g.Dqk, eb));
    g.off_k = take(checked_product(g.B, g.Hkv, g.Sk, g.Dqk, eb));
    g.off_v = take(checked_product(g.B, g.Hkv, g.Sk, g.Dv, eb));
  }
  if (g.split) {
    g.off_o = take(checked_product(g.B, g.Hq, g.Sq, g.Dv, 4));  // fp32 O
  } else if (g.gathered) {
    g.off_o = take(checked_product(g.B, g.Hq, g.Sq, g.Dv, eb));  // padded O (forward) or dO (backward)
  }
  if (g.gathered && bwd) g.off_dq = take(checked_product(g.B, g.Hq, g.Sq, g.Dqk, eb));
  if (g.acc_dkv) {
    g.off_dk = take(checked_product(g.B, g.Hkv, g.Sk, g.Dqk, 4));
    g.off_dv = take(checked_product(g.B, g.Hkv, g.Sk, g.Dv, 4));
  }
  if (g.dt_buffer) g.off_dt = take(rows * checked_product(g.Sk, 4));
  g.off_cublas = take(kCublasWorkspace);
  g.total = off + CheckedSize(kAlign);  // slack to align an arbitrary caller pointer up to 256 bytes
  return g;
}

// ---------------------------------------------------------------- copy kernels
// Sequence b's [start, len) for varlen (common/varlen.h: clamped to the padded extent and
// the packed total, so bad offsets can never read or write out of bounds), else [0, S).
__device__ __forceinline__ SeqExtent seq_of(const int32_t* cu, int64_t b, int64_t S, int64_t total) {
  return cu == nullptr ? SeqExtent{0, S} : clamp_seq(cu, b, total, S);
}

// Strided (or packed varlen) [B, S, H, D] -> padded [B, H, S, D], zeros past each length.
template <typename T>
__global__ void gather_kernel(T* __restrict__ dst, const T* __restrict__ src, Strides4 st, const int32_t* cu,
                              int64_t total_tokens, int64_t B, int64_t H, int64_t S, int64_t D) {
  const int64_t n = B * H * S * D;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = idx % D;
    int64_t t = idx / D;
    const int64_t s = t % S;
    t /= S;
    const int64_t h = t % H;
    const int64_t b = t / H;
    const SeqExtent q = seq_of(cu, b, S, total_tokens);
    T v = from_f<T>(0.f);
    if (s < q.len) {
      const int64_t off = cu != nullptr ? (q.start + s) * st.s + h * st.h + d : b * st.b + s * st.s + h * st.h + d;
      v = src[off];
    }
    dst[idx] = v;
  }
}

// Padded [B, H, S, D] (any element type) -> strided (or packed) output, valid rows only;
// with `add` each element the fp32 sum of the output's value and the copy's, rounded once.
template <typename Tin, typename Tout>
__global__ void scatter_kernel(Tout* __restrict__ dst, const Tin* __restrict__ src, Strides4 st, const int32_t* cu,
                               int64_t total_tokens, int64_t B, int64_t H, int64_t S, int64_t D, bool add) {
  const int64_t n = B * H * S * D;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = idx % D;
    int64_t t = idx / D;
    const int64_t s = t % S;
    t /= S;
    const int64_t h = t % H;
    const int64_t b = t / H;
    const SeqExtent q = seq_of(cu, b, S, total_tokens);
    if (s >= q.len) continue;
    const int64_t off = cu != nullptr ? (q.start + s) * st.s + h * st.h + d : b * st.b + s * st.s + h * st.h + d;
    const float v = to_f<Tin>(src[idx]);
    dst[off] = from_f<Tout>(add ? __fadd_rn(to_f<Tout>(dst[off]), v) : v);
  }
}

// ---------------------------------------------------------------- block reductions
// A partial sum l is 0 when its scores were all -inf (masked) and NaN when one was NaN
// (a NaN score never raises m, but adds exp(NaN) = NaN to l). Both are kept as they are,
// so the row's l is exactly 0 iff the row is fully masked and NaN if any score was NaN.
__device__ __forceinline__ void merge_ml(float& m, float& l, float m2, float l2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) {
    m = mx;
    l += l2;
    return;
  }
  l = l * __expf(m - mx) + l2 * __expf(m2 - mx);
  m = mx;
}

// Reduces (max, sum-of-exp) pairs over the CTA; every thread gets the result.
__device__ void block_reduce_ml(float& m, float& l) {
  __shared__ float sm[32], sl[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float l2 = __shfl_xor_sync(0xffffffffu, l, o);
    merge_ml(m, l, m2, l2);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  __syncthreads();  // protect sm/sl from an earlier use
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
  __syncthreads();
  m = -INFINITY;
  l = 0.f;
  for (int w = 0; w < nw; ++w) merge_ml(m, l, sm[w], sl[w]);
}

__device__ float block_reduce_sum(float x) {
  __shared__ float ss[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) ss[warp] = x;
  __syncthreads();
  float t = 0.f;
  for (int w = 0; w < nw; ++w) t += ss[w];  // fixed order: deterministic
  return t;
}

// ---------------------------------------------------------------- per-row context
// Everything the softmax kernels need about one row (b, h, i) of the score matrix.
template <typename T>
struct Row {
  int64_t b, h, i, ip, len_q, len_k, q_start;
  bool valid;  // i < len_q (padded rows in varlen mode are not)
  float slope;
  const T* bias_row;  // bias[b, h, i, :], stride bias_stride[3]
};

template <typename T>
__device__ __forceinline__ Row<T> make_row(const AttnParams& p, int64_t row, int64_t Sq, int64_t Sk) {
  Row<T> r;
  r.i = row % Sq;
  const int64_t hh = row / Sq;
  r.h = hh % p.heads_q;
  r.b = hh / p.heads_q;
  if (p.varlen) {
    const SeqExtent sq = seq_of(p.cu_seqlens_q, r.b, Sq, p.total_q);
    const SeqExtent sk = seq_of(p.cu_seqlens_k, r.b, Sk, p.total_k);
    r.len_q = sq.len;
    r.len_k = sk.len;
    r.q_start = sq.start;
  } else {
    r.len_q = Sq;
    r.len_k = Sk;
    r.q_start = 0;
  }
  r.valid = r.i < r.len_q;
  r.ip = r.i + align_shift(p, r.len_q, r.len_k);
  r.slope = alibi_slope(p, r.b, r.h);
  r.bias_row = p.bias_kind == kBiasTensor ? static_cast<const T*>(p.bias) + r.b * p.bias_stride[0] +
                                                r.h * p.bias_stride[1] + r.i * p.bias_stride[2]
                                          : nullptr;
  return r;
}

// Final score of element j given the raw scale*q.k value s (-inf when masked); *th gets
// tanh(s/softcap) for the softcap derivative.
template <typename T>
__device__ __forceinline__ float score(const AttnParams& p, const Row<T>& r, int64_t j, float s, float* th) {
  if (j >= r.len_k || !band_keep(p, r.ip, j) || !layout_keep(p, r.h, r.i, j)) return -INFINITY;
  if (p.softcap > 0.f) {
    // fp32 in double: the library builds with --use_fast_math, under which tanhf is the
    // tanh.approx instruction (about 2^-11 relative error), fine for 16-bit outputs only.
    const float t =
        sizeof(T) == 4 ? static_cast<float>(tanh(static_cast<double>(s) / p.softcap)) : tanhf(s / p.softcap);
    *th = t;
    s = p.softcap * t;
  }
  if (r.bias_row != nullptr) {
    s += to_f<T>(r.bias_row[j * p.bias_stride[3]]);
  } else {
    s += alibi_bias(p, r.slope, r.ip, j);
  }
  return s;
}

// The dropout multiplier of element j: rp_keep if kept, else 0 (1 without dropout).
template <typename T>
__device__ __forceinline__ float dropout_scale(const AttnParams& p, const Row<T>& r, int64_t j) {
  if (!dropout_active(p.drop_threshold)) return 1.f;
  return dropout_keep(p.seed, p.offset, static_cast<uint64_t>(r.b), static_cast<uint64_t>(p.heads_q),
                      static_cast<uint64_t>(r.h), static_cast<uint32_t>(r.i), static_cast<uint32_t>(j),
                      p.drop_threshold)
             ? p.rp_keep
             : 0.f;
}

__device__ __forceinline__ int64_t lse_index(const AttnParams& p, int64_t b, int64_t h, int64_t i, int64_t q_start) {
  return p.varlen ? h * p.total_q + q_start + i : (b * p.heads_q + h) * p.seqlen_q + i;
}

// ---------------------------------------------------------------- P stores
// dst[0..3] = a, b, c, d rounded to T, in one 16-byte or 8-byte store (dst aligned to it).
template <typename T>
__device__ __forceinline__ void store4(T* dst, float a, float b, float c, float d) {
  if constexpr (sizeof(T) == sizeof(float)) {
    *reinterpret_cast<float4*>(dst) = make_float4(a, b, c, d);
  } else {
    alignas(8) const T v[4] = {from_f<T>(a), from_f<T>(b), from_f<T>(c), from_f<T>(d)};
    *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(v);
  }
}

// P_hi = rd(p) and P_lo = rd(kLoScale * (p - P_hi)) as floats (p - P_hi is exact in fp32).
// A P_hi that overflowed (dropout's scale, up to 2^16, can take p past fp16's range) is left
// the only term, as in a single rounding; a NaN p gives NaN terms.
template <typename T>
__device__ __forceinline__ float2 split_p(float p) {
  const float hi = to_f<T>(from_f<T>(p));
  return make_float2(hi, isinf(hi) ? 0.f : kLoScale * (p - hi));
}

// Stores p_j of a P row: P_hi at hi[j] and P_lo at lo[j] for 16-bit T, P at hi[j] for fp32.
template <typename T>
__device__ __forceinline__ void store_p(T* hi, T* lo, int64_t j, float p) {
  if constexpr (sizeof(T) == sizeof(float)) {
    hi[j] = p;
  } else {
    const float2 t = split_p<T>(p);
    hi[j] = from_f<T>(t.x);
    lo[j] = from_f<T>(t.y);
  }
}

// The same for p_j0 .. p_j0+3 (j0 % 4 == 0), with vector stores.
template <typename T>
__device__ __forceinline__ void store4_p(T* hi, T* lo, int64_t j0, const float (&p)[4]) {
  if constexpr (sizeof(T) == sizeof(float)) {
    store4<T>(hi + j0, p[0], p[1], p[2], p[3]);
  } else {
    const float2 a = split_p<T>(p[0]), b = split_p<T>(p[1]), c = split_p<T>(p[2]), d = split_p<T>(p[3]);
    store4<T>(hi + j0, a.x, b.x, c.x, d.x);
    store4<T>(lo + j0, a.y, b.y, c.y, d.y);
  }
}

// ---------------------------------------------------------------- forward softmax
// One CTA per row of S. Pass 1: online max / sum of exp. Pass 2: P = exp(s - lse) with
// dropout, written in the input dtype over the row in place: chunk c writes bytes
// [c*sizeof(T)*blockDim, ...) that only overlap fp32 elements already read by this chunk
// or earlier ones, and the barrier between read and write of each chunk orders them.
// A 16-bit P_lo goes to row `row` of lo (row stride ldLo), outside S.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    softmax_fwd_kernel(AttnParams p, float* S, T* lo, int64_t ldLo, int64_t Sq, int64_t Sk, int64_t ldS) {
  const int64_t row = blockIdx.x;
  const Row<T> r = make_row<T>(p, row, Sq, Sk);
  float* srow = S + row * ldS;
  T* prow = reinterpret_cast<T*>(srow);
  T* lrow = lo + row * ldLo;

  float m = -INFINITY, l = 0.f, th = 0.f;
  if (r.valid) {
    for (int64_t j = threadIdx.x; j < r.len_k; j += blockDim.x) {
      const float x = score(p, r, j, srow[j], &th);
      if (x == -INFINITY) continue;
      if (x > m) {
        l = l * __expf(m - x) + 1.f;
        m = x;
      } else {
        l += __expf(x - m);
      }
    }
  }
  block_reduce_ml(m, l);
  const float lse = l == 0.f ? -INFINITY : m + logf(l);  // NaN l: NaN LSE and P
  if (threadIdx.x == 0 && r.valid && p.lse != nullptr) p.lse[lse_index(p, r.b, r.h, r.i, r.q_start)] = lse;

  for (int64_t c0 = 0; c0 < Sk; c0 += blockDim.x) {
    const int64_t j = c0 + threadIdx.x;
    float pv = 0.f;
    if (r.valid && j < r.len_k && lse != -INFINITY) {
      const float x = score(p, r, j, srow[j], &th);
      if (x != -INFINITY) pv = __expf(x - lse) * dropout_scale(p, r, j);
    }
    if (sizeof(T) != sizeof(float)) __syncthreads();
    if (j < Sk) store_p<T>(prow, lrow, j, pv);
  }
}

// The same, for rows that fit in shared memory (the common case, seqlen_k <= 16k): pass 1
// reads S once with 16-byte loads and keeps the final scores in shared memory, pass 2
// writes P from there with vector stores and one Philox call per 8 columns. S is read
// once instead of twice (4 bytes of traffic per element less), and since pass 2 reads no
// global S, the in-place write needs no per-chunk barrier and a 16-bit P_lo can go to the
// row's second half (lo = P + ldS, ldLo = 2 ldS: 16-byte aligned rows).
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    softmax_fwd_cached_kernel(AttnParams p, float* S, T* lo, int64_t ldLo, int64_t Sq, int64_t Sk, int64_t ldS) {
  extern __shared__ float xs[];  // [round_up(Sk, 4)] final scores of this row
  const int64_t row = blockIdx.x;
  const Row<T> r = make_row<T>(p, row, Sq, Sk);
  float* srow = S + row * ldS;  // ldS % 8 == 0: 16-byte aligned rows, j0 + 3 < ldS
  T* prow = reinterpret_cast<T*>(srow);
  T* lrow = lo + row * ldLo;

  float m = -INFINITY, l = 0.f, th = 0.f;
  if (r.valid) {
    for (int64_t j0 = 4 * int64_t(threadIdx.x); j0 < r.len_k; j0 += 4 * int64_t(blockDim.x)) {
      const float4 v = *reinterpret_cast<const float4*>(srow + j0);
      const float raw[4] = {v.x, v.y, v.z, v.w};
      float xv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t j = j0 + u;
        const float x = j < r.len_k ? score(p, r, j, raw[u], &th) : -INFINITY;
        xv[u] = x;
        if (x == -INFINITY) continue;
        if (x > m) {
          l = l * __expf(m - x) + 1.f;
          m = x;
        } else {
          l += __expf(x - m);
        }
      }
      // One 16-byte store per thread: conflict-free, unlike four strided 4-byte ones.
      *reinterpret_cast<float4*>(xs + j0) = make_float4(xv[0], xv[1], xv[2], xv[3]);
    }
  }
  block_reduce_ml(m, l);  // its barriers also order pass 1's reads of S before pass 2's writes of P
  const float lse = l == 0.f ? -INFINITY : m + logf(l);  // NaN l: NaN LSE and P
  if (threadIdx.x == 0 && r.valid && p.lse != nullptr) p.lse[lse_index(p, r.b, r.h, r.i, r.q_start)] = lse;

  const bool live = r.valid && lse != -INFINITY;
  const bool drop = dropout_active(p.drop_threshold);
  const uint64_t head_counter = p.offset + static_cast<uint64_t>(r.b) * p.heads_q + r.h;
  // Eight columns per thread (two 4-column halves), the columns of one Philox call. The
  // 16-byte reads of xs go by quarter warps: threads 8 floats apart would hit each bank
  // twice, so threads 4..7 of each quarter read their second half first (banks 4k + 4..7
  // beside the others' 4k .. 4k + 3: conflict-free).
  const int first = (threadIdx.x >> 2) & 1;
  for (int64_t j8 = 8 * int64_t(threadIdx.x); j8 < Sk; j8 += 8 * int64_t(blockDim.x)) {
    Philox4 w{};
    if (live && j8 < r.len_k && drop) {
      w = dropout_words8(p.seed, head_counter, static_cast<uint32_t>(r.i), static_cast<uint32_t>(j8 >> 3));
    }
#pragma unroll
    for (int step = 0; step < 2; ++step) {
      const int half = step ^ first;
      const int64_t j0 = j8 + 4 * half;
      if (j0 >= Sk) continue;
      // The half's two words, so that the halfword picks below are compile-time.
      const Philox4 wh = {{half ? w.x[2] : w.x[0], half ? w.x[3] : w.x[1], 0u, 0u}};
      float pv[4] = {0.f, 0.f, 0.f, 0.f};
      if (live && j0 < r.len_k) {
        const float4 x4 = *reinterpret_cast<const float4*>(xs + j0);  // pass 1's, before block_reduce_ml
        const float xv[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          if (j0 + u < r.len_k) {
            const float x = xv[u];
            if (x != -INFINITY) {
              pv[u] = __expf(x - lse);
              if (drop) {
                pv[u] *= dropout_halfword(wh, static_cast<uint32_t>(u)) >= p.drop_threshold ? p.rp_keep : 0.f;
              }
            }
          }
        }
      }
      store4_p<T>(prow, lrow, j0, pv);
    }
  }
}

// ---------------------------------------------------------------- backward softmax
// One CTA per row. Pass 1: Delta = sum_j Pdrop_ij dP_ij. Pass 2: writes Pdrop over S and
// dS (gradient of scale*q.k) over dP in the input dtype, in place as in the forward, and
// the bias gradient dT = P * (dPdrop*keep - Delta): straight into dbias when no dimension
// is broadcast, else into the fp32 per-element buffer dt for the ordered reduction.
// The first `cap` columns (a multiple of 4; 8192 at most, 64 KiB of shared memory) are
// read once in pass 1 with 16-byte loads and kept in shared memory for pass 2; columns past
// cap are read again from global memory. In-place safety: a 16-bit write to column j
// overlaps the fp32 column j/2, so while Sk <= 2*cap every overlapped column is a cached
// one and pass 2 never reads global memory that another thread may have overwritten;
// longer rows fall back to a barrier between each chunk's reads and writes.
// kAllCached: cap >= Sk, compiled without the global-memory paths.
template <typename T, bool kAllCached>
__global__ void __launch_bounds__(kRowThreads)
    softmax_bwd_kernel(AttnParams p, float* S, float* dP, float* dt, int64_t Sq, int64_t Sk, int64_t ldS, int64_t cap) {
  extern __shared__ float4 smem4[];
  float* cs = reinterpret_cast<float*>(smem4);  // [cap] raw scores
  float* cdp = cs + cap;                        // [cap] dP
  const int64_t row = blockIdx.x;
  const Row<T> r = make_row<T>(p, row, Sq, Sk);
  float* srow = S + row * ldS;
  float* dprow = dP + row * ldS;
  T* prow = reinterpret_cast<T*>(srow);
  T* dsrow = reinterpret_cast<T*>(dprow);
  const float lse = r.valid ? p.lse_in[lse_index(p, r.b, r.h, r.i, r.q_start)] : -INFINITY;
  const bool live = r.valid && lse != -INFINITY;

  float th = 0.f, delta = 0.f;
  if (live) {
    const int64_t n_cached = r.len_k < cap ? r.len_k : cap;
    for (int64_t j0 = 4 * int64_t(threadIdx.x); j0 < n_cached; j0 += 4 * int64_t(blockDim.x)) {
      const float4 s4 = *reinterpret_cast<const float4*>(srow + j0);  // ldS % 8 == 0: aligned, in the row
      const float4 d4 = *reinterpret_cast<const float4*>(dprow + j0);
      *reinterpret_cast<float4*>(cs + j0) = s4;  // j0 + 3 < cap (cap % 4 == 0)
      *reinterpret_cast<float4*>(cdp + j0) = d4;
      const float sv[4] = {s4.x, s4.y, s4.z, s4.w}, dv[4] = {d4.x, d4.y, d4.z, d4.w};
#pragma unroll
      for (int u = 0; u < 4; ++u) {  // no break: a fully unrolled loop keeps sv/dv in registers
        const int64_t j = j0 + u;
        const float x = j < r.len_k ? score(p, r, j, sv[u], &th) : -INFINITY;
        if (x != -INFINITY) delta += __expf(x - lse) * dropout_scale(p, r, j) * dv[u];
      }
    }
    for (int64_t j = cap + threadIdx.x; !kAllCached && j < r.len_k; j += blockDim.x) {
      const float x = score(p, r, j, srow[j], &th);
      if (x == -INFINITY) continue;
      delta += __expf(x - lse) * dropout_scale(p, r, j) * dprow[j];
    }
  }
  delta = block_reduce_sum(delta);  // its barriers also publish cs/cdp and end pass 1's global reads

  T* dbias_row = nullptr;
  if (p.dbias != nullptr && dt == nullptr) {
    dbias_row = static_cast<T*>(p.dbias) + r.b * p.bias_stride[0] + r.h * p.bias_stride[1] + r.i * p.bias_stride[2];
  }
  float* dt_row = dt != nullptr ? dt + row * Sk : nullptr;
  const bool chunk_barrier = !kAllCached && sizeof(T) != sizeof(float) && Sk > 2 * cap;

  for (int64_t c0 = 0; c0 < Sk; c0 += blockDim.x) {
    const int64_t j = c0 + threadIdx.x;
    float pd = 0.f, dsr = 0.f, dtv = 0.f;
    if (live && j < r.len_k) {
      th = 0.f;
      const bool cached = kAllCached || j < cap;
      const float x = score(p, r, j, cached ? cs[j] : srow[j], &th);
      if (x != -INFINITY) {
        const float pr = __expf(x - lse);
        const float ks = dropout_scale(p, r, j);
        pd = pr * ks;
        dtv = pr * ((cached ? cdp[j] : dprow[j]) * ks - delta);
        dsr = p.softcap > 0.f ? dtv * (1.f - th * th) : dtv;
      }
    }
    if (chunk_barrier) __syncthreads();
    if (j < Sk) {
      prow[j] = from_f<T>(pd);
      dsrow[j] = from_f<T>(dsr);
      if (dbias_row != nullptr) dbias_row[j * p.bias_stride[3]] = from_f<T>(dtv);
      if (dt_row != nullptr) dt_row[j] = dtv;
    }
  }
}

// dBias over broadcast (zero-stride) dimensions: one thread per dbias element sums the
// per-element gradients over the broadcast dimensions in a fixed order (deterministic).
template <typename T>
__global__ void dbias_reduce_kernel(T* dbias, const float* dt, int64_t st0, int64_t st1, int64_t st2, int64_t st3,
                                    int64_t e0, int64_t e1, int64_t e2, int64_t e3) {
  const int64_t st[4] = {st0, st1, st2, st3};
  const int64_t ext[4] = {e0, e1, e2, e3};
  int64_t n_out = 1, n_red = 1;
  for (int d = 0; d < 4; ++d) (st[d] == 0 ? n_red : n_out) *= ext[d];
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < n_out; o += int64_t(gridDim.x) * blockDim.x) {
    int64_t c[4];
    int64_t t = o;
    for (int d = 3; d >= 0; --d) {
      if (st[d] != 0) {
        c[d] = t % ext[d];
        t /= ext[d];
      }
    }
    float sum = 0.f;
    for (int64_t rr = 0; rr < n_red; ++rr) {
      int64_t u = rr;
      for (int d = 3; d >= 0; --d) {
        if (st[d] == 0) {
          c[d] = u % ext[d];
          u /= ext[d];
        }
      }
      sum += dt[((c[0] * e1 + c[1]) * e2 + c[2]) * e3 + c[3]];
    }
    int64_t off = 0;
    for (int d = 0; d < 4; ++d) off += c[d] * st[d];
    dbias[off] = from_f<T>(sum);
  }
}

// ---------------------------------------------------------------- GEMM driver
// One operand as cuBLAS sees it for head (b, head): ptr + b*batch + head*hstride, with
// leading dimension ld. kv operands are indexed by kv head, q operands by query head.
struct Mat {
  void* ptr;
  cudaDataType type;
  int64_t esize;
  int64_t ld, hstride, bstride;
  bool kv;
};

struct Gemm {
  const cublas::Api* api;
  cublas::Handle handle;
  int64_t B, Hkv, G;
};

// C = alpha * op(A) op(B) (+ C when accumulating, and for the 2nd..G-th query head of a
// group when C is a kv operand: the GQA sum) for every (b, kv head, group member r).
flashattn_status_t gemm(const Gemm& ctx, const char* what, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                        const Mat& A, const Mat& B, const Mat& C, bool accumulate = false) {
  const Mat* ops[3] = {&A, &B, &C};
  auto hs = [&ctx](const Mat& x) { return x.kv ? x.hstride : x.hstride * ctx.G; };  // stride over kv heads
  bool combined = true;  // batches fold into the batched dimension
  for (const Mat* x : ops) combined = combined && x->bstride == hs(*x) * ctx.Hkv;
  const int64_t outer = combined ? 1 : ctx.B;
  const int64_t count = combined ? ctx.B * ctx.Hkv : ctx.Hkv;
  for (int64_t b = 0; b < outer; ++b) {
    for (int64_t r = 0; r < ctx.G; ++r) {
      auto at = [&](const Mat& x) {
        const int64_t e = b * x.bstride + (x.kv ? 0 : r * x.hstride);
        return static_cast<char*>(x.ptr) + e * x.esize;
      };
      const float beta = accumulate || (C.kv && r > 0) ? 1.f : 0.f;
      // At most kMaxGemmBatch matrices per call: cuBLAS takes an int batch count, and some
      // cuBLAS versions/GPUs mishandle counts above the 65535 grid y/z limit.
      for (int64_t c0 = 0; c0 < count; c0 += kMaxGemmBatch) {
        const int64_t nb = count - c0 < kMaxGemmBatch ? count - c0 : kMaxGemmBatch;
        auto ptr = [&](const Mat& x) { return at(x) + c0 * hs(x) * x.esize; };
        const cublas::Status st = ctx.api->gemm_strided_batched(
            ctx.handle, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha, ptr(A), A.type,
            static_cast<int>(A.ld), hs(A), ptr(B), B.type, static_cast<int>(B.ld), hs(B), &beta, ptr(C), C.type,
            static_cast<int>(C.ld), hs(C), static_cast<int>(nb), cublas::kCompute32F, cublas::kGemmDefault);
        if (st != cublas::kSuccess) {
          (void)cudaGetLastError();  // a failed launch inside cuBLAS must not fail a later run
          return fail(FLASHATTN_STATUS_CUDA_ERROR,
                      "cublasGemmStridedBatchedEx (%s, m=%lld n=%lld k=%lld, batch %lld of %lld) failed: %s", what,
                      static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                      static_cast<long long>(nb), static_cast<long long>(count), cublas::status_text(st));
        }
      }
    }
  }
  return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status_t launch_status(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return FLASHATTN_STATUS_SUCCESS;
  return fail(FLASHATTN_STATUS_LAUNCH_FAILED, "launching %s failed: %s (%s)", kernel, cudaGetErrorName(err),
              cudaGetErrorString(err));
}

// Opts a kernel into more than 48 KiB of dynamic shared memory (a host-side attribute;
// no synchronization).
template <typename Kernel>
flashattn_status_t allow_smem(Kernel kernel, size_t bytes, const char* name) {
  if (bytes <= 48 * 1024) return FLASHATTN_STATUS_SUCCESS;
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (err == cudaSuccess) return FLASHATTN_STATUS_SUCCESS;
  (void)cudaGetLastError();
  return fail(FLASHATTN_STATUS_CUDA_ERROR, "cudaFuncSetAttribute(%s, %zu bytes of shared memory): %s", name, bytes,
              cudaGetErrorString(err));
}

unsigned elementwise_blocks(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65536 ? 65536 : b));
}

template <typename T>
flashattn_status_t gather(const void* src, void* dst, const Strides4& st, const int32_t* cu, int64_t total, int64_t B,
                          int64_t H, int64_t S, int64_t D, cudaStream_t stream) {
  const int64_t n = B * H * S * D;
  gather_kernel<T><<<elementwise_blocks(n), 256, 0, stream>>>(static_cast<T*>(dst), static_cast<const T*>(src), st, cu,
                                                              total, B, H, S, D);
  return launch_status("gather_kernel");
}

template <typename Tin, typename Tout>
flashattn_status_t scatter(const void* src, void* dst, const Strides4& st, const int32_t* cu, int64_t total, int64_t B,
                           int64_t H, int64_t S, int64_t D, cudaStream_t stream, bool add = false) {
  const int64_t n = B * H * S * D;
  scatter_kernel<Tin, Tout><<<elementwise_blocks(n), 256, 0, stream>>>(
      static_cast<Tout*>(dst), static_cast<const Tin*>(src), st, cu, total, B, H, S, D, add);
  return launch_status("scatter_kernel");
}

// Operand for a caller tensor used in place, or for its padded copy.
Mat tensor_mat(const Geometry& g, const AttnParams& p, const void* ptr, void* padded, const Strides4& st, bool kv,
               int64_t S, int64_t D) {
  const int64_t eb = elem_bytes(p.dtype);
  const int64_t H = kv ? g.Hkv : g.Hq;
  if (g.gathered) return Mat{padded, cuda_type(p.dtype), eb, D, S * D, H * S * D, kv};
  // A stride that cuBLAS ignores (a single row) must still be a valid leading dimension.
  const int64_t ld = S <= 1 && st.s < D ? D : st.s;
  return Mat{const_cast<void*>(ptr), cuda_type(p.dtype), eb, ld, st.h, st.b, kv};
}

// The workspace regions of a run, from an arbitrary caller pointer.
struct Regions {
  char* base;
  char* at(size_t off) const { return base + off; }
};

flashattn_status_t prepare(const Geometry& g, void* workspace, size_t workspace_bytes, cudaStream_t stream, Gemm* ctx,
                           Regions* reg) {
  const size_t total = static_cast<size_t>(g.total.value());  // ok(): checked by the API layer
  if (workspace_bytes < total || workspace == nullptr) {
    return fail(FLASHATTN_STATUS_WORKSPACE_TOO_SMALL,
                "workspace_bytes=%zu is smaller than the %zu bytes the standard algorithm needs", workspace_bytes,
                total);
  }
  const cublas::Api* api = nullptr;
  if (const flashattn_status_t s = cublas::load(&api)) return s;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(FLASHATTN_STATUS_CUDA_ERROR, "cudaGetDevice failed");
  }
  cublas::Handle h = nullptr;
  if (const flashattn_status_t s = cublas::thread_handle(device, &h)) return s;
  const uintptr_t raw = reinterpret_cast<uintptr_t>(workspace);
  reg->base = reinterpret_cast<char*>((raw + kAlign - 1) / kAlign * kAlign);
  cublas::Status st = api->set_stream(h, stream);
  if (st == cublas::kSuccess) st = api->set_workspace(h, reg->at(g.off_cublas), kCublasWorkspace);
  if (st != cublas::kSuccess) {
    return fail(FLASHATTN_STATUS_CUDA_ERROR, "cublasSetStream/cublasSetWorkspace failed: %s", cublas::status_text(st));
  }
  *ctx = Gemm{api, h, g.B, g.Hkv, g.G};
  return FLASHATTN_STATUS_SUCCESS;
}

// What both passes do first: workspace regions and cuBLAS handle (prepare), Q, K, V as GEMM
// operands (gathered into their padded copies when the layout needs it), the score rows
// as fp32 S and as P in the input dtype over the same memory, and S = scale Q K^T.
struct Prologue {
  Geometry g;
  Gemm ctx;
  Regions reg;
  const int32_t* cuq;  // cu_seqlens in varlen mode, else null
  const int32_t* cuk;
  Mat Q, K, V, Sm, Pm;
  float* S;
  int64_t eb, ldP;  // element bytes; P's row stride in elements
};

template <typename T>
flashattn_status_t prologue(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                            Prologue* pr) {
  pr->g = geometry(p);
  const Geometry& g = pr->g;
  FA_TRY(prepare(g, workspace, workspace_bytes, stream, &pr->ctx, &pr->reg));
  pr->cuq = p.varlen ? p.cu_seqlens_q : nullptr;
  pr->cuk = p.varlen ? p.cu_seqlens_k : nullptr;
  void* qp = pr->reg.at(g.off_q);
  void* kp = pr->reg.at(g.off_k);
  void* vp = pr->reg.at(g.off_v);
  if (g.gathered) {
    FA_TRY(gather<T>(p.q, qp, p.q_stride, pr->cuq, p.total_q, g.B, g.Hq, g.Sq, g.Dqk, stream));
    FA_TRY(gather<T>(p.k, kp, p.k_stride, pr->cuk, p.total_k, g.B, g.Hkv, g.Sk, g.Dqk, stream));
    FA_TRY(gather<T>(p.v, vp, p.v_stride, pr->cuk, p.total_k, g.B, g.Hkv, g.Sk, g.Dv, stream));
  }
  pr->Q = tensor_mat(g, p, p.q, qp, p.q_stride, false, g.Sq, g.Dqk);
  pr->K = tensor_mat(g, p, p.k, kp, p.k_stride, true, g.Sk, g.Dqk);
  pr->V = tensor_mat(g, p, p.v, vp, p.v_stride, true, g.Sk, g.Dv);
  pr->S = reinterpret_cast<float*>(pr->reg.at(g.off_s));
  pr->eb = elem_bytes(p.dtype);
  pr->ldP = g.ldS * 4 / pr->eb;
  pr->Sm = Mat{pr->S, CUDA_R_32F, 4, g.ldS, g.Sq * g.ldS, g.Hq * g.Sq * g.ldS, false};
  pr->Pm = Mat{pr->S, cuda_type(p.dtype), pr->eb, pr->ldP, g.Sq * pr->ldP, g.Hq * g.Sq * pr->ldP, false};
  // Column-major view: S^T[Sk x Sq] = K Q^T.
  return gemm(pr->ctx, "S = scale Q K^T", cublas::kOpT, cublas::kOpN, g.Sk, g.Sq, g.Dqk, p.scale, pr->K, pr->Q, pr->Sm);
}

// P_lo as a GEMM operand (split mode): the second half of each P row for the cached
// softmax, else its own region of rows of ldS elements.
Mat plo_mat(const AttnParams& p, const Prologue& pr) {
  const Geometry& g = pr.g;
  void* ptr = g.cached ? static_cast<void*>(reinterpret_cast<char*>(pr.S) + g.ldS * pr.eb) : pr.reg.at(g.off_plo);
  const int64_t ld = g.cached ? pr.ldP : g.ldS;
  return Mat{ptr, cuda_type(p.dtype), pr.eb, ld, g.Sq * ld, g.Hq * g.Sq * ld, false};
}

// P = softmax(options(S)) over every score row, P_lo (split mode) where plo_mat says.
template <typename T>
flashattn_status_t softmax_fwd(const AttnParams& p, const Prologue& pr, cudaStream_t stream) {
  const Geometry& g = pr.g;
  const Mat lo = g.split ? plo_mat(p, pr) : Mat{nullptr, CUDA_R_32F, 4, 0, 0, 0, false};
  T* lp = static_cast<T*>(lo.ptr);
  const unsigned rows = static_cast<unsigned>(g.B * g.Hq * g.Sq);
  if (g.cached) {
    const size_t smem = static_cast<size_t>((g.Sk + 3) / 4 * 4) * sizeof(float);
    FA_TRY(allow_smem(softmax_fwd_cached_kernel<T>, smem, "softmax_fwd_cached_kernel"));
    softmax_fwd_cached_kernel<T><<<rows, kRowThreads, smem, stream>>>(p, pr.S, lp, lo.ld, g.Sq, g.Sk, g.ldS);
    return launch_status("softmax_fwd_cached_kernel");
  }
  softmax_fwd_kernel<T><<<rows, kRowThreads, 0, stream>>>(p, pr.S, lp, lo.ld, g.Sq, g.Sk, g.ldS);
  return launch_status("softmax_fwd_kernel");
}

// Split mode: O = P_hi V + P_lo V / kLoScale in the fp32 buffer, then one rounding into
// the caller's O (its strides, or the varlen packing).
template <typename T>
flashattn_status_t pv_split(const AttnParams& p, const Prologue& pr, cudaStream_t stream) {
  const Geometry& g = pr.g;
  float* o32 = reinterpret_cast<float*>(pr.reg.at(g.off_o));
  const Mat O32{o32, CUDA_R_32F, 4, g.Dv, g.Sq * g.Dv, g.Hq * g.Sq * g.Dv, false};
  // O^T[Dv x Sq] = V^T P^T, twice.
  FA_TRY(gemm(pr.ctx, "O = P_hi V", cublas::kOpN, cublas::kOpN, g.Dv, g.Sq, g.Sk, 1.f, pr.V, pr.Pm, O32));
  FA_TRY(gemm(pr.ctx, "O += P_lo V", cublas::kOpN, cublas::kOpN, g.Dv, g.Sq, g.Sk, 1.f / kLoScale, pr.V, plo_mat(p, pr),
              O32, true));
  return scatter<float, T>(o32, p.o, p.o_stride, pr.cuq, p.total_q, g.B, g.Hq, g.Sq, g.Dv, stream);
}

template <typename T>
flashattn_status_t run_fwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  Prologue pr;
  FA_TRY(prologue<T>(p, workspace, workspace_bytes, stream, &pr));
  FA_TRY(softmax_fwd<T>(p, pr, stream));
  const Geometry& g = pr.g;
  if (g.split) return pv_split<T>(p, pr, stream);
  void* op = pr.reg.at(g.off_o);
  const Mat O = tensor_mat(g, p, p.o, op, p.o_stride, false, g.Sq, g.Dv);
  // O^T[Dv x Sq] = V^T P^T.
  FA_TRY(gemm(pr.ctx, "O = P V", cublas::kOpN, cublas::kOpN, g.Dv, g.Sq, g.Sk, 1.f, pr.V, pr.Pm, O));
  if (g.gathered) FA_TRY((scatter<T, T>(op, p.o, p.o_stride, pr.cuq, p.total_q, g.B, g.Hq, g.Sq, g.Dv, stream)));
  return FLASHATTN_STATUS_SUCCESS;
}

template <typename T>
flashattn_status_t run_bwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  Prologue pr;
  FA_TRY(prologue<T>(p, workspace, workspace_bytes, stream, &pr));
  const Geometry& g = pr.g;
  const Gemm& ctx = pr.ctx;
  const Regions& reg = pr.reg;
  const int32_t* cuq = pr.cuq;
  const int32_t* cuk = pr.cuk;
  const Mat &Q = pr.Q, &K = pr.K, &V = pr.V;
  void* dop = reg.at(g.off_o);
  void* dqp = reg.at(g.off_dq);
  if (g.gathered) FA_TRY(gather<T>(p.dout, dop, p.do_stride, cuq, p.total_q, g.B, g.Hq, g.Sq, g.Dv, stream));
  const Mat dO = tensor_mat(g, p, p.dout, dop, p.do_stride, false, g.Sq, g.Dv);
  const Mat dQ = tensor_mat(g, p, p.dq, dqp, p.dq_stride, false, g.Sq, g.Dqk);
  Mat dK = tensor_mat(g, p, p.dk, nullptr, p.dk_stride, true, g.Sk, g.Dqk);
  Mat dV = tensor_mat(g, p, p.dv, nullptr, p.dv_stride, true, g.Sk, g.Dv);
  if (g.acc_dkv) {
    dK = Mat{reg.at(g.off_dk), CUDA_R_32F, 4, g.Dqk, g.Sk * g.Dqk, g.Hkv * g.Sk * g.Dqk, true};
    dV = Mat{reg.at(g.off_dv), CUDA_R_32F, 4, g.Dv, g.Sk * g.Dv, g.Hkv * g.Sk * g.Dv, true};
  }
  float* S = pr.S;
  float* dP = reinterpret_cast<float*>(reg.at(g.off_dp));
  float* dt = g.dt_buffer && p.dbias != nullptr ? reinterpret_cast<float*>(reg.at(g.off_dt)) : nullptr;
  const int64_t eb = pr.eb, ldP = pr.ldP;
  const Mat dPm{dP, CUDA_R_32F, 4, g.ldS, g.Sq * g.ldS, g.Hq * g.Sq * g.ldS, false};
  const Mat& Pm = pr.Pm;
  const Mat dSm{dP, cuda_type(p.dtype), eb, ldP, g.Sq * ldP, g.Hq * g.Sq * ldP, false};

  // dP^T[Sk x Sq] = V dO^T.
  FA_TRY(gemm(ctx, "dP = dO V^T", cublas::kOpT, cublas::kOpN, g.Sk, g.Sq, g.Dv, 1.f, V, dO, dPm));
  const int64_t rows = g.B * g.Hq * g.Sq;
  const int64_t Sk4 = (g.Sk + 3) / 4 * 4;
  const int64_t cap = Sk4 < kCachedRowMax / 2 ? Sk4 : kCachedRowMax / 2;
  const size_t smem = static_cast<size_t>(cap) * 2 * sizeof(float);
  if (cap >= g.Sk) {
    FA_TRY(allow_smem(softmax_bwd_kernel<T, true>, smem, "softmax_bwd_kernel"));
    softmax_bwd_kernel<T, true>
        <<<static_cast<unsigned>(rows), kRowThreads, smem, stream>>>(p, S, dP, dt, g.Sq, g.Sk, g.ldS, cap);
  } else {
    FA_TRY(allow_smem(softmax_bwd_kernel<T, false>, smem, "softmax_bwd_kernel"));
    softmax_bwd_kernel<T, false>
        <<<static_cast<unsigned>(rows), kRowThreads, smem, stream>>>(p, S, dP, dt, g.Sq, g.Sk, g.ldS, cap);
  }
  FA_TRY(launch_status("softmax_bwd_kernel"));
  if (dt != nullptr) {
    int64_t n_out = 1;
    const int64_t ext[4] = {g.B, g.Hq, g.Sq, g.Sk};
    for (int d = 0; d < 4; ++d) n_out *= p.bias_stride[d] == 0 ? 1 : ext[d];
    dbias_reduce_kernel<T><<<elementwise_blocks(n_out), 256, 0, stream>>>(
        static_cast<T*>(p.dbias), dt, p.bias_stride[0], p.bias_stride[1], p.bias_stride[2], p.bias_stride[3], g.B, g.Hq,
        g.Sq, g.Sk);
    FA_TRY(launch_status("dbias_reduce_kernel"));
  }
  // dV^T[Dv x Sk] = dO^T Pdrop; dQ^T[Dqk x Sq] = scale K^T dS^T; dK^T[Dqk x Sk] = scale Q^T dS.
  // Accumulating gradients (p.grad_accumulate): the GEMMs that write a gradient in the
  // dtype add it (beta = 1: alpha op(A) op(B) + C in fp32, rounded once), a gathered dQ
  // first holding the caller's; fp32 dK/dV buffers are added by their scatter.
  const bool add = p.grad_accumulate != 0;
  if (add && g.gathered) FA_TRY(gather<T>(p.dq, dqp, p.dq_stride, cuq, p.total_q, g.B, g.Hq, g.Sq, g.Dqk, stream));
  FA_TRY(gemm(ctx, "dV = P^T dO", cublas::kOpN, cublas::kOpT, g.Dv, g.Sk, g.Sq, 1.f, dO, Pm, dV, add && !g.acc_dkv));
  FA_TRY(gemm(ctx, "dQ = scale dS K", cublas::kOpN, cublas::kOpN, g.Dqk, g.Sq, g.Sk, p.scale, K, dSm, dQ, add));
  FA_TRY(gemm(ctx, "dK = scale dS^T Q", cublas::kOpN, cublas::kOpT, g.Dqk, g.Sk, g.Sq, p.scale, Q, dSm, dK,
              add && !g.acc_dkv));
  if (g.gathered) FA_TRY((scatter<T, T>(dqp, p.dq, p.dq_stride, cuq, p.total_q, g.B, g.Hq, g.Sq, g.Dqk, stream)));
  if (g.acc_dkv) {
    FA_TRY((scatter<float, T>(dK.ptr, p.dk, p.dk_stride, cuk, p.total_k, g.B, g.Hkv, g.Sk, g.Dqk, stream, add)));
    FA_TRY((scatter<float, T>(dV.ptr, p.dv, p.dv_stride, cuk, p.total_k, g.B, g.Hkv, g.Sk, g.Dv, stream, add)));
  }
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace

flashattn_status_t standard_check(const AttnParams& p) {
  if (p.dtype != kFp16 && p.dtype != kBf16 && p.dtype != kFp32) {
    return fail(FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED, "dtype=%d is not supported by the standard algorithm",
                static_cast<int>(p.dtype));
  }
  const Geometry g = geometry(p);
  // cuBLAS takes int sizes and leading dimensions (batch counts are split into calls of
  // kMaxGemmBatch, strides and offsets are 64-bit); the softmax kernels run one CTA per
  // score row on a 1-D grid (at most 2^31 - 1 CTAs).
  const int64_t rows = g.B * g.Hq * g.Sq;
  if (g.Sq > INT_MAX || g.Sk > INT_MAX || g.ldS * 2 > INT_MAX) {
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                "algorithm=STANDARD: seqlen_q=%lld, seqlen_k=%lld: cuBLAS takes 32-bit matrix sizes and leading "
                "dimensions (seqlen_q <= %d, seqlen_k rounded up to 8 <= %d)",
                static_cast<long long>(g.Sq), static_cast<long long>(g.Sk), INT_MAX, INT_MAX / 2);
  }
  if (rows > INT_MAX) {
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                "algorithm=STANDARD: batch=%lld x heads_q=%lld x seqlen_q=%lld = %lld score rows exceeds %d, the "
                "softmax kernels' grid limit (one thread block per row)",
                static_cast<long long>(g.B), static_cast<long long>(g.Hq), static_cast<long long>(g.Sq),
                static_cast<long long>(rows), INT_MAX);
  }
  const cublas::Api* api = nullptr;
  if (const flashattn_status_t s = cublas::load(&api)) return s;
  int device = 0;
  const cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(FLASHATTN_STATUS_CUDA_ERROR, "cudaGetDevice failed: %s", cudaGetErrorString(err));
  }
  // Creating the handle allocates device memory: done here, before anything is written.
  cublas::Handle h = nullptr;
  return cublas::thread_handle(device, &h);
}

CheckedSize standard_workspace_size(const AttnParams& p) { return geometry(p).total; }

flashattn_status_t standard_fwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  switch (p.dtype) {
    case kFp16: return run_fwd<__half>(p, workspace, workspace_bytes, stream);
    case kBf16: return run_fwd<__nv_bfloat16>(p, workspace, workspace_bytes, stream);
    case kFp32: return run_fwd<float>(p, workspace, workspace_bytes, stream);
  }
  return fail(FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED, "dtype=%d is not supported by the standard algorithm",
              static_cast<int>(p.dtype));
}

flashattn_status_t standard_bwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  switch (p.dtype) {
    case kFp16: return run_bwd<__half>(p, workspace, workspace_bytes, stream);
    case kBf16: return run_bwd<__nv_bfloat16>(p, workspace, workspace_bytes, stream);
    case kFp32: return run_bwd<float>(p, workspace, workspace_bytes, stream);
  }
  return fail(FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED, "dtype=%d is not supported by the standard algorithm",
              static_cast<int>(p.dtype));
}

}  // namespace flashattn
