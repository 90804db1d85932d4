// Split-KV decode attention of a KV-cache run (flashattn_fwd_kvcache): a few query tokens
// per sequence against a contiguous or paged cache, after the append (append_kernel.cuh).
//
// GQA packing: one CTA takes the query heads that share a KV head times the query tokens
// (row r = token i * group + head g, kRows rows per CTA), so each K/V tile is read
// once per KV head. Split-KV: the CTA's keys (the sequence's n keys, narrowed to the band
// of its rows) are cut into `splits` ranges of whole tiles; split s writes fp32 O and LSE
// to the workspace parts (then combine merges them), or, with one split, O in the dtype
// and LSE directly. Sm90a, where the host launches the splits of a row chunk as one
// cluster (the Cluster instances): each split leaves its part in its shared memory and
// the cluster merges them (cluster_merge), with the combine's arithmetic, so the bits are
// the same.
//
// Memory: tiles of kTileK keys go into a shared-memory ring of kStages tiles (two where
// shared memory is smaller), so tiles are in flight while one is computed; one barrier per
// tile. Two architecture policies (fa2/arch.h), chosen by the host (src/cuda/decode.cu):
// - Sm80: the 128 threads gather each tile row by row through the block table (any page
//   size, NHD or HND through strides) with 16-byte cp.async into rows padded by 16 bytes;
//   `vec` is false when a dim, pointer or stride (of a dim of extent above 1) is not a
//   multiple of 16 bytes, and rows are then loaded element by element.
// - Sm90a: one thread issues the tile as copy-engine boxes of 64 dims x box_rows keys
//   (tensor maps of the K and V caches, BulkMaps: one per page of 16 or 32 keys; for a
//   contiguous cache or pages of a multiple of 64 keys four boxes of 16 keys per 64 dims
//   where a producer warp issues, else one) into rows in the 128-byte swizzle, completing
//   on the stage's full mbarrier; the other threads issue only math. At head dims 128 and
//   256 that thread is lane 0 of a fifth warp, the producer (kProducer): it refills a stage
//   once all 128 compute threads have arrived on the stage's empty mbarrier, so the refill
//   is off the compute warps' path and they share no per-tile barrier; the warp reads a
//   paged cache's block table 32 pages at a time, a window ahead of the tiles (PageWindow,
//   paged_tile). At head dim 64 thread 0 refills after each tile's CTA barrier: four CTAs
//   per SM hide that, and a fifth warp's registers would cost one.
//
// Compute, on tensor cores (mma.sync m16n8k16, fp32 accumulation, as the fa2 kernels):
// the CTA's 16 query rows are the M of every product, so GQA groups and several query
// tokens share each K/V element read. The four warps split each tile's keys and run
// independent online softmaxes (flash-decoding inside the CTA), merged once at the end.
// P is rounded to the dtype for P V, as in the flash kernels. Device values out of range
// (kernels/decode/cache.cuh) give NaN rows.
#pragma once
#include <math.h>

#include <type_traits>

#include "combine/combine_element.cuh"
#include "common/mask.h"
#include "common/tensor_map.h"
#include "decode/cache.cuh"
#include "fa2/arch.h"
#include "hopper/tma.cuh"
#include "hopper/warpgroup.cuh"

