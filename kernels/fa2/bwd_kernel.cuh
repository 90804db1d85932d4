// Generation-1 backward main kernel (sm_80+, FA2 design).
//
// One CTA per (k-block of Bc keys, kv head, sequence). K_j and V_j stay in shared memory;
// the CTA walks the query heads of its GQA group and, for each, the q-blocks of Br rows
// that are not fully masked, so dK_j and dV_j of the whole group accumulate in registers
// (GQA reduction is free and deterministic). Per (head, q-block):
//   S  = Q K^T, dP = dO V^T                          (registers, warp grid WS_M x WS_N; in
//        sm_90a code at d=64/128/256 one wgmma tile per warpgroup instead, kWg)
//   P  = exp2(S*scale*log2e - LSE*log2e), dropout mask from philox (same as the forward)
//   dS = P * (dP * keep/(1-p) - Delta)  [* (1 - tanh^2) with softcap]
//   P_dropped and dS go to shared memory (bf16/fp16), then
//   dV += P_dropped^T dO, dK += dS^T Q                (registers, warp grid WK_M x WK_N; kWgK)
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
#include "fa2/arch.h"
#include "fa2/bwd.h"
#include "fa2/bwd_ctx.cuh"
#include "fa2/bwd_dq.cuh"
#include "fa2/bwd_epilogue.cuh"
#include "fa2/bwd_loads.cuh"
#include "fa2/bwd_primitives.cuh"
#include "fa2/bwd_schedule.cuh"
#include "fa2/bwd_state.cuh"
#include "fa2/bwd_traits.h"
#include "fa2/dropout.cuh"
#include "fa2/mma.cuh"
#include "fa2/wgmma.cuh"

namespace flashattn {
namespace fa2 {

template <class Arch, class Tr, typename T>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    bwd_main_kernel(const BwdArgs args, const __grid_constant__ DqMapParam<Tr> dq_map,
                    const __grid_constant__ QdoMapParam<Tr> qdo_map) {
  using Elem = ElemTraits<T>;
  constexpr int Br = Tr::Br, Bc = Tr::Bc, D = Tr::D, DV = Tr::DV;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ BwdCtx ctx;
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
    if (p.varlen) {
      // Defensive clamps: offsets outside [0, total], decreasing offsets and lengths
      // above the plan maxima cannot make the kernel leave its tensors.
      int64_t qs = p.cu_seqlens_q[b], qe = p.cu_seqlens_q[b + 1];
      int64_t ks = p.cu_seqlens_k[b], ke = p.cu_seqlens_k[b + 1];
      qs = qs < 0 ? 0 : (qs > p.total_q ? p.total_q : qs);
      qe = qe < qs ? qs : (qe > p.total_q ? p.total_q : qe);
      ks = ks < 0 ? 0 : (ks > p.total_k ? p.total_k : ks);
      ke = ke < ks ? ks : (ke > p.total_k ? p.total_k : ke);
      len_q = static_cast<int>(qe - qs < p.seqlen_q ? qe - qs : p.seqlen_q);
      len_k = static_cast<int>(ke - ks < p.seqlen_k ? ke - ks : p.seqlen_k);
      q_tok0 = qs;
      k_tok0 = ks;
    }
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
  constexpr int kWS_M = G::kWS_M, kSM = G::kSM, kSN = G::kSN, kMTs = G::kMTs, kNTs = G::kNTs, kSL = G::kSL;
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
    // (kWg: acc_s / acc_dp are first written by the wgmma statements, which the front end's
    // use-before-set analysis does not see.)
#pragma nv_diag_suppress 549
    auto s_phase = [&](auto sl_c, auto gen_c, auto mask_c, auto drop_c) {
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
        // Fast-path (EW2) pieces. Masked tiles: keep tile column c of the rows rr, rr + 8 iff
        // lo <= c <= hi (band and key length in tile-column units).
        auto band_cols = [&](int rr, int n0, int(&lo)[2], int(&hi)[2]) {
          const int len_k = bwd_lds(ctx.len_k), blo = bwd_lds(ctx.band_lo), bhi = bwd_lds(ctx.band_hi);
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            lo[hr] = r0 + rr + 8 * hr + blo - n0;
            hi[hr] = min(r0 + rr + 8 * hr + bhi, len_k - 1) - n0;
          }
        };
        // P of element e of n8 tile nt of m16 tile ml (S still in acc_s).
        auto p_of = [&](int ml, int nt, int e, float scale_log2, const float(&lse2)[2], const int(&lo)[2],
                        const int(&hi)[2]) {
          float x = acc_s[ml][nt][e] * scale_log2 - lse2[e >> 1];
          if constexpr (kMask) {
            const int c = ws_n0 + nt * 8 + 2 * t + (e & 1);
            if (c < lo[e >> 1] || c > hi[e >> 1]) x = -INFINITY;
          }
          return fast_exp2(x);
        };
        // P and dS of one n8 tile at byte offset a of sP (rows rr, rr + 8; dS: + the P tile).
        auto store_pds_at = [&](uint32_t a, const float* pd, const float* ds) {
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(pack2<T>(pd[0], pd[1])) : "memory");
          asm volatile("st.shared.b32 [%0+1024], %1;\n" ::"r"(a), "r"(pack2<T>(pd[2], pd[3])) : "memory");
          asm volatile("st.shared.b32 [%0+%2], %1;\n" ::"r"(a), "r"(pack2<T>(ds[0], ds[1])), "n"(Tr::TileP::kBytes)
                       : "memory");
          asm volatile("st.shared.b32 [%0+%2], %1;\n" ::"r"(a), "r"(pack2<T>(ds[2], ds[3])),
                       "n"(Tr::TileP::kBytes + 1024)
                       : "memory");
        };
        // Byte offset in sP of n8 tile nt of a row whose tile 0 is at o0: with ws_n0 a multiple
        // of kSN (a power of two) the n8 tiles of a row stay in one 64-column block up to
        // nt = 8 and their 16-byte chunk index is (ws_n0 / 8 | nt) ^ (row & 7) = chunk(0) ^ nt,
        // so tile nt's byte offset is tile 0's XOR (nt << 4); a 128-column warp tile crosses
        // into the next 64-column block at nt = 8. Row + 8: + 1024 bytes; dS: + the P tile.
        auto pds_off = [](uint32_t o0, int nt) {
          return (o0 ^ static_cast<uint32_t>((nt & 7) << 4)) + static_cast<uint32_t>((nt >> 3) * Br * 128);
        };
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
        // Dropout alone (kDrop): the dropped elements of m16 tile ml, one Philox call per two
        // n8 tiles (fa2/dropout.cuh); P_dropped = P rp_keep where kept, else 0, and dS = P
        // (dP_dropped - Delta) with dP_dropped alike, as the general path computes them.
        [[maybe_unused]] DropBits<kNTs> drop[SL];
        auto drop_bits_of = [&](int ml) {
          const uint64_t head_ctr =
              p.offset + static_cast<uint64_t>(bwd_lds(ctx.b)) * static_cast<uint64_t>(p.heads_q) + h;
          return dropout_drop_bits<kNTs, 1>(p.seed, head_ctr, static_cast<uint32_t>(r0 + ws_m0 + ml * 16 + g),
                                            static_cast<uint32_t>(bwd_lds(ctx.n0) + ws_n0), t, p.drop_threshold);
        };
        // Element e of n8 tile nt under the dropped bits: P to store (pst) and dP.
        auto drop_elem = [&](DropBits<kNTs> bits, int nt, int e, float& pst, float& dp) {
          const bool dropped = (bits >> (4 * nt + e)) & 1u;
          pst = dropped ? 0.f : pst * p.rp_keep;
          dp = dropped ? 0.f : dp * p.rp_keep;
        };
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
          if (free_wait && ms == 0) hopper::mbar_wait(smem_u32(&ctx.free_bar), ((tma_bits >> 4) & 1u) ^ 1u);
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

