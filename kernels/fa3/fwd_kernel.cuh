// The FA3-design forward kernel (sm_90a only): warp specialization over a TMA / mbarrier
// pipeline and wgmma GEMMs.
//
// Persistent: one CTA per SM walks query tiles (Cfg::kBlockM rows of one (query head,
// sequence)) in tile_at's order: CTA c starts with tile c. Where every tile is as long, CTA
// c goes on with tiles c + gridDim.x, c + 2 gridDim.x, ...; where tiles differ in length
// (under the causal mask, or where a sequence's last tile leaves consumer warpgroups without
// rows), each CTA claims its next one from a counter in global memory (an atomic add), so
// CTAs whose tiles were short take more of them and all finish
// together (where O has no buffer of its own, Cfg::kOwnO, the host launches one CTA per
// causal tile instead: the next tile's loads cannot overlap, and a walk gains nothing). The
// producer claims the next tile once it has issued the loads of the current one (it runs
// ahead of the consumers by the rings' depth) and names it to the consumers through a
// shared-memory slot that the Q tile's full barrier publishes. 128 (1 + Cfg::kConsumers)
// threads (fa3/fwd_traits.h: three consumer warpgroups at d = 64, two elsewhere):
//   warpgroup 0, the producer: drops to 24 registers (setmaxnreg); one elected thread loads
//     each tile's Q tile and its K and V blocks into 2-stage rings with TMA (128-byte
//     swizzle; 64-byte at d = 96), K one block ahead of V. The rings run on across tiles,
//     so the next tile's first blocks load while the consumers finish the last one. Every
//     stage of each ring has a full barrier (transaction bytes) and an empty barrier that
//     each consumer warpgroup arrives on (one thread) once its GEMM of the stage is done (K
//     after S, V after O += P V); the Q tile has a full barrier and an empty one (its last S
//     GEMM is done, or where O leaves through it, every consumer's O store has read it).
//   warpgroups 1 .. kConsumers, the consumers: raised to 240 registers (160 with three);
//     consumer warpgroup c owns query rows 64 c .. 64 c + 63 of the tile. Per K/V block:
//     S = Q K^T (wgmma, both operands shared-memory descriptors), mask (diagonal and last
//     blocks only), online softmax in base 2 in registers, O += P V (wgmma with P from
//     registers, V an MN-major descriptor). Within a warpgroup the GEMMs of neighbouring
//     blocks overlap: S of block j + 1 and O += P V of block j are issued together, and the
//     softmax of block j + 1 runs under the second. Between the warpgroups, named barriers
//     make them take turns issuing (ping-pong, round robin over three), so one's softmax
//     runs under the others' GEMMs.
// Blocks run from the last key block down, so the masked ones come first; key blocks a
// causal tile cannot see are never loaded. Epilogue: each consumer warpgroup writes its O
// rows (16-bit) into the O buffer in shared memory (without a buffer of its own: over its Q
// rows) and one thread stores them with TMA; LSE (fp32) by plain stores from registers.
//
// Serves: head_dim_qk up to Dqk and head_dim_v up to Dv (fa3/fwd_traits.h; the tensor maps
// span the real head dims: the tiles' columns past them load as zeros, O's are not stored;
// nothing else here reads a head dim), no varlen, bias,
// softcap, dropout or block-sparse layout, band mask only causal (window_right 0,
// window_left unbounded) with either alignment, GQA (key head = h / (heads_q / heads_kv)).
// The host sends everything else to fa2.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "common/exp2.h"
#include "common/params.h"
#include "fa2/mma.cuh"
#include "fa2/wgmma.cuh"
#include "fa3/fwd.h"
#include "fa3/fwd_traits.h"
#include "hopper/tma.cuh"
#include "hopper/warpgroup.cuh"