namespace flashattn {
namespace decode {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16;  // query rows per CTA: the M of the mma

// Tiles of kTileK keys (K and V: 18, 35 and 68 KiB with the Sm80 padding at head dims 64,
// 128 and 256; 16, 32 and 64 KiB unpadded), kWarpKeys of them per warp.
constexpr int kTileK = 64;
constexpr int kWarpKeys = kTileK / kWarps;  // 16: one k16 step of P V

// Sm80: the kernel is bound by instruction latency (each warp waits on dependent math for
// every 16 keys), so resident warps matter more than ring depth: at head dim 64 a ring of
// two stages (39 KiB) lets four CTAs share an SM, registers budgeted for them by
// __launch_bounds__ (kMinBlocks); above, three stages and two CTAs (one at d=256, by
// shared memory). Sm90a: unpadded rows make three stages at d=64 51.5 KiB, four CTAs still.
// docs/internals/kernels-decode.md has the measurements.
template <typename Arch, int D>
constexpr int kStages = Arch::kSm90 || D > 64 ? 3 : 2;
template <typename Arch, int D>
constexpr int kMinBlocks = D <= 64 ? 4 : 2;

// Sm90a at head dims 128 and 256: warp kWarps (threads kThreads .. kThreads + 31) is the
// producer, which issues every tile; the kThreads compute threads (every loop over them
// strides by kThreads) compute. Its registers are the kernel's (setmaxnreg takes whole
// warpgroups): at d=128 two CTAs of 160 threads at 150 registers still fit an SM's 64k,
// while at d=64 four CTAs would cap them at 102 against the 116 used. At d=256, 160 x 2
// would cap them at 204 against 239: __launch_bounds__ budgets one CTA there, which is
// all that shared memory holds anyway (the host's count stays kMinBlocks).
template <typename Arch, int D>
constexpr bool kProducer = Arch::kSm90&& D >= 128;
template <typename Arch, int D>
constexpr int kBlockThreads = kProducer<Arch, D> ? kThreads + 32 : kThreads;
template <typename Arch, int D>
constexpr int kBoundsMinBlocks = kProducer<Arch, D>&& D > 128 ? 1 : kMinBlocks<Arch, D>;
// With a producer, the barrier of the compute threads alone (load_query, merge_store):
// __syncthreads would also wait for the producer, which may be waiting for them on an
// empty mbarrier. Id 0 is __syncthreads; no other barrier of this kernel uses 1.
constexpr int kBarCompute = 1;
template <typename Arch, int D>
__device__ __forceinline__ void compute_sync() {
  if constexpr (kProducer<Arch, D>) hopper::bar_sync(kBarCompute, kThreads);
  else __syncthreads();
}

// The Sm90a kernel's tensor maps of the K and V caches: 4-D (dims, keys of a row or page,
// kv heads, rows or pages), boxes of 64 dims x box_rows keys in the 128-byte swizzle,
// dims past the head dim and keys past the row zero-filled (src/cuda/tensor_map.hpp).
struct BulkMaps {
  TensorMap128 k, v;
  int box_rows;  // the page size (16, 32) when pages are smaller than 64 keys, else 64 or 16
};
constexpr int kMaxBoxes = kTileK / 16;  // boxes of a tile (pages of 16 keys)
struct NoMaps {};
template <typename Arch>
using MapsOf = std::conditional_t<Arch::kSm90, BulkMaps, NoMaps>;

// Shared memory of a CTA for padded head dim D, element type T and a ring of Stages tiles
// (kStages, or 2 where the device's shared memory is smaller). A stage holds kTileK key
// rows so that ldmatrix of eight consecutive rows is free of bank conflicts: Sm80, rows
// padded by 16 bytes; Sm90a, D / 64 blocks of kTileK rows x 64 dims (128 bytes), chunk c
// (16 bytes) of row r at c ^ (r % 8), as the copy engine's 128-byte swizzle writes it (the
// ring then starts 1024-byte aligned: kvAlign). The K/V ring is reused for the cross-warp
// merge once the last tile is done.
template <typename Arch, typename T, int D, int Stages>
struct SmemBase {
  static_assert(sizeof(T) == 2, "fp16 and bf16 rows: 64 dims are 128 bytes");
  static constexpr int kStride = Arch::kSm90 ? D : D + 8;  // elements per key row of a stage
  struct Ring {
    T k[Stages][kTileK * kStride];
    T v[Stages][kTileK * kStride];
  };
  struct Merge {
    float acc[kWarps][kRows][D];
    float m[kWarps][kRows], l[kWarps][kRows];
    int64_t row[kRows], o_off[kRows];       // each row's index in LSE and parts, and its offset in O
    float part[kRows][D], part_lse[kRows];  // this split's part, where the cluster merges the splits
  };
  static_assert(sizeof(Merge) <= sizeof(Ring), "the merge scratch must fit in the K/V ring");
  union {
    Ring ring;
    Merge merge;
  } u;
  alignas(16) T q[kRows][D + 8];  // query rows (rotated), zero past head_dim_qk and nr
  int64_t ip[kRows];              // aligned query position of each row
  int64_t q_off[kRows];           // offset of each row in q, -1 past nr
  float slope[kRows];
  int bad;
};
template <typename Arch, typename T, int D, int Stages, bool Bulk = Arch::kSm90, bool Producer = kProducer<Arch, D>>
struct Smem : SmemBase<Arch, T, D, Stages> {};
template <typename Arch, typename T, int D, int Stages>
struct Smem<Arch, T, D, Stages, true, false> : SmemBase<Arch, T, D, Stages> {
  uint64_t full[Stages];  // mbarrier of each stage: its tile has landed
};
template <typename Arch, typename T, int D, int Stages>
struct Smem<Arch, T, D, Stages, true, true> : SmemBase<Arch, T, D, Stages> {
  uint64_t full[Stages];   // mbarrier of each stage: its tile has landed (the producer arms it)
  uint64_t empty[Stages];  // mbarrier of each stage: every compute thread is done with its tile
};

// Alignment of the ring (the start of Smem) and the dynamic shared memory a launch needs:
// the copy engine's 128-byte swizzle repeats every 1024 bytes, and the kernel rounds its
// dynamic shared memory up to the next 1024-byte boundary.
template <typename Arch>
constexpr unsigned kvAlign = Arch::kSm90 ? 1024 : 16;
template <typename Arch, typename T, int D, int Stages>
constexpr size_t smem_size() {
  return sizeof(Smem<Arch, T, D, Stages>) + (kvAlign<Arch> > 16 ? kvAlign<Arch> : 0);
}

// Byte offset in a stage of the 16 bytes of dims [col, col + 8) of key row `row`.
template <typename Arch, int D>
__device__ __forceinline__ uint32_t kv_offset(int row, int col) {  // 2-byte elements (SmemBase)
  if constexpr (Arch::kSm90)
    return static_cast<uint32_t>((col / 64) * (kTileK * 128) + row * 128 + (((col % 64) / 8) ^ (row % 8)) * 16);
  else return static_cast<uint32_t>((row * (D + 8) + col) * 2);
}

// Outputs of one split: fp32 parts [splits, batch, heads_q, seqlen_q, (head_dim_v)].
struct Parts {
  float* o;
  float* lse;
};

// tanh(x) within about 1e-6 absolute. The library is built with --use_fast_math, under
// which tanhf is tanh.approx.f32 (relative error 2^-11, an fp16 rounding of every
// softcapped score); softmax is shift-invariant, so the score's absolute error is what
// reaches O.
__device__ __forceinline__ float tanh_fp32(float x) { return 1.f - 2.f / (__expf(2.f * x) + 1.f); }

// One 8-element chunk of a cache row into shared memory: 16-byte cp.async when vec, else
// element by element with zeros past dim; zeros when off < 0 (no row).
template <typename T>
__device__ __forceinline__ void load_chunk(const T* base, int64_t off, int d0, int64_t dim, bool vec, T* out) {
  if (off < 0) {
    *reinterpret_cast<uint4*>(out) = make_uint4(0, 0, 0, 0);
  } else if (vec) {
    fa2::cp_async_16(fa2::smem_u32(out), base + off + d0, true);
  } else {
    for (int e = 0; e < 8; ++e) out[e] = d0 + e < dim ? base[off + d0 + e] : from_float<T>(0.f);
  }
}

// Gathers the K and V rows of keys [t0, t0 + kTileK) into stage st; rows at or past k1
// are zero. A page entry outside the pool sets sm.bad (its rows zero). Eight consecutive
// threads copy one key's row, 16 bytes each per step: every warp instruction reads whole
// 128-byte lines of four rows.
template <typename Arch, typename T, int D, int Stages>
__device__ __forceinline__ void load_tile(const AttnParams& p, const Sequence& s, int64_t b, int64_t hk, int64_t t0,
                                          int64_t k1, bool vec, Smem<Arch, T, D, Stages>& sm, int st) {
  constexpr int kStride = Smem<Arch, T, D, Stages>::kStride;
  constexpr int kPerKey = 8, kKeysPerPass = kThreads / kPerKey;
  const int part = static_cast<int>(threadIdx.x) % kPerKey;
  const int ck = static_cast<int>((p.head_dim_qk + 7) / 8), cv = static_cast<int>((p.head_dim_v + 7) / 8);
  const T* kb = static_cast<const T*>(p.k);
  const T* vb = static_cast<const T*>(p.v);
#pragma unroll
  for (int pass = 0; pass < kTileK / kKeysPerPass; ++pass) {
    const int jj = pass * kKeysPerPass + static_cast<int>(threadIdx.x) / kPerKey;
    const int64_t j = t0 + jj;
    const KeyOffsets off = j < k1 ? key_offsets(p, s, b, hk, j) : KeyOffsets{-1, -1};
    if (j < k1 && off.k < 0) sm.bad = 1;
    if (vec && off.k >= 0) {  // the common case: straight 16-byte copies, a fixed trip count
#pragma unroll
      for (int i = 0; i < D / 8 / kPerKey; ++i) {
        const int c = part + i * kPerKey;
        if (c < ck) fa2::cp_async_16(fa2::smem_u32(&sm.u.ring.k[st][jj * kStride + c * 8]), kb + off.k + c * 8, true);
        if (c < cv) fa2::cp_async_16(fa2::smem_u32(&sm.u.ring.v[st][jj * kStride + c * 8]), vb + off.v + c * 8, true);
      }
      continue;
    }
    for (int c = part; c < ck; c += kPerKey)
      load_chunk(kb, off.k, c * 8, p.head_dim_qk, vec, &sm.u.ring.k[st][jj * kStride + c * 8]);
    for (int c = part; c < cv; c += kPerKey)
      load_chunk(vb, off.v, c * 8, p.head_dim_v, vec, &sm.u.ring.v[st][jj * kStride + c * 8]);
  }
}

// Sm90a, one thread: the boxes of keys [t0, t0 + kTileK) into stage st, completing on
// sm.full[st] (armed here with the bytes of the boxes issued). Tiles start at multiples of
// box_rows (the host's condition), so a box never crosses a page. A box whose first key is
// at or past k1 is not issued (its V rows are zeroed by the warps: zero_v_tail); a page
// entry outside the pool sets sm.bad and its box is not issued. Column blocks wholly past
// a head dim are not issued either (the kernel zeroed them once).
template <typename Arch, typename T, int D, int Stages>
__device__ __forceinline__ void bulk_tile(const AttnParams& p, const Sequence& s, int64_t b, int64_t hk, int64_t t0,
                                          int64_t k1, const BulkMaps& maps, Smem<Arch, T, D, Stages>& sm, int st) {
  constexpr int kBlockBytes = kTileK * 128;
  const int box = maps.box_rows;
  const int ck = static_cast<int>((p.head_dim_qk + 63) / 64), cv = static_cast<int>((p.head_dim_v + 63) / 64);
  KeySlot at[kMaxBoxes];
  uint32_t bytes = 0;
#pragma unroll
  for (int i = 0; i < kMaxBoxes; ++i) {
    const int64_t j = t0 + i * box;
    at[i] = KeySlot{-1, 0};
    if (i * box >= kTileK || j >= k1) continue;
    at[i] = key_slot(p, s, b, j);
    if (at[i].row < 0) sm.bad = 1;
    else bytes += static_cast<uint32_t>((ck + cv) * box * 128);
  }
  const uint32_t bar = fa2::smem_u32(&sm.full[st]);
  hopper::mbar_expect(bar, bytes);
  const uint32_t k0 = fa2::smem_u32(sm.u.ring.k[st]), v0 = fa2::smem_u32(sm.u.ring.v[st]);
#pragma unroll
  for (int i = 0; i < kMaxBoxes; ++i) {
    if (at[i].row < 0) continue;
    const int slot = static_cast<int>(at[i].slot), row = static_cast<int>(at[i].row), h = static_cast<int>(hk);
    const uint32_t dst = static_cast<uint32_t>(i * box * 128);
#pragma unroll
    for (int c = 0; c < D / 64; ++c) {
      if (c < ck) hopper::tma_load(k0 + c * kBlockBytes + dst, &maps.k, c * 64, slot, h, row, bar);
      if (c < cv) hopper::tma_load(v0 + c * kBlockBytes + dst, &maps.v, c * 64, slot, h, row, bar);
    }
  }
}

// The producer warp's lane 0, paged cache: the boxes of keys [t0, t0 + kTileK) into stage
// st from the slots of the tile's boxes (box i: keys t0 + i x box_rows ..; row -1: not
// issued), completing on sm.full[st], armed here with the bytes of the boxes issued; as
// bulk_tile's second half, which keeps its own copy (sharing this one changed the d = 64
// kernel's register allocation, whose machine code is main's).
template <typename Arch, typename T, int D, int Stages>
__device__ __forceinline__ void issue_boxes(const AttnParams& p, int64_t hk, const BulkMaps& maps,
                                            const KeySlot (&at)[kMaxBoxes], Smem<Arch, T, D, Stages>& sm, int st) {
  constexpr int kBlockBytes = kTileK * 128;
  const int box = maps.box_rows;
  const int ck = static_cast<int>((p.head_dim_qk + 63) / 64), cv = static_cast<int>((p.head_dim_v + 63) / 64);
  uint32_t bytes = 0;
#pragma unroll
  for (int i = 0; i < kMaxBoxes; ++i)
    if (at[i].row >= 0) bytes += static_cast<uint32_t>((ck + cv) * box * 128);
  const uint32_t bar = fa2::smem_u32(&sm.full[st]);
  hopper::mbar_expect(bar, bytes);
  const uint32_t k0 = fa2::smem_u32(sm.u.ring.k[st]), v0 = fa2::smem_u32(sm.u.ring.v[st]);
#pragma unroll
  for (int i = 0; i < kMaxBoxes; ++i) {
    if (at[i].row < 0) continue;
    const int slot = static_cast<int>(at[i].slot), row = static_cast<int>(at[i].row), h = static_cast<int>(hk);
    const uint32_t dst = static_cast<uint32_t>(i * box * 128);
#pragma unroll
    for (int c = 0; c < D / 64; ++c) {
      if (c < ck) hopper::tma_load(k0 + c * kBlockBytes + dst, &maps.k, c * 64, slot, h, row, bar);
      if (c < cv) hopper::tma_load(v0 + c * kBlockBytes + dst, &maps.v, c * 64, slot, h, row, bar);
    }
  }
}

// The producer warp, paged cache: the tile of keys [t0, t0 + kTileK) into stage st
// (issue_boxes), its boxes' entries taken from the warp's window of the block table
// (PageWindow: read a window ahead, so no table read is on the tile's path). A tile's
// pages lie in one window: a tile starts at a multiple of 64 keys, so with pages of 16 or
// 32 its first page is a multiple of 4 or 2 past the split's first, and with pages of 64
// keys or more it has one page. Box i holds keys t0 + i x box_rows on: with pages of 16 or
// 32 keys (a box a page) page i past the tile's first, from its key 0; with pages of 64
// or more (boxes of 16 or 64 keys) the tile's page, from its key slot + i x box_rows.
// Every lane tests its entry against the pool, and the ballot marks those outside; lane 0
// sets sm.bad for one among the tile's before its mbar_expect, whose release the compute
// warps' waits acquire (they read sm.bad after their last wait), and issues the boxes.
template <typename Arch, typename T, int D, int Stages>
__device__ __forceinline__ void paged_tile(const AttnParams& p, int64_t hk, int64_t t0, int64_t k1,
                                           const BulkMaps& maps, PageWindow& win, Smem<Arch, T, D, Stages>& sm,
                                           int st) {
  const int32_t ps = static_cast<int32_t>(p.kv_page_size), j0 = static_cast<int32_t>(t0);
  const int32_t page = j0 / ps, slot = j0 - page * ps;
  if (page - win.first >= 32) win.advance();  // a tile moves on by at most 4 pages: one window
  const int lane = static_cast<int>(threadIdx.x % 32), rel = page - win.first;
  const unsigned outside =
      __ballot_sync(0xffffffffu, win.first + lane < win.end && (win.cur < 0 || win.cur >= p.kv_num_rows));
  const int box = maps.box_rows;
  const bool within = box < ps;  // a tile's boxes lie in one page, else a box is a page
  KeySlot at[kMaxBoxes];
  bool bad = false;
#pragma unroll
  for (int i = 0; i < kMaxBoxes; ++i) {
    const int32_t pi = within ? 0 : i;  // box i: page + pi, or unused
    const int32_t row = __shfl_sync(0xffffffffu, win.cur, (rel + pi) & 31);
    at[i] = KeySlot{-1, 0};
    if (i * box >= kTileK || t0 + i * box >= k1) continue;
    if ((outside >> (rel + pi)) & 1u) bad = true;
    else at[i] = KeySlot{row, within ? slot + i * box : slot};
  }
  if (lane == 0) {
    if (bad) sm.bad = 1;
    issue_boxes<Arch, T, D, Stages>(p, hk, maps, at, sm, st);
  }
}

// Sm90a, one warp after its tile landed: zeros in its V rows of keys at or past k1 (rows
// of boxes not issued, or keys past the used length: stale or unwritten cache slots), so
// that P = 0 there adds exact zeros. Only the CTA's last tile has such keys, and no copy
// refills its stage afterwards.
template <typename Arch, typename T, int D, int Stages>
__device__ __forceinline__ void zero_v_tail(Smem<Arch, T, D, Stages>& sm, int st, int64_t j0, int64_t k1) {
  const int lane = threadIdx.x % 32, key0 = threadIdx.x / 32 * kWarpKeys;
  unsigned char* v = reinterpret_cast<unsigned char*>(sm.u.ring.v[st]);
  for (int e = lane; e < kWarpKeys * (D / 8); e += 32) {
    const int r = e / (D / 8), col = e % (D / 8) * 8;
    if (j0 + r >= k1) *reinterpret_cast<uint4*>(v + kv_offset<Arch, D>(key0 + r, col)) = make_uint4(0, 0, 0, 0);
  }
  __syncwarp();
}

// Zeros in the dims of every row of every stage of one ring (K or V) that no tile copy
// writes for head dim `dim`: past the last 8-dim chunk of the gather (Sm80), past the last
// 64-dim column block of the boxes (Sm90a: the engine zero-fills a block partly past dim).
template <typename Arch, typename T, int D, int Stages>
__device__ __forceinline__ void zero_uncopied_cols(T (&ring)[Stages][kTileK * Smem<Arch, T, D, Stages>::kStride],
                                                   int64_t dim) {
  constexpr int kChunks = D / 8;  // 16-byte chunks of a row
  const int first = static_cast<int>(Arch::kSm90 ? (dim + 63) / 64 * 8 : (dim + 7) / 8);
  const int n = kChunks - first;
  for (int e = threadIdx.x; e < Stages * kTileK * n; e += kThreads) {
    const int st = e / (kTileK * n), r = e / n % kTileK, c = first + e % n;
    unsigned char* stage = reinterpret_cast<unsigned char*>(ring[st]);
    *reinterpret_cast<uint4*>(stage + kv_offset<Arch, D>(r, c * 8)) = make_uint4(0, 0, 0, 0);
  }
}

// Keys [k0, k1) of one split: the rows' band within [0, n) (query rows i_first..i_last,
// aligned by shift), cut into `splits` ranges of whole tiles.
struct KeyRange {
  int64_t k0, k1;
};

__device__ __forceinline__ KeyRange split_keys(const AttnParams& p, const Sequence& s, int64_t i_first, int64_t i_last,
                                               int64_t shift, int split, int splits) {
  int64_t lo = 0, hi = s.ok ? s.n : 0;
  if (p.has_band && p.window_right >= 0 && p.window_right < hi) {
    const int64_t h = i_last + shift + p.window_right + 1;
    hi = h < hi ? (h > 0 ? h : 0) : hi;
  }
  if (p.has_band && p.window_left >= 0 && p.window_left < s.n) {
    const int64_t l = i_first + shift - p.window_left;
    lo = l > lo ? l : lo;
  }
  const int64_t len = hi > lo ? hi - lo : 0;
  const int64_t per = ((len + splits - 1) / splits + kTileK - 1) / kTileK * kTileK;
  const int64_t k0 = lo + split * per;
  return {k0, k0 + per < hi ? k0 + per : hi};
}

// The CTA's query rows into shared memory (zero past nr and head_dim_qk), rotated and
// rounded to T at the used length (+ i under a band mask), with each row's aligned
// position and ALiBi slope. The row offsets come first (one division per row, not per
// element), then every thread issues all its loads before its first store, so the query
// costs one round trip rather than one per element. Ends with a barrier of the compute
// threads.
template <typename Arch, typename T, int D, int Stages>
__device__ void load_query(const AttnParams& p, const Sequence& s, int64_t b, int64_t hk, int64_t r0, int nr,
                           int64_t group, int64_t shift, Smem<Arch, T, D, Stages>& sm) {
  if (threadIdx.x < kRows) {
    const int64_t rr = r0 + threadIdx.x, i = rr / group, h = hk * group + rr % group;
    sm.ip[threadIdx.x] = i + shift;
    sm.slope[threadIdx.x] = alibi_slope(p, b, h);  // 0 without ALiBi
    sm.q_off[threadIdx.x] =
        static_cast<int>(threadIdx.x) < nr ? b * p.q_stride.b + i * p.q_stride.s + h * p.q_stride.h : -1;
  }
  compute_sync<Arch, D>();
  constexpr int kPerThread = kRows * D / kThreads;
  const T* q = static_cast<const T*>(p.q);
  T x[kPerThread];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int e = k * kThreads + static_cast<int>(threadIdx.x), r = e / D, d = e % D;
    const int64_t off = sm.q_off[r];
    x[k] = off >= 0 && d < p.head_dim_qk ? q[off + d] : from_float<T>(0.f);
  }
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int e = k * kThreads + static_cast<int>(threadIdx.x);
    sm.q[e / D][e % D] = x[k];
  }
  compute_sync<Arch, D>();
  if (p.rotary != 0 && s.ok) {
    const int64_t half = p.rotary_dim / 2;
    for (int64_t e = threadIdx.x; e < nr * half; e += kThreads) {
      const int r = static_cast<int>(e / half);
      const int64_t k = e % half, i = (r0 + r) / group;
      int64_t da, db;
      rotary_dims(p, k, &da, &db);
      float xa = to_float(sm.q[r][da]), xb = to_float(sm.q[r][db]);
      rotate_pair<T>(p, s.used + (p.has_band ? i : 0), k, &xa, &xb);
      sm.q[r][da] = from_float<T>(xa);
      sm.q[r][db] = from_float<T>(xb);
    }
  }
  compute_sync<Arch, D>();
}

