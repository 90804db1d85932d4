// The S phase of one step of the FA2-design backward main kernel: S = Q K^T and dP = dO V^T
// per slice of SL m16 tiles of the warp's S tile, then P and dS into shared memory (sP, sdS).
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/exp2.h"
#include "common/mask.h"
#include "common/params.h"
#include "common/philox.h"
#include "fa2/bwd.h"
#include "fa2/bwd_ctx.cuh"
#include "fa2/bwd_primitives.cuh"
#include "fa2/bwd_state.cuh"
#include "fa2/dropout.cuh"
#include "fa2/mma.cuh"
#include "fa2/wgmma.cuh"

namespace flashattn {
namespace fa2 {

// The column part of BwdPOf's capture: only where it masks (kMask).
template <bool kMask>
struct BwdTileCols {
  const int& ws_n0;
  const int& t;
};
template <>
struct BwdTileCols<false> {
  __device__ BwdTileCols(int, int) {}
};

// The pieces of the S phase (BwdScores below) hold references to the phase's values in the
// order of their first use, as the lambdas they were captured them, so that the optimizer
// gets the lambdas' IR.
// Fast-path (EW2) pieces. Masked tiles: keep tile column c of the rows rr, rr + 8 iff
// lo <= c <= hi (band and key length in tile-column units).
struct BwdBandCols {
  BwdCtx& ctx;
  const int& r0;

  __device__ void operator()(int rr, int n0, int (&lo)[2], int (&hi)[2]) const {
    const int len_k = bwd_lds(ctx.len_k), blo = bwd_lds(ctx.band_lo), bhi = bwd_lds(ctx.band_hi);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      lo[hr] = r0 + rr + 8 * hr + blo - n0;
      hi[hr] = min(r0 + rr + 8 * hr + bhi, len_k - 1) - n0;
    }
  }
};

// P of element e of n8 tile nt of m16 tile ml (S still in acc_s).
template <int SL, int kNTs, bool kMask>
struct BwdPOf {
  const float (&acc_s)[SL][kNTs][4];
  BwdTileCols<kMask> tc;

  __device__ float operator()(int ml, int nt, int e, float scale_log2, const float (&lse2)[2], const int (&lo)[2],
                              const int (&hi)[2]) const {
    float x = acc_s[ml][nt][e] * scale_log2 - lse2[e >> 1];
    if constexpr (kMask) {
      const int c = tc.ws_n0 + nt * 8 + 2 * tc.t + (e & 1);
      if (c < lo[e >> 1] || c > hi[e >> 1]) x = -INFINITY;
    }
    return fast_exp2(x);
  }
};

// P and dS of one n8 tile at byte offset a of sP (rows rr, rr + 8; dS: + the P tile).
template <class Tr, typename T>
struct BwdStorePdsAt {
  __device__ void operator()(uint32_t a, const float* pd, const float* ds) const {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(pack2<T>(pd[0], pd[1])) : "memory");
    asm volatile("st.shared.b32 [%0+1024], %1;\n" ::"r"(a), "r"(pack2<T>(pd[2], pd[3])) : "memory");
    asm volatile("st.shared.b32 [%0+%2], %1;\n" ::"r"(a), "r"(pack2<T>(ds[0], ds[1])), "n"(Tr::TileP::kBytes)
                 : "memory");
    asm volatile("st.shared.b32 [%0+%2], %1;\n" ::"r"(a), "r"(pack2<T>(ds[2], ds[3])), "n"(Tr::TileP::kBytes + 1024)
                 : "memory");
  }
};

// Byte offset in sP of n8 tile nt of a row whose tile 0 is at o0: with ws_n0 a multiple
// of kSN (a power of two) the n8 tiles of a row stay in one 64-column block up to
// nt = 8 and their 16-byte chunk index is (ws_n0 / 8 | nt) ^ (row & 7) = chunk(0) ^ nt,
// so tile nt's byte offset is tile 0's XOR (nt << 4); a 128-column warp tile crosses
// into the next 64-column block at nt = 8. Row + 8: + 1024 bytes; dS: + the P tile.
template <int Br>
struct BwdPdsOff {
  __device__ uint32_t operator()(uint32_t o0, int nt) const {
    return (o0 ^ static_cast<uint32_t>((nt & 7) << 4)) + static_cast<uint32_t>((nt >> 3) * Br * 128);
  }
};

