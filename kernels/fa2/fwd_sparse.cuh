// The block-sparse tile scan of the FA2-design forward kernel (fwd_kernel.cuh): which KV tiles
// of a q block a layout attends, looked up warp-uniformly (every warp computes it itself).
// The lookups are function objects holding references to the kernel's per-CTA values (set by
// fwd_layout_setup) in the order of their first use: the optimizer then sees the code as it
// saw the kernel-local lambdas they replace, and the kernel's machine code stays the same.
#pragma once
#include <stdint.h>

#include "common/params.h"

namespace flashattn {
namespace fa2 {

constexpr int kFwdScanMore = -0x40000000;  // FwdScanResolve: no attended tile in this batch

// Batched scan (when a tile needs <= 32 lookups): lane handles lookup q of tile n_top - k,
// k = lane / lk_tile. Returns bit 0 = block attended, bit 1 = a real lookup.
template <int kBlockN>
struct FwdScanIssue {
  const int& lane;
  const int& lk_tile;
  const int& tiles_per_scan;
  const int& n_block_min;
  const int& ncb_max;
  const int& len_k;
  const uint32_t& lay_bk;
  const uint8_t* const& layout_h;
  const int& rb0;
  const AttnParams& p;

  __device__ uint32_t operator()(int n_top) const {
    const int k = lane / lk_tile;
    const int q = lane - k * lk_tile;
    const int n = n_top - k;
    if (k >= tiles_per_scan || n < n_block_min) return 0u;
    const int r = q / ncb_max, c = q - r * ncb_max;
    const uint32_t c_first = static_cast<uint32_t>(n) * kBlockN;
    const uint32_t c_last = static_cast<uint32_t>(min(n * kBlockN + kBlockN, len_k) - 1);
    const uint32_t cb = c_first / lay_bk + c;
    if (cb > c_last / lay_bk) return 0u;
    return (layout_h[static_cast<int64_t>(rb0 + r) * p.n_col_blocks + cb] != 0 ? 1u : 0u) | 2u;
  }
};

// First tile from n_top down with an attended block (its state in *state: 1 partially,
// 2 fully covered); a value < n_block_min when the range ends; kFwdScanMore otherwise.
struct FwdScanResolve {
  const int& lk_tile;
  const int& tiles_per_scan;
  const int& n_block_min;

  __device__ int operator()(int n_top, uint32_t look, int* state) const {
    const uint32_t on = __ballot_sync(0xffffffffu, look & 1u);
    const uint32_t real = __ballot_sync(0xffffffffu, (look >> 1) & 1u);
    const uint32_t tile_mask = lk_tile >= 32 ? 0xffffffffu : (1u << lk_tile) - 1u;
    for (int k = 0; k < tiles_per_scan; ++k) {
      const int n = n_top - k;
      if (n < n_block_min) return n;
      const uint32_t m = tile_mask << (k * lk_tile);
      if (on & m) {
        *state = (on & m) == (real & m) ? 2 : 1;
        return n;
      }
    }
    return kFwdScanMore;
  }
};

// Tiles needing more than 32 lookups: one tile at a time. 0: nothing attended, 1, 2 as above.
template <int kBlockN>
struct FwdTileState {
  const int& len_k;
  const uint32_t& lay_bk;
  const int& n_rb;
  const int& lane;
  const uint8_t* const& layout_h;
  const int& rb0;
  const AttnParams& p;

  __device__ int operator()(int n) const {
    const uint32_t c_first = static_cast<uint32_t>(n) * kBlockN;
    const uint32_t c_last = static_cast<uint32_t>(min(n * kBlockN + kBlockN, len_k) - 1);
    const int cb0 = static_cast<int>(c_first / lay_bk);
    const int n_cb = static_cast<int>(c_last / lay_bk) - cb0 + 1;
    const int total = n_rb * n_cb;
    bool any = false, all = true;
    for (int idx = lane; idx < total; idx += 32) {
      const int r = idx / n_cb, c = idx - r * n_cb;
      const bool on = layout_h[static_cast<int64_t>(rb0 + r) * p.n_col_blocks + cb0 + c] != 0;
      any |= on;
      all &= on;
    }
    any = __any_sync(0xffffffffu, any);
    all = __all_sync(0xffffffffu, all);
    return all ? 2 : (any ? 1 : 0);
  }
};

// Largest attended tile index <= n (or a value < n_block_min), its state in *state.
template <int kBlockN>
struct FwdPrevActive {
  const uint8_t* const& layout;
  const int& tiles_per_scan;
  const int& n_block_min;
  const FwdScanResolve& scan_resolve;
  const FwdScanIssue<kBlockN>& scan_issue;
  const FwdTileState<kBlockN>& tile_state;

  __device__ int operator()(int n, int* state) const {
    *state = 2;
    if (layout == nullptr) return n;
    if (tiles_per_scan > 0) {
      for (; n >= n_block_min; n -= tiles_per_scan) {
        const int r = scan_resolve(n, scan_issue(n), state);
        if (r != kFwdScanMore) return r;
      }
      return n;
    }
    for (; n >= n_block_min; --n) {
      const int st = tile_state(n);
      if (st != 0) {
        *state = st;
        return n;
      }
    }
    return n;
  }
};

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

}  // namespace fa2
}  // namespace flashattn
