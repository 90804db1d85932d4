// Generation-1 backward main kernel (sm_80+, FA2 design). Its S phase (S, dP, P and dS into
// shared memory) is BwdScores (bwd_scores.cuh); the other phases are in the files it includes.
//
// One CTA per (k-block of Bc keys, kv head, sequence). K_j and V_j stay in shared memory;
// the CTA walks the query heads of its GQA group and, for each, the q-blocks of Br rows
// that are not fully masked, so dK_j and dV_j of the whole group accumulate in registers
// (GQA reduction is free and deterministic). Per (head, q-block):
//   S  = Q K^T, dP = dO V^T                          (registers, warp grid WS_M x WS_N; in
//        sm_90a code at d=64/128/256 one wgmma tile per warpgroup instead, kWg)
//   P  = exp2(S*scale*log2e - LSE*log2e), dropout mask from philox (same as the forward)
//   dS = P * (dP * keep/(1-p) - Delta)  [* (1 - tanh^2) with softcap]
//   P_dropped (P where kept, else 0) and dS go to shared memory (bf16/fp16), then
//   dV += P_dropped^T dO, dK += dS^T Q                (registers, warp grid WK_M x WK_N; kWgK);
//   the epilogue multiplies dV by keep/(1-p) in fp32
//   dQ_partial = dS K -> red.global.add into the fp32 dQ workspace (warp grid WQ_M x WQ_N, kWgQ;
//   with kDqStage each warp stages 16x32 blocks in shared memory so that one float4
//   reduction covers 4 whole 128-byte rows; with kDqBulk (sm_90) the staged rows go to
//   global memory by asynchronous bulk reductions of the copy engine instead);
//   in deterministic mode the adds into one (head, q-block) happen in ascending k-block
//   order, serialized by a per-(sequence, head, q-block) turn counter.
// Q, dO, LSE and Delta of the next tile are prefetched into a second stage during the
// current one (cp.async; on sm_90 at d=64/128/256 Q and dO by the copy engine, kTmaQdo).
// The softmax scale is applied to dK here and to dQ in the convert kernel.
// In sm_90a code at d=64/128/256 every GEMM is warpgroup MMA (wgmma.cuh): kWg (S, dP), kWgK
// (dV, dK), kWgQ (dQ, then its reductions per 16x32 block); the warp grids are then the
// kernel-local kWS_*/kWK_*/kWQ_* (each warp 16 rows of its warpgroup's 64-row tile, in the
// fragment layout of mma.sync, so the elementwise and reduction code is shared).
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/mask.h"
#include "common/params.h"
#include "common/philox.h"
#include "common/varlen.h"
#include "fa2/arch.h"
#include "fa2/bwd.h"
#include "fa2/bwd_ctx.cuh"
#include "fa2/bwd_dq.cuh"
#include "fa2/bwd_epilogue.cuh"
#include "fa2/bwd_loads.cuh"
#include "fa2/bwd_primitives.cuh"
#include "fa2/bwd_schedule.cuh"
#include "fa2/bwd_scores.cuh"
#include "fa2/bwd_state.cuh"
#include "fa2/bwd_traits.h"
#include "fa2/mma.cuh"
#include "fa2/wgmma.cuh"