// One warp's online softmax over its keys of every tile, in mma fragments (g = lane / 4,
// t = lane % 4): O (16 rows x D) as D/8 m16n8 accumulators, and the running max and sum of
// rows g and g + 8 (index h = 0, 1), the same in the four lanes of a quad; ip and slope of
// those rows.
template <int D>
struct WarpState {
  float o[D / 8][4];
  float m[2], l[2];
  int64_t ip[2];
  float slope[2];
};

using ScoreFrag = float[kWarpKeys / 8][4];
using ProbFrag = uint32_t[kWarpKeys / 16][4];

// S = Q K^T for the warp's keys of stage st (kWarpKeys / 8 m16n8 tiles).
template <typename Arch, typename T, int D, int Stages>
__device__ __forceinline__ void warp_qk(const Smem<Arch, T, D, Stages>& sm, int st, ScoreFrag& s) {
  const int lane = threadIdx.x % 32, key0 = threadIdx.x / 32 * kWarpKeys;
  const int q_row = lane % 8 + 8 * (lane / 8 % 2), q_col = 8 * (lane / 16);
  const int k_row = lane % 8 + 8 * (lane / 16), k_col = 8 * (lane / 8 % 2);
  const uint32_t ks0 = fa2::smem_u32(sm.u.ring.k[st]);
#pragma unroll
  for (int nt = 0; nt < kWarpKeys / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t a[4];
    fa2::ldmatrix_x4(a, fa2::smem_u32(&sm.q[q_row][ks * 16 + q_col]));
#pragma unroll
    for (int np = 0; np < kWarpKeys / 16; ++np) {  // two n8 tiles of keys per ldmatrix
      uint32_t b[4];
      fa2::ldmatrix_x4(b, ks0 + kv_offset<Arch, D>(key0 + np * 16 + k_row, ks * 16 + k_col));
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      fa2::mma16816<T>(s[2 * np], a, b0);
      fa2::mma16816<T>(s[2 * np + 1], a, b1);
    }
  }
}

