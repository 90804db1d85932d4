// The wgmma pieces that only the FA3-design forward uses, beside fa2/wgmma.cuh (same operand
// layouts and conventions):
//   descriptors and the S = Q K^T GEMM for tiles in the 128-byte swizzle (64-column blocks,
//     head dims that are multiples of 64) or the 64-byte swizzle (32-column blocks: d = 96);
//   (fa2/wgmma.cuh has the instruction shapes the forward adds: m64n112k16 for S over key
//   blocks of 112 rows, m64n96k16 and m64n192k16 with A from registers for O += P V).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "fa2/wgmma.cuh"

namespace flashattn {
namespace fa3 {

// Shared-memory matrix descriptor of an operand in tiles of kSwizzle-byte rows per column
// block (128: 64 columns, layout type 1; 64: 32 columns, layout type 2), 8-row groups
// 8 kSwizzle bytes apart (the stride byte offset). K-major: `addr` = the operand's first row
// at the k16 step's first column (the row group's base + 32 bytes per k16 step within the
// column block); `lbo` unused. MN-major: `addr` = the k16 step's first row at the first
// column block; `lbo` = the distance of the next column block. As fa2::wg_desc (which is
// the 128-byte case), every 8-row group's base must be aligned to 8 kSwizzle bytes.
template <int kSwizzle>
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo = 16) {
  static_assert(kSwizzle == 128 || kSwizzle == 64, "128- or 64-byte swizzle");
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>(8 * kSwizzle >> 4) << 32) | (static_cast<uint64_t>(kSwizzle == 128 ? 1 : 2) << 62);
}

// S (64 x 8 NT per warpgroup, fp32) = A B^T over K (a multiple of 16), both operands K-major
// in kSwizzle tiles: a0 = the warpgroup's first row of A (kRA-row column blocks), b0 = B's
// first row (kRB-row column blocks). A k16 step advances a descriptor by 32 bytes within a
// column block and by the block's size across blocks. Issued, not waited for.
template <typename T, int NT, int K, int kRA, int kRB, int kSwizzle>
__device__ __forceinline__ void gemm_s(float (&acc)[1][NT][4], uint32_t a0, uint32_t b0) {
  constexpr int kStepsPerBlock = kSwizzle / 32;
  const uint64_t da = wg_desc<kSwizzle>(a0), db = wg_desc<kSwizzle>(b0);
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    const int blk = kk / kStepsPerBlock, step = kk % kStepsPerBlock;
    const uint64_t a = da + static_cast<uint64_t>(blk * (kRA * kSwizzle / 16) + step * 2);
    const uint64_t b = db + static_cast<uint64_t>(blk * (kRB * kSwizzle / 16) + step * 2);
    if (kk == 0) fa2::wg_mma_ss<T, NT * 8, false, 0>(acc, a, b);
    else fa2::wg_mma_ss<T, NT * 8, true, 0>(acc, a, b);
  }
}

}  // namespace fa3
}  // namespace flashattn
