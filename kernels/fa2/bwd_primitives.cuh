// Device primitives of the FA2-design backward main kernel: the warp GEMM on swizzled
// shared tiles, tile loads, reductions and the TMA / mbarrier operations of the Sm90a code
// (the deterministic mode's turn counters: common/turns.cuh).
#pragma once
#include <stdint.h>

#include "common/turns.cuh"
#include "fa2/mma.cuh"
#include "hopper/tma.cuh"

namespace flashattn {
namespace fa2 {

// threadIdx.x behind an opaque move: values derived from it are recomputed where they
// are used instead of being hoisted out of the main loop, where they would pin dozens
// of registers next to the dK/dV accumulators (a few integer ops per use is cheaper).
__device__ __forceinline__ int bwd_tid() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
  return t;
}

// ---------------------------------------------------------------------------------
// Warp GEMM on swizzled shared tiles: acc[MT][NT] (a (16MT) x (8NT) warp tile) += A * B.
//   A(m, k) = sA[a_off + m][k]   (kAT false)    or  sA[k][a_off + m]  (kAT true)
//   B(k, n) = sB[b_off + n][k]   (kBT false)    or  sB[k][b_off + n]  (kBT true)
// kRA / kRB are the tiles' row counts (stride of their 64-column blocks). Every ldmatrix
// reads 8 consecutive stored rows at one 16-byte chunk column, which the XOR swizzle
// (chunk ^ (row & 7)) makes conflict-free with or without transposition.
// Addresses are built so that each one is a per-lane register plus a compile-time
// offset (k steps move whole 16-row groups or flip swizzle bits by a constant): hoisting
// every (k step, tile) address out of the main loop would cost hundreds of registers.
// ---------------------------------------------------------------------------------
template <class Arch, typename T, int MT, int NT, int K, bool kAT, bool kBT, int kRA, int kRB>
__device__ __forceinline__ void bwd_warp_gemm(float (&acc)[MT][NT][4], uint32_t sA, int a_off, uint32_t sB, int b_off) {
  static_assert(NT % 2 == 0, "B fragments are loaded for pairs of n8 tiles");
  const int lane = bwd_tid() & 31;
  const int li = lane >> 3, lr = lane & 7;
  uint32_t a_base[MT], b_base[NT / 2];
  uint32_t a_x = 0, b_x = 0;
  // sm_90 code, transposed operands whose warp tile extent E = 16 MT or 8 NT is a power of
  // two <= 64 at an offset that is a multiple of E (as every caller's is): chunk
  // c = off / 8 + 2 i + lane bit with off / 8 a multiple of E / 8 > 2 i + 1, so all i share
  // the 64-column block and row, and chunk bits (c & 7) ^ lr = ((off / 8 & 7) | bit) ^ lr ^ 2 i:
  // tile i's tile-relative offset is tile 0's XOR (i << 5).
  constexpr bool kXA = Arch::kSm90 && kAT && (MT == 1 || MT == 2 || MT == 4);
  constexpr bool kXB = Arch::kSm90 && kBT && (NT == 2 || NT == 4 || NT == 8);
  if constexpr (kXA) {
    const uint32_t c0 = static_cast<uint32_t>(a_off) >> 3;
    const uint32_t rel = (c0 >> 3) * static_cast<uint32_t>(kRA * 128) +
                         static_cast<uint32_t>(lr + 8 * (li >> 1)) * 128u +
                         ((((c0 & 7u) | static_cast<uint32_t>(li & 1)) ^ static_cast<uint32_t>(lr)) << 4);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) a_base[mt] = sA + (rel ^ static_cast<uint32_t>(mt << 5));
  }
  if constexpr (kXB) {
    const uint32_t c0 = static_cast<uint32_t>(b_off) >> 3;
    const uint32_t rel = (c0 >> 3) * static_cast<uint32_t>(kRB * 128) +
                         static_cast<uint32_t>(lr + 8 * (li & 1)) * 128u +
                         ((((c0 & 7u) | static_cast<uint32_t>(li >> 1)) ^ static_cast<uint32_t>(lr)) << 4);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) b_base[np] = sB + (rel ^ static_cast<uint32_t>(np << 5));
  }
