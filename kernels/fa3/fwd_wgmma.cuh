// The wgmma shapes that only the FA3-design forward's wider head dims use, as further
// specializations of fa2/wgmma.cuh's templates (same operand layouts and conventions):
//   m64n112k16, both operands in shared memory, K-major: S = Q K^T over key blocks of 112
//     rows (head_dim_qk 192, fa3/fwd_traits.h);
//   m64n192k16, A from registers, B MN-major: O += P V at head_dim_v 192.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "fa2/wgmma.cuh"

namespace flashattn {
namespace fa2 {

// The four accumulator registers of n8 tile j, as asm operands with constraint C.
#define FA3_WG_TILE(C, j) C(d[0][j][0]), C(d[0][j][1]), C(d[0][j][2]), C(d[0][j][3])
#define FA3_WG_OPS_112(C)                                                                                      \
  FA3_WG_TILE(C, 0), FA3_WG_TILE(C, 1), FA3_WG_TILE(C, 2), FA3_WG_TILE(C, 3), FA3_WG_TILE(C, 4),               \
      FA3_WG_TILE(C, 5), FA3_WG_TILE(C, 6), FA3_WG_TILE(C, 7), FA3_WG_TILE(C, 8), FA3_WG_TILE(C, 9),           \
      FA3_WG_TILE(C, 10), FA3_WG_TILE(C, 11), FA3_WG_TILE(C, 12), FA3_WG_TILE(C, 13)
#define FA3_WG_OPS_192(C)                                                                                      \
  FA3_WG_OPS_112(C), FA3_WG_TILE(C, 14), FA3_WG_TILE(C, 15), FA3_WG_TILE(C, 16), FA3_WG_TILE(C, 17),           \
      FA3_WG_TILE(C, 18), FA3_WG_TILE(C, 19), FA3_WG_TILE(C, 20), FA3_WG_TILE(C, 21), FA3_WG_TILE(C, 22),      \
      FA3_WG_TILE(C, 23)
#define FA3_WG_REGS_112                                                                                     \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27," \
  "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,"   \
  "%54,%55}"
#define FA3_WG_REGS_192                                                                                      \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"  \
  "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,"    \
  "%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"    \
  "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95}"

// S tile: 56 accumulator registers (%0..%55), then the descriptors %56 (A) and %57 (B); the
// first k16 step of a GEMM writes d without reading it (scale-d 0, constraint "=f").
#define FA3_WG_SS_112(CTY, TY, ACC, C, SCALE)                                                                    \
  template <>                                                                                                    \
  __device__ __forceinline__ void wg_mma_ss<CTY, 112, ACC, 0>(float(&d)[1][14][4], uint64_t da, uint64_t db) {   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\nwgmma.mma_async.sync.aligned.m64n112k16.f32." TY \
                 "." TY " " FA3_WG_REGS_112 ", %56, %57, p, 1, 1, 0, 0;\n}\n"                                    \
                 : FA3_WG_OPS_112(C)                                                                             \
                 : "l"(da), "l"(db));                                                                            \
  }
FA3_WG_SS_112(__nv_bfloat16, "bf16", false, "=f", "0")
FA3_WG_SS_112(__nv_bfloat16, "bf16", true, "+f", "1")
FA3_WG_SS_112(__half, "f16", false, "=f", "0")
FA3_WG_SS_112(__half, "f16", true, "+f", "1")
#undef FA3_WG_SS_112

// O tile at head_dim_v 192: 96 accumulator registers (%0..%95), the A fragment %96..%99,
// the descriptor of B (MN-major: transpose flag 1) %100.
#define FA3_WG_RS_192(CTY, TY)                                                                                    \
  template <>                                                                                                     \
  __device__ __forceinline__ void wg_mma_rs<CTY, 192>(float(&d)[1][24][4], const uint32_t(&a)[4], uint64_t db) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned.m64n192k16.f32." TY "." TY  \
                 " " FA3_WG_REGS_192 ", {%96, %97, %98, %99}, %100, p, 1, 1, 1;\n}\n"                             \
                 : FA3_WG_OPS_192("+f")                                                                           \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));                                          \
  }
FA3_WG_RS_192(__nv_bfloat16, "bf16")
FA3_WG_RS_192(__half, "f16")
#undef FA3_WG_RS_192
#undef FA3_WG_REGS_192
#undef FA3_WG_REGS_112
#undef FA3_WG_OPS_192
#undef FA3_WG_OPS_112
#undef FA3_WG_TILE

}  // namespace fa2
}  // namespace flashattn
