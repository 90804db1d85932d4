// Generation-1 FlashAttention forward kernel (FA2 design, sm_80+).
//
// One CTA per (q block, query head, sequence). Warps split the q block by rows (kMT m16
// tiles each), so row max / row sum are quad shuffles. S = Q K^T and O += P V run on
// mma.sync m16n8k16 with fp32 accumulation; P never leaves registers. Q, K, V live in
// XOR-swizzled shared tiles filled by 16-byte cp.async with zero-fill predicates (rows
// past the sequence, head-dim chunks past the real head dim). K and V are single
// buffered: V(n) is loaded while S(n) is computed, K(n-1) while softmax and P V(n) run.
//
// Every plan option is a warp-uniform runtime branch: band masks (causal/sliding window,
// both alignments: only KV tiles intersecting the band are walked, only boundary tiles
// apply the element mask), softcap, bias tensor, ALiBi, dropout (Philox keep decisions of
// common/philox.h), block-sparse layouts (inactive tiles skipped, partial tiles masked
// per element), varlen, GQA/MQA, arbitrary strides.
//
// In the Sm90a policy's code (arch.h) at d=64/128/256 (kWgF) both GEMMs are warpgroup MMA: S = Q K^T with Q and K
// from the swizzled shared tiles, O += P V with P from registers and V from shared memory; the
// four warps are one warpgroup and own rows 16 w + 64 mt (m64 tile mt) instead of 32 w + 16 mt,
// in the same fragment layout, so the softmax and option code is shared. The tiles then start
// at the first 1024-byte boundary of the dynamic shared memory (the launcher adds kFwdWgAlign
// bytes).
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/mask.h"
#include "common/params.h"
#include "fa2/arch.h"
#include "fa2/dropout.cuh"
#include "fa2/fwd_sparse.cuh"
#include "fa2/fwd_traits.h"
#include "fa2/mma.cuh"
#include "fa2/wgmma.cuh"