#pragma unroll
  for (int mt = 0; mt < MT && !kXA; ++mt) {
    if (!kAT) {
      a_base[mt] = sA + static_cast<uint32_t>(a_off + mt * 16 + lr + 8 * (li & 1)) * 128u;
    } else {
      const int c = (a_off + mt * 16) / 8 + (li & 1);
      a_base[mt] =
          sA + static_cast<uint32_t>((c >> 3) * kRA * 128 + (lr + 8 * (li >> 1)) * 128 + (((c & 7) ^ lr) << 4));
    }
  }
  if (!kAT) a_x = static_cast<uint32_t>(((li >> 1) ^ lr) << 4);
#pragma unroll
  for (int np = 0; np < NT / 2 && !kXB; ++np) {
    if (!kBT) {
      b_base[np] = sB + static_cast<uint32_t>(b_off + np * 16 + lr + 8 * (li >> 1)) * 128u;
    } else {
      const int c = (b_off + np * 16) / 8 + (li >> 1);
      b_base[np] = sB + static_cast<uint32_t>((c >> 3) * kRB * 128 + (lr + 8 * (li & 1)) * 128 + (((c & 7) ^ lr) << 4));
    }
  }
  if (!kBT) b_x = static_cast<uint32_t>(((li & 1) ^ lr) << 4);
#pragma unroll
  for (int kk = 0; kk < K; kk += 16) {
    // Non-transposed operands: k runs along the stored row; chunk kk/8 (even) lives in
    // 64-column block kk/64 with swizzle bits ((kk/8)&7) ^ lane bits.
    const uint32_t a_step = kAT ? static_cast<uint32_t>(kk * 128) : static_cast<uint32_t>((kk >> 6) * kRA * 128);
    const uint32_t b_step = kBT ? static_cast<uint32_t>(kk * 128) : static_cast<uint32_t>((kk >> 6) * kRB * 128);
    const uint32_t a_sw = kAT ? 0u : (a_x ^ static_cast<uint32_t>(((kk >> 3) & 7) << 4));
    const uint32_t b_sw = kBT ? 0u : (b_x ^ static_cast<uint32_t>(((kk >> 3) & 7) << 4));
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if (!kAT) ldmatrix_x4(a[mt], a_base[mt] + a_sw + a_step);
      else ldmatrix_x4_trans(a[mt], a_base[mt] + a_step);
    }
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      if (!kBT) ldmatrix_x4(b, b_base[np] + b_sw + b_step);
      else ldmatrix_x4_trans(b, b_base[np] + b_step);
      const uint32_t b0[2] = {b[0], b[1]};
      const uint32_t b1[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma16816<T>(acc[mt][2 * np], a[mt], b0);
        mma16816<T>(acc[mt][2 * np + 1], a[mt], b1);
      }
    }
  }
}

template <int MT, int NT>
__device__ __forceinline__ void bwd_zero(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
}

