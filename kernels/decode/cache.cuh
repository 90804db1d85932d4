// What the decode kernels read about one sequence of a KV-cache run (kernels/decode): its
// used length, cache row and whether its device-side values are in range, the address of a
// cache key through the block table, and the rotary embedding of one pair of dims. Values
// that live in device memory (used lengths, cache rows, block-table entries) are checked
// here, in the kernels, so a bad value never makes a kernel read or write outside the
// buffers the plan describes.
#pragma once
#include <stdint.h>

#include "common/params.h"
#include "fa2/mma.cuh"
#include "flashattn.h"

namespace flashattn {
namespace decode {

// Element conversions of the fa2 kernels (one definition for every family).
template <typename T>
__device__ __forceinline__ float to_float(T x) {
  return fa2::ElemTraits<T>::to_float(x);
}
template <typename T>
__device__ __forceinline__ T from_float(float x) {
  return fa2::ElemTraits<T>::from_float(x);
}

// One sequence: n keys attended (used + seqlen_new), its contiguous cache row, and ok
// when the used length, the cache row and every rotary position are in range.
struct Sequence {
  int64_t used, n, row;
  bool ok;
};

__device__ __forceinline__ Sequence sequence(const AttnParams& p, int64_t b) {
  Sequence s;
  s.used = p.kv_seqused[b];
  s.n = s.used + p.kv_seqlen_new;
  s.ok = s.used >= 0 && s.n <= p.seqlen_k;
  s.row = b;
  if (p.kv_block_table == nullptr) {
    s.row = p.kv_batch_idx != nullptr ? p.kv_batch_idx[b] : b;
    s.ok = s.ok && s.row >= 0 && s.row < p.kv_num_rows;
  }
  if (p.rotary != 0) {
    const int64_t last_k = p.kv_seqlen_new - 1, last_q = p.has_band ? p.seqlen_q - 1 : 0;
    s.ok = s.ok && s.used + (last_k > last_q ? last_k : last_q) < p.rotary_rows;
  }
  return s;
}

// Where key j of a sequence lives: cache row (contiguous: the sequence's row; paged: the
// block-table entry of its page) and slot in it; row -1 when the page entry is outside
// the pool. Positions are below 2^31 (decode_check), so the page arithmetic is 32-bit.
struct KeySlot {
  int64_t row, slot;
};

__device__ __forceinline__ KeySlot key_slot(const AttnParams& p, const Sequence& s, int64_t b, int64_t j) {
  if (p.kv_block_table == nullptr) return {s.row, j};
  const int32_t ps = static_cast<int32_t>(p.kv_page_size), jj = static_cast<int32_t>(j);
  const int32_t lp = jj / ps;
  const int64_t row = p.kv_block_table[b * p.kv_max_pages + lp];
  if (row < 0 || row >= p.kv_num_rows) return {-1, 0};
  return {row, jj - lp * ps};
}

// The Sm90a producer warp's window on the block-table entries of one split's pages
// (kernels/decode/decode_kernel.cuh, paged_tile): lane l holds the entry of page first + l
// (cur) and of page first + 32 + l (nxt). Each 32 pages are one coalesced 128-byte read,
// issued a window ahead of their use (32 pages: 8 tiles with pages of 16 keys), so no
// tile waits on a table read. Pages at or past `end` (past the split's keys) are not
// read: the entries read are those key_slot reads for the split's tiles.
struct PageWindow {
  const int32_t* table;  // the sequence's row of the block table
  int32_t first, end;
  int32_t cur, nxt;

  __device__ __forceinline__ int32_t read(int32_t page) const { return page < end ? table[page] : 0; }
  // The next window's entries become the current ones, and the window after it is read.
  __device__ __forceinline__ void advance() {
    first += 32;
    cur = nxt;
    nxt = read(first + 32 + static_cast<int32_t>(threadIdx.x % 32));
  }
};

// The window of keys [k0, k1) of sequence b, at its first page (each lane: two reads).
__device__ __forceinline__ PageWindow page_window(const AttnParams& p, int64_t b, int64_t k0, int64_t k1) {
  const int64_t ps = p.kv_page_size;
  const int32_t lane = static_cast<int32_t>(threadIdx.x % 32);
  PageWindow w;
  w.table = p.kv_block_table + b * p.kv_max_pages;
  w.first = k1 > k0 ? static_cast<int32_t>(k0 / ps) : 0;
  w.end = k1 > k0 ? static_cast<int32_t>((k1 + ps - 1) / ps) : 0;
  w.cur = w.read(w.first + lane);
  w.nxt = w.read(w.first + 32 + lane);
  return w;
}

// Element offsets of key j (of kv head hk) in the K and V caches; both -1 when the
// block-table entry of its page is outside the pool.
struct KeyOffsets {
  int64_t k, v;
};

__device__ __forceinline__ KeyOffsets key_offsets(const AttnParams& p, const Sequence& s, int64_t b, int64_t hk,
                                                  int64_t j) {
  const KeySlot ks = key_slot(p, s, b, j);
  if (ks.row < 0) return {-1, -1};
  return {ks.row * p.k_stride.b + ks.slot * p.k_stride.s + hk * p.k_stride.h,
          ks.row * p.v_stride.b + ks.slot * p.v_stride.s + hk * p.v_stride.h};
}

// The dims (a, b) of rotary pair k: (2k, 2k+1) interleaved, (k, k + rotary_dim/2) half-split.
__device__ __forceinline__ void rotary_dims(const AttnParams& p, int64_t k, int64_t* a, int64_t* b) {
  const bool interleaved = p.rotary == FLASHATTN_ROTARY_INTERLEAVED;
  *a = interleaved ? 2 * k : k;
  *b = interleaved ? 2 * k + 1 : k + p.rotary_dim / 2;
}

// Rotates the pair (xa, xb) of pair k at position pos in fp32 (no contraction, as the CPU
// backend computes it) and rounds both to T.
template <typename T>
__device__ __forceinline__ void rotate_pair(const AttnParams& p, int64_t pos, int64_t k, float* xa, float* xb) {
  const int64_t half = p.rotary_dim / 2;
  const float c = to_float(static_cast<const T*>(p.rotary_cos)[pos * half + k]);
  const float sn = to_float(static_cast<const T*>(p.rotary_sin)[pos * half + k]);
  const float a = __fsub_rn(__fmul_rn(*xa, c), __fmul_rn(*xb, sn));
  const float b = __fadd_rn(__fmul_rn(*xb, c), __fmul_rn(*xa, sn));
  *xa = to_float(from_float<T>(a));
  *xb = to_float(from_float<T>(b));
}

}  // namespace decode
}  // namespace flashattn
