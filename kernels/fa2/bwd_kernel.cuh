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
#include "common/philox.h"
#include "fa2/arch.h"
#include "fa2/bwd.h"
#include "fa2/bwd_ctx.cuh"
#include "fa2/bwd_primitives.cuh"
#include "fa2/bwd_schedule.cuh"
#include "fa2/bwd_traits.h"
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
        bwd_mbar_init(smem_u32(&ctx.tma_bar[i]));
        ctx.tma_state[i] = 0;
        ctx.tma_uses[i] = 0;
        if constexpr (Tr::kSkew) bwd_mbar_init(smem_u32(&ctx.cpa_bar[i]), Tr::kThreads);
      }
      if constexpr (Tr::kSkew && !Tr::kSkew2) bwd_mbar_init(smem_u32(&ctx.free_bar), Tr::kThreads);
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

  constexpr bool kTma = Arch::kSm90 && Tr::kTmaQdo;
  // kTma: the layout starts at the first 1024-byte boundary (see BwdTraits::kTmaQdo).
  const uint32_t s_raw = smem_u32(smem);
  const uint32_t s_base = kTma ? (s_raw + 1023u) & ~1023u : s_raw;
  unsigned char* const smem_al = smem + (s_base - s_raw);
  const uint32_t sK = s_base + Tr::kOffK, sV = s_base + Tr::kOffV;
  // P | dS buffer 0 (kSkew2: step parity st picks buffer 0 or 1 inside the loop).
  const uint32_t sP0 = s_base + Tr::kOffP;
  constexpr int kOffQ = Arch::kSm90 ? Tr::kOffQ90 : Tr::kOffQ80;
  constexpr int kStage = Arch::kSm90 ? Tr::kStage90 : Tr::kStage80;
  auto sQ = [&](int st) { return s_base + kOffQ + st * kStage; };
  auto sdO = [&](int st) { return sQ(st) + Tr::TileQ::kBytes; };
  // S/dP warp grid. kWg (sm_90a code, the copy-engine layout): two warpgroups,
  // each one wgmma tile of 64 rows x kSN columns; warp w computes rows 16 (w % kWS_M) .. + 15
  // and columns kSN (w / kWS_M) ..: Br = 64 splits the Bc columns between the warpgroups,
  // Br = 128 the rows. Else the traits' WS_M x WS_N grid of mma.sync warp tiles.
  constexpr bool kWg = Arch::kWgmma && kTma && (Br == 64 || Br == 128) &&
                       Bc * Br / 128 >= 32 && Bc * Br / 128 <= 128;
  constexpr int kWS_M = kWg ? 4 * (Br / 64) : Tr::WS_M;
  constexpr int kSM = kWg ? 16 : Tr::kSM, kSN = kWg ? Bc * Br / 128 : Tr::kSN;
  constexpr int kMTs = kSM / 16, kNTs = kSN / 8, kSL = kWg ? 1 : Tr::kSL;
  // dK/dV warp grid. kWgK: two warpgroups, each 64 keys x kKN (dK) / kVN (dV)
  // columns of wgmma accumulators; warp w owns keys 16 (w % kWK_M) .. + 15 and column part
  // w / kWK_M (Bc = 128: the warpgroups split the keys, Bc = 64: the columns). Else the
  // traits' WK_M x WK_N grid.
  constexpr bool kWgK = kWg && (Bc == 64 || Bc == 128);
  constexpr int kWK_M = kWgK ? 4 * (Bc / 64) : Tr::WK_M, kWK_N = 8 / kWK_M;
  constexpr int kKM = Bc / kWK_M, kKN = D / kWK_N, kVN = DV / kWK_N;
  constexpr int kMTk = kKM / 16, kNTk = kKN / 8, kNTv = kVN / 8;
  static_assert(!kWgK || ((kKN == 64 || kKN == 128) && (kVN == 64 || kVN == 128)), "wgmma dK/dV widths");
  // dQ warp grid. kWgQ: two warpgroups, each 64 rows x kQN columns (Br = 64: the
  // warpgroups split the columns, Br = 128: the rows), computed in kQPx passes of 64 columns;
  // warp w owns rows 16 (w % kWQ_M) .. + 15, column part w / kWQ_M. Else the traits' grid.
  constexpr bool kWgQ = kWg;
  constexpr int kWQ_M = kWgQ ? 4 * (Br / 64) : Tr::WQ_M, kWQ_N = 8 / kWQ_M;
  constexpr int kQM = Br / kWQ_M, kQN = D / kWQ_N;
  constexpr int kQPx = kWgQ ? kQN / 64 : Tr::kQP;
  // The reductions' unit: kBlk blocks of kMTq m16 tiles x (8 kNTqp) columns per pass.
  constexpr int kBlk = kWgQ ? 2 : 1, kMTq = kQM / 16, kNTqp = kWgQ ? 4 : Tr::kNTqp;
  static_assert(!kWgQ || (kQN % 64 == 0 && Tr::kDqStage), "wgmma dQ: 64-column passes, staged reductions");
  // This warp's first key and first dK / dV column in the dK/dV grid.
  auto wk_pos = [](int warp, int& m0, int& kn0, int& vn0) {
    const int cw = kWgK ? warp / kWK_M : warp % Tr::WK_N;
    m0 = (kWgK ? warp % kWK_M : warp / Tr::WK_N) * kKM;
    kn0 = cw * kKN;
    vn0 = cw * kVN;
  };
  auto lse_s = [&](int st) {
    if constexpr (kTma) return reinterpret_cast<float*>(smem_al + Tr::kOffRows90 + st * Tr::kRowBytes);
    return reinterpret_cast<float*>(smem_al + kOffQ + st * kStage + Tr::TileQ::kBytes + Tr::TileDO::kBytes);
  };
  auto delta_s = [&](int st) { return lse_s(st) + Br; };

  // Tile state of (head h, q-block m): 0 skip, 1 compute, 2 compute with element mask.
  // Collective (all threads, uniform arguments) when a block-sparse layout is present.
  auto tile_state = [&](int h, int m) -> int {
    if (m < bwd_lds(ctx.m_lo) || m >= bwd_lds(ctx.m_hi)) return 0;
    const int len_q = bwd_lds(ctx.len_q), n0 = bwd_lds(ctx.n0), n_valid = bwd_lds(ctx.n_valid);
    const int n_last = n0 + n_valid - 1;
    const int r0 = m * Br;
    const int r1 = (r0 + Br < len_q ? r0 + Br : len_q) - 1;
    bool partial = bwd_tile_partial(m, Br, Bc, len_q, n0, n_valid, bwd_lds(ctx.band_lo), bwd_lds(ctx.band_hi));
    if (p.layout != nullptr) {
      bool any_on = false, any_off = false;  // the tile's cells spread over the CTA
      const BwdLayoutView lv{p.layout, p.layout_heads, p.n_row_blocks, p.n_col_blocks, p.block_q, p.block_k};
      bwd_layout_cells(lv, h, r0, r1, n0, n_last, bwd_tid(), Tr::kThreads, any_on, any_off);
      const bool on = __syncthreads_or(any_on) != 0;
      const bool off = __syncthreads_or(any_off) != 0;
      if (!on) return 0;
      if (off) partial = true;
    }
    return partial ? 2 : 1;
  };

  constexpr int kWinTiles = 1024;
  // Advances (hi, m) to the next tile to compute, starting at (hi, m) inclusive. In
  // deterministic mode every q-block of the sequence is visited and the skipped ones
  // still pass this k-block's turn on to the next k-block.
  auto find_tile = [&](int& hi, int& m, bool& masked) -> bool {
    if constexpr (Arch::kSm90) {
      if (bwd_lds(ctx.simple)) {  // CTA-uniform; selects, no branches
        const int mb = bwd_lds(ctx.m_lo), me = bwd_lds(ctx.m_hi);
        const int m2 = m < mb ? mb : m;
        const bool wrap = m2 >= me;
        hi += wrap ? 1 : 0;
        m = wrap ? mb : m2;
        masked = m < bwd_lds(ctx.m_un_lo) || m >= bwd_lds(ctx.m_un_hi);
        return hi < group && mb < me;
      }
    }
    if constexpr (Arch::kSm90) {
      if (!det && p.layout != nullptr) {  // uniform
        const BwdLayoutView lv{p.layout, p.layout_heads, p.n_row_blocks, p.n_col_blocks, p.block_q, p.block_k};
        const uint64_t r = bwd_next_sparse<Br, Bc, kWinTiles, Tr::kThreads>(lv, ctx, group, hi, m);
        if ((r >> 63) == 0) return false;
        hi = static_cast<int>((r >> 32) & 0x3fffffffu);
        m = static_cast<int>(static_cast<uint32_t>(r));
        masked = ((r >> 62) & 1u) != 0;
        return true;
      }
    }
    while (hi < group) {
      const int h = bwd_lds(ctx.hk) * group + hi;
      const int mb = det ? 0 : bwd_lds(ctx.m_lo), me = det ? bwd_lds(ctx.n_mb) : bwd_lds(ctx.m_hi);
      if (m < mb) m = mb;
      for (; m < me; ++m) {
        const int st = tile_state(h, m);
        if (st != 0) {
          masked = st == 2;
          return true;
        }
        if (det && bwd_tid() == 0) {
          int32_t* sem = args.dq_sema + (static_cast<int64_t>(bwd_lds(ctx.b)) * p.heads_q + h) * args.n_qblocks + m;
          const int n_blk = bwd_lds(ctx.n_blk);
          bwd_wait_turn(sem, n_blk);
          bwd_st_release(sem, n_blk + 1);
        }
      }
      ++hi;
      m = 0;
    }
    return false;
  };

  // Q and dO tiles (`tiles` true) and the LSE and Delta rows (`rows` true) of (head
  // h = hk * group + hi, q-block m) into stage st by cp.async.
  auto load_q_do = [&](int st, int h, [[maybe_unused]] int hi, int m, bool tiles = true, bool rows = true) {
    if constexpr (Arch::kSm90) {
      const int r0 = m * Br;
      const int len_q = bwd_lds(ctx.len_q);
      const int nv = len_q - r0 < Br ? len_q - r0 : Br;
      if (tiles) {
        const T* gq = bwd_ldsp<T>(ctx.q_row0) + hi * p.q_stride.h + static_cast<int64_t>(r0) * p.q_stride.s;
        const T* gdo = bwd_ldsp<T>(ctx.do_row0) + hi * p.do_stride.h + static_cast<int64_t>(r0) * p.do_stride.s;
        bwd_load_tile<Arch, typename Tr::TileQ, Br, D, Tr::kThreads>(sQ(st), reinterpret_cast<const uint16_t*>(gq),
                                                               p.q_stride.s, nv, static_cast<int>(p.head_dim_qk));
        bwd_load_tile<Arch, typename Tr::TileDO, Br, DV, Tr::kThreads>(sdO(st), reinterpret_cast<const uint16_t*>(gdo),
                                                                 p.do_stride.s, nv, static_cast<int>(p.head_dim_v));
      }
      const int t = bwd_tid();
      if (rows && t < Br) {  // as below: rows past the end read as 0
        const bool ok = r0 + t < len_q;
        const int64_t idx = ok ? bwd_lds64(ctx.lse_row0) + hi * bwd_lds64(ctx.lse_hstep) + r0 + t : 0;
        bwd_cp_async_4(smem_u32(lse_s(st) + t), p.lse_in + idx, ok);
        bwd_cp_async_4(smem_u32(delta_s(st) + t), args.delta + idx, ok);
      }
      return;
    }
    const int r0 = m * Br;
    const int len_q = bwd_lds(ctx.len_q);
    const int nv = len_q - r0 < Br ? len_q - r0 : Br;
    const int64_t q_tok0 = bwd_lds64(ctx.q_tok0);
    const int b = bwd_lds(ctx.b);
    const int64_t tok = p.varlen ? q_tok0 + r0 : r0;
    const T* gq = static_cast<const T*>(p.q) + (p.varlen ? 0 : static_cast<int64_t>(b) * p.q_stride.b) +
                  tok * p.q_stride.s + static_cast<int64_t>(h) * p.q_stride.h;
    const T* gdo = static_cast<const T*>(p.dout) + (p.varlen ? 0 : static_cast<int64_t>(b) * p.do_stride.b) +
                   tok * p.do_stride.s + static_cast<int64_t>(h) * p.do_stride.h;
    if (tiles) {
      bwd_load_tile<Arch, typename Tr::TileQ, Br, D, Tr::kThreads>(sQ(st), reinterpret_cast<const uint16_t*>(gq),
                                                             p.q_stride.s, nv, static_cast<int>(p.head_dim_qk));
      bwd_load_tile<Arch, typename Tr::TileDO, Br, DV, Tr::kThreads>(sdO(st), reinterpret_cast<const uint16_t*>(gdo),
                                                               p.do_stride.s, nv, static_cast<int>(p.head_dim_v));
    }
    // LSE and Delta rows by cp.async too (a plain load would stall these warps for a
    // full memory latency). Rows past the end read as 0: their Q and dO rows are zero,
    // so S = 0, P = 1, dP = Delta = 0 and dS = 0; they contribute nothing.
    const int t = bwd_tid();
    if (rows && t < Br) {
      const int i = r0 + t;
      const bool ok = i < len_q;
      const int64_t idx = !ok ? 0
                              : p.varlen ? static_cast<int64_t>(h) * p.total_q + q_tok0 + i
                                         : (static_cast<int64_t>(b) * p.heads_q + h) * p.seqlen_q + i;
      bwd_cp_async_4(smem_u32(lse_s(st) + t), p.lse_in + idx, ok);
      bwd_cp_async_4(smem_u32(delta_s(st) + t), args.delta + idx, ok);
    }
  };

  float acc_dk[kMTk][kNTk][4];
  float acc_dv[kMTk][kNTv][4];
  bwd_zero(acc_dk);
  bwd_zero(acc_dv);

  int hi = 0, m = 0;
  bool masked = false;
  bool have = find_tile(hi, m, masked);

  {
    // Prologue: K, V and the first Q/dO in one cp.async group.
    const int b = bwd_lds(ctx.b), hk = bwd_lds(ctx.hk), n0 = bwd_lds(ctx.n0), n_valid = bwd_lds(ctx.n_valid);
    const int64_t k_tok = (p.varlen ? bwd_lds64(ctx.k_tok0) : 0) + n0;
    const T* gk = static_cast<const T*>(p.k) + (p.varlen ? 0 : static_cast<int64_t>(b) * p.k_stride.b) +
                  k_tok * p.k_stride.s + static_cast<int64_t>(hk) * p.k_stride.h;
    const T* gv = static_cast<const T*>(p.v) + (p.varlen ? 0 : static_cast<int64_t>(b) * p.v_stride.b) +
                  k_tok * p.v_stride.s + static_cast<int64_t>(hk) * p.v_stride.h;
    bwd_load_tile<Arch, typename Tr::TileK, Bc, D, Tr::kThreads>(sK, reinterpret_cast<const uint16_t*>(gk), p.k_stride.s,
                                                           n_valid, static_cast<int>(p.head_dim_qk));
    bwd_load_tile<Arch, typename Tr::TileV, Bc, DV, Tr::kThreads>(sV, reinterpret_cast<const uint16_t*>(gv), p.v_stride.s,
                                                            n_valid, static_cast<int>(p.head_dim_v));
    if (have) load_q_do(0, hk * group + hi, hi, m);
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
          bwd_mbar_wait(smem_u32(&ctx.tma_bar[st]), (tma_bits >> (st + 2)) & 1u);
          tma_bits ^= 4u << st;
          top_bar = false;
        } else if ((tma_bits >> (st + 5)) & 1u) {
          bwd_mbar_wait(smem_u32(&ctx.cpa_bar[st]), (tma_bits >> (st + 7)) & 1u);
          if constexpr (kWg) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
          tma_bits ^= 128u << st;
          top_bar = false;
        }
      } else if constexpr (kTma) {
        const int ts = bwd_lds(ctx.tma_state[st]);
        if (ts & 1) bwd_mbar_wait(smem_u32(&ctx.tma_bar[st]), static_cast<uint32_t>(ts >> 1));
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
    const bool next = find_tile(nhi, nm, nmasked);
    // Q/dO of the next tile into stage st^1, by the copy engine where it can (returns true
    // then) else by cp.async, and its LSE/Delta rows if `rows`.
    auto prefetch = [&](bool rows) -> bool {
      const int nh = bwd_lds(ctx.hk) * group + nhi;
      bool tma = false;
      if constexpr (kTma) {
        // Whole tiles, and without varlen also the last one (rows past seqlen_q are outside
        // the map: zero-filled); with varlen a partial tile would read the next sequence.
        tma = args.qdo_map_ok && (!p.varlen || (nm + 1) * Br <= bwd_lds(ctx.len_q));  // uniform
        if (bwd_tid() == 0) {
          const int ns = st ^ 1;
          if (tma) {
            // The stage's last writes may have been cp.async (generic proxy) by any thread:
            // they completed (cp.async.wait_group) before a CTA barrier this thread passed
            // since, so this thread's fence orders them before the engine's writes.
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            const uint32_t bar = smem_u32(&ctx.tma_bar[ns]);
            if (!(kSkew && skew)) {
              const int uses = ctx.tma_uses[ns];
              ctx.tma_uses[ns] = uses + 1;
              ctx.tma_state[ns] = ((uses & 1) << 1) | 1;
            }
            bwd_mbar_expect(bar, static_cast<uint32_t>(Tr::TileQ::kBytes + Tr::TileDO::kBytes));
            const int row = static_cast<int>((p.varlen ? bwd_lds64(ctx.q_tok0) : 0) + nm * Br);
            const int b = p.varlen ? 0 : bwd_lds(ctx.b);
#pragma unroll
            for (int c = 0; c < D / 64; ++c)
              bwd_tma_load(sQ(ns) + static_cast<uint32_t>(c * Br * 128), &qdo_map.q, c * 64, row, nh, b, bar);
#pragma unroll
            for (int c = 0; c < DV / 64; ++c)
              bwd_tma_load(sdO(ns) + static_cast<uint32_t>(c * Br * 128), &qdo_map.dout, c * 64, row, nh, b, bar);
          } else if (!(kSkew && skew)) {
            ctx.tma_state[ns] = 0;
          }
        }
      }
      load_q_do(st ^ 1, nh, nhi, nm, !tma, rows);
      return tma;
    };
    if (args.stages == 2 && next) {
      if (kSkew && skew) {
        // Only the LSE/Delta rows now: their stage's readers (the previous step's S phase)
        // are done; its Q/dO may still be read by slower warps' GEMMs of the previous step.
        load_q_do(st ^ 1, bwd_lds(ctx.hk) * group + nhi, nhi, nm, false, true);
      } else {
        prefetch(true);
      }
    }
    cp_async_commit();

    // ---- per slice of kSL m16 tiles of the warp's S tile: S = Q K^T, dP = dO V^T, then
    // P, dS. kSL = 1 keeps only 2 x kNTs x 4 fragment registers live next to the dK/dV
    // accumulators but re-reads the K/V fragments per slice; kSL = kMTs reads them once.
    // The general path (any option) always runs with one m16 tile per slice: its
    // registers would not fit next to a whole warp tile of S and dP.
    const bool general = p.softcap > 0.f || p.bias_kind != kBiasNone || p.p_drop > 0.f ||
                         args.dbias_mode != kDbiasNone || (masked && p.layout != nullptr);
    // (kWg: acc_s / acc_dp are first written by the wgmma statements, which the front end's
    // use-before-set analysis does not see.)
#pragma nv_diag_suppress 549
    auto s_phase = [&](auto sl_c, auto gen_c, auto mask_c) {
    constexpr int SL = decltype(sl_c)::value;
    constexpr bool kGen = decltype(gen_c)::value;
    [[maybe_unused]] constexpr bool kMask = decltype(mask_c)::value;  // fast path: masked tile
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
      auto band_cols = [&](int rr, int n0, int (&lo)[2], int (&hi)[2]) {
        const int len_k = bwd_lds(ctx.len_k), blo = bwd_lds(ctx.band_lo), bhi = bwd_lds(ctx.band_hi);
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          lo[hr] = r0 + rr + 8 * hr + blo - n0;
          hi[hr] = min(r0 + rr + 8 * hr + bhi, len_k - 1) - n0;
        }
      };
      // P of element e of n8 tile nt of m16 tile ml (S still in acc_s).
      auto p_of = [&](int ml, int nt, int e, float scale_log2, const float (&lse2)[2], const int (&lo)[2],
                      const int (&hi)[2]) {
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
        asm volatile("st.shared.b32 [%0+%2], %1;\n" ::"r"(a), "r"(pack2<T>(ds[2], ds[3])), "n"(Tr::TileP::kBytes + 1024)
                     : "memory");
      };
      // Byte offset in sP of n8 tile nt of a row whose tile 0 is at o0 (EW2 below explains the
      // XOR); a 128-column warp tile crosses into the next 64-column block at nt = 8.
      auto pds_off = [](uint32_t o0, int nt) {
        return (o0 ^ static_cast<uint32_t>((nt & 7) << 4)) + static_cast<uint32_t>((nt >> 3) * Br * 128);
      };
      if constexpr (kWg) {
        // Both GEMMs issued at once (the warpgroup's rows: ws_m0 of its warp 0); the S batch
        // completes first (wait_group 1) while dP's still runs.
        const uint32_t wg_row = static_cast<uint32_t>(ws_m0 - (warp & 3) * 16) * 128u;
        wg_fence();
        wg_gemm<T, kNTs, D, 0, Br, Bc, true>(acc_s, sQ(st) + wg_row, sK + static_cast<uint32_t>(ws_n0) * 128u);
        wg_commit();
        wg_gemm<T, kNTs, DV, 0, Br, Bc, true>(acc_dp, sdO(st) + wg_row, sV + static_cast<uint32_t>(ws_n0) * 128u);
        wg_commit();
        wg_wait<1>();
        wg_hold(acc_s);
      } else
      {
        bwd_warp_gemm<Arch, T, SL, kNTs, D, false, false, Br, Bc>(acc_s, sQ(st), ws_m0, sK, ws_n0);
      }
      // PFIRST (fast path): P = exp2(...) in place of S before the dP GEMM, so that the
      // exponentials can overlap that GEMM's tensor work; P and dS are stored after it (a
      // store before it would pin the exponentials there: ptxas keeps shared stores and the
      // GEMM's ldmatrix in order).
      constexpr bool kPF = !kGen && Arch::kSm90 &&
                           (kSN == 16 || kSN == 32 || kSN == 64 || kSN == 128);
      if constexpr (kPF) {
        const float scale_log2 = p.scale * kLog2e;
        const int n0 = bwd_lds(ctx.n0);
#pragma unroll
        for (int ml = 0; ml < SL; ++ml) {
          const int rr = ws_m0 + ml * 16 + g;
          float lse2[2];
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {  // as row_vals below
            const float l = lse_s(st)[rr + 8 * hr];
            lse2[hr] = l == -INFINITY ? INFINITY : l * kLog2e;
          }
          int lo[2] = {0, 0}, hi[2] = {0, 0};
          if constexpr (kMask) band_cols(rr, n0, lo, hi);
#pragma unroll
          for (int nt = 0; nt < kNTs; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_s[ml][nt][e] = p_of(ml, nt, e, scale_log2, lse2, lo, hi);
        }
      }
      if constexpr (kWg) {
        wg_hold(acc_s);  // (keeps the P computation above the wait, overlapping the dP batch)
        wg_wait<0>();
        wg_hold(acc_dp);
      } else
      {
        bwd_warp_gemm<Arch, T, SL, kNTs, DV, false, false, Br, Bc>(acc_dp, sdO(st), ws_m0, sV, ws_n0);
      }
      if constexpr (kSkew1) {
        if (free_wait && ms == 0) bwd_mbar_wait(smem_u32(&ctx.free_bar), ((tma_bits >> 4) & 1u) ^ 1u);
      }
      if constexpr (kPF) {
#pragma unroll
        for (int ml = 0; ml < SL; ++ml) {
          const int rr = ws_m0 + ml * 16 + g;
          float dlt[2];
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) dlt[hr] = delta_s(st)[rr + 8 * hr];
          const uint32_t o0 = 2u * static_cast<uint32_t>(Tr::TileP::offset(rr, ws_n0 + 2 * t));
#pragma unroll
          for (int nt = 0; nt < kNTs; ++nt) {
            float ds[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) ds[e] = acc_s[ml][nt][e] * (acc_dp[ml][nt][e] - dlt[e >> 1]);
            store_pds_at(sP + pds_off(o0, nt), acc_s[ml][nt], ds);  // offsets as in EW2 below
          }
        }
        continue;  // next slice
      }

      // Row values of the two rows (rr, rr + 8) this thread touches in m16 tile ml of the
      // slice. LSE = -inf (fully masked row) becomes +inf so that every P of the row is
      // exactly exp2(-inf) = 0.
      auto row_vals = [&](int rr, float (&lse2)[2], float (&dlt)[2]) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const float l = lse_s(st)[rr + 8 * hr];
          lse2[hr] = l == -INFINITY ? INFINITY : l * kLog2e;
          dlt[hr] = delta_s(st)[rr + 8 * hr];
        }
      };
      const int n0 = bwd_lds(ctx.n0);
      const bool has_softcap = p.softcap > 0.f;
      const bool has_bias = p.bias_kind == kBiasTensor;
      const bool has_alibi = p.bias_kind == kBiasAlibi || p.bias_kind == kBiasAlibiSymmetric;
      const bool has_dropout = p.p_drop > 0.f;
      auto store_pds = [&](int rr, int cc, float p0, float p1, float p2, float p3, float d0, float d1, float d2, float d3) {
        // P_dropped and dS rows to shared memory ([query][key]).
        const int ro = Tr::TileP::offset(rr, cc), ro8 = Tr::TileP::offset(rr + 8, cc);
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sP + 2u * ro), "r"(pack2<T>(p0, p1)) : "memory");
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sP + 2u * ro8), "r"(pack2<T>(p2, p3)) : "memory");
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sdS + 2u * ro), "r"(pack2<T>(d0, d1)) : "memory");
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sdS + 2u * ro8), "r"(pack2<T>(d2, d3)) : "memory");
      };
      if constexpr (!kGen) {
        // Fast path (no score modifier, dropout, dBias or layout): compact unrolled code,
        // one instantiation for unmasked and one for masked tiles (a run-time test per
        // element was if-converted: ~5 mask instructions per element on every tile).
        const float scale_log2 = p.scale * kLog2e;
        if constexpr (Arch::kSm90 && (kSN == 16 || kSN == 32 || kSN == 64 || kSN == 128)) {
          // P/dS store addresses: with ws_n0 a multiple of kSN (a power of two <= 64) the
          // n8 tiles of a row stay in one 64-column block and their 16-byte chunk index is
          // (ws_n0 / 8 | nt) ^ (row & 7) = chunk(0) ^ nt, so tile nt's byte offset is tile
          // 0's XOR (nt << 4); row + 8: + 1024 bytes; dS: + the P tile size.
#pragma unroll
          for (int ml = 0; ml < SL; ++ml) {
            const int rr = ws_m0 + ml * 16 + g;
            float lse2[2], dlt[2];
            row_vals(rr, lse2, dlt);
            const uint32_t o0 = 2u * static_cast<uint32_t>(Tr::TileP::offset(rr, ws_n0 + 2 * t));
            int lo[2] = {0, 0}, hi[2] = {0, 0};
            if constexpr (kMask) band_cols(rr, n0, lo, hi);
#pragma unroll
            for (int nt = 0; nt < kNTs; ++nt) {
              float pd[4], ds[4];
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                pd[e] = p_of(ml, nt, e, scale_log2, lse2, lo, hi);
                ds[e] = pd[e] * (acc_dp[ml][nt][e] - dlt[e >> 1]);
              }
              store_pds_at(sP + pds_off(o0, nt), pd, ds);
            }
          }
        } else {
#pragma unroll
        for (int ml = 0; ml < SL; ++ml) {
        const int rr = ws_m0 + ml * 16 + g;  // tile row of e = 0, 1 (e = 2, 3: rr + 8)
        float lse2[2], dlt[2];
        row_vals(rr, lse2, dlt);
        const int i_a = r0 + rr;
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
            pd[e] = fast_exp2(x);
            ds[e] = pd[e] * (acc_dp[ml][nt][e] - dlt[e >> 1]);
          }
          store_pds(rr, cc, pd[0], pd[1], pd[2], pd[3], ds[0], ds[1], ds[2], ds[3]);
        }
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
            for (int k = 0; k < kNTs; ++k) {
              if ((km != 0 || k != 0) && km == ml && k == nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                  sv[e] = acc_s[km][k][e];
                  dv[e] = acc_dp[km][k][e];
                }
              }
            }
          }
          const int cc = ws_n0 + nt * 8 + 2 * t;  // tile col of e = 0, 2 (e = 1, 3: cc + 1)
          // Dropout keep words: lanes t and t^1 share the 4-column philox group; each
          // computes one of the two rows and they swap the halves the other needs.
          uint32_t kw[4] = {0u, 0u, 0u, 0u};
          if (has_dropout) {
            const uint64_t head_ctr = p.offset + static_cast<uint64_t>(b) * static_cast<uint64_t>(p.heads_q) + h;
            const uint32_t i_sel = static_cast<uint32_t>(r0 + rr + 8 * (t & 1));
            const uint32_t j4 = static_cast<uint32_t>((n0 + ws_n0 + nt * 8) / 4 + (t >> 1));
            const Philox4 w = dropout_words(p.seed, head_ctr, i_sel, j4);
            const uint32_t send0 = (t & 1) ? w.x[0] : w.x[2];
            const uint32_t send1 = (t & 1) ? w.x[1] : w.x[3];
            const uint32_t recv0 = __shfl_xor_sync(0xffffffffu, send0, 1);
            const uint32_t recv1 = __shfl_xor_sync(0xffffffffu, send1, 1);
            if (t & 1) {
              kw[0] = recv0; kw[1] = recv1; kw[2] = w.x[2]; kw[3] = w.x[3];
            } else {
              kw[0] = w.x[0]; kw[1] = w.x[1]; kw[2] = recv0; kw[3] = recv1;
            }
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
                s += alibi_bias(p, p.alibi_slopes[h], i + bwd_lds(ctx.shift), j);
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
              const bool kept = kw[e] >= p.drop_threshold;
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
    if (!general) {
      using SliceT = std::integral_constant<int, kSL>;
      if (!Arch::kSm90 || masked) s_phase(SliceT{}, std::false_type{}, std::true_type{});
      else s_phase(SliceT{}, std::false_type{}, std::false_type{});
    } else {
      s_phase(std::integral_constant<int, 1>{}, std::true_type{}, std::true_type{});
    }
    if (kSkew && skew) cp_async_wait<0>();  // the next tile's LSE/Delta rows: visible after the barrier
    // kWgK, kWgQ: the dK/dV and dQ GEMMs read sP/sdS through the async proxy (this thread's
    // stores above are generic).
    if constexpr (kWgK || kWgQ) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();  // sP, sdS complete (kSkew: and every warp is past the previous step)
    if (kSkew && skew && next) {
      const int ns = st ^ 1;
      if (prefetch(false)) {  // uniform
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
      wk_pos(bwd_tid() >> 5, wk_m0, wk_n0, wv_n0);
      bwd_warp_gemm<Arch, T, kMTk, kNTv, Br, true, true, Br, Br>(acc_dv, sP, wk_m0, sdO(st), wv_n0);
    };
    auto dk_phase = [&]() {
      int wk_m0, wk_n0, wv_n0;
      wk_pos(bwd_tid() >> 5, wk_m0, wk_n0, wv_n0);
      bwd_warp_gemm<Arch, T, kMTk, kNTk, Br, true, true, Br, Br>(acc_dk, sdS, wk_m0, sQ(st), wk_n0);
    };

    // dQ in kQP column passes of the warp tile.
    auto dq_phase = [&]() {
      const int warp = bwd_tid() >> 5, lane = bwd_tid() & 31;
      const int g = lane >> 2, t = lane & 3;
      const int wq_m0 = (kWgQ ? warp % kWQ_M : warp / Tr::WQ_N) * kQM;
      const int b = bwd_lds(ctx.b);
      int32_t* sem = det ? args.dq_sema + (static_cast<int64_t>(b) * p.heads_q + h) * args.n_qblocks + m : nullptr;
#pragma unroll 1
      for (int qp = 0; qp < kQPx; ++qp) {
      const int wq_p0 = (kWgQ ? warp / kWQ_M : warp % Tr::WQ_N) * kQN + qp * (kQN / kQPx);
      float acc_q[kMTq][kBlk * kNTqp][4];
      if constexpr (kWgQ) {
        wg_fence();
        wg_gemm<T, kBlk * kNTqp, Bc, 1, Br, Bc, true>(acc_q, sdS + static_cast<uint32_t>(wq_m0 - (warp & 3) * 16) * 128u,
                                                     sK + static_cast<uint32_t>((wq_p0 >> 6) * Bc * 128));
        wg_commit();
        wg_wait<0>();
        wg_hold(acc_q);
      } else
      {
        bwd_zero(acc_q);
        bwd_warp_gemm<Arch, T, kMTq, kNTqp, Bc, false, true, Br, Bc>(acc_q, sdS, wq_m0, sK, wq_p0);
      }
      if (det && qp == 0) {
        if (bwd_tid() == 0) bwd_wait_turn(sem, bwd_lds(ctx.n_blk));
        __syncthreads();
      }
#pragma unroll
      for (int blk = 0; blk < kBlk; ++blk) {
      // Block blk of the pass: columns wq_n0 .. + 8 kNTqp - 1 (its fragments acc_dq).
      float (&acc_dq)[kMTq][kNTqp][4] = *reinterpret_cast<float (*)[kMTq][kNTqp][4]>(&acc_q[0][blk * kNTqp][0]);
      const int wq_n0 = wq_p0 + blk * 8 * kNTqp;
      const int dqk = static_cast<int>(p.head_dim_qk);
      const int len_q = bwd_lds(ctx.len_q);
      const int64_t dq_row0 = p.varlen ? bwd_lds64(ctx.q_tok0) : static_cast<int64_t>(b) * p.seqlen_q;
      float* dq_base = args.dq_accum + ((dq_row0 + r0) * p.heads_q + h) * dqk;
      const int64_t dq_rs = p.heads_q * dqk;
      if constexpr (Arch::kSm90 && Tr::kDqStage) {
        // Stage one m16 x 32 block of the warp's pass tile at a time: row R at R * 128 B,
        // 16-byte chunk c stored at c ^ (2 * (R & 3)) (conflict-free for both the 8-byte
        // fragment stores and the row-wise 16-byte reads), then 4 reductions of 4 rows each.
        const uint32_t stg = s_base + Tr::kOffStg + static_cast<uint32_t>(warp * Tr::kStgWarpBytes);
        if constexpr (Tr::kDqBulk) {
          if (args.dq_map_ok) {  // uniform; never in deterministic mode (the host sets it)
            // Block mt of the pass: the warp stores its fragments into buffer mt in the
            // map's 128-byte swizzle (row R at R * 128 B, 16-byte chunk c at c ^ (R & 7): the
            // fragment stores hit every bank pair at most twice), makes them visible to the
            // copy engine (proxy fence), and lane 0 issues one tensor reduction of the 16 x 32
            // box at (column wq_n0, head h, row dq_row0 + r0 + wq_m0 + 16 mt); the engine
            // skips columns >= head_dim_qk and rows past the accumulator. Rows past len_q
            // would land in the next sequence's rows: in the last block they are stored as 0
            // (they hold dS K of zero-filled Q rows, which NaN or Inf keys can make NaN).
            // Both blocks of the pass are stored before one fence and issued together; the
            // buffers are refilled once the previous pass's group is done reading them.
            const uint32_t bufs = (s_base + Tr::kOffStg + 1023u) & ~1023u;  // the swizzle needs 1024-byte alignment
            const uint32_t buf0 = bufs + static_cast<uint32_t>((warp * 2 + blk) * Tr::kBulkBufBytes);
            const uint32_t lane_o = static_cast<uint32_t>(g * 128 + ((((t >> 1) ^ g) << 4) | ((t & 1) << 3)));
            const int rows_left = len_q - r0 - wq_m0;
            const int row0 = static_cast<int>(dq_row0 + r0 + wq_m0);
            const uint64_t map = reinterpret_cast<uint64_t>(&dq_map);
            static_assert(kMTq * kBlk <= 2, "one buffer per m16 block of the pass");
            if (lane == 0 && blk == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
            __syncwarp();
#pragma unroll
            for (int mt = 0; mt < kMTq; ++mt) {
              const uint32_t buf = buf0 + static_cast<uint32_t>(mt * Tr::kBulkBufBytes);
              const bool partial = mt * 16 + 16 > rows_left;  // uniform
#pragma unroll
              for (int nt = 0; nt < kNTqp; ++nt)
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) {
                  float x = acc_dq[mt][nt][2 * hf], y = acc_dq[mt][nt][2 * hf + 1];
                  if (partial && mt * 16 + g + 8 * hf >= rows_left) x = y = 0.f;
                  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(buf + ((lane_o ^ static_cast<uint32_t>(nt << 5)) +
                                                                                static_cast<uint32_t>(hf * 1024))),
                               "f"(x), "f"(y)
                               : "memory");
                }
            }
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncwarp();
            if (lane == 0) {
#pragma unroll
              for (int mt = 0; mt < kMTq; ++mt)
                if (mt * 16 < rows_left)
                  asm volatile(
                      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                          map),
                      "r"(buf0 + static_cast<uint32_t>(mt * Tr::kBulkBufBytes)), "r"(wq_n0), "r"(h), "r"(row0 + mt * 16)
                      : "memory");
              asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
            }
            continue;  // next block (or column pass)
          }
        }
        // This lane's row (lane / 8 + 4 i + 16 mt) and 4 columns as one base pointer plus
        // 4-row steps, and the row bound as one compare per reduction.
        const int row_l = lane >> 3;
        float* const lane_dq = dq_base + static_cast<int64_t>(wq_m0 + row_l) * dq_rs + wq_n0 + (lane & 7) * 4;
        const int64_t step4 = 4 * dq_rs;
        const int rows_left = len_q - r0 - wq_m0 - row_l;  // row 4 i + 16 mt exists iff < rows_left
        const bool col_ok = wq_n0 + (lane & 7) * 4 < dqk;
        // The global address of reduction k (row 4 k of this lane, k = 4 mt + i) is the
        // previous one plus 4 rows, by an add the compiler cannot re-associate into a wide
        // multiply; the reduction is predicated (no branch to sink address math into).
        uint64_t red_ptr = 0;
        asm("cvta.to.global.u64 %0, %1;\n" : "=l"(red_ptr) : "l"(lane_dq));
        const uint64_t red_step = static_cast<uint64_t>(step4) * sizeof(float);
        // Staging store of (row g + 8 hf, cols nt * 8 + 2 t): chunk 2 nt + (t >> 1) XOR 2 (g & 3),
        // i.e. tile 0's offset XOR (nt << 5), + 1024 for hf.
        const uint32_t stg_o0 = static_cast<uint32_t>(g * 128 + ((((t >> 1) ^ (2 * (g & 3))) << 4) | ((t & 1) << 3)));
#pragma unroll
        for (int mt = 0; mt < kMTq; ++mt) {
#pragma unroll
          for (int nt = 0; nt < kNTqp; ++nt) {
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
              const uint32_t off = (stg_o0 ^ static_cast<uint32_t>(nt << 5)) + static_cast<uint32_t>(hf * 1024);
              asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(stg + off), "f"(acc_dq[mt][nt][2 * hf]),
                           "f"(acc_dq[mt][nt][2 * hf + 1])
                           : "memory");
            }
          }
          __syncwarp();
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int row = 4 * i + (lane >> 3), ch = lane & 7;
            const uint32_t off = static_cast<uint32_t>(row * 128 + ((ch ^ (2 * (row & 3))) << 4));
            float4 v;
            asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                         : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                         : "r"(stg + off)
                         : "memory");
            const int ok = col_ok && mt * 16 + 4 * i < rows_left;
            asm volatile(
                "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
                " @p red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n}\n" ::"l"(red_ptr),
                "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(ok)
                : "memory");
            asm("add.u64 %0, %0, %1;\n" : "+l"(red_ptr) : "l"(red_step));
          }
          __syncwarp();
        }
      } else
      {
#pragma unroll
      for (int mt = 0; mt < kMTq; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNTqp; ++nt) {
          const int r = wq_m0 + mt * 16 + g, c = wq_n0 + nt * 8 + 2 * t;
          if constexpr (Arch::kSm90 && Tr::kDqV4) {
          // Lanes t, t^1 swap half their fragment so each holds 4 consecutive columns of
          // one row: one 16-byte vector reduction instead of two 8-byte ones (the atomics
          // share the L1/LSU pipe with the shared-memory traffic).
          const bool odd = (t & 1) != 0;
          const float s0 = odd ? acc_dq[mt][nt][0] : acc_dq[mt][nt][2];
          const float s1 = odd ? acc_dq[mt][nt][1] : acc_dq[mt][nt][3];
          const float x0 = __shfl_xor_sync(0xffffffffu, s0, 1);
          const float x1 = __shfl_xor_sync(0xffffffffu, s1, 1);
          const float4 v = odd ? make_float4(x0, x1, acc_dq[mt][nt][2], acc_dq[mt][nt][3])
                               : make_float4(acc_dq[mt][nt][0], acc_dq[mt][nt][1], x0, x1);
          const int rv = odd ? r + 8 : r, cv = odd ? c - 2 : c;
          if (cv < dqk && r0 + rv < len_q) bwd_red_vec(dq_base + rv * dq_rs + cv, v);
          } else {
            // Two 8-byte reductions (at d=256 with one pass, the swap's extra registers
            // cost more than the narrower atomics: 104 vs 142 TFLOP/s on H100).
            if (c < dqk) {
              if (r0 + r < len_q) bwd_red_add2<Arch>(dq_base + r * dq_rs + c, acc_dq[mt][nt][0], acc_dq[mt][nt][1]);
              if (r0 + r + 8 < len_q)
                bwd_red_add2<Arch>(dq_base + (r + 8) * dq_rs + c, acc_dq[mt][nt][2], acc_dq[mt][nt][3]);
            }
          }
        }
      }
      }
      }  // block
      }  // column pass
      if (det) {
        __threadfence();
        __syncthreads();
        if (bwd_tid() == 0) bwd_st_release(sem, bwd_lds(ctx.n_blk) + 1);
      }
    };
    if constexpr (kWgK) {
      // Both GEMMs issued for the warpgroup's 64 keys (its warp 0's wk_m0: the first key of a
      // 64-column block of sP / sdS), then the dQ GEMM and its reductions run beside them.
      int wk_m0, wk_n0, wv_n0;
      const int warp = bwd_tid() >> 5;
      wk_pos(warp, wk_m0, wk_n0, wv_n0);
      const uint32_t ka = static_cast<uint32_t>(((wk_m0 - (warp & 3) * 16) >> 6) * Br * 128);
      wg_fence();
      wg_gemm<T, kNTv, Br, 3, Br, Br, false>(acc_dv, sP + ka, sdO(st) + static_cast<uint32_t>((wv_n0 >> 6) * Br * 128));
      wg_gemm<T, kNTk, Br, 3, Br, Br, false>(acc_dk, sdS + ka, sQ(st) + static_cast<uint32_t>((wk_n0 >> 6) * Br * 128));
      wg_commit();
      dq_phase();
      wg_wait<0>();
      wg_hold(acc_dv);
      wg_hold(acc_dk);
    } else
    {
    dv_phase();
    constexpr bool kMid = Arch::kSm90 && Tr::kDqMid;
    if constexpr (kMid) dq_phase();
    dk_phase();
    if constexpr (!kMid) dq_phase();
    }
    if constexpr (kSkew1) {
      if (skew) {  // this thread's reads of sP/sdS are done (phase = this step)
        bwd_mbar_arrive(smem_u32(&ctx.free_bar));
        tma_bits ^= 16u;
      }
    }

    if (args.stages == 1) {
      __syncthreads();  // every read of stage 0 is done
      if (next) load_q_do(0, bwd_lds(ctx.hk) * group + nhi, nhi, nm);
      cp_async_commit();
    } else {
      st ^= 1;
    }
    hi = nhi;
    m = nm;
    masked = nmasked;
    have = next;
  }

  // Bulk dQ reductions: complete (their shared-memory reads included) before the CTA exits.
  if constexpr (Arch::kSm90 && Tr::kDqBulk) {
    if ((tid & 31) == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  }

  // ---- dK (scaled), dV to global ----
  {
    const int warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    int wk_m0, wk_n0, wv_n0;
    wk_pos(warp, wk_m0, wk_n0, wv_n0);
    const int b = bwd_lds(ctx.b), hk = bwd_lds(ctx.hk), n0 = bwd_lds(ctx.n0), n_valid = bwd_lds(ctx.n_valid);
    const int64_t k_tok = (p.varlen ? bwd_lds64(ctx.k_tok0) : 0) + n0;
    T* gdk = static_cast<T*>(p.dk) + (p.varlen ? 0 : static_cast<int64_t>(b) * p.dk_stride.b) +
             k_tok * p.dk_stride.s + static_cast<int64_t>(hk) * p.dk_stride.h;
    T* gdv = static_cast<T*>(p.dv) + (p.varlen ? 0 : static_cast<int64_t>(b) * p.dv_stride.b) +
             k_tok * p.dv_stride.s + static_cast<int64_t>(hk) * p.dv_stride.h;
    const int dqk = static_cast<int>(p.head_dim_qk), dv = static_cast<int>(p.head_dim_v);
    const float scale = p.scale;
    bool staged = false;
    if constexpr (Arch::kSm90) {
      // EPI: through shared memory (the K and V tiles, free now), then whole 16-byte row
      // chunks to global memory, when the row starts allow 16-byte stores (uniform).
      staged = ((reinterpret_cast<uintptr_t>(gdk) | reinterpret_cast<uintptr_t>(gdv)) & 15u) == 0 &&
               ((p.dk_stride.s | p.dv_stride.s) & 7) == 0;
      if (staged) {
        // Every warp's last reads of sK and sV are done, and so are the prologue's copies into
        // them (still in flight here if the CTA had no tile to compute: no loop-top wait ran).
        cp_async_wait<0>();
        __syncthreads();
#pragma unroll
        for (int mt = 0; mt < kMTk; ++mt) {
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int r = wk_m0 + mt * 16 + g + 8 * hf;
#pragma unroll
            for (int nt = 0; nt < kNTk; ++nt) {
              const uint32_t v = pack2<T>(acc_dk[mt][nt][2 * hf] * scale, acc_dk[mt][nt][2 * hf + 1] * scale);
              const uint32_t a = sK + 2u * static_cast<uint32_t>(Tr::TileK::offset(r, wk_n0 + nt * 8 + 2 * t));
              asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
            }
#pragma unroll
            for (int nt = 0; nt < kNTv; ++nt) {
              const uint32_t v = pack2<T>(acc_dv[mt][nt][2 * hf], acc_dv[mt][nt][2 * hf + 1]);
              const uint32_t a = sV + 2u * static_cast<uint32_t>(Tr::TileV::offset(r, wv_n0 + nt * 8 + 2 * t));
              asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
            }
          }
        }
        __syncthreads();
        auto rows_out = [&](auto tile_c, uint32_t s_tile, T* gdst, int64_t stride, int cols, auto ncols_c) {
          using Tile = decltype(tile_c);
          constexpr int kChunks = decltype(ncols_c)::value / 8;  // 16-byte chunks per row
#pragma unroll 1
          for (int i = tid; i < Bc * kChunks; i += Tr::kThreads) {
            const int r = i / kChunks, c = (i % kChunks) * 8;
            if (r < n_valid && c < cols) {
              uint4 v;
              asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                           : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                           : "r"(s_tile + 2u * static_cast<uint32_t>(Tile::offset(r, c))));
              *reinterpret_cast<uint4*>(gdst + static_cast<int64_t>(r) * stride + c) = v;
            }
          }
        };
        rows_out(typename Tr::TileK{}, sK, gdk, p.dk_stride.s, dqk, std::integral_constant<int, D>{});
        rows_out(typename Tr::TileV{}, sV, gdv, p.dv_stride.s, dv, std::integral_constant<int, DV>{});
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMTk; ++mt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = wk_m0 + mt * 16 + g + 8 * hf;
        if (staged || r >= n_valid) continue;
#pragma unroll
        for (int nt = 0; nt < kNTk; ++nt) {
          const int c = wk_n0 + nt * 8 + 2 * t;
          if (c < dqk) {
            const uint32_t v = pack2<T>(acc_dk[mt][nt][2 * hf] * scale, acc_dk[mt][nt][2 * hf + 1] * scale);
            *reinterpret_cast<uint32_t*>(gdk + static_cast<int64_t>(r) * p.dk_stride.s + c) = v;
          }
        }
#pragma unroll
        for (int nt = 0; nt < kNTv; ++nt) {
          const int c = wv_n0 + nt * 8 + 2 * t;
          if (c < dv) {
            const uint32_t v = pack2<T>(acc_dv[mt][nt][2 * hf], acc_dv[mt][nt][2 * hf + 1]);
            *reinterpret_cast<uint32_t*>(gdv + static_cast<int64_t>(r) * p.dv_stride.s + c) = v;
          }
        }
      }
    }
  }
}

}  // namespace fa2
}  // namespace flashattn