// Score x (already scaled) of key j for row h of the lane with softcap, ALiBi and the
// masks (-inf past k1 or outside the band).
template <int D>
__device__ __forceinline__ float masked_score(const AttnParams& p, const WarpState<D>& ws, int h, int64_t j, int64_t k1,
                                              float x) {
  if (p.softcap > 0.f) x = p.softcap * tanh_fp32(x / p.softcap);
  x += alibi_bias(p, ws.slope[h], ws.ip[h], j);
  return j >= k1 || !band_keep(p, ws.ip[h], j) ? -INFINITY : x;
}

// Final scores of the warp's keys (first key j0; masked: -inf), the online-softmax update
// of m, l and O, and P rounded to T as the A fragments of P V.
template <typename T, int D>
__device__ __forceinline__ void warp_softmax(const AttnParams& p, int64_t j0, int64_t k1, ScoreFrag& s,
                                             WarpState<D>& ws, ProbFrag& pa) {
  const int t = threadIdx.x % 4;
  // Warp-uniform: no softcap, ALiBi or band mask, and every key of the warp in range.
  const bool plain = p.softcap <= 0.f && p.bias_kind != kBiasAlibi && p.bias_kind != kBiasAlibiSymmetric &&
                     !p.has_band && j0 + kWarpKeys <= k1;
  float alpha[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kWarpKeys / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float x = s[nt][2 * h + e] * p.scale;
        if (!plain) x = masked_score(p, ws, h, j0 + nt * 8 + 2 * t + e, k1, x);
        s[nt][2 * h + e] = x;
        mx = fmaxf(mx, x);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(ws.m[h], mx);
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < kWarpKeys / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float x = s[nt][2 * h + e];
        const float pj = x == -INFINITY ? 0.f : __expf(x - m_new);  // a NaN score stays NaN
        s[nt][2 * h + e] = pj;
        sum += pj;
      }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    alpha[h] = ws.m[h] == -INFINITY ? 0.f : __expf(ws.m[h] - m_new);
    ws.l[h] = ws.l[h] * alpha[h] + sum;
    ws.m[h] = m_new;
  }
  // Once the running maxima settle, most tiles leave them unchanged: skip the rescale then.
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      ws.o[dt][0] *= alpha[0];
      ws.o[dt][1] *= alpha[0];
      ws.o[dt][2] *= alpha[1];
      ws.o[dt][3] *= alpha[1];
    }
  }