namespace flashattn {
namespace fa3 {

// Named barriers (hopper::bar_sync / bar_arrive; id 0 is
// __syncthreads): the consumer warpgroups' turns at the tensor cores (ping-pong), and each
// one's O tile complete in shared memory before its TMA store.
constexpr int kBarTurn = 1;  // + consumer index c: warpgroup c may issue its GEMMs
template <class Cfg>         // + c: warpgroup c's O tile is in shared memory
constexpr int kBarEpilogue = kBarTurn + Cfg::kConsumers;

// Key blocks that query rows r0 .. r0 + rows - 1 (those < len_q) attend to: [0, return value).
// Producer and consumers call it for a tile (rows = kBlockM) with the same arguments, so both
// walk the same blocks; a consumer warpgroup also for its own 64 rows.
template <class Cfg>
__device__ __forceinline__ int key_blocks(const AttnParams& p, int r0, int rows, int len_q, int len_k, int shift) {
  int end = len_k;
  if (p.has_band) {
    // Causal: the last row (i < len_q) sees keys j <= i + shift.
    const int last = min(r0 + rows, len_q) - 1 + shift;
    end = last < 0 ? 0 : min(last + 1, len_k);
  }
  return (end + Cfg::kBlockN - 1) / Cfg::kBlockN;
}

// The element mask of key block n (keys n kBlockN ..): keys past len_k and, causal, keys
// j > i + shift of this thread's rows row0 and row0 + 8. Only the blocks that need it call it.
// Each row's last visible key is taken relative to the thread's first column of the block
// (n kBlockN + 2 t), so each element compares its column offset, a constant, with one limit
// per row (FA3's form): an ISETP with an immediate and an FSEL per element, where the column
// computed per element took an add and two compares more, and a register per column.
template <class Cfg>
__device__ __forceinline__ void mask_block(const AttnParams& p, float (&acc_s)[1][Cfg::kBlockN / 8][4], int n, int row0,
                                           int len_k, int shift) {
  const int t = static_cast<int>(threadIdx.x) % 4;
  int lim[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int last = p.has_band ? min(len_k - 1, row0 + hh * 8 + shift) : len_k - 1;
    lim[hh] = last - n * Cfg::kBlockN - 2 * t;
  }
#pragma unroll
  for (int nt = 0; nt < Cfg::kBlockN / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (nt * 8 + (e & 1) > lim[e >> 1]) acc_s[0][nt][e] = -INFINITY;
}

// The most the running max of a row may grow (in log2 units of the scaled scores) before
// the exps' offset follows it: until then the offset stays, the probabilities reach at most
// 2^8 (exact in fp32 sums, well inside the 16-bit range of P), and O needs no rescaling.
constexpr float kMaxGrowthLog2 = 8.f;

// One step of the online softmax (base 2) on the scores of a block, rows g (hh 0) and g + 8
// (hh 1): the scores turned into probabilities in place, the running sums updated, and
// alpha[hh], the factor the O accumulator still has to be scaled by (the caller applies it
// once no GEMM writes O). row_max is the offset of the exps, not always the running max
// (FlashAttention-4's conditional rescaling): it moves to the block's new max only where that
// exceeds it by more than kMaxGrowthLog2, else alpha is 1. Returns whether this thread has a
// row whose offset moved (alpha != 1). A row with every score so far masked keeps max -inf;
// its exps use 0 as the offset, so its probabilities and alpha are 0.
template <int NT>
__device__ __forceinline__ bool softmax_step(float (&acc_s)[1][NT][4], float (&row_max)[2], float (&row_sum)[2],
                                             float (&alpha)[2], float sl2) {
  bool moved = false;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float mx = row_max[hh];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(acc_s[0][nt][2 * hh], acc_s[0][nt][2 * hh + 1]));
    mx = fa2::quad_max(mx);
    const float m_old = row_max[hh] * sl2, m_new = mx == -INFINITY ? 0.f : mx * sl2;
    // False where the old offset is -inf (the difference is +inf): a row masked so far counts as
    // moved at every block, which only rescales zeros.
    const bool keep = m_new - m_old <= kMaxGrowthLog2;
    const float m_scaled = keep ? m_old : m_new;
    alpha[hh] = keep ? 1.f : fa2::fast_exp2(m_old - m_new);
    row_max[hh] = keep ? row_max[hh] : mx;
    moved |= !keep;
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pe = fa2::fast_exp2(fmaf(acc_s[0][nt][2 * hh + e], sl2, -m_scaled));
        acc_s[0][nt][2 * hh + e] = pe;
        sum += pe;
      }
    row_sum[hh] = row_sum[hh] * alpha[hh] + sum;
  }
  return moved;
}

template <int NV>
__device__ __forceinline__ void rescale_o(float (&acc_o)[1][NV][4], const float (&alpha)[2]) {
#pragma unroll
  for (int nv = 0; nv < NV; ++nv)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[0][nv][e] *= alpha[e >> 1];
}

