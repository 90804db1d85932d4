// Tile loads of the FA2-design forward kernel (fwd_kernel.cuh): Q, K, V and the bias tile by
// cp.async into shared memory.
#pragma once
#include <stdint.h>

#include "common/params.h"
#include "fa2/mma.cuh"

namespace flashattn {
namespace fa2 {

// Copies a [kRows x kCols] tile (row stride in elements) into a SwizzledTile<kRows, kCols>
// with cp.async; rows >= rows_valid and 8-column chunks >= chunks_valid are zero-filled.
// Thread tid owns chunk (tid % 8) of every 64-column block in rows tid/8 + k*(kThreads/8),
// so the swizzle and the global address advance by constants.
template <int kRows, int kCols, int kThreads, typename T>
__device__ __forceinline__ void load_tile_async(uint32_t s_tile, const T* g, int64_t row_stride, int rows_valid,
                                                int chunks_valid, const T* safe, int tid) {
  constexpr int kRowStep = kThreads / 8;
  static_assert(kRows % kRowStep == 0 && kCols % 64 == 0, "tile loader shape");
  const int r0 = tid >> 3, c0 = tid & 7;
  const uint32_t s_lane = s_tile + 2u * static_cast<uint32_t>(r0 * 64 + ((c0 ^ (r0 & 7)) << 3));
  const T* gp = g + r0 * row_stride + c0 * 8;
  const int64_t step = kRowStep * row_stride;
#pragma unroll
  for (int it = 0; it < kRows / kRowStep; ++it) {
    const bool row_ok = r0 + it * kRowStep < rows_valid;
#pragma unroll
    for (int cb = 0; cb < kCols / 64; ++cb) {
      const bool pred = row_ok && cb * 8 + c0 < chunks_valid;
      cp_async_16(s_lane + 2u * static_cast<uint32_t>(cb * kRows * 64 + it * kRowStep * 64), pred ? gp + cb * 64 : safe,
                  pred);
    }
    gp += step;
  }
}

// Prologue: the Q tile and KV tile n_block's K tile by cp.async, one group.
template <class Cfg, typename T>
__device__ __forceinline__ void fwd_load_q_k(const AttnParams& p, T* sQ, T* sK, const T* gQ, const T* gK,
                                             const T* q_base, const T* k_base, int n_block, int rows_q, int len_k,
                                             int dq_chunks, int tid) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kThreads = Cfg::kThreads;
  load_tile_async<kBlockM, Cfg::kDS, kThreads>(smem_u32(sQ), gQ, p.q_stride.s, rows_q, dq_chunks, q_base, tid);
  load_tile_async<kBlockN, Cfg::kDS, kThreads>(smem_u32(sK),
                                               gK + static_cast<int64_t>(n_block) * kBlockN * p.k_stride.s,
                                               p.k_stride.s, len_k - n_block * kBlockN, dq_chunks, k_base, tid);
  cp_async_commit();
}

// The bias tile of q block m0 and KV tile n0 (kExtras with bias_smem: k stride 1, 16-byte
// aligned rows) into sB by cp.async, next to V; rows and columns past the sequences zero.
template <class Cfg, typename T>
__device__ __forceinline__ void fwd_load_bias_tile(const AttnParams& p, T* sB, const T* bias_base, int m0, int n0,
                                                   int rows_q, int len_k, int tid) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kThreads = Cfg::kThreads;
  constexpr int kChunks = kBlockN / 8;
  const T* gB = bias_base + static_cast<int64_t>(m0) * p.bias_stride[2] + n0;
  for (int idx = tid; idx < kBlockM * kChunks; idx += kThreads) {
    const int row = idx / kChunks, ch = idx - row * kChunks;
    int valid = row < rows_q ? min(8, len_k - n0 - ch * 8) : 0;
    valid = valid < 0 ? 0 : valid;
    const T* src = valid > 0 ? gB + row * p.bias_stride[2] + ch * 8 : bias_base;
    cp_async_16_bytes(smem_u32(sB + row * Cfg::kBiasStride + ch * 8), src, valid * 2);
  }
}

}  // namespace fa2
}  // namespace flashattn