#pragma unroll
  for (int kp = 0; kp < kWarpKeys / 16; ++kp) {
    pa[kp][0] = fa2::pack2<T>(s[2 * kp][0], s[2 * kp][1]);
    pa[kp][1] = fa2::pack2<T>(s[2 * kp][2], s[2 * kp][3]);
    pa[kp][2] = fa2::pack2<T>(s[2 * kp + 1][0], s[2 * kp + 1][1]);
    pa[kp][3] = fa2::pack2<T>(s[2 * kp + 1][2], s[2 * kp + 1][3]);
  }
}

// O += P V over the warp's keys of stage st (past k1 P is exactly 0 and the V rows are
// zeros, so those terms add exact zeros).
template <typename Arch, typename T, int D, int Stages>
__device__ __forceinline__ void warp_pv(const Smem<Arch, T, D, Stages>& sm, int st, const ProbFrag& pa,
                                        WarpState<D>& ws) {
  const int lane = threadIdx.x % 32, key0 = threadIdx.x / 32 * kWarpKeys;
  const int v_row = lane % 8 + 8 * (lane / 8 % 2), v_col = 8 * (lane / 16);
  const uint32_t vs0 = fa2::smem_u32(sm.u.ring.v[st]);
#pragma unroll
  for (int kp = 0; kp < kWarpKeys / 16; ++kp)
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {  // two n8 tiles of dims per ldmatrix
      uint32_t b[4];
      fa2::ldmatrix_x4_trans(b, vs0 + kv_offset<Arch, D>(key0 + kp * 16 + v_row, dp * 16 + v_col));
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      fa2::mma16816<T>(ws.o[2 * dp], pa[kp], b0);
      fa2::mma16816<T>(ws.o[2 * dp + 1], pa[kp], b1);
    }
}