// The query tile `tile` of the persistent walk. Tiles are numbered in sections of heads
// ((head, sequence) pairs, head fastest) whose K and V fit a 16 MB share of L2 together (at 1k
// keys 2-6% faster than 32 MB, whose sections held 32-128 heads); within a section query block
// by query block from the last one down, the section's heads fastest, so under a causal mask
// (the last query blocks see the most key blocks) the longest tiles go first over the whole
// section and the section ends in its shortest ones: the CTAs that take the last tiles take
// short ones, and the walk (or, one CTA per tile, the hardware's dispatch) ends balanced.
// Without a mask the tiles are as long (but for a sequence's last, which may leave warpgroups
// idle), and a section is one head (its query blocks in turn, as the CTAs running at once then
// read the K and V of one or two heads).
// Under the causal mask the tiles are shifted up by the whole warpgroups (64 rows each) of the
// last tile's rows past len_q, so that the partial tile is the first, whose rows see the fewest
// keys: its m0 is negative, and its warpgroups whose rows all lie before row 0 stay idle (they
// load no Q box and store no O box: the copy engine is never given a negative row). At the end,
// the partial tile (d = 64 at 1k keys: 64 rows) would be the longest, most of its warpgroups
// idle through all its key blocks (8 at 1k), and no other warpgroup's GEMMs to hide its softmax.
struct Tile {
  int m0, h, b;
};
template <class Cfg>
__device__ __forceinline__ Tile tile_at(const AttnParams& p, int tile, int tiles_m) {
  constexpr unsigned kL2Share = 16u << 20, kKeyBytes = (Cfg::kDqk + Cfg::kDv) * 2;
  const int heads = static_cast<int>(p.heads_q * p.batch);
  const unsigned len_k = static_cast<unsigned>(p.seqlen_k);  // >= 1 (the host refuses 0 keys)
  const int section = p.has_band ? max(1, min(heads, static_cast<int>(kL2Share / kKeyBytes / len_k))) : 1;
  const int first = tile / (section * tiles_m) * section;  // the section's first head
  const int in_section = min(section, heads - first);      // its heads (fewer in the last)
  const int r = tile - first * tiles_m;                    // the tile within the section
  const int m = tiles_m - 1 - r / in_section, hb = first + r % in_section;
  const int pad = p.has_band ? (tiles_m * Cfg::kBlockM - static_cast<int>(p.seqlen_q)) / 64 * 64 : 0;
  return {m * Cfg::kBlockM - pad, hb % static_cast<int>(p.heads_q), hb / static_cast<int>(p.heads_q)};
}

// ---- end of a tile's walk: the rows' sums, their reciprocals and the LSE (plain stores) ----
// sum = 0 exactly iff every score of the row was masked (or it saw no key block): O = 0,
// LSE = -inf. A NaN score makes the sum NaN, and O and LSE with it. Called between issuing the
// last O += P V and waiting for it: the shuffles, the reciprocal, the logarithm and the stores
// run under that GEMM instead of after it, on the path to the tile's O store.
__device__ __forceinline__ void finalize(const AttnParams& p, const Tile& tl, int row0, int t,
                                         const float (&row_max)[2], const float (&row_sum)[2], float sl2,
                                         float (&inv)[2]) {
  const int len_q = static_cast<int>(p.seqlen_q);
  float* const lse = p.lse != nullptr ? p.lse + (static_cast<int64_t>(tl.b) * p.heads_q + tl.h) * p.seqlen_q : nullptr;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float sum = fa2::quad_sum(row_sum[hh]);
    inv[hh] = sum != 0.f ? 1.f / sum : 0.f;
    const int i = row0 + hh * 8;
    if (lse != nullptr && t == 0 && i >= 0 && i < len_q)
      lse[i] = sum != 0.f ? (row_max[hh] * sl2 + __log2f(sum)) * kLn2 : -INFINITY;
  }
}