namespace flashattn {
namespace fa2 {

template <class Arch, class Tr, typename T>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    bwd_main_kernel(const BwdArgs args, const __grid_constant__ DqMapParam<Tr> dq_map,
                    const __grid_constant__ QdoMapParam<Tr> qdo_map) {
  constexpr int Br = Tr::Br, Bc = Tr::Bc, D = Tr::D, DV = Tr::DV;
  extern __shared__ __align__(128) unsigned char smem[];
  BwdCtx& ctx = bwd_ctx();
  const AttnParams& p = args.p;
  const int tid = threadIdx.x;
  const int group = static_cast<int>(p.heads_q / p.heads_kv);
  const bool det = p.deterministic != 0;

  if (tid == 0) {
    const int n_blk = static_cast<int>(blockIdx.x % static_cast<unsigned>(args.n_kblocks));
    const int64_t rest = blockIdx.x / static_cast<unsigned>(args.n_kblocks);
    const int hk = static_cast<int>(rest % p.heads_kv);
    const int b = static_cast<int>(rest / p.heads_kv);
    int64_t q_tok0 = 0, k_tok0 = 0;
    int len_q = static_cast<int>(p.seqlen_q), len_k = static_cast<int>(p.seqlen_k);
    if (p.varlen) varlen_extent(p, b, q_tok0, k_tok0, len_q, len_k);
    const int n0 = n_blk * Bc;
    const int n_valid = len_k - n0 < Bc ? len_k - n0 : Bc;
    const int64_t shift = p.align == 1 ? static_cast<int64_t>(len_k) - len_q : 0;
    // q rows that see at least one key of [n0, n_last] under the band mask.
    const int64_t n_last = n0 + n_valid - 1;
    int64_t i_lo = 0, i_hi = static_cast<int64_t>(len_q) - 1;
    if (p.has_band) {
      if (p.window_right >= 0 && n0 - shift - p.window_right > i_lo) i_lo = n0 - shift - p.window_right;
      if (p.window_left >= 0 && n_last - shift + p.window_left < i_hi) i_hi = n_last - shift + p.window_left;
    }
    constexpr int64_t kBig = int64_t{1} << 30;  // lengths are < 2^30, so clamping here changes nothing
    const int64_t lo64 = (p.has_band && p.window_left >= 0) ? shift - p.window_left : -kBig;
    const int64_t hi64 = (p.has_band && p.window_right >= 0) ? shift + p.window_right : kBig;
    ctx.q_tok0 = q_tok0;
    ctx.k_tok0 = k_tok0;
    ctx.len_q = len_q;
    ctx.len_k = len_k;
    ctx.n0 = n0;
    ctx.n_valid = n_valid;
    ctx.shift = static_cast<int>(shift);
    ctx.m_lo = i_lo <= i_hi ? static_cast<int>(i_lo / Br) : 0;
    ctx.m_hi = i_lo <= i_hi ? static_cast<int>(i_hi / Br) + 1 : 0;
    ctx.n_mb = (len_q + Br - 1) / Br;
    ctx.band_lo = static_cast<int>(lo64 < -kBig ? -kBig : (lo64 > kBig ? kBig : lo64));
    ctx.band_hi = static_cast<int>(hi64 < -kBig ? -kBig : (hi64 > kBig ? kBig : hi64));
    ctx.b = b;
    ctx.hk = hk;
    ctx.n_blk = n_blk;
    if constexpr (Arch::kSm90) {
      // The unmasked q-blocks: trim the masked ones off both ends of [m_lo, m_hi).
      int lo = ctx.m_lo, hi = ctx.m_hi;
      if (n_valid < Bc) lo = hi;  // every tile is partial
      while (lo < hi && bwd_tile_partial(lo, Br, Bc, len_q, n0, n_valid, ctx.band_lo, ctx.band_hi)) ++lo;
      while (hi > lo && bwd_tile_partial(hi - 1, Br, Bc, len_q, n0, n_valid, ctx.band_lo, ctx.band_hi)) --hi;
      ctx.m_un_lo = lo;
      ctx.m_un_hi = hi;
      ctx.simple = !det && p.layout == nullptr;
    }
    if constexpr (Arch::kSm90) {
      ctx.win_base = 0;
      ctx.win_hi = -1;  // no window yet
    }
    if constexpr (Arch::kSm90 && (Tr::kTmaQdo || Tr::kSkew)) {
      for (int i = 0; i < 2; ++i) {
        hopper::mbar_init(smem_u32(&ctx.tma_bar[i]));
        ctx.tma_state[i] = 0;
        ctx.tma_uses[i] = 0;
        if constexpr (Tr::kSkew) hopper::mbar_init(smem_u32(&ctx.cpa_bar[i]), Tr::kThreads);
      }
      if constexpr (Tr::kSkew && !Tr::kSkew2) hopper::mbar_init(smem_u32(&ctx.free_bar), Tr::kThreads);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if constexpr (Arch::kSm90) {
      const int64_t h0 = static_cast<int64_t>(hk) * group;
      ctx.q_row0 = static_cast<const T*>(p.q) + (p.varlen ? 0 : static_cast<int64_t>(b) * p.q_stride.b) +
                   q_tok0 * p.q_stride.s + h0 * p.q_stride.h;
      ctx.do_row0 = static_cast<const T*>(p.dout) + (p.varlen ? 0 : static_cast<int64_t>(b) * p.do_stride.b) +
                    q_tok0 * p.do_stride.s + h0 * p.do_stride.h;
      ctx.lse_row0 = p.varlen ? h0 * p.total_q + q_tok0 : (static_cast<int64_t>(b) * p.heads_q + h0) * p.seqlen_q;
      ctx.lse_hstep = p.varlen ? p.total_q : p.seqlen_q;
    }
  }
  __syncthreads();
  if (bwd_lds(ctx.n0) >= bwd_lds(ctx.len_k)) return;  // varlen: this sequence has fewer k-blocks (CTA-uniform)

  using G = BwdGrid<Arch, Tr>;
  constexpr bool kTma = G::kTma, kWg = G::kWg, kWgK = G::kWgK, kWgQ = G::kWgQ;
  constexpr int kSL = G::kSL;
  constexpr int kMTk = G::kMTk, kNTk = G::kNTk, kNTv = G::kNTv;
  // kTma: the layout starts at the first 1024-byte boundary (see BwdTraits::kTmaQdo).
  const uint32_t s_raw = smem_u32(smem);
  const uint32_t s_base = kTma ? (s_raw + 1023u) & ~1023u : s_raw;
  const uint32_t sK = s_base + Tr::kOffK, sV = s_base + Tr::kOffV;
  // P | dS buffer 0 (kSkew2: step parity st picks buffer 0 or 1 inside the loop).
  const uint32_t sP0 = s_base + Tr::kOffP;
  const BwdKernel<Arch, Tr, T> k{args, p, ctx, dq_map, qdo_map, group, det, s_base, smem + (s_base - s_raw), sK, sV};

  float acc_dk[kMTk][kNTk][4];
  float acc_dv[kMTk][kNTv][4];
  bwd_zero(acc_dk);
  bwd_zero(acc_dv);

  int hi = 0, m = 0;
  bool masked = false;
  bool have = bwd_find_tile(k, hi, m, masked);

  {
    // Prologue: K, V and the first Q/dO in one cp.async group.
    const int b = bwd_lds(ctx.b), hk = bwd_lds(ctx.hk), n0 = bwd_lds(ctx.n0), n_valid = bwd_lds(ctx.n_valid);
    const int64_t k_tok = (p.varlen ? bwd_lds64(ctx.k_tok0) : 0) + n0;
    const T* gk = static_cast<const T*>(p.k) + (p.varlen ? 0 : static_cast<int64_t>(b) * p.k_stride.b) +
                  k_tok * p.k_stride.s + static_cast<int64_t>(hk) * p.k_stride.h;
    const T* gv = static_cast<const T*>(p.v) + (p.varlen ? 0 : static_cast<int64_t>(b) * p.v_stride.b) +
                  k_tok * p.v_stride.s + static_cast<int64_t>(hk) * p.v_stride.h;
    bwd_load_tile<Arch, typename Tr::TileK, Bc, D, Tr::kThreads>(
        sK, reinterpret_cast<const uint16_t*>(gk), p.k_stride.s, n_valid, static_cast<int>(p.head_dim_qk));
    bwd_load_tile<Arch, typename Tr::TileV, Bc, DV, Tr::kThreads>(
        sV, reinterpret_cast<const uint16_t*>(gv), p.v_stride.s, n_valid, static_cast<int>(p.head_dim_v));
    if (have) bwd_load_q_do(k, 0, hk * group + hi, hi, m);
    cp_async_commit();
  }

  // kSkew with two stages (uniform): one CTA barrier per step (BwdTraits::kSkew). Every
  // thread then tracks the copy-engine stages itself: bit s of tma_bits = stage s's tile
  // came by the engine, bit s + 2 = the parity of the phase of its mbarrier to wait for
  // (the thread-0 bookkeeping in BwdCtx would race with the readers without the barrier);
  // bit 4 = the parity of the step (of the free barrier's phase this step arrives on);
  // bit s + 5 = stage s's tile came by cp.async with an arrival on cpa_bar[s], bit s + 7 =
  // the parity of that barrier's phase to wait for.
  constexpr bool kSkew = Arch::kSm90 && Tr::kSkew, kSkew1 = kSkew && !Tr::kSkew2;
  const bool skew = kSkew && args.stages == 2;
  [[maybe_unused]] uint32_t tma_bits = 0;
  int st = 0;
  while (have) {
    cp_async_wait<0>();
    // kWg: the GEMMs read Q/dO/K/V through the async proxy; what this thread's cp.async wrote
    // (generic proxy) is ordered before them by a proxy fence after its completion, before the
    // barrier that publishes it (and by the readers' own fence after a cpa_bar wait below).
    if constexpr (kWg) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    bool top_bar = true;
    if constexpr (kTma || kSkew) {
      if (kSkew && skew) {
        // Q/dO by the engine or by cp.async with barrier arrivals (the first step's came
        // without: the barrier below); LSE/Delta visible since the last step's barrier.
        if ((tma_bits >> st) & 1u) {
          hopper::mbar_wait(smem_u32(&ctx.tma_bar[st]), (tma_bits >> (st + 2)) & 1u);
          tma_bits ^= 4u << st;
          top_bar = false;
        } else if ((tma_bits >> (st + 5)) & 1u) {
          hopper::mbar_wait(smem_u32(&ctx.cpa_bar[st]), (tma_bits >> (st + 7)) & 1u);
          if constexpr (kWg) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
          tma_bits ^= 128u << st;
          top_bar = false;
        }
      } else if constexpr (kTma) {
        const int ts = bwd_lds(ctx.tma_state[st]);
        if (ts & 1) hopper::mbar_wait(smem_u32(&ctx.tma_bar[st]), static_cast<uint32_t>(ts >> 1));
      }
    }
    // Stage st ready; without kSkew also: the previous step's readers of sP/sdS and of stage
    // st^1 are done.
    if (top_bar) __syncthreads();
    // kSkew1: the previous step's readers of sP/sdS may still be busy (else the barrier above
    // or, with kSkew2, the other buffer settles it): wait for them before the first store.
    [[maybe_unused]] const bool free_wait = kSkew1 && skew && !top_bar;
    const uint32_t sP = sP0 + (Tr::kSkew2 && skew ? static_cast<uint32_t>(st * (Tr::kOffP1 - Tr::kOffP)) : 0u);
    const uint32_t sdS = sP + Tr::TileP::kBytes;

    const int h = bwd_lds(ctx.hk) * group + hi;
    const int r0 = m * Br;
    int nhi = hi, nm = m + 1;
    bool nmasked = false;
    const bool next = bwd_find_tile(k, nhi, nm, nmasked);
    if (args.stages == 2 && next) {
      if (kSkew && skew) {
        // Only the LSE/Delta rows now: their stage's readers (the previous step's S phase)
        // are done; its Q/dO may still be read by slower warps' GEMMs of the previous step.
        bwd_load_q_do(k, st ^ 1, bwd_lds(ctx.hk) * group + nhi, nhi, nm, false, true);
      } else {
        bwd_prefetch(k, st, nhi, nm, skew, true);
      }
    }
    cp_async_commit();

    // ---- per slice of kSL m16 tiles of the warp's S tile: S = Q K^T, dP = dO V^T, then
    // P, dS. kSL = 1 keeps only 2 x kNTs x 4 fragment registers live next to the dK/dV
    // accumulators but re-reads the K/V fragments per slice; kSL = kMTs reads them once.
    // The general path (score modifiers, bias, dBias, a layout; dropout beside any of them)
    // always runs with one m16 tile per slice: its registers would not fit next to a whole
    // warp tile of S and dP. Dropout alone runs the fast path's dropout flavor.
    const bool general =
        p.softcap > 0.f || p.bias_kind != kBiasNone || args.dbias_mode != kDbiasNone || (masked && p.layout != nullptr);
    const BwdScores<Arch, Tr, T> s_phase{r0, k, st, sK, sV, p, h, {free_wait, tma_bits}, sP, sdS, masked, args, group};
    using SliceT = std::integral_constant<int, kSL>;
    if (general) {
      s_phase(std::integral_constant<int, 1>{}, std::true_type{}, std::true_type{}, std::false_type{});
    } else if (dropout_active(p.drop_threshold)) {  // masked or not: the masked flavor's tests pass every kept element
      s_phase(std::integral_constant<int, 1>{}, std::false_type{}, std::true_type{}, std::true_type{});
    } else if (!Arch::kSm90 || masked) {
      s_phase(SliceT{}, std::false_type{}, std::true_type{}, std::false_type{});
    } else {
      s_phase(SliceT{}, std::false_type{}, std::false_type{}, std::false_type{});
    }
    if (kSkew && skew) cp_async_wait<0>();  // the next tile's LSE/Delta rows: visible after the barrier
    // kWgK, kWgQ: the dK/dV and dQ GEMMs read sP/sdS through the async proxy (this thread's
    // stores above are generic).
    if constexpr (kWgK || kWgQ) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();  // sP, sdS complete (kSkew: and every warp is past the previous step)
    if (kSkew && skew && next) {
      const int ns = st ^ 1;
      if (bwd_prefetch(k, st, nhi, nm, skew, false)) {  // uniform
        tma_bits = (tma_bits | (1u << ns)) & ~(32u << ns);
      } else {
        bwd_cpa_arrive(smem_u32(&ctx.cpa_bar[ns]));
        tma_bits = (tma_bits & ~(1u << ns)) | (32u << ns);
      }
      cp_async_commit();
    }

    // ---- dV += P_dropped^T dO, dK += dS^T Q; dQ += dS K (fp32 workspace) after both or
    // (Tr::kDqMid) between them ----
    auto dv_phase = [&]() {
      int wk_m0, wk_n0, wv_n0;
      G::wk_pos(bwd_tid() >> 5, wk_m0, wk_n0, wv_n0);
      bwd_warp_gemm<Arch, T, kMTk, kNTv, Br, true, true, Br, Br>(acc_dv, sP, wk_m0, k.sdO(st), wv_n0);
    };
    auto dk_phase = [&]() {
      int wk_m0, wk_n0, wv_n0;
      G::wk_pos(bwd_tid() >> 5, wk_m0, wk_n0, wv_n0);
      bwd_warp_gemm<Arch, T, kMTk, kNTk, Br, true, true, Br, Br>(acc_dk, sdS, wk_m0, k.sQ(st), wk_n0);
    };

    if constexpr (kWgK) {
      // Both GEMMs issued for the warpgroup's 64 keys (its warp 0's wk_m0: the first key of a
      // 64-column block of sP / sdS), then the dQ GEMM and its reductions run beside them.
      int wk_m0, wk_n0, wv_n0;
      const int warp = bwd_tid() >> 5;
      G::wk_pos(warp, wk_m0, wk_n0, wv_n0);
      const uint32_t ka = static_cast<uint32_t>(((wk_m0 - (warp & 3) * 16) >> 6) * Br * 128);
      wg_fence();
      wg_gemm<T, kNTv, Br, 3, Br, Br, false>(acc_dv, sP + ka,
                                             k.sdO(st) + static_cast<uint32_t>((wv_n0 >> 6) * Br * 128));
      wg_gemm<T, kNTk, Br, 3, Br, Br, false>(acc_dk, sdS + ka,
                                             k.sQ(st) + static_cast<uint32_t>((wk_n0 >> 6) * Br * 128));
      wg_commit();
      bwd_dq_phase(k, h, m, r0, sdS);
      wg_wait<0>();
      wg_hold(acc_dv);
      wg_hold(acc_dk);
    } else {
      dv_phase();
      constexpr bool kMid = Arch::kSm90 && Tr::kDqMid;
      if constexpr (kMid) bwd_dq_phase(k, h, m, r0, sdS);
      dk_phase();
      if constexpr (!kMid) bwd_dq_phase(k, h, m, r0, sdS);
    }
    if constexpr (kSkew1) {
      if (skew) {  // this thread's reads of sP/sdS are done (phase = this step)
        hopper::mbar_arrive(smem_u32(&ctx.free_bar));
        tma_bits ^= 16u;
      }
    }

    if (args.stages == 1) {
      __syncthreads();  // every read of stage 0 is done
      if (next) bwd_load_q_do(k, 0, bwd_lds(ctx.hk) * group + nhi, nhi, nm);
      cp_async_commit();
    } else {
      st ^= 1;
    }
    hi = nhi;
    m = nm;
    masked = nmasked;
    have = next;
  }

  bwd_epilogue(k, acc_dk, acc_dv);
}

}  // namespace fa2
}  // namespace flashattn