// Sm90a clusters (the splits of one row chunk, src/cuda/decode.cu): a barrier of all the
// cluster's threads that orders the shared memory writes before it with the reads after
// it, and a float of CTA `rank`'s shared memory at the address of `local` in this CTA's.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ float ld_cluster(const float* local, unsigned rank) {
  uint32_t addr;
  float x;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(addr) : "r"(fa2::smem_u32(local)), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(x) : "r"(addr) : "memory");
  return x;
}

// Where the final O / LSE of one split go.
struct Dest {
  int64_t b, hk, r0, group, sq;
  int split, splits;
};

// The cluster's merge of its splits' parts (each in its CTA's mg.part and mg.part_lse):
// split s's CTA writes elements s x kThreads + thread, every splits x kThreads, of O and
// LSE, each through combine_element over the parts in split order, as the combine kernel
// reads them from the workspace. The barriers: every part is written before any is read,
// and no CTA exits while another reads its shared memory.
template <typename Arch, typename T, int D, int Stages>
__device__ void cluster_merge(const AttnParams& p, const Dest& dst, int nr, int64_t rows_total,
                              Smem<Arch, T, D, Stages>& sm) {
  auto& mg = sm.u.merge;
  cluster_sync();
  const int dv = static_cast<int>(p.head_dim_v);
  for (int e = dst.split * kThreads + static_cast<int>(threadIdx.x); e < nr * dv; e += dst.splits * kThreads) {
    const int r = e / dv, d = e % dv;
    float out, lse;
    combine::combine_element(
        dst.splits, [&](int64_t s) { return ld_cluster(&mg.part_lse[r], static_cast<unsigned>(s)); },
        [&](int64_t s) { return ld_cluster(&mg.part[r][d], static_cast<unsigned>(s)); }, &out, &lse);
    static_cast<T*>(p.o)[mg.o_off[r] + d] = from_float<T>(out);
    if (d == 0 && p.lse != nullptr) p.lse[mg.row[r] - dst.split * rows_total] = lse;
  }
  cluster_sync();
}

// Merges the warps' states and writes O = acc / l and LSE = m + log l (after the ring is
// drained): to O and LSE with one split, else as the split's part (to the workspace, or,
// in a cluster of the splits, to shared memory, then cluster_merge). As on the CPU, a row
// is empty (O = 0, LSE = -inf) iff l == 0 exactly; a NaN l (a NaN or +inf score) stays
// NaN, and bad device values give NaN.
template <typename Arch, typename T, int D, int Stages, bool Cluster>
__device__ void merge_store(const AttnParams& p, const Parts& parts, const Dest& dst, int nr,
                            Smem<Arch, T, D, Stages>& sm, const WarpState<D>& ws) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // (Sm90a: no copy is left in flight, every tile's mbarrier was waited on.)
  if constexpr (!Arch::kSm90) fa2::cp_async_wait<0>();
  compute_sync<Arch, D>();  // every warp is done with the ring
  auto& mg = sm.u.merge;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h;
    if (r >= nr) continue;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      mg.acc[warp][r][dt * 8 + 2 * t] = ws.o[dt][2 * h];
      mg.acc[warp][r][dt * 8 + 2 * t + 1] = ws.o[dt][2 * h + 1];
    }
    if (t == 0) {
      mg.m[warp][r] = ws.m[h];
      mg.l[warp][r] = ws.l[h];
    }
  }
  const int64_t rows_total = p.batch * p.heads_q * dst.sq;
  if (threadIdx.x < kRows) {  // one division per row, not per element
    const int64_t rr = dst.r0 + threadIdx.x, i = rr / dst.group, h = dst.hk * dst.group + rr % dst.group;
    mg.row[threadIdx.x] = dst.split * rows_total + (dst.b * p.heads_q + h) * dst.sq + i;
    mg.o_off[threadIdx.x] = dst.b * p.o_stride.b + i * p.o_stride.s + h * p.o_stride.h;
  }
  compute_sync<Arch, D>();
  const bool bad = sm.bad != 0;
  for (int e = threadIdx.x; e < nr * D; e += kThreads) {
    const int r = e / D, d = e % D;
    if (d >= p.head_dim_v) continue;
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, mg.m[w][r]);
    float l = 0.f, o = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      const float f = mg.m[w][r] == -INFINITY ? 0.f : __expf(mg.m[w][r] - mx);
      l += mg.l[w][r] * f;
      o += mg.acc[w][r][d] * f;
    }
    const int64_t row = mg.row[r];  // split * rows_total + the output row
    const float val = bad ? NAN : (l == 0.f ? 0.f : o / l);
    if constexpr (Cluster) mg.part[r][d] = val;
    else if (dst.splits == 1) static_cast<T*>(p.o)[mg.o_off[r] + d] = from_float<T>(val);
    else parts.o[row * p.head_dim_v + d] = val;
    if (d == 0) {
      const float lse = bad ? NAN : (l == 0.f ? -INFINITY : mx + logf(l));
      if constexpr (Cluster) mg.part_lse[r] = lse;
      else if (dst.splits > 1) parts.lse[row] = lse;
      else if (p.lse != nullptr) p.lse[row] = lse;
    }
  }
  if constexpr (Cluster) cluster_merge<Arch, T, D, Stages>(p, dst, nr, rows_total, sm);
}

// One CTA's share of the run: its output rows (dst, nr: a row chunk of one KV head's
// query rows, one split of its keys), their sequence and the alignment of its query rows
// to the keys (shift), and the keys [kr.k0, kr.k1) of the split.
struct CtaWork {
  Dest dst;
  int nr;
  Sequence s;
  int64_t shift;
  KeyRange kr;
};