// ---- epilogue of a tile: O, scaled by inv, through shared memory and a TMA store ----
// O goes to so_wg: the warpgroup's rows of the O buffer, or (without a buffer of its own) of
// the Q tile (its S GEMMs, the only readers, are done), in the layout of a TMA load
// (hopper::swizzled_chunk, kBlockM rows a column block), where the 4-byte stores of a warp
// hit 32 distinct banks. The store's read of shared memory is waited for where the memory is
// next needed: with an O buffer of its own, by the storing thread at the warpgroup's next
// epilogue (or as the CTA ends), so the store runs under the next tile's first blocks; through
// the Q tile, at once.
template <class Cfg, typename T, int kNV>
__device__ __forceinline__ void epilogue(const AttnParams& p, const FwdMaps& maps, const Tile& tl, int cw, int warp,
                                         int g, int t, uint32_t so_wg, const float (&acc_o)[1][kNV][4],
                                         const float (&inv)[2]) {
  constexpr int kBlockM = Cfg::kBlockM, kDv = Cfg::kDv, kSw = Cfg::kSwizzle;
  const int len_q = static_cast<int>(p.seqlen_q);
  // Own O buffer: the warpgroup's previous O store has read it (its storing thread waits for
  // that here, a tile after issuing it, so the store ran under this tile's GEMMs).
  if constexpr (Cfg::kOwnO) {
    if (static_cast<int>(threadIdx.x) % 128 == 0) hopper::bulk_wait_read_all();
    hopper::bar_sync(kBarEpilogue<Cfg> + cw, 128);
  }
  // With three consumer warpgroups (160 registers), the base is made opaque here: ptxas would
  // otherwise compute the kNV x 2 addresses below once, before the walk, and spill them.
  uint32_t so_rows = so_wg;
  if constexpr (Cfg::kConsumers == 3) asm volatile("" : "+r"(so_rows));
#pragma unroll
  for (int nv = 0; nv < kNV; ++nv)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const uint32_t a = so_rows + hopper::swizzled_chunk<kSw, kBlockM>(warp * 16 + g + hh * 8, nv) + t * 4;
      const uint32_t v = fa2::pack2<T>(acc_o[0][nv][2 * hh] * inv[hh], acc_o[0][nv][2 * hh + 1] * inv[hh]);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
    }
  hopper::fence_proxy_async_smem();
  hopper::bar_sync(kBarEpilogue<Cfg> + cw, 128);
  // One thread stores the warpgroup's kBoxRows rows; the engine skips rows past len_q.
  static_assert(Cfg::kBoxRows == 64, "one O box per consumer warpgroup");
  const int r0 = tl.m0 + cw * 64;
  if (static_cast<int>(threadIdx.x) % 128 == 0 && r0 >= 0 && r0 < len_q) {
#pragma unroll
    for (int cb = 0; cb < kDv / Cfg::kCols; ++cb)
      hopper::tma_store(&maps.o, so_wg + static_cast<uint32_t>(cb * kBlockM * kSw), cb * Cfg::kCols, r0, tl.h, tl.b);
    hopper::bulk_commit();
    // Through the Q tile, Q's next load waits for the store to have read it (q_empty).
    if constexpr (!Cfg::kOwnO) hopper::bulk_wait_read_all();
  }
}

