// Global-to-shared copies of the FA2-design backward main kernel's steps: Q, dO, LSE and
// Delta of a (head, q-block) tile by cp.async, and the next tile's prefetch by the copy
// engine where it can.
#pragma once
#include <stdint.h>

#include "common/params.h"
#include "fa2/bwd.h"
#include "fa2/bwd_ctx.cuh"
#include "fa2/bwd_primitives.cuh"
#include "fa2/bwd_state.cuh"
#include "fa2/mma.cuh"

namespace flashattn {
namespace fa2 {

// Q and dO tiles (`tiles` true) and the LSE and Delta rows (`rows` true) of (head
// h = hk * group + hi, q-block m) into stage st by cp.async.
template <class Arch, class Tr, typename T>
__device__ __forceinline__ void bwd_load_q_do(const BwdKernel<Arch, Tr, T>& k, int st, int h, [[maybe_unused]] int hi,
                                              int m, bool tiles = true, bool rows = true) {
  constexpr int Br = Tr::Br, D = Tr::D, DV = Tr::DV;
  const AttnParams& p = k.p;
  const BwdArgs& args = k.args;
  BwdCtx& ctx = k.ctx;
  if constexpr (Arch::kSm90) {
    const int r0 = m * Br;
    const int len_q = bwd_lds(ctx.len_q);
    const int nv = len_q - r0 < Br ? len_q - r0 : Br;
    if (tiles) {
      const T* gq = bwd_ldsp<T>(ctx.q_row0) + hi * p.q_stride.h + static_cast<int64_t>(r0) * p.q_stride.s;
      const T* gdo = bwd_ldsp<T>(ctx.do_row0) + hi * p.do_stride.h + static_cast<int64_t>(r0) * p.do_stride.s;
      bwd_load_tile<Arch, typename Tr::TileQ, Br, D, Tr::kThreads>(k.sQ(st), reinterpret_cast<const uint16_t*>(gq),
                                                                   p.q_stride.s, nv, static_cast<int>(p.head_dim_qk));
      bwd_load_tile<Arch, typename Tr::TileDO, Br, DV, Tr::kThreads>(k.sdO(st), reinterpret_cast<const uint16_t*>(gdo),
                                                                     p.do_stride.s, nv, static_cast<int>(p.head_dim_v));
    }
    const int t = bwd_tid();
    if (rows && t < Br) {  // as below: rows past the end read as 0
      const bool ok = r0 + t < len_q;
      const int64_t idx = ok ? bwd_lds64(ctx.lse_row0) + hi * bwd_lds64(ctx.lse_hstep) + r0 + t : 0;
      bwd_cp_async_4(smem_u32(k.lse_s(st) + t), p.lse_in + idx, ok);
      bwd_cp_async_4(smem_u32(k.delta_s(st) + t), args.delta + idx, ok);
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
    bwd_load_tile<Arch, typename Tr::TileQ, Br, D, Tr::kThreads>(k.sQ(st), reinterpret_cast<const uint16_t*>(gq),
                                                                 p.q_stride.s, nv, static_cast<int>(p.head_dim_qk));
    bwd_load_tile<Arch, typename Tr::TileDO, Br, DV, Tr::kThreads>(k.sdO(st), reinterpret_cast<const uint16_t*>(gdo),
                                                                   p.do_stride.s, nv, static_cast<int>(p.head_dim_v));
  }
  // LSE and Delta rows by cp.async too (a plain load would stall these warps for a
  // full memory latency). Rows past the end read as 0: their Q and dO rows are zero,
  // so S = 0, P = 1, dP = Delta = 0 and dS = 0; they contribute nothing.
  const int t = bwd_tid();
  if (rows && t < Br) {
    const int i = r0 + t;
    const bool ok = i < len_q;
    const int64_t idx = !ok        ? 0
                        : p.varlen ? static_cast<int64_t>(h) * p.total_q + q_tok0 + i
                                   : (static_cast<int64_t>(b) * p.heads_q + h) * p.seqlen_q + i;
    bwd_cp_async_4(smem_u32(k.lse_s(st) + t), p.lse_in + idx, ok);
    bwd_cp_async_4(smem_u32(k.delta_s(st) + t), args.delta + idx, ok);
  }
}

// Q/dO of the next tile into stage st^1, by the copy engine where it can (returns true
// then) else by cp.async, and its LSE/Delta rows if `rows`.
template <class Arch, class Tr, typename T>
__device__ __forceinline__ bool bwd_prefetch(const BwdKernel<Arch, Tr, T>& k, int st, int nhi, int nm,
                                             [[maybe_unused]] bool skew, bool rows) {
  using G = BwdGrid<Arch, Tr>;
  constexpr int Br = Tr::Br, D = Tr::D, DV = Tr::DV;
  constexpr bool kTma = G::kTma, kSkew = G::kSkew;
  const AttnParams& p = k.p;
  const BwdArgs& args = k.args;
  BwdCtx& ctx = k.ctx;
  const int group = k.group;
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
        hopper::mbar_expect(bar, static_cast<uint32_t>(Tr::TileQ::kBytes + Tr::TileDO::kBytes));
        const int row = static_cast<int>((p.varlen ? bwd_lds64(ctx.q_tok0) : 0) + nm * Br);
        const int b = p.varlen ? 0 : bwd_lds(ctx.b);
#pragma unroll
        for (int c = 0; c < D / 64; ++c)
          hopper::tma_load(k.sQ(ns) + static_cast<uint32_t>(c * Br * 128), &k.qdo_map.q, c * 64, row, nh, b, bar);
#pragma unroll
        for (int c = 0; c < DV / 64; ++c)
          hopper::tma_load(k.sdO(ns) + static_cast<uint32_t>(c * Br * 128), &k.qdo_map.dout, c * 64, row, nh, b, bar);
      } else if (!(kSkew && skew)) {
        ctx.tma_state[ns] = 0;
      }
    }
  }
  bwd_load_q_do(k, st ^ 1, nh, nhi, nm, !tma, rows);
  return tma;
}

}  // namespace fa2
}  // namespace flashattn