__device__ __forceinline__ CtaWork cta_work(const AttnParams& p, int splits, int row_chunks) {
  CtaWork w;
  int64_t task = blockIdx.x;
  w.dst.splits = splits;
  w.dst.split = static_cast<int>(task % splits);
  task /= splits;
  const int chunk = static_cast<int>(task % row_chunks);
  task /= row_chunks;
  w.dst.hk = task % p.heads_kv;
  w.dst.b = task / p.heads_kv;
  w.dst.group = p.heads_q / p.heads_kv;
  w.dst.sq = p.seqlen_q;
  w.dst.r0 = static_cast<int64_t>(chunk) * kRows;
  const int64_t rows = w.dst.group * w.dst.sq - w.dst.r0;
  w.nr = static_cast<int>(rows < kRows ? rows : kRows);
  w.s = sequence(p, w.dst.b);
  w.shift = w.s.n - w.dst.sq;  // bottom-right: query row i is row i + shift of the keys
  w.kr = split_keys(p, w.s, w.dst.r0 / w.dst.group, (w.dst.r0 + w.nr - 1) / w.dst.group, w.shift, w.dst.split, splits);
  return w;
}
// The tiles of kTileK keys of a split (the last one partial where k1 - k0 is not a multiple).
__device__ __forceinline__ int64_t tile_count(const KeyRange& kr) {
  return kr.k1 > kr.k0 ? (kr.k1 - kr.k0 + kTileK - 1) / kTileK : 0;
}

// A warp's state before its first tile (after load_query): nothing accumulated yet, the
// aligned positions and ALiBi slopes of its rows.
template <typename Arch, typename T, int D, int Stages>
__device__ __forceinline__ void init_state(const Smem<Arch, T, D, Stages>& sm, WarpState<D>& ws) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = static_cast<int>(threadIdx.x % 32) / 4 + 8 * h;
    ws.m[h] = -INFINITY;
    ws.l[h] = 0.f;
    ws.ip[h] = sm.ip[r];
    ws.slope[h] = sm.slope[r];
  }
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) ws.o[dt][0] = ws.o[dt][1] = ws.o[dt][2] = ws.o[dt][3] = 0.f;
}

// The CTA where a barrier of all its threads starts each tile, after which the tile
// Stages - 1 ahead is issued into the stage every warp is done with: Sm80 (every thread
// gathers) and Sm90a without a producer warp (d = 64: thread 0 issues).
template <typename Arch, typename T, int D, int Stages, bool Cluster>
__device__ __forceinline__ void cta_with_barriers(const AttnParams& p, const Parts& parts, bool vec,
                                                  const MapsOf<Arch>& maps, const CtaWork& w,
                                                  Smem<Arch, T, D, Stages>& sm) {
  constexpr bool kBulk = Arch::kSm90;
  const Dest dst = w.dst;
  const int nr = w.nr;
  const Sequence s = w.s;
  const int64_t shift = w.shift;
  const KeyRange kr = w.kr;
  if (threadIdx.x == 0) sm.bad = s.ok ? 0 : 1;
  if (p.head_dim_qk < D || p.head_dim_v < D) {  // dims past head_dim read as zeros
    zero_uncopied_cols<Arch, T, D, Stages>(sm.u.ring.k, p.head_dim_qk);
    zero_uncopied_cols<Arch, T, D, Stages>(sm.u.ring.v, p.head_dim_v);
    // Sm90a: these are whole 64-dim column blocks that no box writes (the copy engine fills
    // only the blocks below), so thread 0 may issue the first tiles before every thread's
    // zeros are written; the fence orders them before the proxy's later reads and writes.
    if constexpr (kBulk) hopper::fence_proxy_async_smem();
  }
  const int64_t tiles = tile_count(kr);
  // Tile t lives in stage t % Stages, in that stage's use t / Stages.
  auto fill = [&](int64_t t) {
    const int st = static_cast<int>(t % Stages);
    if constexpr (kBulk) bulk_tile<Arch, T, D, Stages>(p, s, dst.b, dst.hk, kr.k0 + t * kTileK, kr.k1, maps, sm, st);
    else load_tile<Arch, T, D, Stages>(p, s, dst.b, dst.hk, kr.k0 + t * kTileK, kr.k1, vec, sm, st);
  };
  if constexpr (kBulk) {
    // The combine, launched as this grid's programmatic dependent (src/cuda/combine.cu),
    // may start once every CTA has: it waits for this grid's end before reading.
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    // The first tiles are issued before the query loads, so both round trips overlap (the
    // waits on their mbarriers come after load_query's barriers).
    if (threadIdx.x == 0) {
      for (int st = 0; st < Stages; ++st) hopper::mbar_init(fa2::smem_u32(&sm.full[st]));
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
      for (int t = 0; t < Stages - 1; ++t)
        if (t < tiles) fill(t);
    }
  }
  load_query<Arch, T, D, Stages>(p, s, dst.b, dst.hk, dst.r0, nr, dst.group, shift, sm);

  WarpState<D> ws;
  init_state<Arch, T, D, Stages>(sm, ws);
  if constexpr (!kBulk) {
#pragma unroll
    for (int t = 0; t < Stages - 1; ++t) {
      if (t < tiles) fill(t);
      fa2::cp_async_commit();
    }
  }
  for (int64_t t = 0; t < tiles; ++t) {
    const int st = static_cast<int>(t % Stages);
    const int64_t next = t + Stages - 1, j0 = kr.k0 + t * kTileK + threadIdx.x / 32 * kWarpKeys;
    if constexpr (kBulk) {
      __syncthreads();  // every warp is done with tile t - 1, whose stage is refilled next
      if (threadIdx.x == 0 && next < tiles) fill(next);
      hopper::mbar_wait(fa2::smem_u32(&sm.full[st]), static_cast<uint32_t>(t / Stages) & 1u);
      if (j0 + kWarpKeys > kr.k1) zero_v_tail<Arch, T, D, Stages>(sm, st, j0, kr.k1);
    } else {
      fa2::cp_async_wait<Stages - 2>();
      __syncthreads();  // tile t is in; every warp is done with tile t - 1, whose stage is refilled next
      if (next < tiles) fill(next);
      fa2::cp_async_commit();
    }
    ScoreFrag sc;
    ProbFrag pa;
    warp_qk<Arch, T, D, Stages>(sm, st, sc);
    warp_softmax<T, D>(p, j0, kr.k1, sc, ws, pa);
    warp_pv<Arch, T, D, Stages>(sm, st, pa, ws);
  }
  merge_store<Arch, T, D, Stages, Cluster>(p, parts, dst, nr, sm, ws);
}