template <class Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fwd_kernel(const AttnParams p, const __grid_constant__ FwdMaps maps, int* next_tile) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kDqk = Cfg::kDqk, kDv = Cfg::kDv, kSw = Cfg::kSwizzle, kCols = Cfg::kCols;
  constexpr int kNT = kBlockN / 8;  // n8 tiles of S per warpgroup row block
  constexpr int kNV = kDv / 8;      // n8 tiles of O
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sq = (fa2::smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t so = Cfg::kOwnO ? sq + Cfg::kQBytes : sq;  // the O staging tile
  const uint32_t sk0 = sq + Cfg::kQBytes + Cfg::kOBytes;
  const uint32_t sv0 = sk0 + kStages * Cfg::kKBytes;
  const uint32_t bar0 = sv0 + kStages * Cfg::kVBytes;
  const uint32_t q_full = bar0, q_empty = bar0 + 8u;
  const uint32_t tile_slot = bar0 + static_cast<uint32_t>(Cfg::kBarBytes);
  auto bar = [&](int kind, int s) { return bar0 + 8u * static_cast<uint32_t>(2 + kind * kStages + s); };
  auto k_full = [&](int s) { return bar(0, s); };
  auto v_full = [&](int s) { return bar(1, s); };
  auto k_empty = [&](int s) { return bar(2, s); };
  auto v_empty = [&](int s) { return bar(3, s); };
  // Block it of the CTA's walk (counted over all its tiles) lives in stage it % kStages, in
  // that stage's use number it / kStages.
  auto stage = [](int it) { return it % kStages; };
  auto parity = [](int it) { return static_cast<uint32_t>(it / kStages) & 1u; };

  const int len_q = static_cast<int>(p.seqlen_q), len_k = static_cast<int>(p.seqlen_k);
  const int shift = p.align == 1 ? len_k - len_q : 0;
  // Evaluated where used, from p: a value computed here and held across the register
  // reallocation (setmaxnreg) below spills.
  auto tiles_m = [&] { return (static_cast<int>(p.seqlen_q) + kBlockM - 1) / kBlockM; };
  auto num_tiles = [&] { return tiles_m() * static_cast<int>(p.heads_q * p.batch); };

  if (threadIdx.x == 0) {
    hopper::mbar_init(q_full);
    // Q is free for the next tile: own O buffer, once every consumer warpgroup's last S GEMM
    // is done; else once each warpgroup's O store has read it (one arrival a warpgroup).
    hopper::mbar_init(q_empty, Cfg::kConsumers);
    for (int s = 0; s < kStages; ++s) {
      hopper::mbar_init(k_full(s));
      hopper::mbar_init(v_full(s));
      hopper::mbar_init(k_empty(s), Cfg::kConsumers);
      hopper::mbar_init(v_empty(s), Cfg::kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // The warpgroup's index through a shuffle, which ptxas knows to be warp-uniform: the Q
  // tile's descriptors (from cw) then stay in uniform registers, and the S GEMM's issue
  // needs no vector-to-uniform moves per k16 step.
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  if (wg == 0) {
    // ---- producer: per tile, K of its first block, Q (once the previous tile is done with
    // the Q buffer: q_empty), then K one block ahead of V (K_it, V_it-1, K_it+1, ...), the
    // order the consumers use them in. Every tile loads Q, so the Q barriers turn once per
    // tile. ----
    hopper::regs_dec<Cfg::kProducerRegs>();
    if (threadIdx.x != 0) return;
    hopper::tma_prefetch_map(&maps.q);
    hopper::tma_prefetch_map(&maps.k);
    hopper::tma_prefetch_map(&maps.v);
    hopper::tma_prefetch_map(&maps.o);
    const int kv_group = static_cast<int>(p.heads_q / p.heads_kv);
    // The CTA's tile after `tile`: with a counter (the host sets one where tiles differ in
    // length: a causal walk, or last tiles with idle warpgroups; src/cuda/fa3_fwd.cpp),
    // tiles gridDim.x, gridDim.x + 1, ... go to the CTAs in the order they ask; without, the
    // next of the CTA's static stride (past the last tile where the grid has one CTA per tile).
    auto claim = [&](int tile) {
      const int grid = static_cast<int>(gridDim.x);
      return next_tile != nullptr ? atomicAdd(next_tile, 1) + grid : tile + grid;
    };
    int base = 0;  // walk steps of the CTA's earlier tiles
    int tile = static_cast<int>(blockIdx.x);
    for (int tc = 0;; ++tc) {  // tc: the CTA's tiles so far
      // The consumers read the slot as the Q tile's full barrier completes, and are done with
      // it once they release the Q tile (q_empty). It carries the tile decoded (tile_at's
      // divisions done once, here, off the consumers' path from the barrier to their first
      // GEMM).
      auto name_tile = [&](const Tile& t) {
        hopper::mbar_wait(q_empty, static_cast<uint32_t>(tc & 1) ^ 1u);
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(tile_slot), "r"(tile), "r"(t.m0), "r"(t.h),
                     "r"(t.b)
                     : "memory");
      };
      if (tile >= num_tiles()) {  // no tile left: the barrier completes with no bytes
        name_tile(Tile{0, 0, 0});
        hopper::mbar_arrive(q_full);
        return;
      }
      const Tile tl = tile_at<Cfg>(p, tile, tiles_m());
      // From p's fields, not the values above: in 24 registers, keeping those live spills.
      const int n_blocks =
          key_blocks<Cfg>(p, tl.m0, kBlockM, static_cast<int>(p.seqlen_q), static_cast<int>(p.seqlen_k),
                          p.align == 1 ? static_cast<int>(p.seqlen_k - p.seqlen_q) : 0);
      const int kvh = tl.h / kv_group;
      // Operand `which` (0 K, 1 V) of walk step it of this tile. A fresh barrier counts as
      // having completed the phase before its first: the first round through a ring does not
      // wait.
      auto load = [&](int which, int it) {
        const int s = stage(base + it), n = n_blocks - 1 - it;
        const uint32_t full = which == 0 ? k_full(s) : v_full(s);
        const int bytes = which == 0 ? Cfg::kKBytes : Cfg::kVBytes;
        const uint32_t dst = (which == 0 ? sk0 : sv0) + static_cast<uint32_t>(s * bytes);
        hopper::mbar_wait(which == 0 ? k_empty(s) : v_empty(s), parity(base + it) ^ 1u);
        hopper::mbar_expect(full, bytes);
#pragma unroll
        for (int c = 0; c < (kDqk > kDv ? kDqk : kDv) / kCols; ++c)
          if (c < (which == 0 ? kDqk : kDv) / kCols)
            hopper::tma_load(dst + static_cast<uint32_t>(c * kBlockN * kSw), which == 0 ? &maps.k : &maps.v, c * kCols,
                             n * kBlockN, kvh, tl.b, full);
      };
      if (n_blocks > 0) load(0, 0);
      name_tile(tl);
      // A box of 64 rows per consumer warpgroup; none for those whose rows lie before row 0
      // (causal, tile_at's first tile), which stay idle.
      const int q_lo = tl.m0 < 0 ? -tl.m0 / 64 : 0;
      hopper::mbar_expect(q_full, (Cfg::kConsumers - q_lo) * Cfg::kBoxRows * kDqk * 2);
      for (int w = q_lo; w < Cfg::kConsumers; ++w)
#pragma unroll
        for (int c = 0; c < kDqk / kCols; ++c)
          hopper::tma_load(sq + static_cast<uint32_t>(c * kBlockM * kSw + w * Cfg::kBoxRows * kSw), &maps.q, c * kCols,
                           tl.m0 + w * Cfg::kBoxRows, tl.h, tl.b, q_full);
      for (int it = 1; it < n_blocks; ++it) {
        load(0, it);
        load(1, it - 1);
      }
      // The next tile is claimed before the wait for the last V stage, so that the counter's
      // round trip runs under that wait rather than on the path to the next tile's first loads.
      const int next = claim(tile);
      if (n_blocks > 0) load(1, n_blocks - 1);
      base += n_blocks;
      tile = next;
    }
  }

  // ---- consumers ----
  hopper::regs_inc<Cfg::kConsumerRegs>();
  const int cw = wg - 1;                                      // rows 64 cw .. 64 cw + 63 of the tile
  const int warp = (static_cast<int>(threadIdx.x) / 32) % 4;  // rows 16 warp .. + 15 of those
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const float sl2 = p.scale * kLog2e;
  const uint32_t sq_wg = sq + static_cast<uint32_t>(cw * 64 * kSw);  // this warpgroup's Q rows
  const uint32_t so_wg = so + static_cast<uint32_t>(cw * 64 * kSw);  // and its O rows
  // A warpgroup's release of a K or V stage (or of the Q tile): one arrival, by its first
  // thread once the warpgroup has waited for the GEMMs that read it (a wgmma group completes
  // for the whole warpgroup); the empty barriers count warpgroups, not threads.
  auto wg_arrive = [](uint32_t bar) {
    if (threadIdx.x % 128 == 0) hopper::mbar_arrive(bar);
  };
  // The Q tile is read for the last time by this tile's last S GEMM (own O buffer).
  auto q_done = [&] {
    if constexpr (Cfg::kOwnO) wg_arrive(q_empty);
  };
  int base = 0;
  for (int tc = 0;; ++tc) {
    hopper::mbar_wait(q_full, static_cast<uint32_t>(tc & 1));
    int tile;
    Tile tl;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(tile), "=r"(tl.m0), "=r"(tl.h), "=r"(tl.b)
                 : "r"(tile_slot)
                 : "memory");
    if (tile >= num_tiles()) {
      // The CTA's shared memory outlives its last O store's read of it.
      if (static_cast<int>(threadIdx.x) % 128 == 0) hopper::bulk_wait_read_all();
      return;
    }
    const int m0 = tl.m0;
    const int row0 = m0 + cw * 64 + warp * 16 + g;  // this thread's rows: row0 and row0 + 8
    // Warpgroups with rows in the tile, lo .. hi - 1: fewer than kConsumers where a sequence's
    // rows end early (without a mask, its last tile: d = 64 at 1k keys, five 192-row tiles and
    // one of 64 rows) or, causal, begin late (its first tile, m0 < 0; tile_at). One without
    // computes nothing: it releases each stage once the stage is loaded (the producer cannot
    // then reload it before the others' release of its previous use), then runs as a tile of
    // no key blocks (no turns; an epilogue that stores no row). The test is a warp vote, which
    // ptxas knows to be uniform: from the thread index alone, `base` and the stage addresses
    // left the uniform registers (a tenth more instructions at d = 256, 0.82-0.92x); skipping
    // the epilogue too (a jump past the tile's code) spilled 44 bytes at d = 64.
    const int lo = m0 < 0 ? -m0 / 64 : 0;
    const int hi = min(Cfg::kConsumers, (len_q - m0 + 63) / 64);
    int n_blocks = key_blocks<Cfg>(p, m0, kBlockM, len_q, len_k, shift);
    // Walk step it's K and V stages, released as soon as they are loaded (waiting for the full
    // barrier first, so the producer cannot reload a stage before the others released its
    // previous use), by a warpgroup that has nothing to compute there.
    auto release = [&](int it) {
      hopper::mbar_wait(k_full(stage(base + it)), parity(base + it));
      wg_arrive(k_empty(stage(base + it)));
      hopper::mbar_wait(v_full(stage(base + it)), parity(base + it));
      wg_arrive(v_empty(stage(base + it)));
    };
    if (__any_sync(0xffffffffu, cw < lo || cw >= hi)) {
      for (int it = 0; it < n_blocks; ++it) release(it);
      base += n_blocks;
      n_blocks = 0;
    }

    float acc_o[1][kNV][4];
#pragma unroll
    for (int nv = 0; nv < kNV; ++nv)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[0][nv][e] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f}, alpha[2];
    float acc_s[1][kNT][4];
    uint32_t pa[kNT / 2][4];  // P of the previous block, waiting for its O += P V

    // Blocks that take the element mask: past len_k, or (causal) reaching above the tile's
    // first row's diagonal; uniform per block.
    auto needs_mask = [&](int n) {
      const int n0 = n * kBlockN;
      return n0 + kBlockN > len_k || (p.has_band && n0 + kBlockN - 1 > m0 + shift);
    };
    // S = Q K^T of walk step it (K-major operands); issued and committed, not waited for.
    auto issue_s = [&](int it) {
      fa2::wg_gemm<T, kNT, kDqk, 0, kBlockM, kBlockN, true, kSw>(
          acc_s, sq_wg, sk0 + static_cast<uint32_t>(stage(base + it) * Cfg::kKBytes));
    };
    // O += P V of walk step it: P from pa, V MN-major (k16 step kk = rows 16 kk.., 16 kSw
    // bytes further; N = kDv across its column blocks, kBlockN kSw bytes apart).
    auto issue_pv = [&](int it) {
      fa2::wg_gemm_rs<T, kNV, kNT / 2, kBlockN, kSw>(acc_o, pa,
                                                     sv0 + static_cast<uint32_t>(stage(base + it) * Cfg::kVBytes));
    };

    // Intra-warpgroup overlap: step it issues S(it) = Q K(it)^T and then O += P(it-1) V(it-1),
    // so the softmax of block it runs while the tensor cores do the second GEMM; O is rescaled
    // by block it's alpha only once that GEMM is done. No accumulator or P register is touched
    // between a GEMM's issue and its wait.
    //
    // Ping-pong between the consumer warpgroups: each step's GEMMs are issued in turn, round
    // robin over the tile's active ones, lo first (turn_wait .. turn_pass), so one warpgroup's
    // softmax runs under the others' GEMMs. Turn barrier c completes when warpgroup c waits
    // (128 threads) and the one before it has passed (128): warpgroup lo's first turn of a
    // tile is passed by itself (alone in the tile, every turn), and the last active warpgroup
    // skips its last pass (nobody waits for it), so every barrier ends every tile balanced.
    // All active warpgroups take the same n_blocks turns. Warpgroup lo cannot start the next
    // tile's turns before the others have taken their last ones: the next Q tile waits for
    // every warpgroup's q_empty arrivals, which follow their last turns.
    auto turn_wait = [&] { hopper::bar_sync(kBarTurn + cw, 256); };
    auto turn_pass = [&](int it) {
      const bool last = cw + 1 == hi;
      if (!last || it + 1 < n_blocks) hopper::bar_arrive(kBarTurn + (last ? lo : cw + 1), 256);
    };
    if (n_blocks > 0) {
      if (cw == lo) hopper::bar_arrive(kBarTurn + lo, 256);
      // Causal: the tile's first steps (its last key blocks) may lie wholly above this
      // warpgroup's diagonal (d = 64: one of a 192-row tile's blocks, for warpgroups 0 and 1;
      // d = 256: one for warpgroup 0). It takes its turns there but issues nothing and releases
      // the stages, then walks the rest as a tile of fewer blocks: the block of walk step it
      // stays n_blocks - 1 - it. The count is a warp reduction, which ptxas knows to be uniform
      // (base and the stage addresses stay in uniform registers); reduced under a branch on
      // p.has_band instead, it got a divergent fallback path (BRA.DIV, a second copy of the
      // softmax). Without a mask the count is 0.
      const int own = key_blocks<Cfg>(p, m0 + cw * 64, 64, len_q, len_k, shift);
      const int skip = __reduce_max_sync(0xffffffffu, p.has_band ? max(0, n_blocks - own) : 0);
      for (int it = 0; it < skip; ++it) {
        turn_wait();
        turn_pass(it);
        release(it);
      }
      base += skip;
      n_blocks -= skip;
    }
    if (n_blocks == 0) q_done();
    if (n_blocks > 0) {
      hopper::mbar_wait(k_full(stage(base)), parity(base));
      turn_wait();
      fa2::wg_fence();
      issue_s(0);
      fa2::wg_commit();
      turn_pass(0);
      fa2::wg_wait<0>();
      fa2::wg_hold(acc_s);
      wg_arrive(k_empty(stage(base)));
      if (n_blocks == 1) q_done();
      if (needs_mask(n_blocks - 1)) mask_block<Cfg>(p, acc_s, n_blocks - 1, row0, len_k, shift);
      softmax_step(acc_s, row_max, row_sum, alpha, sl2);  // alpha = 0: O is still 0
      hopper::pack_a<T>(pa, acc_s);
    }
    for (int it = 1; it < n_blocks; ++it) {
      const int n = n_blocks - 1 - it;
      hopper::mbar_wait(k_full(stage(base + it)), parity(base + it));
      turn_wait();
      fa2::wg_fence();
      issue_s(it);
      fa2::wg_commit();
      // V of the block before, loaded after this block's K: waited for once S is issued (the
      // fence again after the wait's loop, as ptxas would insert it).
      hopper::mbar_wait(v_full(stage(base + it - 1)), parity(base + it - 1));
      fa2::wg_fence();
      issue_pv(it - 1);
      fa2::wg_commit();
      turn_pass(it);
      fa2::wg_wait<1>();  // S(it) done; O += P V may still run
      fa2::wg_hold(acc_s);
      wg_arrive(k_empty(stage(base + it)));
      if (it == n_blocks - 1) q_done();
      // The softmax sits in the two arms of this branch, the wait after it: within one basic
      // block ptxas hoists the wait above the softmax (it sees no dependency between them), and
      // nothing would overlap the second GEMM. The hold keeps the front end from sinking the
      // softmax below the wait.
      bool moved;
      if (needs_mask(n)) {
        mask_block<Cfg>(p, acc_s, n, row0, len_k, shift);
        moved = softmax_step(acc_s, row_max, row_sum, alpha, sl2);
      } else {
        moved = softmax_step(acc_s, row_max, row_sum, alpha, sl2);
      }
      fa2::wg_hold(acc_s);
      fa2::wg_wait<0>();
      fa2::wg_hold(acc_o);
      wg_arrive(v_empty(stage(base + it - 1)));
      // Skipped by the whole warp where none of its rows moved its offset (most blocks once
      // the first few have set the rows' maxima).
      if (__any_sync(0xffffffffu, moved)) rescale_o(acc_o, alpha);
      hopper::pack_a<T>(pa, acc_s);
    }
    float inv[2];
    if (n_blocks > 0) {
      hopper::mbar_wait(v_full(stage(base + n_blocks - 1)), parity(base + n_blocks - 1));
      fa2::wg_fence();
      issue_pv(n_blocks - 1);
      fa2::wg_commit();
      finalize(p, tl, row0, t, row_max, row_sum, sl2, inv);
      fa2::wg_wait<0>();
      fa2::wg_hold(acc_o);
      wg_arrive(v_empty(stage(base + n_blocks - 1)));
    } else {
      finalize(p, tl, row0, t, row_max, row_sum, sl2, inv);
    }
    base += n_blocks;
    epilogue<Cfg, T>(p, maps, tl, cw, warp, g, t, so_wg, acc_o, inv);
    // O through the Q tile: Q is free once this warpgroup's O store has read it.
    if (!Cfg::kOwnO) wg_arrive(q_empty);
  }
}

}  // namespace fa3
}  // namespace flashattn
