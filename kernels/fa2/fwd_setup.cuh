// Per-CTA set-up steps of the FA2-design forward kernel (fwd_kernel.cuh): the plan's options,
// the accumulators and the ldmatrix lane addresses.
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/exp2.h"
#include "common/mask.h"
#include "common/params.h"
#include "common/philox.h"
#include "fa2/fwd_traits.h"
#include "fa2/mma.cuh"

namespace flashattn {
namespace fa2 {

// The options of a plan as the forward kernel applies them (all off without kExtras).
// Elementwise scores are produced directly in the log2 domain:
//   no softcap: s = x * scale * log2e;  softcap c: s = (c * log2e) * tanh(x * scale / c)
//   then + bias * log2e or + (slope * log2e) * distance.
template <typename T>
struct FwdOptions {
  bool softcap_on, bias_on, alibi_on, elementwise;
  float sl2;  // the scale to the log2 domain: 1 when the scores are pre-scaled (elementwise)
  float x_mul, cap_l2, alibi_slope_l2;
  bool dropout;
  uint64_t drop_head;  // Philox counter of the (sequence, head)
  const T* bias_base;  // the bias tensor at (b, h)
};

template <bool kExtras, typename T>
__device__ __forceinline__ FwdOptions<T> fwd_options(const AttnParams& p, int b, int h) {
  const bool softcap_on = kExtras && p.softcap > 0.f;
  const bool bias_on = kExtras && p.bias_kind == kBiasTensor;
  const bool alibi_on = kExtras && (p.bias_kind == kBiasAlibi || p.bias_kind == kBiasAlibiSymmetric);
  const bool elementwise = softcap_on || bias_on || alibi_on;
  const float sl2 = elementwise ? 1.f : p.scale * kLog2e;
  const float x_mul = softcap_on ? p.scale / p.softcap : p.scale * kLog2e;
  const float cap_l2 = p.softcap * kLog2e;
  const float alibi_slope_l2 = alibi_on ? alibi_slope(p, b, h) * kLog2e : 0.f;
  const bool dropout = kExtras && dropout_active(p.drop_threshold);
  const uint64_t drop_head = p.offset + static_cast<uint64_t>(b) * static_cast<uint64_t>(p.heads_q) + h;
  const T* bias_base = nullptr;
  if (bias_on) bias_base = static_cast<const T*>(p.bias) + b * p.bias_stride[0] + h * p.bias_stride[1];
  return {softcap_on, bias_on,        alibi_on, elementwise, sl2,      x_mul,
          cap_l2,     alibi_slope_l2, dropout,  drop_head,   bias_base};
}

// The accumulators before the first KV tile: O = 0, row maxima -inf, row sums 0.
template <class Cfg>
__device__ __forceinline__ void fwd_init_acc(float (&acc_o)[Cfg::kMT][Cfg::kNV][4], float (&row_max)[Cfg::kMT * 2],
                                             float (&row_sum)[Cfg::kMT * 2]) {
  constexpr int kMT = Cfg::kMT;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nv = 0; nv < Cfg::kNV; ++nv)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][nv][e] = 0.f;
#pragma unroll
  for (int r = 0; r < kMT * 2; ++r) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0.f;
  }
}

// The ldmatrix lane addresses of the Q, K and V tiles (swizzle precomputed per lane).
template <class Cfg, typename T>
__device__ __forceinline__ void fwd_init_lanes(SwizzledLane<Cfg::kBlockM>& lq, SwizzledLane<Cfg::kBlockN>& lk,
                                               SwizzledLane<Cfg::kBlockN>& lv, const T* sQ, const T* sK, const T* sV,
                                               int row_w0, int lane) {
  // Q, A operand: rows (lane & 15), cols (lane >> 4) * 8
  lq.init(smem_u32(sQ), row_w0 + (lane & 15), (lane >> 4) * 8);
  // K, B operand from [n][k]: rows (lane & 7) + (lane >> 4) * 8, cols ((lane >> 3) & 1) * 8
  lk.init(smem_u32(sK), (lane & 7) + ((lane >> 4) << 3), ((lane >> 3) & 1) * 8);
  // V, B operand from [k][n] (.trans): rows (lane & 15), cols (lane >> 4) * 8
  lv.init(smem_u32(sV), lane & 15, (lane >> 4) * 8);
}

}  // namespace fa2
}  // namespace flashattn