// The producer warp's loop: tile t into stage t % Stages (its use t / Stages) once every
// compute thread has arrived on that stage's empty barrier after tile t - Stages (the
// barrier's phase t / Stages - 1), so the first Stages tiles go out at once, beside
// load_query. A paged cache's entries come from the warp's window (paged_tile); a
// contiguous cache reads no table, and lane 0 issues (bulk_tile). The warp waits together,
// so it stays converged for the shuffles and for the cluster barriers after the loop.
template <typename Arch, typename T, int D, int Stages>
__device__ __forceinline__ void produce(const AttnParams& p, const CtaWork& w, const BulkMaps& maps, PageWindow& win,
                                        Smem<Arch, T, D, Stages>& sm) {
  const int64_t tiles = tile_count(w.kr);
  for (int64_t t = 0; t < tiles; ++t) {
    const int st = static_cast<int>(t % Stages);
    const int64_t t0 = w.kr.k0 + t * kTileK;
    if (t >= Stages) hopper::mbar_wait(fa2::smem_u32(&sm.empty[st]), (static_cast<uint32_t>(t / Stages) & 1u) ^ 1u);
    if (p.kv_block_table != nullptr) paged_tile<Arch, T, D, Stages>(p, w.dst.hk, t0, w.kr.k1, maps, win, sm, st);
    else if (threadIdx.x == kThreads)
      bulk_tile<Arch, T, D, Stages>(p, w.s, w.dst.b, w.dst.hk, t0, w.kr.k1, maps, sm, st);
  }
}

// The CTA with a producer warp (kProducer): warp kWarps issues every tile (produce), the
// compute warps wait on each tile's full barrier and arrive on its empty barrier once
// their reads of it are done. After the prologue no barrier spans the producer: the
// compute warps' own are named (compute_sync), and under Cluster the producer takes its
// part in cluster_merge's two cluster barriers. The same splits, tiles and arithmetic as
// cta_with_barriers, so the same bits.
template <typename Arch, typename T, int D, int Stages, bool Cluster>
__device__ __forceinline__ void cta_with_producer(const AttnParams& p, const Parts& parts, const BulkMaps& maps,
                                                  const CtaWork& w, Smem<Arch, T, D, Stages>& sm) {
  const bool producer = threadIdx.x >= kThreads;
  PageWindow win{};
  if (producer) {
    if (threadIdx.x == kThreads) {  // the thread that issues every tile owns sm.bad until merge_store
      sm.bad = w.s.ok ? 0 : 1;
      for (int st = 0; st < Stages; ++st) {
        hopper::mbar_init(fa2::smem_u32(&sm.full[st]));
        hopper::mbar_init(fa2::smem_u32(&sm.empty[st]), kThreads);
      }
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    // The first two windows' entries are read before the barrier: they come in while the
    // CTA meets it.
    if (p.kv_block_table != nullptr) win = page_window(p, w.dst.b, w.kr.k0, w.kr.k1);
  } else if (p.head_dim_qk < D || p.head_dim_v < D) {  // dims past head_dim read as zeros
    zero_uncopied_cols<Arch, T, D, Stages>(sm.u.ring.k, p.head_dim_qk);
    zero_uncopied_cols<Arch, T, D, Stages>(sm.u.ring.v, p.head_dim_v);
    hopper::fence_proxy_async_smem();  // before the copy engine's writes to the other columns
  }
  // The combine, launched as this grid's programmatic dependent (src/cuda/combine.cu), may
  // start once every CTA has: it waits for this grid's end before reading.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  __syncthreads();  // barriers initialized, sm.bad set, columns zeroed: the CTA's only barrier
  if (producer) {
    produce<Arch, T, D, Stages>(p, w, maps, win, sm);
    if constexpr (Cluster) {
      __syncwarp();
      cluster_sync();  // cluster_merge's: every part is written
      cluster_sync();  // and read
    }
    return;
  }
  load_query<Arch, T, D, Stages>(p, w.s, w.dst.b, w.dst.hk, w.dst.r0, w.nr, w.dst.group, w.shift, sm);
  WarpState<D> ws;
  init_state<Arch, T, D, Stages>(sm, ws);
  const int64_t tiles = tile_count(w.kr);
  for (int64_t t = 0; t < tiles; ++t) {
    const int st = static_cast<int>(t % Stages);
    const int64_t j0 = w.kr.k0 + t * kTileK + threadIdx.x / 32 * kWarpKeys;
    hopper::mbar_wait(fa2::smem_u32(&sm.full[st]), static_cast<uint32_t>(t / Stages) & 1u);
    if (j0 + kWarpKeys > w.kr.k1) zero_v_tail<Arch, T, D, Stages>(sm, st, j0, w.kr.k1);
    ScoreFrag sc;
    ProbFrag pa;
    warp_qk<Arch, T, D, Stages>(sm, st, sc);
    warp_softmax<T, D>(p, j0, w.kr.k1, sc, ws, pa);
    warp_pv<Arch, T, D, Stages>(sm, st, pa, ws);
    hopper::mbar_arrive(fa2::smem_u32(&sm.empty[st]));  // after this thread's last read of the stage
  }
  merge_store<Arch, T, D, Stages, Cluster>(p, parts, w.dst, w.nr, sm, ws);
}

// Cluster: Sm90a, launched in clusters of `splits` CTAs (the splits of each row chunk),
// which merge their parts (cluster_merge); a separate instance, so the others hold no
// cluster instructions. CTAs of kBlockThreads threads (160 with a producer warp).
template <typename Arch, typename T, int D, int Stages, bool Cluster>
__global__ void __launch_bounds__(kBlockThreads<Arch, D>, kBoundsMinBlocks<Arch, D>)
    decode_kernel(const AttnParams p, const Parts parts, int splits, int row_chunks, bool vec,
                  const __grid_constant__ MapsOf<Arch> maps) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uintptr_t base = (reinterpret_cast<uintptr_t>(smem_raw) + kvAlign<Arch> - 1) & ~uintptr_t{kvAlign<Arch> - 1};
  Smem<Arch, T, D, Stages>& sm = *reinterpret_cast<Smem<Arch, T, D, Stages>*>(base);
  const CtaWork w = cta_work(p, splits, row_chunks);
  if constexpr (kProducer<Arch, D>) cta_with_producer<Arch, T, D, Stages, Cluster>(p, parts, maps, w, sm);
  else cta_with_barriers<Arch, T, D, Stages, Cluster>(p, parts, vec, maps, w, sm);
}

}  // namespace decode
}  // namespace flashattn
