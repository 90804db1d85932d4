// The score steps of the FA2-design forward kernel (fwd_kernel.cuh), one KV tile at a time,
// in the order the kernel runs them: the elementwise transform (softcap, bias, ALiBi), the
// element masks, the online softmax (S becomes P) and dropout on P.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/exp2.h"
#include "common/mask.h"
#include "common/params.h"
#include "fa2/dropout.cuh"
#include "fa2/fwd_traits.h"
#include "fa2/mma.cuh"

namespace flashattn {
namespace fa2 {

// Elementwise score transform (kExtras): S in the log2 domain, scaled and soft-capped,
//   no softcap: s = x * scale * log2e;  softcap c: s = (c * log2e) * tanh(x * scale / c)
// then + bias * log2e (the bias tile staged in sB with bias_smem, else read from global
// memory) or + (slope * log2e) * distance (ALiBi).
template <class Cfg, typename T, class WRow>
__device__ __forceinline__ void fwd_score_transform(float (&s)[Cfg::kMT][Cfg::kNT][4], const AttnParams& p,
                                                    const WRow& wrow, const T* sB, const T* bias_base, bool softcap_on,
                                                    bool bias_on, bool alibi_on, int bias_smem, float x_mul,
                                                    float cap_l2, float alibi_slope_l2, int m0, int n0, int len_q,
                                                    int len_k, int shift, int g, int t) {
  constexpr int kMT = Cfg::kMT, kNT = Cfg::kNT;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = s[mt][nt][e] * x_mul;
        s[mt][nt][e] = softcap_on ? cap_l2 * tanhf(x) : x;
      }
  if (bias_on && bias_smem) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const T* brow = sB + (wrow(mt) + g + hh * 8) * Cfg::kBiasStride + 2 * t;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          const uint32_t u = *reinterpret_cast<const uint32_t*>(brow + nt * 8);
          T h2[2];
          memcpy(h2, &u, 4);
          s[mt][nt][2 * hh] = fmaf(ElemTraits<T>::to_float(h2[0]), kLog2e, s[mt][nt][2 * hh]);
          s[mt][nt][2 * hh + 1] = fmaf(ElemTraits<T>::to_float(h2[1]), kLog2e, s[mt][nt][2 * hh + 1]);
        }
      }
  } else if (bias_on) {
    // One row at a time (the empty asm keeps the loads of a row together, bounding
    // the registers in flight); pairs of columns are one 32-bit load when aligned.
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int i = m0 + wrow(mt) + g + hh * 8;
        if (i < len_q) {
          const T* brow = bias_base + static_cast<int64_t>(i) * p.bias_stride[2];
          const int64_t bsk = p.bias_stride[3];
          const bool pairs = bsk == 1 && (reinterpret_cast<uintptr_t>(brow) & 3u) == 0;
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            const int j = n0 + nt * 8 + 2 * t;
            float b0 = 0.f, b1 = 0.f;
            if (pairs && j + 1 < len_k) {
              const uint32_t u = *reinterpret_cast<const uint32_t*>(brow + j);
              T h2[2];
              memcpy(h2, &u, 4);
              b0 = ElemTraits<T>::to_float(h2[0]);
              b1 = ElemTraits<T>::to_float(h2[1]);
            } else {
              if (j < len_k) b0 = ElemTraits<T>::to_float(brow[j * bsk]);
              if (j + 1 < len_k) b1 = ElemTraits<T>::to_float(brow[(j + 1) * bsk]);
            }
            s[mt][nt][2 * hh] = fmaf(b0, kLog2e, s[mt][nt][2 * hh]);
            s[mt][nt][2 * hh + 1] = fmaf(b1, kLog2e, s[mt][nt][2 * hh + 1]);
          }
        }
        asm volatile("" ::: "memory");
      }
  } else if (alibi_on) {
    const bool sym = p.bias_kind == kBiasAlibiSymmetric;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int ip = m0 + wrow(mt) + g + hh * 8 + shift;
        const float dist0 = static_cast<float>(n0 + 2 * t - ip);  // one conversion per row
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float dist = dist0 + static_cast<float>(nt * 8 + e);
            s[mt][nt][2 * hh + e] = fmaf(alibi_slope_l2, sym ? -fabsf(dist) : dist, s[mt][nt][2 * hh + e]);
          }
      }
  }
}

