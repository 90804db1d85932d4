// Split tiles of the fp32 kernels: shared tiles that hold 3xTF32 operands already split
// (mma.cuh's split, once per element per CTA), laid out so that the products load both
// halves of a fragment in 16-byte accesses that are the mma's operand registers as they
// are, and spend no instruction on the split. Three layouts, all filled from an fp32
// staging tile (tile_io.cuh's load_tile) by every thread of the CTA; pitches in 4-byte
// words (traits.h):
// - B with k along its rows (K of Q K^T: element (n, k)): pair k / 2 of row n, elements
//   k and k + 1, at word n * pitch + 2k as {big(k), big(k + 1), small(k), small(k + 1)},
//   a lane's b0, b1 of both halves (pair_pitch).
// - B with k down its columns (V of P V: element (k, n), k = key): pair k / 2 of column
//   n, the same 4 words, at word (k / 2) * pitch + 4n (pair_row_pitch).
// - A (Q of Q K^T: element (m, k)), in fragments of 16 rows: rows m and m + 8 (m % 16 < 8)
//   share a tile row, m / 16 * 8 + m % 8, where pair k / 2 takes 8 words at 4k: the big
//   terms of a0..a3 ((m, k), (m + 8, k), (m, k + 1), (m + 8, k + 1)), then the small ones;
//   in odd tile rows the small ones first (a_pitch: the rows are unpadded, and this puts
//   the two rows of a phase's lanes 4 banks apart).
#pragma once
#include <stdint.h>

#include "fp32/mma.cuh"