// Loads rows [0, n_valid) x cols [0, d_valid) of a [kRows x kCols] swizzled tile from
// global rows at `g + r * row_stride`; everything else is zero-filled (no global read).
template <class Arch, class Tile, int kRows, int kColsUsed, int kThreads>
__device__ __forceinline__ void bwd_load_tile(uint32_t s, const uint16_t* g, int64_t row_stride, int n_valid,
                                              int d_valid) {
  constexpr int kChunksPerRow = kColsUsed / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  constexpr int kRowStep = kThreads / kChunksPerRow;
  if constexpr (Arch::kSm90 && kThreads % kChunksPerRow == 0 && kRowStep % 8 == 0) {
    // Thread = (row r, chunk ch), rows r + i * kRowStep: the swizzle (row & 7) is the
    // same for all i, so the shared offsets differ by constants and the global ones by
    // multiples of the row stride.
    const unsigned tid = static_cast<unsigned>(bwd_tid());
    const int r = static_cast<int>(tid / kChunksPerRow), ch = static_cast<int>(tid % kChunksPerRow);
    const bool col_ok = ch * 8 < d_valid;
    const uint16_t* src = g + r * row_stride + ch * 8;
    const uint32_t dst = s + 2u * static_cast<uint32_t>(Tile::offset(r, ch * 8));
    // Row i's source is row i-1's plus kRowStep rows, by an add the compiler cannot turn
    // back into a wide multiply; row bound as one compare against rows_left.
    const int rows_left = n_valid - r;
    const uint64_t step = static_cast<uint64_t>(row_stride) * (2 * kRowStep);
    uint64_t cur = reinterpret_cast<uint64_t>(src);
    if (Arch::kSm90 && n_valid >= kRows && d_valid >= kColsUsed) {
      // LD4: every row and column valid (uniform): no predicates, no fallback pointers.
#pragma unroll
      for (int i = 0; i < (kRows + kRowStep - 1) / kRowStep; ++i) {
        if (kRows % kRowStep == 0 || r + i * kRowStep < kRows)
          cp_async_16(dst + 2u * static_cast<uint32_t>(i * kRowStep * 64), reinterpret_cast<const uint16_t*>(cur),
                      true);
        if (i + 1 < (kRows + kRowStep - 1) / kRowStep) asm("add.u64 %0, %0, %1;\n" : "+l"(cur) : "l"(step));
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < (kRows + kRowStep - 1) / kRowStep; ++i) {
      if (kRows % kRowStep == 0 || r + i * kRowStep < kRows) {
        const bool ok = col_ok && i * kRowStep < rows_left;
        cp_async_16(dst + 2u * static_cast<uint32_t>(i * kRowStep * 64),
                    ok ? reinterpret_cast<const uint16_t*>(cur) : g, ok);
      }
      if (i + 1 < (kRows + kRowStep - 1) / kRowStep) asm("add.u64 %0, %0, %1;\n" : "+l"(cur) : "l"(step));
    }
  } else {
#pragma unroll
    for (int c0 = 0; c0 < kChunks; c0 += kThreads) {
      const int c = c0 + bwd_tid();
      if (kChunks % kThreads == 0 || c < kChunks) {
        const int r = c / kChunksPerRow, ch = c % kChunksPerRow;
        const bool ok = r < n_valid && ch * 8 < d_valid;
        const uint16_t* src = ok ? g + r * row_stride + ch * 8 : g;
        cp_async_16(s + 2u * Tile::offset(r, ch * 8), src, ok);
      }
    }
  }
}

// 4-byte cp.async; pred false writes 4 zero bytes and reads nothing.
__device__ __forceinline__ void bwd_cp_async_4(uint32_t smem_addr, const void* gmem, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(pred ? 4 : 0));
}

// Vector reduction of v into dst (V = float2 or float4: sm_90 instructions). V is a template
// parameter so that the overload, which the CUDA headers declare for sm_90 code only, is
// looked up where the Sm90a policy's code instantiates the call.
template <class V>
__device__ __forceinline__ void bwd_red_vec(float* dst, V v) {
  atomicAdd(reinterpret_cast<V*>(dst), v);
}

// Two adjacent floats: one 8-byte vector atomic on sm_90, two scalar ones before.
template <class Arch>
__device__ __forceinline__ void bwd_red_add2(float* dst, float a, float b) {
  if constexpr (Arch::kSm90) {
    bwd_red_vec(dst, make_float2(a, b));
  } else {
    atomicAdd(dst, a);
    atomicAdd(dst + 1, b);
  }
}

// cp.async completion on an mbarrier (the TMA / mbarrier operations: hopper/tma.cuh):
// sm_90 instructions, called only in the Sm90a policy's code.
// Arrives on bar (count: one per thread) once this thread's earlier cp.async have landed.
__device__ __forceinline__ void bwd_cpa_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
}  // namespace fa2
}  // namespace flashattn