// The dropped elements of m16 tile ml of the slice as bits, one Philox call per two n8
// tiles (fa2/dropout.cuh): for the fast path with dropout alone (kDrop) and the general path.
template <int kNTs>
struct BwdDropBitsOf {
  const AttnParams& p;
  BwdCtx& ctx;
  const int& h;
  const int& r0;
  const int& ws_m0;
  const int& g;
  const int& ws_n0;
  const int& t;

  __device__ DropBits<kNTs> operator()(int ml) const {
    const uint64_t head_ctr = p.offset + static_cast<uint64_t>(bwd_lds(ctx.b)) * static_cast<uint64_t>(p.heads_q) + h;
    return dropout_drop_bits<kNTs, 1>(p.seed, head_ctr, static_cast<uint32_t>(r0 + ws_m0 + ml * 16 + g),
                                      static_cast<uint32_t>(bwd_lds(ctx.n0) + ws_n0), t, p.drop_threshold);
  }
};

// Element e of n8 tile nt under the dropped bits: P to store (pst: P where kept, else 0; the
// keep scale goes onto dV in fp32 in the epilogue, so a P of 16 bits exactly, such as 1 for a
// query that sees one key, stays exact) and dP (dP rp_keep where kept, else 0).
template <int kNTs>
struct BwdDropElem {
  const AttnParams& p;

  __device__ void operator()(DropBits<kNTs> bits, int nt, int e, float& pst, float& dp) const {
    const bool dropped = (bits >> (4 * nt + e)) & 1u;
    pst = dropped ? 0.f : pst;
    dp = dropped ? 0.f : dp * p.rp_keep;
  }
};

// Row values of the two rows (rr, rr + 8) this thread touches in m16 tile ml of the
// slice. LSE = -inf (fully masked row) becomes +inf so that every P of the row is
// exactly exp2(-inf) = 0.
template <class Arch, class Tr, typename T>
struct BwdRowVals {
  const BwdKernel<Arch, Tr, T>& k;
  const int& st;

  __device__ void operator()(int rr, float (&lse2)[2], float (&dlt)[2]) const {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const float l = k.lse_s(st)[rr + 8 * hr];
      lse2[hr] = l == -INFINITY ? INFINITY : l * kLog2e;
      dlt[hr] = k.delta_s(st)[rr + 8 * hr];
    }
  }
};

// P_dropped and dS of one n8 tile (rows rr, rr + 8, column cc) to shared memory.
template <class Tr, typename T>
struct BwdStorePds {
  const uint32_t& sP;
  const uint32_t& sdS;

  __device__ void operator()(int rr, int cc, float p0, float p1, float p2, float p3, float d0, float d1, float d2,
                             float d3) const {
    // P_dropped and dS rows to shared memory ([query][key]).
    const int ro = Tr::TileP::offset(rr, cc), ro8 = Tr::TileP::offset(rr + 8, cc);
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sP + 2u * ro), "r"(pack2<T>(p0, p1)) : "memory");
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sP + 2u * ro8), "r"(pack2<T>(p2, p3)) : "memory");
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sdS + 2u * ro), "r"(pack2<T>(d0, d1)) : "memory");
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sdS + 2u * ro8), "r"(pack2<T>(d2, d3)) : "memory");
  }
};

// kSkew1: what the S phase needs to wait for the previous step's readers of sP/sdS (see the
// kernel). Without kSkew1 nothing: the kernel's values are not referenced, so that they
// stay plain registers from the start (a reference would keep them in memory until the
// phase is inlined, which changes the code around them).
template <bool kSkew1>
struct BwdFreeWait {
  const bool& free_wait;
  const uint32_t& tma_bits;
};
template <>
struct BwdFreeWait<false> {
  __device__ BwdFreeWait(bool, uint32_t) {}
};