namespace flashattn {
namespace fp32 {

__device__ __forceinline__ uint4 split_pair(float lo, float hi) {
  const Split a = split(lo), b = split(hi);
  return make_uint4(a.big, b.big, a.small, b.small);
}

// Splits the staging tile src [ROWS x W] (row pitch SP floats) into a B split tile dst with
// k along its rows (pitch DP words). The caller synchronizes before and after.
template <int ROWS, int W, int SP, int DP, int kThreads>
__device__ __forceinline__ void split_rows(uint32_t* dst, const float* src) {
#pragma unroll 2
  for (int e = threadIdx.x; e < ROWS * W / 4; e += kThreads) {
    const int r = e / (W / 4), c = 4 * (e % (W / 4));
    const float4 x = *reinterpret_cast<const float4*>(src + r * SP + c);
    uint4* d = reinterpret_cast<uint4*>(dst + r * DP + 2 * c);
    d[0] = split_pair(x.x, x.y);
    d[1] = split_pair(x.z, x.w);
  }
}

// Splits the staging tile src [ROWS x W] (ROWS a multiple of 16) into the A split tile
// dst (pitch DP words), whose first tile row holds src's row 0.
template <int ROWS, int W, int SP, int DP, int kThreads>
__device__ __forceinline__ void split_a_rows(uint32_t* dst, const float* src) {
#pragma unroll 2
  for (int e = threadIdx.x; e < ROWS / 2 * W / 4; e += kThreads) {
    const int tr = e / (W / 4), c = 4 * (e % (W / 4)), r = tr / 8 * 16 + tr % 8;
    const float4 x = *reinterpret_cast<const float4*>(src + r * SP + c),
                 y = *reinterpret_cast<const float4*>(src + (r + 8) * SP + c);
    const Split s[8] = {split(x.x), split(y.x), split(x.y), split(y.y), split(x.z), split(y.z), split(x.w), split(y.w)};
    uint4* d = reinterpret_cast<uint4*>(dst + tr * DP + 4 * c);
    const int odd = tr & 1;
    d[odd] = make_uint4(s[0].big, s[1].big, s[2].big, s[3].big);
    d[1 - odd] = make_uint4(s[0].small, s[1].small, s[2].small, s[3].small);
    d[2 + odd] = make_uint4(s[4].big, s[5].big, s[6].big, s[7].big);
    d[3 - odd] = make_uint4(s[4].small, s[5].small, s[6].small, s[7].small);
  }
}

// Splits the staging tile src [ROWS x W] (row pitch SP floats; k = row) into a B split
// tile dst with k down its columns (pitch DP words).
template <int ROWS, int W, int SP, int DP, int kThreads>
__device__ __forceinline__ void split_columns(uint32_t* dst, const float* src) {
#pragma unroll 2
  for (int e = threadIdx.x; e < ROWS / 2 * W / 4; e += kThreads) {
    const int u = e / (W / 4), c = 4 * (e % (W / 4));
    const float4 x = *reinterpret_cast<const float4*>(src + 2 * u * SP + c),
                 y = *reinterpret_cast<const float4*>(src + (2 * u + 1) * SP + c);
    uint4* d = reinterpret_cast<uint4*>(dst + u * DP + 4 * c);
    d[0] = split_pair(x.x, y.x);
    d[1] = split_pair(x.y, y.y);
    d[2] = split_pair(x.z, y.z);
    d[3] = split_pair(x.w, y.w);
  }
}

__device__ __forceinline__ uint4 load_quad(const uint32_t* at) { return *reinterpret_cast<const uint4*>(at); }

// The A fragment of rows [m0, m0 + 16) (m0 a multiple of 16) and k-step [k0, k0 + 8) of an
// A split tile (pitch words).
__device__ __forceinline__ void load_a_split(Split (&f)[4], const uint32_t* a, int pitch, int m0, int k0) {
  const int odd = lane_g() & 1;  // m0 / 2 is even
  const uint32_t* at = a + (m0 / 2 + lane_g()) * pitch + 4 * k0 + 8 * lane_t();
  const uint4 big = load_quad(at + 4 * odd), small = load_quad(at + 4 - 4 * odd);
  f[0] = Split{big.x, small.x};
  f[1] = Split{big.y, small.y};
  f[2] = Split{big.z, small.z};
  f[3] = Split{big.w, small.w};
}

// The B fragment of k-step [k0, k0 + 8) and columns [n0, n0 + 8) of the matrix B[k][n] held
// as a split tile: kKMajor, element (k, n) at row n of a tile with k along its rows (K for
// Q K^T); else with k down its columns (V for P V).
template <bool kKMajor>
__device__ __forceinline__ void load_b_split(Split (&f)[2], const uint32_t* b, int pitch, int k0, int n0) {
  const int n = n0 + lane_g(), u = k0 / 2 + lane_t();
  const uint4 x = load_quad(kKMajor ? b + n * pitch + 4 * u : b + u * pitch + 4 * n);
  f[0] = Split{x.x, x.z};
  f[1] = Split{x.y, x.w};
}
// The same fragments of a B split tile with k down its columns, read at fixed offsets
// from the lane's base v_lane = b + lane_t() * pitch + 4 * lane_g() (k0 and n0 known at
// compile time: one instruction a load, no address arithmetic).
__device__ __forceinline__ void load_b_split_rows(Split (&f)[2], const uint32_t* v_lane, int pitch, int k0, int n0) {
  const uint4 x = load_quad(v_lane + k0 / 2 * pitch + 4 * n0);
  f[0] = Split{x.x, x.z};
  f[1] = Split{x.y, x.w};
}

// c[NT][4] += A[m0 .. m0+16][0 .. kdim) B[0 .. kdim)[n0 .. n0 + 8 NT) for one warp: A an A
// split tile (kASplit), else an fp32 tile at a[m * lda + k] split as it is read (mma.cuh's
// load_a); B as load_b_split<kBKMajor> reads it; kdim a multiple of 8.
template <bool kBKMajor, bool kASplit, int NT>
__device__ __forceinline__ void warp_gemm_split(float (&c)[NT][4], const uint32_t* a, int lda, const uint32_t* b,
                                                int ldb, int m0, int n0, int kdim) {
#pragma unroll 2
  for (int k0 = 0; k0 < kdim; k0 += 8) {
    Split af[4];
    if constexpr (kASplit) load_a_split(af, a, lda, m0, k0);
    else load_a<false>(af, reinterpret_cast<const float*>(a), lda, m0, k0);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      Split bf[2];
      load_b_split<kBKMajor>(bf, b, ldb, k0, n0 + 8 * n);
      mma3(c[n], af, bf);
    }
  }
}

}  // namespace fp32
}  // namespace flashattn