namespace flashattn {
namespace fa2 {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Copies a [kRows x kCols] tile (row stride in elements) into a SwizzledTile<kRows, kCols>
// with cp.async; rows >= rows_valid and 8-column chunks >= chunks_valid are zero-filled.
// Thread tid owns chunk (tid % 8) of every 64-column block in rows tid/8 + k*(kThreads/8),
// so the swizzle and the global address advance by constants.
template <int kRows, int kCols, int kThreads, typename T>
__device__ __forceinline__ void load_tile_async(uint32_t s_tile, const T* g, int64_t row_stride, int rows_valid,
                                                int chunks_valid, const T* safe, int tid) {
  constexpr int kRowStep = kThreads / 8;
  static_assert(kRows % kRowStep == 0 && kCols % 64 == 0, "tile loader shape");
  const int r0 = tid >> 3, c0 = tid & 7;
  const uint32_t s_lane = s_tile + 2u * static_cast<uint32_t>(r0 * 64 + ((c0 ^ (r0 & 7)) << 3));
  const T* gp = g + r0 * row_stride + c0 * 8;
  const int64_t step = kRowStep * row_stride;
#pragma unroll
  for (int it = 0; it < kRows / kRowStep; ++it) {
    const bool row_ok = r0 + it * kRowStep < rows_valid;
#pragma unroll
    for (int cb = 0; cb < kCols / 64; ++cb) {
      const bool pred = row_ok && cb * 8 + c0 < chunks_valid;
      cp_async_16(s_lane + 2u * static_cast<uint32_t>(cb * kRows * 64 + it * kRowStep * 64), pred ? gp + cb * 64 : safe,
                  pred);
    }
    gp += step;
  }
}

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

// Dropout on P (kExtras; the row sums keep the undropped values): keep decisions are first
// gathered into a bit mask by a rolled loop (one Philox call per thread, n8 tile and m16
// tile), which keeps register pressure low; dropped elements of P set to 0.
template <class Cfg, class WRow>
__device__ __forceinline__ void fwd_dropout(float (&s)[Cfg::kMT][Cfg::kNT][4], const AttnParams& p, const WRow& wrow,
                                            uint64_t drop_head, int m0, int n0, int g, int t) {
  constexpr int kMT = Cfg::kMT, kNT = Cfg::kNT;
  // Fully unrolled when the O accumulator is small, else two Philox calls in flight.
  constexpr int kDropUnroll = kMT * Cfg::kNV <= 16 ? kNT : 2;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    const DropBits<kNT> drop_bits = dropout_drop_bits<kNT, kDropUnroll>(
        p.seed, drop_head, static_cast<uint32_t>(m0 + wrow(mt) + g), static_cast<uint32_t>(n0), t, p.drop_threshold);
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if ((drop_bits >> (4 * nt + e)) & 1u) s[mt][nt][e] = 0.f;
  }
}

// Varlen: sequence b's first query and key token and its lengths from the offsets (clamped so
// that bad inputs stay in bounds; lengths at most the plan's maxima).
__device__ __forceinline__ void fwd_varlen_extent(const AttnParams& p, int b, int64_t& q_start, int64_t& k_start,
                                                  int& len_q, int& len_k) {
  int64_t a = p.cu_seqlens_q[b], e = p.cu_seqlens_q[b + 1];
  a = a < 0 ? 0 : (a > p.total_q ? p.total_q : a);
  e = e < a ? a : (e > p.total_q ? p.total_q : e);
  q_start = a;
  len_q = static_cast<int>(e - a < p.seqlen_q ? e - a : p.seqlen_q);
  a = p.cu_seqlens_k[b];
  e = p.cu_seqlens_k[b + 1];
  a = a < 0 ? 0 : (a > p.total_k ? p.total_k : a);
  e = e < a ? a : (e > p.total_k ? p.total_k : e);
  k_start = a;
  len_k = static_cast<int>(e - a < p.seqlen_k ? e - a : p.seqlen_k);
}

// Epilogue: O normalized by the row sums (and by 1 - p with dropout), the LSE, and O through
// shared memory (the Q tile) to global memory, each warp its own rows.
template <class Cfg, typename T, bool kExtras, bool kWgF, class WRow>
__device__ __forceinline__ void fwd_epilogue(const AttnParams& p, float (&acc_o)[Cfg::kMT][Cfg::kNV][4],
                                             const float (&row_max)[Cfg::kMT * 2], const float (&row_sum)[Cfg::kMT * 2],
                                             const WRow& wrow, T* sQ, T* gO, bool dropout, float sl2, int b, int h,
                                             int64_t q_start, int m0, int rows_q, int dv_chunks, int row_w0, int lane,
                                             int g, int t) {
  constexpr int kMT = Cfg::kMT;
  using OTile = typename Cfg::OTile;
  const float out_scale = kExtras && dropout ? p.rp_keep : 1.f;
  float* lse_out = nullptr;
  if (p.lse != nullptr)
    lse_out = p.lse + (p.varlen ? h * p.total_q + q_start : (static_cast<int64_t>(b) * p.heads_q + h) * p.seqlen_q);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = mt * 2 + hh;
      // sum = 0 exactly iff every probability of the row was 0 (the row maximum alone
      // contributes ex2(0) = 1): a fully masked row, O = 0 and LSE = -inf. fmaxf skips
      // NaN, so a NaN score (NaN in Q, or in a kept K row) leaves the max alone but makes
      // its exp, and from then on the sum (NaN * alpha), NaN: O and LSE become NaN.
      const float sum = quad_sum(row_sum[r]);
      const float inv = sum != 0.f ? out_scale / sum : 0.f;
#pragma unroll
      for (int nv = 0; nv < Cfg::kNV; ++nv) {
        acc_o[mt][nv][2 * hh] *= inv;
        acc_o[mt][nv][2 * hh + 1] *= inv;
      }
      const int row = wrow(mt) + g + hh * 8;
      if (lse_out != nullptr && t == 0 && row < rows_q)
        lse_out[m0 + row] = sum != 0.f ? (row_max[r] * sl2 + __log2f(sum)) * kLn2 : -INFINITY;
    }
  // Each warp only ever read its own rows of sQ, so it may overwrite them now (kWgF: the
  // warpgroup's GEMMs read every row; they are all complete after this barrier).
  if constexpr (kWgF) __syncthreads();
  T* sO = sQ;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nv = 0; nv < Cfg::kNV; ++nv)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = wrow(mt) + g + hh * 8;
        const int col = nv * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(sO + OTile::offset(row, col)) =
            pack2<T>(acc_o[mt][nv][2 * hh], acc_o[mt][nv][2 * hh + 1]);
      }
  __syncwarp();
  constexpr int kOChunks = Cfg::kDV / 8;
