// The wgmma pieces that only the FA3-design forward uses, beside fa2/wgmma.cuh (same operand
// layouts and conventions):
//   descriptors and the S = Q K^T GEMM for tiles in the 128-byte swizzle (64-column blocks,
//     head dims that are multiples of 64) or the 64-byte swizzle (32-column blocks: d = 96);
//   further specializations of fa2/wgmma.cuh's instruction templates for the forward's shapes:
//     m64n112k16, both operands in shared memory, K-major: S over key blocks of 112 rows
//     (head_dim_qk 192, fa3/fwd_traits.h);
//     m64n96k16 and m64n192k16, A from registers, B MN-major: O += P V at head_dim_v 96, 192.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "fa2/wgmma.cuh"

namespace flashattn {
namespace fa2 {

// The four accumulator registers of n8 tile j, as asm operands with constraint C.
#define FA3_WG_TILE(C, j) C(d[0][j][0]), C(d[0][j][1]), C(d[0][j][2]), C(d[0][j][3])
#define FA3_WG_OPS_96(C)                                                                                            \
  FA3_WG_TILE(C, 0), FA3_WG_TILE(C, 1), FA3_WG_TILE(C, 2), FA3_WG_TILE(C, 3), FA3_WG_TILE(C, 4), FA3_WG_TILE(C, 5), \
      FA3_WG_TILE(C, 6), FA3_WG_TILE(C, 7), FA3_WG_TILE(C, 8), FA3_WG_TILE(C, 9), FA3_WG_TILE(C, 10),               \
      FA3_WG_TILE(C, 11)
#define FA3_WG_OPS_112(C) FA3_WG_OPS_96(C), FA3_WG_TILE(C, 12), FA3_WG_TILE(C, 13)
#define FA3_WG_OPS_192(C)                                                                                 \
  FA3_WG_OPS_112(C), FA3_WG_TILE(C, 14), FA3_WG_TILE(C, 15), FA3_WG_TILE(C, 16), FA3_WG_TILE(C, 17),      \
      FA3_WG_TILE(C, 18), FA3_WG_TILE(C, 19), FA3_WG_TILE(C, 20), FA3_WG_TILE(C, 21), FA3_WG_TILE(C, 22), \
      FA3_WG_TILE(C, 23)
#define FA3_WG_REGS_96                                                                                      \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27," \
  "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}"
#define FA3_WG_REGS_112                                                                                      \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"  \
  "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53," \
  "%54,%55}"
#define FA3_WG_REGS_192                                                                                      \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"  \
  "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53," \
  "%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79," \
  "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95}"

// S tile: 56 accumulator registers (%0..%55), then the descriptors %56 (A) and %57 (B); the
// first k16 step of a GEMM writes d without reading it (scale-d 0, constraint "=f").
#define FA3_WG_SS_112(CTY, TY, ACC, C, SCALE)                                                                      \
  template <>                                                                                                      \
  __device__ __forceinline__ void wg_mma_ss<CTY, 112, ACC, 0>(float(&d)[1][14][4], uint64_t da, uint64_t db) {     \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\nwgmma.mma_async.sync.aligned.m64n112k16.f32." TY \
                 "." TY " " FA3_WG_REGS_112 ", %56, %57, p, 1, 1, 0, 0;\n}\n"                                      \
                 : FA3_WG_OPS_112(C)                                                                               \
                 : "l"(da), "l"(db));                                                                              \
  }
FA3_WG_SS_112(__nv_bfloat16, "bf16", false, "=f", "0")
FA3_WG_SS_112(__nv_bfloat16, "bf16", true, "+f", "1")
FA3_WG_SS_112(__half, "f16", false, "=f", "0")
FA3_WG_SS_112(__half, "f16", true, "+f", "1")
#undef FA3_WG_SS_112

// O tile at head_dim_v N = 96 or 192: N / 2 accumulator registers, then the A fragment (four
// operands, A0 the first) and the descriptor of B (MN-major: transpose flag 1).
#define FA3_WG_RS(CTY, TY, N, A0, A1, A2, A3, DB)                                                                    \
  template <>                                                                                                        \
  __device__ __forceinline__ void wg_mma_rs<CTY, N>(float(&d)[1][N / 8][4], const uint32_t(&a)[4], uint64_t db) {    \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY \
                 " " FA3_WG_REGS_##N ", {" A0 ", " A1 ", " A2 ", " A3 "}, " DB ", p, 1, 1, 1;\n}\n"                  \
                 : FA3_WG_OPS_##N("+f")                                                                              \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));                                             \
  }
FA3_WG_RS(__nv_bfloat16, "bf16", 96, "%48", "%49", "%50", "%51", "%52")
FA3_WG_RS(__half, "f16", 96, "%48", "%49", "%50", "%51", "%52")
FA3_WG_RS(__nv_bfloat16, "bf16", 192, "%96", "%97", "%98", "%99", "%100")
FA3_WG_RS(__half, "f16", 192, "%96", "%97", "%98", "%99", "%100")
#undef FA3_WG_RS
#undef FA3_WG_REGS_192
#undef FA3_WG_REGS_112
#undef FA3_WG_REGS_96
#undef FA3_WG_OPS_192
#undef FA3_WG_OPS_112
#undef FA3_WG_OPS_96
#undef FA3_WG_TILE

}  // namespace fa2

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
