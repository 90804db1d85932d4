// Generation-1 FlashAttention forward kernel (FA2 design, sm_80+). Its steps are in the fwd_*.cuh
// files it includes (loads, set-up, block-sparse scan, score steps, epilogue).
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

#include "common/mask.h"
#include "common/params.h"
#include "common/varlen.h"
#include "fa2/arch.h"
#include "fa2/fwd_epilogue.cuh"
#include "fa2/fwd_loads.cuh"
#include "fa2/fwd_scores.cuh"
#include "fa2/fwd_setup.cuh"
#include "fa2/fwd_sparse.cuh"
#include "fa2/fwd_traits.h"
#include "fa2/mma.cuh"
#include "fa2/wgmma.cuh"

namespace flashattn {
namespace fa2 {

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
  if (p.varlen) varlen_extent(p, b, q_start, k_start, len_q, len_k);
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
  fwd_load_q_k<Cfg>(p, sQ, sK, gQ, gK, q_base, k_base, n_block, rows_q, len_k, dq_chunks, tid);

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
    DropBits<kNT> drop_bits[kMT];
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
      if (o.dropout) fwd_drop_bits<Cfg>(drop_bits, p, wrow, o.drop_head, m0, n0, g, t);  // under the GEMM
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
    if (o.dropout) {
      if constexpr (!kWgF) fwd_drop_bits<Cfg>(drop_bits, p, wrow, o.drop_head, m0, n0, g, t);
      fwd_drop_apply<Cfg>(s, drop_bits);
    }

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