// The step's values by reference, in the order of their first use below. Called with
// (slice, general path, masked tile, dropout) as integral constants: see the kernel.
template <class Arch, class Tr, typename T>
struct BwdScores {
  const int& r0;
  const BwdKernel<Arch, Tr, T>& k;
  const int& st;
  const uint32_t& sK;
  const uint32_t& sV;
  const AttnParams& p;
  const int& h;
  BwdFreeWait<BwdGrid<Arch, Tr>::kSkew1> fw;
  const uint32_t& sP;
  const uint32_t& sdS;
  const bool& masked;
  const BwdArgs& args;
  const int& group;

  // (kWg: acc_s / acc_dp are first written by the wgmma statements, which the front end's
  // use-before-set analysis does not see.)
#pragma nv_diag_suppress 549
  template <class SlC, class GenC, class MaskC, class DropC>
  __device__ void operator()(SlC sl_c, GenC gen_c, MaskC mask_c, DropC drop_c) const {
    using Elem = ElemTraits<T>;
    using G = BwdGrid<Arch, Tr>;
    constexpr int Br = Tr::Br, Bc = Tr::Bc, D = Tr::D, DV = Tr::DV;
    constexpr bool kWg = G::kWg, kSkew1 = G::kSkew1;
    constexpr int kWS_M = G::kWS_M, kSM = G::kSM, kSN = G::kSN, kMTs = G::kMTs, kNTs = G::kNTs;
    BwdCtx& ctx = bwd_ctx();

    constexpr int SL = decltype(sl_c)::value;
    constexpr bool kGen = decltype(gen_c)::value;
    [[maybe_unused]] constexpr bool kMask = decltype(mask_c)::value;  // fast path: masked tile
    constexpr bool kDrop = decltype(drop_c)::value;                   // fast path with dropout
#pragma unroll 1
    for (int ms = 0; ms < kMTs; ms += SL) {
      const int warp = bwd_tid() >> 5, lane = bwd_tid() & 31;
      const int g = lane >> 2, t = lane & 3;
      const int ws_m0 = (kWg ? warp % kWS_M : warp / Tr::WS_N) * kSM + ms * 16;
      const int ws_n0 = (kWg ? warp / kWS_M : warp % Tr::WS_N) * kSN;
      float acc_s[SL][kNTs][4];
      float acc_dp[SL][kNTs][4];
      if constexpr (!kWg) {  // (wgmma: the first k16 step overwrites)
        bwd_zero(acc_s);
        bwd_zero(acc_dp);
      }
      const BwdBandCols band_cols{ctx, r0};
      const BwdPOf<SL, kNTs, kMask> p_of{acc_s, {ws_n0, t}};
      const BwdStorePdsAt<Tr, T> store_pds_at{};
      const BwdPdsOff<Br> pds_off{};
      if constexpr (kWg) {
        // Both GEMMs issued at once (the warpgroup's rows: ws_m0 of its warp 0); the S batch
        // completes first (wait_group 1) while dP's still runs.
        const uint32_t wg_row = static_cast<uint32_t>(ws_m0 - (warp & 3) * 16) * 128u;
        wg_fence();
        wg_gemm<T, kNTs, D, 0, Br, Bc, true>(acc_s, k.sQ(st) + wg_row, sK + static_cast<uint32_t>(ws_n0) * 128u);
        wg_commit();
        wg_gemm<T, kNTs, DV, 0, Br, Bc, true>(acc_dp, k.sdO(st) + wg_row, sV + static_cast<uint32_t>(ws_n0) * 128u);
        wg_commit();
        wg_wait<1>();
        wg_hold(acc_s);
      } else {
        bwd_warp_gemm<Arch, T, SL, kNTs, D, false, false, Br, Bc>(acc_s, k.sQ(st), ws_m0, sK, ws_n0);
      }
      // Dropout: the dropped elements of m16 tile ml, one Philox call per two n8 tiles
      // (fa2/dropout.cuh); the P stored for dV is P where kept, else 0 (dV takes rp_keep in
      // the epilogue), and dS = P (dP_dropped - Delta) with dP_dropped = dP rp_keep where
      // kept, else 0, as the general path computes them.
      [[maybe_unused]] DropBits<kNTs> drop[SL];
      const BwdDropBitsOf<kNTs> drop_bits_of{p, ctx, h, r0, ws_m0, g, ws_n0, t};
      const BwdDropElem<kNTs> drop_elem{p};
      // PFIRST (fast path): P = exp2(...) in place of S before the dP GEMM, so that the
      // exponentials (and with dropout the keep decisions) can overlap that GEMM's tensor
      // work; P and dS are stored after it (a store before it would pin the exponentials
      // there: ptxas keeps shared stores and the GEMM's ldmatrix in order).
      constexpr bool kPF = !kGen && Arch::kSm90 && (kSN == 16 || kSN == 32 || kSN == 64 || kSN == 128);
      if constexpr (kPF) {
        const float scale_log2 = p.scale * kLog2e;
        const int n0 = bwd_lds(ctx.n0);
#pragma unroll
        for (int ml = 0; ml < SL; ++ml) {
          const int rr = ws_m0 + ml * 16 + g;
          float lse2[2];
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {  // as row_vals below
            const float l = k.lse_s(st)[rr + 8 * hr];
            lse2[hr] = l == -INFINITY ? INFINITY : l * kLog2e;
          }
          int lo[2] = {0, 0}, hi[2] = {0, 0};
          if constexpr (kMask) band_cols(rr, n0, lo, hi);
#pragma unroll
          for (int nt = 0; nt < kNTs; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_s[ml][nt][e] = p_of(ml, nt, e, scale_log2, lse2, lo, hi);
          if constexpr (kDrop) drop[ml] = drop_bits_of(ml);
        }
      }
      if constexpr (kWg) {
        wg_hold(acc_s);  // (keeps the P computation above the wait, overlapping the dP batch)
        wg_wait<0>();
        wg_hold(acc_dp);
      } else {
        bwd_warp_gemm<Arch, T, SL, kNTs, DV, false, false, Br, Bc>(acc_dp, k.sdO(st), ws_m0, sV, ws_n0);
      }
      if constexpr (kSkew1) {
        if (fw.free_wait && ms == 0) hopper::mbar_wait(smem_u32(&ctx.free_bar), ((fw.tma_bits >> 4) & 1u) ^ 1u);
      }
      if constexpr (kPF) {
#pragma unroll
        for (int ml = 0; ml < SL; ++ml) {
          const int rr = ws_m0 + ml * 16 + g;
          float dlt[2];
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) dlt[hr] = k.delta_s(st)[rr + 8 * hr];
          const uint32_t o0 = 2u * static_cast<uint32_t>(Tr::TileP::offset(rr, ws_n0 + 2 * t));
#pragma unroll
          for (int nt = 0; nt < kNTs; ++nt) {
            float pd[4], ds[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float dp = acc_dp[ml][nt][e];
              pd[e] = acc_s[ml][nt][e];
              if constexpr (kDrop) drop_elem(drop[ml], nt, e, pd[e], dp);
              ds[e] = acc_s[ml][nt][e] * (dp - dlt[e >> 1]);
            }
            store_pds_at(sP + pds_off(o0, nt), pd, ds);
          }
        }
        continue;  // next slice
      }

      const BwdRowVals<Arch, Tr, T> row_vals{k, st};
      const int n0 = bwd_lds(ctx.n0);
      const bool has_softcap = p.softcap > 0.f;
      const bool has_bias = p.bias_kind == kBiasTensor;
      const bool has_alibi = p.bias_kind == kBiasAlibi || p.bias_kind == kBiasAlibiSymmetric;
      const bool has_dropout = dropout_active(p.drop_threshold);
      const BwdStorePds<Tr, T> store_pds{sP, sdS};
      if constexpr (!kGen) {
        // Fast path without the PFIRST order (sm_80, or tile widths it does not take):
        // compact unrolled code, one instantiation for unmasked and one for masked tiles
        // (a run-time test per element was if-converted: ~5 mask instructions per element
        // on every tile); dropout alone (kDrop) adds its keep decisions here.
        const float scale_log2 = p.scale * kLog2e;
#pragma unroll
        for (int ml = 0; ml < SL; ++ml) {
          const int rr = ws_m0 + ml * 16 + g;  // tile row of e = 0, 1 (e = 2, 3: rr + 8)
          float lse2[2], dlt[2];
          row_vals(rr, lse2, dlt);
          const int i_a = r0 + rr;
          if constexpr (kDrop) drop[ml] = drop_bits_of(ml);
          // keep j iff lo <= j <= hi (band and key length), per row; only on masked tiles
          int lo[2] = {0, 0}, hi[2] = {0, 0};
          if (masked) {
            const int len_k = bwd_lds(ctx.len_k), blo = bwd_lds(ctx.band_lo), bhi = bwd_lds(ctx.band_hi);
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
              lo[hr] = i_a + 8 * hr + blo;
              hi[hr] = min(i_a + 8 * hr + bhi, len_k - 1);
            }
          }
#pragma unroll
          for (int nt = 0; nt < kNTs; ++nt) {
            const int cc = ws_n0 + nt * 8 + 2 * t;
            float pd[4], ds[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float x = acc_s[ml][nt][e] * scale_log2 - lse2[e >> 1];
              if (masked) {
                const int j = n0 + cc + (e & 1);
                if (j < lo[e >> 1] || j > hi[e >> 1]) x = -INFINITY;
              }
              const float pr = fast_exp2(x);
              float dp = acc_dp[ml][nt][e];
              pd[e] = pr;
              if constexpr (kDrop) drop_elem(drop[ml], nt, e, pd[e], dp);
              ds[e] = pr * (dp - dlt[e >> 1]);
            }
            store_pds(rr, cc, pd[0], pd[1], pd[2], pd[3], ds[0], ds[1], ds[2], ds[3]);
          }
        }
      } else {
        // General path: every option, one rolled loop over the n8 tiles so the code
        // exists once (an unrolled copy per element would overflow the instruction
        // cache); the tile's fragments are picked out with predicated moves.
        const int b = bwd_lds(ctx.b);
        const int len_q = bwd_lds(ctx.len_q), len_k = bwd_lds(ctx.len_k);
#pragma unroll 1
        for (int ml = 0; ml < SL; ++ml) {
          const int rr = ws_m0 + ml * 16 + g;  // tile row of e = 0, 1 (e = 2, 3: rr + 8)
          float lse2[2], dlt[2];
          row_vals(rr, lse2, dlt);
          // Dropout: bit 4 nt + e set iff element e of n8 tile nt is dropped (fa2/dropout.cuh).
          const DropBits<kNTs> dropped_bits = has_dropout ? drop_bits_of(ml) : DropBits<kNTs>(0);
#pragma unroll 1
          for (int nt = 0; nt < kNTs; ++nt) {
            float sv[4], dv[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              sv[e] = acc_s[0][0][e];
              dv[e] = acc_dp[0][0][e];
            }
#pragma unroll
            for (int km = 0; km < SL; ++km) {
#pragma unroll
              for (int kt = 0; kt < kNTs; ++kt) {
                if ((km != 0 || kt != 0) && km == ml && kt == nt) {
#pragma unroll
                  for (int e = 0; e < 4; ++e) {
                    sv[e] = acc_s[km][kt][e];
                    dv[e] = acc_dp[km][kt][e];
                  }
                }
              }
            }
            const int cc = ws_n0 + nt * 8 + 2 * t;  // tile col of e = 0, 2 (e = 1, 3: cc + 1)
            const uint32_t dropped = static_cast<uint32_t>(dropped_bits >> (4 * nt));
            float pdv[4], dsv[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int r = rr + 8 * (e >> 1), c = cc + (e & 1);
              const int i = r0 + r, j = n0 + c;
              float s = sv[e] * p.scale, th = 0.f;
              if (has_softcap) {
                th = tanhf(s * (1.f / p.softcap));
                s = p.softcap * th;
              }
              if (i < len_q && j < len_k) {
                if (has_bias) {
                  s += Elem::to_float(static_cast<const T*>(
                      p.bias)[static_cast<int64_t>(b) * p.bias_stride[0] + static_cast<int64_t>(h) * p.bias_stride[1] +
                              static_cast<int64_t>(i) * p.bias_stride[2] + static_cast<int64_t>(j) * p.bias_stride[3]]);
                } else if (has_alibi) {
                  s += alibi_bias(p, alibi_slope(p, b, h), i + bwd_lds(ctx.shift), j);
                }
              }
              float x = s * kLog2e - lse2[e >> 1];
              if (masked) {
                // Band as the per-row key interval [i + band_lo, i + band_hi] within [0, len_k).
                // Rows past len_q (zero Q and dO rows of the last q-block) are dropped too: they
                // contribute nothing either way, and their row block can lie past the layout
                // (compute-sanitizer memcheck: 1-byte reads past the layout with block_q < Br).
                bool keep = j >= i + bwd_lds(ctx.band_lo) && j <= i + bwd_lds(ctx.band_hi) && j < len_k && i < len_q;
                if (p.layout != nullptr && keep) {
                  const int lh = p.layout_heads == 1 ? 0 : h;
                  keep = p.layout[(static_cast<int64_t>(lh) * p.n_row_blocks + i / static_cast<int>(p.block_q)) *
                                      p.n_col_blocks +
                                  j / static_cast<int>(p.block_k)] != 0;
                }
                if (!keep) x = -INFINITY;
              }
              const float pr = fast_exp2(x);
              float dp = dv[e];
              float pd = pr;
              if (has_dropout) {
                const bool kept = !((dropped >> e) & 1u);
                dp = kept ? dp * p.rp_keep : 0.f;
                pd = kept ? pr : 0.f;  // rp_keep: on dV in the epilogue (BwdDropElem)
              }
              float ds = pr * (dp - dlt[e >> 1]);
              if (args.dbias_mode != kDbiasNone && i < len_q && j < len_k) {
                if (args.dbias_mode == kDbiasDirect) {
                  T* db = static_cast<T*>(p.dbias) + static_cast<int64_t>(b) * p.bias_stride[0] +
                          static_cast<int64_t>(h) * p.bias_stride[1] + static_cast<int64_t>(i) * p.bias_stride[2] +
                          static_cast<int64_t>(j) * p.bias_stride[3];
                  *db = Elem::from_float(ds);
                } else if (args.dbias_mode == kDbiasAccum) {
                  if (ds != 0.f) {
                    atomicAdd(args.dbias_accum + static_cast<int64_t>(b) * args.dbias_accum_stride[0] +
                                  static_cast<int64_t>(h) * args.dbias_accum_stride[1] +
                                  static_cast<int64_t>(i) * args.dbias_accum_stride[2] +
                                  static_cast<int64_t>(j) * args.dbias_accum_stride[3],
                              ds);
                  }
                } else {
                  // kDbiasSlab: this thread is the only writer of the element (the CTA owns
                  // the key block, the kv head and the sequence; the thread owns the tile
                  // position across the group's heads), so a plain update is race-free.
                  const int hh = args.dbias_slab_kvhead ? h / group : h;
                  float* sl = args.dbias_accum + static_cast<int64_t>(b) * args.dbias_accum_stride[0] +
                              static_cast<int64_t>(hh) * args.dbias_accum_stride[1] +
                              static_cast<int64_t>(i) * args.dbias_accum_stride[2] + j;
                  *sl += ds;
                }
              }
              if (has_softcap) ds *= 1.f - th * th;
              pdv[e] = pd;
              dsv[e] = ds;
            }
            store_pds(rr, cc, pdv[0], pdv[1], pdv[2], pdv[3], dsv[0], dsv[1], dsv[2], dsv[3]);
          }
        }
      }
    }
  }
#pragma nv_diag_default 549
};

}  // namespace fa2
}  // namespace flashattn