// The element mask of a boundary tile (the band of a causal or sliding-window mask, the end
// of the keys): masked elements of S set to -inf.
template <class Cfg, class WRow>
__device__ __forceinline__ void fwd_band_mask(float (&s)[Cfg::kMT][Cfg::kNT][4], const WRow& wrow, bool band, int wl,
                                              int wr, int m0, int n0, int len_k, int shift, int g, int t) {
  constexpr int kMT = Cfg::kMT, kNT = Cfg::kNT;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int ip = m0 + wrow(mt) + g + hh * 8 + shift;
      // Columns kept by the band and the sequence end: [lo, hi].
      int hi = len_k - 1, lo = 0;
      if (band && wr >= 0) hi = min(hi, ip + wr);
      if (band && wl >= 0) lo = max(lo, ip - wl);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = n0 + nt * 8 + 2 * t + e;
          if (j < lo || j > hi) s[mt][nt][2 * hh + e] = -INFINITY;
        }
    }
}

// Online softmax (base 2) over one KV tile: the row maxima and sums updated, O rescaled by
// exp2 of the change of the maximum, S replaced by P = exp2(S * sl2 - max * sl2).
template <class Cfg>
__device__ __forceinline__ void fwd_softmax(float (&s)[Cfg::kMT][Cfg::kNT][4], float (&acc_o)[Cfg::kMT][Cfg::kNV][4],
                                            float (&row_max)[Cfg::kMT * 2], float (&row_sum)[Cfg::kMT * 2], float sl2) {
  constexpr int kMT = Cfg::kMT, kNT = Cfg::kNT;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = mt * 2 + hh;
      float mx = row_max[r];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hh], s[mt][nt][2 * hh + 1]));
      mx = quad_max(mx);
      const float m_scaled = mx == -INFINITY ? 0.f : mx * sl2;
      const float alpha = fast_exp2(row_max[r] * sl2 - m_scaled);
      row_max[r] = mx;
      row_sum[r] *= alpha;
#pragma unroll
      for (int nv = 0; nv < Cfg::kNV; ++nv) {
        acc_o[mt][nv][2 * hh] *= alpha;
        acc_o[mt][nv][2 * hh + 1] *= alpha;
      }
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pe = fast_exp2(fmaf(s[mt][nt][2 * hh + e], sl2, -m_scaled));
          s[mt][nt][2 * hh + e] = pe;
          sum += pe;
        }
      row_sum[r] += sum;
    }
}

// Dropout on P (kExtras; the row sums keep the undropped values): the keep decisions of the
// tile as a bit mask per m16 tile (fwd_drop_bits: a rolled loop, one Philox call per thread,
// pair of n8 tiles and m16 tile, which keeps register pressure low; they depend on no score,
// so the sm_90a code computes them while the S GEMM runs), then dropped elements of P set to
// 0 (fwd_drop_apply).
template <class Cfg, class WRow>
__device__ __forceinline__ void fwd_drop_bits(DropBits<Cfg::kNT> (&bits)[Cfg::kMT], const AttnParams& p,
                                              const WRow& wrow, uint64_t drop_head, int m0, int n0, int g, int t) {
  constexpr int kMT = Cfg::kMT, kNT = Cfg::kNT;
  // Fully unrolled when the O accumulator is small, else two Philox calls in flight.
  constexpr int kDropUnroll = kMT * Cfg::kNV <= 16 ? kNT : 2;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
    bits[mt] = dropout_drop_bits<kNT, kDropUnroll>(p.seed, drop_head, static_cast<uint32_t>(m0 + wrow(mt) + g),
                                                   static_cast<uint32_t>(n0), t, p.drop_threshold);
}
template <class Cfg>
__device__ __forceinline__ void fwd_drop_apply(float (&s)[Cfg::kMT][Cfg::kNT][4],
                                               const DropBits<Cfg::kNT> (&bits)[Cfg::kMT]) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < Cfg::kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if ((bits[mt] >> (4 * nt + e)) & 1u) s[mt][nt][e] = 0.f;
}

}  // namespace fa2
}  // namespace flashattn
