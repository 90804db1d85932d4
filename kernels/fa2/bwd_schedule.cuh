// Which (head, q-block) tiles a CTA of the FA2-design backward visits: the element-mask
// test of a tile, and the block-sparse layout scan (windows of q-blocks evaluated in
// parallel into shared bitmaps).
#pragma once
#include <stdint.h>

#include "fa2/bwd_ctx.cuh"
#include "fa2/bwd_primitives.cuh"
#include "fa2/bwd_state.cuh"

namespace flashattn {
namespace fa2 {

// Whether q-block m (rows [m Br, min((m + 1) Br, len_q))) of the k-block [n0, n0 + n_valid)
// needs the element mask: a partial k-block, or a row whose band interval
// [i + band_lo, i + band_hi] does not cover the whole k-block. False for every m in one
// contiguous range (both band conditions are monotone in m).
__device__ __forceinline__ bool bwd_tile_partial(int m, int Br, int Bc, int len_q, int n0, int n_valid, int band_lo,
                                                 int band_hi) {
  const int n_last = n0 + n_valid - 1;
  const int r0 = m * Br;
  const int r1 = (r0 + Br < len_q ? r0 + Br : len_q) - 1;
  return n_valid < Bc || n0 < r1 + band_lo || n_last > r0 + band_hi;
}

// The layout's description, passed by value to the functions below (a reference to the
// kernel's parameters would make the kernel copy them all to local memory).
struct BwdLayoutView {
  const uint8_t* layout;
  int64_t layout_heads, n_row_blocks, n_col_blocks, block_q, block_k;
};
// Scans the layout cells that rows [r0, r1] x keys [n0, n_last] of head h touch, cells
// first, first + stride, ... of the row-major list: any_on / any_off are set if one of them
// is on / off. (Cell counts fit 32 bits: a tile is at most 128 x 128 elements.)
__device__ __forceinline__ void bwd_layout_cells(const BwdLayoutView lv, int h, int r0, int r1, int n0, int n_last,
                                                 int first, int stride, bool& any_on, bool& any_off) {
  const int64_t lh = lv.layout_heads == 1 ? 0 : h;
  const int64_t rb0 = r0 / lv.block_q, cb0 = n0 / lv.block_k;
  const int ncb = static_cast<int>(n_last / lv.block_k - cb0 + 1);
  const int cnt = static_cast<int>(r1 / lv.block_q - rb0 + 1) * ncb;
  for (int e = first; e < cnt; e += stride) {
    const int64_t rb = rb0 + e / ncb, cb = cb0 + e % ncb;
    if (lv.layout[(lh * lv.n_row_blocks + rb) * lv.n_col_blocks + cb]) any_on = true;
    else any_off = true;
  }
}

// SCHED2 (collective, all threads): the window of q-blocks [m0, m0 + kWin) of head h
// (relative head hi) into ctx's bitmaps, each thread evaluating the layout cells of its
// tiles alone; same states as the main kernel's tile_state. Not inlined: it runs about
// once per head and k-block, and inlined into the main loop it made ptxas spill.
template <int Br, int Bc, int kWin, int kThreads>
__device__ __noinline__ void bwd_fill_window(const BwdLayoutView p, BwdCtx& ctx, int h, int hi, int m0) {
  __syncthreads();  // every thread is done reading the previous window
  if (bwd_tid() < kWin / 32) {
    ctx.win_act[bwd_tid()] = 0u;
    ctx.win_msk[bwd_tid()] = 0u;
  }
  __syncthreads();
  const int m_lo = ctx.m_lo, m_hi = ctx.m_hi, len_q = ctx.len_q, n0 = ctx.n0, n_valid = ctx.n_valid;
  const int n_last = n0 + n_valid - 1;
  for (int i = bwd_tid(); i < kWin; i += kThreads) {
    const int m = m0 + i;
    if (m < m_lo || m >= m_hi) continue;
    const int r0 = m * Br;
    const int r1 = (r0 + Br < len_q ? r0 + Br : len_q) - 1;
    bool any_on = false, any_off = false;
    bwd_layout_cells(p, h, r0, r1, n0, n_last, 0, 1, any_on, any_off);  // this thread's tile alone
    if (!any_on) continue;
    atomicOr(&ctx.win_act[i >> 5], 1u << (i & 31));
    if (any_off || bwd_tile_partial(m, Br, Bc, len_q, n0, n_valid, ctx.band_lo, ctx.band_hi))
      atomicOr(&ctx.win_msk[i >> 5], 1u << (i & 31));
  }
  if (bwd_tid() == 0) {
    ctx.win_base = m0;
    ctx.win_hi = hi;
  }
  __syncthreads();
}

// SCHED2 (collective): the next tile to compute at or after (hi, m) from the window
// bitmaps, refilling them as needed. Returns 0 when there is none, else bit 63 set, bit 62
// = needs the element mask, bits 32..61 = hi, bits 0..31 = m. Not inlined, like the fill.
template <int Br, int Bc, int kWin, int kThreads>
__device__ __noinline__ uint64_t bwd_next_sparse(const BwdLayoutView lv, BwdCtx& ctx, int group, int hi, int m) {
  while (hi < group) {
    const int mb = ctx.m_lo, me = ctx.m_hi;
    if (m < mb) m = mb;
    while (m < me) {
      int base = ctx.win_base;
      if (ctx.win_hi != hi || m < base || m >= base + kWin) {
        bwd_fill_window<Br, Bc, kWin, kThreads>(lv, ctx, ctx.hk * group + hi, hi, m);
        base = m;
      }
      const int idx = m - base;
      int w = idx >> 5;
      uint32_t bits = ctx.win_act[w] & (~0u << (idx & 31));
      while (bits == 0u && ++w < kWin / 32) bits = ctx.win_act[w];
      if (bits == 0u) {
        m = base + kWin;  // nothing left in this window
        continue;
      }
      const int bit = __ffs(static_cast<int>(bits)) - 1;
      m = base + w * 32 + bit;
      if (m >= me) break;
      const uint64_t masked = (ctx.win_msk[w] >> bit) & 1u;
      return (uint64_t{1} << 63) | (masked << 62) | (static_cast<uint64_t>(hi) << 32) | static_cast<uint32_t>(m);
    }
    ++hi;
    m = 0;
  }
  return 0;
}

// Tile state of (head h, q-block m): 0 skip, 1 compute, 2 compute with element mask.
// Collective (all threads, uniform arguments) when a block-sparse layout is present.
template <class Arch, class Tr, typename T>
__device__ __forceinline__ int bwd_tile_state(const BwdKernel<Arch, Tr, T>& k, int h, int m) {
  constexpr int Br = Tr::Br, Bc = Tr::Bc;
  const AttnParams& p = k.p;
  BwdCtx& ctx = k.ctx;
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
}

constexpr int kBwdWinTiles = 1024;
// Advances (hi, m) to the next tile to compute, starting at (hi, m) inclusive. In
// deterministic mode every q-block of the sequence is visited and the skipped ones
// still pass this k-block's turn on to the next k-block.
template <class Arch, class Tr, typename T>
__device__ __forceinline__ bool bwd_find_tile(const BwdKernel<Arch, Tr, T>& k, int& hi, int& m, bool& masked) {
  constexpr int Br = Tr::Br, Bc = Tr::Bc;
  const AttnParams& p = k.p;
  const BwdArgs& args = k.args;
  BwdCtx& ctx = k.ctx;
  const int group = k.group;
  const bool det = k.det;
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
      const uint64_t r = bwd_next_sparse<Br, Bc, kBwdWinTiles, Tr::kThreads>(lv, ctx, group, hi, m);
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
      const int st = bwd_tile_state(k, h, m);
      if (st != 0) {
        masked = st == 2;
        return true;
      }
      if (det && bwd_tid() == 0) {
        int32_t* sem = args.dq_turns + (static_cast<int64_t>(bwd_lds(ctx.b)) * p.heads_q + h) * args.n_qblocks + m;
        const int n_blk = bwd_lds(ctx.n_blk);
        turn_wait(sem, n_blk);
        turn_pass(sem, n_blk + 1);
      }
    }
    ++hi;
    m = 0;
  }
  return false;
}

}  // namespace fa2
}  // namespace flashattn
