// The block-sparse tile scan of the FA2-design forward kernel: which KV tiles of a q block a
// layout attends, looked up warp-uniformly (every warp computes it itself). Each step is a
// function object holding references to the kernel's per-CTA values (set up in
// fwd_kernel), the same references the kernel's lambdas held before, in the same order.
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

}  // namespace fa2
}  // namespace flashattn