#pragma unroll
  for (int it = 0; it < (Cfg::kRowsPerWarp * kOChunks + 31) / 32; ++it) {
    const int idx = lane + it * 32;
    const int r = idx / kOChunks, c = idx - r * kOChunks;
    const int row = kWgF ? wrow(r >> 4) + (r & 15) : row_w0 + r;
    if (r < Cfg::kRowsPerWarp && row < rows_q && c < dv_chunks) {
      const uint4 v = *reinterpret_cast<const uint4*>(sO + OTile::offset(row, c * 8));
      *reinterpret_cast<uint4*>(gO + row * p.o_stride.s + c * 8) = v;
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

// The bias tile of q block m0 and KV tile n0 (kExtras with bias_smem: k stride 1, 16-byte
// aligned rows) into sB by cp.async, next to V; rows and columns past the sequences zero.
template <class Cfg, typename T>
__device__ __forceinline__ void fwd_load_bias_tile(const AttnParams& p, T* sB, const T* bias_base, int m0, int n0,
                                                   int rows_q, int len_k, int tid) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kThreads = Cfg::kThreads;
  constexpr int kChunks = kBlockN / 8;
  const T* gB = bias_base + static_cast<int64_t>(m0) * p.bias_stride[2] + n0;
  for (int idx = tid; idx < kBlockM * kChunks; idx += kThreads) {
    const int row = idx / kChunks, ch = idx - row * kChunks;
    int valid = row < rows_q ? min(8, len_k - n0 - ch * 8) : 0;
    valid = valid < 0 ? 0 : valid;
    const T* src = valid > 0 ? gB + row * p.bias_stride[2] + ch * 8 : bias_base;
    cp_async_16_bytes(smem_u32(sB + row * Cfg::kBiasStride + ch * 8), src, valid * 2);
  }
}

// Block-sparse (kExtras with a layout): the layout of head h (layout_h), its block sizes
// (clamped to 2^30 so that 32-bit divisions stay exact), the layout rows of q block m0..m_last
// (rb0, n_rb) and the lookups one KV tile needs (at most ncb_max columns, lk_tile in all;
// tiles_per_scan tiles per 32-lane batch, 0 when one tile needs more).
template <int kBlockN>
__device__ __forceinline__ void fwd_layout_setup(const AttnParams& p, const uint8_t* layout, int h, int m0, int m_last,
                                                 uint32_t& lay_bq, uint32_t& lay_bk, const uint8_t*& layout_h, int& rb0,
                                                 int& n_rb, int& ncb_max, int& lk_tile, int& tiles_per_scan) {
  lay_bq = static_cast<uint32_t>(min(p.block_q, static_cast<int64_t>(1) << 30));
  lay_bk = static_cast<uint32_t>(min(p.block_k, static_cast<int64_t>(1) << 30));
  layout_h = layout + (p.layout_heads == 1 ? 0 : static_cast<int64_t>(h)) * p.n_row_blocks * p.n_col_blocks;
  rb0 = static_cast<int>(static_cast<uint32_t>(m0) / lay_bq);
  n_rb = static_cast<int>(static_cast<uint32_t>(m_last) / lay_bq) - rb0 + 1;
  // Layout blocks one KV tile can touch: n_rb rows x at most ncb_max columns.
  ncb_max = static_cast<int>(min(p.n_col_blocks, static_cast<int64_t>((kBlockN - 1) / lay_bk + 2)));
  lk_tile = n_rb * ncb_max;
  tiles_per_scan = lk_tile <= 32 ? 32 / lk_tile : 0;
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

// The next KV tile below n_block with an attended block (a value < n_block_min when none;
// its state in *next_state): the batch the kernel looked up early (look) first, if any.
template <int kBlockN>
__device__ __forceinline__ int fwd_next_tile(const FwdScanResolve& scan_resolve,
                                             const FwdPrevActive<kBlockN>& prev_active, bool scan_early, uint32_t look,
                                             int n_block, int n_block_min, int tiles_per_scan, int* next_state) {
  int n_next = n_block_min - 1;
  if (scan_early) {
    n_next = scan_resolve(n_block - 1, look, next_state);
    if (n_next == kFwdScanMore) n_next = prev_active(n_block - 1 - tiles_per_scan, next_state);
  } else if (n_block > n_block_min) {
    n_next = prev_active(n_block - 1, next_state);
  }
  return n_next;
}

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
  const bool dropout = kExtras && p.p_drop > 0.f;
  const uint64_t drop_head = p.offset + static_cast<uint64_t>(b) * static_cast<uint64_t>(p.heads_q) + h;
  const T* bias_base = nullptr;
  if (bias_on) bias_base = static_cast<const T*>(p.bias) + b * p.bias_stride[0] + h * p.bias_stride[1];
  return {softcap_on, bias_on,        alibi_on, elementwise, sl2,      x_mul,
          cap_l2,     alibi_slope_l2, dropout,  drop_head,   bias_base};
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

// kExtras: compiled with the rarer options (softcap, bias tensor, ALiBi, dropout, block-sparse
// layouts); without them the kernel needs fewer registers. Both variants branch on the
// options at run time; the host picks the extras variant only when one is enabled.
// bias_smem (extras only): the bias tensor has k stride 1, 16-byte aligned rows and the
// launch reserved Cfg::kBiasSmemBytes more shared memory; bias tiles are then staged with
// cp.async next to V instead of being read element by element.
template <class Arch, typename Cfg, typename T, bool kExtras>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fwd_kernel(const AttnParams p, const int bias_smem, const int b0, const int h0) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kMT = Cfg::kMT, kNT = Cfg::kNT;
  constexpr int kThreads = Cfg::kThreads;
  using QTile = typename Cfg::QTile;
  using KTile = typename Cfg::KTile;
  using VTile = typename Cfg::VTile;
  using OTile = typename Cfg::OTile;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  constexpr bool kWgF =
      Arch::kWgmma && kThreads == 128 && Cfg::kD % 64 == 0 && Cfg::kDV % 64 == 0 && (kBlockN == 64 || kBlockN == 128);
  unsigned char* const smem_al =
      kWgF ? smem_raw + ((1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u)
           : smem_raw;
  T* sQ = reinterpret_cast<T*>(smem_al);
  T* sK = sQ + QTile::kElems;
  T* sV = sK + KTile::kElems;
  T* sB = sV + VTile::kElems;  // bias tile, only with bias_smem

  // Grid (m blocks, heads, sequences) from query head h0 and sequence b0 on: the launcher
  // splits heads_q and batch into chunks of at most 65535 (the grid's y/z limit). b and h
  // stay cheap to re-derive (a special register plus a kernel parameter), which matters
  // to register allocation: they are used again in the epilogue.
  const int m_block = blockIdx.x;
  const int h = h0 + static_cast<int>(blockIdx.y);
  const int b = b0 + static_cast<int>(blockIdx.z);
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;

  // ---- this sequence's extent (varlen offsets clamped so bad inputs stay in bounds) ----
  int64_t q_start = 0, k_start = 0;
  int len_q = static_cast<int>(p.seqlen_q), len_k = static_cast<int>(p.seqlen_k);
  if (p.varlen) fwd_varlen_extent(p, b, q_start, k_start, len_q, len_k);
  const int m0 = m_block * kBlockM;
  if (m0 >= len_q) return;
  const int rows_q = min(kBlockM, len_q - m0);
  const int m_last = m0 + rows_q - 1;
  const int hk = h / static_cast<int>(p.heads_q / p.heads_kv);

  const T* q_base = static_cast<const T*>(p.q);
  const T* k_base = static_cast<const T*>(p.k);
  const T* v_base = static_cast<const T*>(p.v);
  const T* gQ = q_base + (p.varlen ? q_start * p.q_stride.s : b * p.q_stride.b) + h * p.q_stride.h + m0 * p.q_stride.s;
  const T* gK = k_base + (p.varlen ? k_start * p.k_stride.s : b * p.k_stride.b) + hk * p.k_stride.h;
  const T* gV = v_base + (p.varlen ? k_start * p.v_stride.s : b * p.v_stride.b) + hk * p.v_stride.h;
  T* gO = static_cast<T*>(p.o) + (p.varlen ? q_start * p.o_stride.s : b * p.o_stride.b) + h * p.o_stride.h +
          m0 * p.o_stride.s;
  const int dq_chunks = static_cast<int>(p.head_dim_qk >> 3);
  const int dv_chunks = static_cast<int>(p.head_dim_v >> 3);

  // ---- KV tile range from the band mask (int32: lengths < 2^30, windows clamped) ----
  const int shift = p.align == 1 ? len_k - len_q : 0;
  const bool band = p.has_band != 0;
  const int wl = p.window_left < 0 ? -1 : static_cast<int>(min(p.window_left, static_cast<int64_t>(1) << 30));
  const int wr = p.window_right < 0 ? -1 : static_cast<int>(min(p.window_right, static_cast<int64_t>(1) << 30));
  int64_t col_begin = 0, col_end = len_k;  // columns any row of this tile may keep
  if (band && wr >= 0) col_end = min(col_end, static_cast<int64_t>(m_last) + shift + wr + 1);
  if (band && wl >= 0) col_begin = max(col_begin, static_cast<int64_t>(m0) + shift - wl);
  const int n_block_min = col_begin < col_end ? static_cast<int>(col_begin / kBlockN) : 0;
  const int n_block_max = col_begin < col_end ? static_cast<int>((col_end + kBlockN - 1) / kBlockN) : 0;

  // ---- block-sparse tile classification (warp-uniform; each warp computes it itself) ----
  const uint8_t* layout = kExtras ? p.layout : nullptr;
  const uint8_t* layout_h = nullptr;
  // Divisors clamped to 2^30 (j / block stays exact for j < 2^30) so 32-bit math suffices.
  uint32_t lay_bq = 1, lay_bk = 1;
  int rb0 = 0, n_rb = 0, ncb_max = 1, lk_tile = 1, tiles_per_scan = 0;
  if (layout != nullptr)
    fwd_layout_setup<kBlockN>(p, layout, h, m0, m_last, lay_bq, lay_bk, layout_h, rb0, n_rb, ncb_max, lk_tile,
                              tiles_per_scan);

  const FwdScanIssue<kBlockN> scan_issue{lane,  lk_tile, tiles_per_scan, n_block_min, ncb_max,
                                         len_k, lay_bk,  layout_h,       rb0,         p};
  const FwdScanResolve scan_resolve{lk_tile, tiles_per_scan, n_block_min};
  const FwdTileState<kBlockN> tile_state{len_k, lay_bk, n_rb, lane, layout_h, rb0, p};
  const FwdPrevActive<kBlockN> prev_active{layout, tiles_per_scan, n_block_min, scan_resolve, scan_issue, tile_state};

  int cur_state = 2;
  int n_block = n_block_max > n_block_min ? prev_active(n_block_max - 1, &cur_state) : n_block_min - 1;

  const int row_w0 = warp * Cfg::kRowsPerWarp;  // first row of this warp within the tile
  // First row of this warp's m16 tile mt (kWgF: of m64 tile mt, see the header).
  auto wrow = [&](int mt) { return kWgF ? mt * 64 + warp * 16 : row_w0 + mt * 16; };

  if (n_block < n_block_min) {
    // Every element of these rows is masked: O = 0, LSE = -inf.
    for (int idx = tid; idx < rows_q * dv_chunks; idx += kThreads) {
      const int r = idx / dv_chunks, c = idx - r * dv_chunks;
      *reinterpret_cast<uint4*>(gO + r * p.o_stride.s + c * 8) = make_uint4(0, 0, 0, 0);
    }
    if (p.lse != nullptr) {
      float* lse =
          p.lse + (p.varlen ? h * p.total_q + q_start : (static_cast<int64_t>(b) * p.heads_q + h) * p.seqlen_q);
      for (int r = tid; r < rows_q; r += kThreads) lse[m0 + r] = -INFINITY;
    }
    return;
  }

  // ---- prologue: Q tile and the first K tile ----
  load_tile_async<kBlockM, Cfg::kDS, kThreads>(smem_u32(sQ), gQ, p.q_stride.s, rows_q, dq_chunks, q_base, tid);
  load_tile_async<kBlockN, Cfg::kDS, kThreads>(smem_u32(sK),
                                               gK + static_cast<int64_t>(n_block) * kBlockN * p.k_stride.s,
                                               p.k_stride.s, len_k - n_block * kBlockN, dq_chunks, k_base, tid);
  cp_async_commit();

  // ---- per-thread options ----
  const FwdOptions<T> o = fwd_options<kExtras, T>(p, b, h);

  float acc_o[kMT][Cfg::kNV][4];
  float row_max[kMT * 2], row_sum[kMT * 2];
  fwd_init_acc<Cfg>(acc_o, row_max, row_sum);

  // ldmatrix lane addressing (swizzle precomputed per lane).
  SwizzledLane<kBlockM> lq;
  SwizzledLane<kBlockN> lk, lv;
  fwd_init_lanes<Cfg>(lq, lk, lv, sQ, sK, sV, row_w0, lane);

  for (;;) {
    const int n0 = n_block * kBlockN;
    cp_async_wait<0>();
    // kWgF: the GEMMs read the tiles through the async proxy; this thread's cp.async wrote them
    // through the generic one.
    if constexpr (kWgF) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();  // K(n) (and Q) visible; every warp is done with V of the previous tile
    load_tile_async<kBlockN, Cfg::kDVS, kThreads>(smem_u32(sV), gV + static_cast<int64_t>(n0) * p.v_stride.s,
                                                  p.v_stride.s, len_k - n0, dv_chunks, v_base, tid);
    if (kExtras && o.bias_on && bias_smem) fwd_load_bias_tile<Cfg>(p, sB, o.bias_base, m0, n0, rows_q, len_k, tid);

    cp_async_commit();

    // Block-sparse: look up the next candidate tiles now; the ballot after the GEMM finds
    // the loads completed.
    const bool scan_early = layout != nullptr && tiles_per_scan > 0 && n_block > n_block_min;
    const uint32_t look = scan_early ? scan_issue(n_block - 1) : 0u;

    // ---- S = Q K^T ----
    float s[kMT][kNT][4];
    if constexpr (kWgF) {
      // One m64 x kBlockN wgmma tile per mt; the first k16 step overwrites s.
      wg_fence();
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        wg_gemm<T, kNT, Cfg::kD, 0, kBlockM, kBlockN, true>(*reinterpret_cast<float(*)[1][kNT][4]>(&s[mt][0][0]),
                                                            smem_u32(sQ) + static_cast<uint32_t>(mt * 64 * 128),
                                                            smem_u32(sK));
      }
      wg_commit();
      wg_wait<0>();
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) wg_hold(*reinterpret_cast<float(*)[1][kNT][4]>(&s[mt][0][0]));
    } else {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < Cfg::kKQ; ++ks) {
        uint32_t qa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) ldmatrix_x4(qa[mt], lq.at(mt * 16, ks * 16));
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          uint32_t kb[4];
          ldmatrix_x4(kb, lk.at(np * 16, ks * 16));
          const uint32_t b0[2] = {kb[0], kb[1]};
          const uint32_t b1[2] = {kb[2], kb[3]};
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma16816<T>(s[mt][2 * np], qa[mt], b0);
            mma16816<T>(s[mt][2 * np + 1], qa[mt], b1);
          }
        }
      }
    }

    // Next active tile (warp-uniform scan of the layout, if any).
    int next_state = 2;
    const int n_next = fwd_next_tile<kBlockN>(scan_resolve, prev_active, scan_early, look, n_block, n_block_min,
                                              tiles_per_scan, &next_state);

    cp_async_wait<0>();
    if constexpr (kWgF) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();  // V(n) (and the bias tile) visible; every warp is done reading K(n)
    if (n_next >= n_block_min) {
      load_tile_async<kBlockN, Cfg::kDS, kThreads>(smem_u32(sK),
                                                   gK + static_cast<int64_t>(n_next) * kBlockN * p.k_stride.s,
                                                   p.k_stride.s, len_k - n_next * kBlockN, dq_chunks, k_base, tid);
      cp_async_commit();
    }

    // ---- elementwise score transform: scale, softcap, bias / ALiBi (log2 domain) ----
    if (o.elementwise)
      fwd_score_transform<Cfg>(s, p, wrow, sB, o.bias_base, o.softcap_on, o.bias_on, o.alibi_on, bias_smem, o.x_mul,
                               o.cap_l2, o.alibi_slope_l2, m0, n0, len_q, len_k, shift, g, t);

    // ---- element mask on boundary tiles ----
    const bool col_edge = n0 + kBlockN > len_k;
    const bool band_edge =
        band && ((wr >= 0 && n0 + kBlockN - 1 > m0 + shift + wr) || (wl >= 0 && n0 < m_last + shift - wl));
    if (col_edge || band_edge) fwd_band_mask<Cfg>(s, wrow, band, wl, wr, m0, n0, len_k, shift, g, t);

    if (cur_state == 1) {
      // Partially covered block-sparse tile: per-element layout lookup. Column blocks are
      // computed once per column (32-bit divisions), row offsets once per row.
      int64_t lrow[kMT][2];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int i = min(m0 + wrow(mt) + g + hh * 8, m_last);
          lrow[mt][hh] = static_cast<int64_t>(static_cast<uint32_t>(i) / lay_bq) * p.n_col_blocks;
        }
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = min(n0 + nt * 8 + 2 * t + e, len_k - 1);
          const uint8_t* lcol = layout_h + static_cast<uint32_t>(j) / lay_bk;
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
              if (lcol[lrow[mt][hh]] == 0) s[mt][nt][2 * hh + e] = -INFINITY;
        }
    }

    // ---- online softmax (base 2) ----
    fwd_softmax<Cfg>(s, acc_o, row_max, row_sum, o.sl2);

    // ---- dropout on P (the row sums above keep the undropped values) ----
    if (o.dropout) fwd_dropout<Cfg>(s, p, wrow, o.drop_head, m0, n0, g, t);

    // ---- O += P V (P from registers) ----
    if constexpr (kWgF) {
      // V MN-major: k16 step kk = rows 16 kk.. (2048 bytes further), N = kDV across its
      // 64-column blocks (kBlockN * 128 bytes apart).
      // (Every P fragment is packed before the first wgmma: a register written between two of
      // them makes ptxas insert a warpgroup fence there.)
      const uint64_t db = wg_desc(smem_u32(sV), kBlockN * 128);
      uint32_t pa[Cfg::kKV][kMT][4];
#pragma unroll
      for (int kk = 0; kk < Cfg::kKV; ++kk)
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          pa[kk][mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          pa[kk][mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          pa[kk][mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          pa[kk][mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < Cfg::kKV; ++kk)
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
          wg_mma_rs<T, Cfg::kDV>(*reinterpret_cast<float(*)[1][Cfg::kNV][4]>(&acc_o[mt][0][0]), pa[kk][mt],
                                 db + static_cast<uint64_t>(kk * 128));
      wg_commit();
      wg_wait<0>();
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) wg_hold(*reinterpret_cast<float(*)[1][Cfg::kNV][4]>(&acc_o[mt][0][0]));
    } else
#pragma unroll
      for (int kk = 0; kk < Cfg::kKV; ++kk) {
        uint32_t pa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          pa[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          pa[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          pa[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          pa[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int np = 0; np < Cfg::kNV / 2; ++np) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, lv.at(kk * 16, np * 16));
          const uint32_t b0[2] = {vb[0], vb[1]};
          const uint32_t b1[2] = {vb[2], vb[3]};
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma16816<T>(acc_o[mt][2 * np], pa[mt], b0);
            mma16816<T>(acc_o[mt][2 * np + 1], pa[mt], b1);
          }
        }
      }

    if (n_next < n_block_min) break;
    n_block = n_next;
    cur_state = next_state;
  }

  // ---- epilogue: normalize, LSE, O through shared memory (this warp's rows only) ----
  fwd_epilogue<Cfg, T, kExtras, kWgF>(p, acc_o, row_max, row_sum, wrow, sQ, gO, o.dropout, o.sl2, b, h, q_start, m0,
                                      rows_q, dv_chunks, row_w0, lane, g, t);
}

}  // namespace fa2
}  // namespace flashattn