        // Row values of the two rows (rr, rr + 8) this thread touches in m16 tile ml of the
        // slice. LSE = -inf (fully masked row) becomes +inf so that every P of the row is
        // exactly exp2(-inf) = 0.
        auto row_vals = [&](int rr, float(&lse2)[2], float(&dlt)[2]) {
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            const float l = k.lse_s(st)[rr + 8 * hr];
            lse2[hr] = l == -INFINITY ? INFINITY : l * kLog2e;
            dlt[hr] = k.delta_s(st)[rr + 8 * hr];
          }
        };
        const int n0 = bwd_lds(ctx.n0);
        const bool has_softcap = p.softcap > 0.f;
        const bool has_bias = p.bias_kind == kBiasTensor;
        const bool has_alibi = p.bias_kind == kBiasAlibi || p.bias_kind == kBiasAlibiSymmetric;
        const bool has_dropout = p.p_drop > 0.f;
        auto store_pds = [&](int rr, int cc, float p0, float p1, float p2, float p3, float d0, float d1, float d2,
                             float d3) {
          // P_dropped and dS rows to shared memory ([query][key]).
          const int ro = Tr::TileP::offset(rr, cc), ro8 = Tr::TileP::offset(rr + 8, cc);
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sP + 2u * ro), "r"(pack2<T>(p0, p1)) : "memory");
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sP + 2u * ro8), "r"(pack2<T>(p2, p3)) : "memory");
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sdS + 2u * ro), "r"(pack2<T>(d0, d1)) : "memory");
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sdS + 2u * ro8), "r"(pack2<T>(d2, d3)) : "memory");
        };
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
              // Dropout: bit e set iff element e of this n8 tile is dropped (fa2/dropout.cuh).
              uint32_t dropped = 0u;
              if (has_dropout) {
                const uint64_t head_ctr = p.offset + static_cast<uint64_t>(b) * static_cast<uint64_t>(p.heads_q) + h;
                dropped = dropout_drop_bits<1, 1>(p.seed, head_ctr, static_cast<uint32_t>(r0 + rr),
                                                  static_cast<uint32_t>(n0 + ws_n0 + nt * 8), t, p.drop_threshold);
              }
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
                    s += Elem::to_float(static_cast<const T*>(p.bias)[static_cast<int64_t>(b) * p.bias_stride[0] +
                                                                      static_cast<int64_t>(h) * p.bias_stride[1] +
                                                                      static_cast<int64_t>(i) * p.bias_stride[2] +
                                                                      static_cast<int64_t>(j) * p.bias_stride[3]]);
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
                  pd = kept ? pr * p.rp_keep : 0.f;
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
    };
#pragma nv_diag_default 549
    using SliceT = std::integral_constant<int, kSL>;
    if (general) {
      s_phase(std::integral_constant<int, 1>{}, std::true_type{}, std::true_type{}, std::false_type{});
    } else if (p.p_drop > 0.f) {  // masked or not: the masked flavor's tests pass every kept element
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
