// Warpgroup MMA (wgmma, sm_90a only) of the Hopper kernels: the generation-1 backward's
// S = Q K^T and dP = dO V^T, the fa2 forward's O += P V and every GEMM of the FA3-design
// kernels (kernels/fa3). Operands straight from swizzled shared tiles (column blocks at
// 1024-byte boundaries in the hardware's 128- or 64-byte swizzle, wg_desc) or, for A, from
// registers; fp32 accumulators in registers in the layout of mma.sync's C fragments
// (warp w of the warpgroup owns rows 16 (w % 4) .. + 15; per n8 tile j the thread holds
// {(g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)} = d[0][j][0..3], g = lane / 4,
// t = lane % 4), so the elementwise code after the GEMM is the mma.sync code's.
// Only sm_90a code calls these (arch.h's Sm90a policy, the fa3 instances), the one target
// that has the instructions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace flashattn {
namespace fa2 {

// Shared-memory matrix descriptor of an operand in tiles of kSwizzle-byte rows per column
// block, the copy engine's swizzle of that width: 128 (64 16-bit columns, layout type 1: the
// SwizzledTile of the fa2 kernels) or 64 (32 columns, layout type 2: the fa3 kernels at
// d = 96). 8-row groups are 8 kSwizzle bytes apart (the stride byte offset).
// K-major (rows = M or N, columns = K): `addr` = the operand's first row at the k16 step's
//   first column: the row's 8-row group base + kSwizzle * (row % 8) + 32 * (k16 step within
//   the column block); `lbo` is unused.
// MN-major (rows = K, columns = M or N; the wgmma's transpose flag set): `addr` = the k16
//   step's first row (a multiple of 8) at the operand's first column block; `lbo` = the
//   distance of the next column block (the tile's rows x kSwizzle bytes).
// The hardware applies the swizzle to the absolute address bits, so the base of every 8-row
// group must be aligned to 8 kSwizzle bytes (the tiles' column blocks are 1024-byte aligned).
template <int kSwizzle = 128>
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo = 16) {
  static_assert(kSwizzle == 128 || kSwizzle == 64, "128- or 64-byte swizzle");
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>(8 * kSwizzle >> 4) << 32) | (static_cast<uint64_t>(kSwizzle == 128 ? 1 : 2) << 62);
}
// Before the first wgmma of a batch: orders the warpgroup's earlier register and shared
// accesses before the asynchronous GEMMs.
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Wait until at most N committed batches are still in flight.
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins an accumulator register after wg_wait: without it the compiler could move a use of
// the register above the wait (it sees the value as produced by the wgmma statement).
template <int NT>
__device__ __forceinline__ void wg_hold(float (&d)[1][NT][4]) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[0][j][e])::"memory");
}

// d (64 x N per warpgroup, fp32) = (kAcc ? d : 0) + A (64 x 16) * B (16 x N), A and B in
// shared memory (descriptors da, db); kTr = the transpose flags: 0 both K-major, 1 B MN-major,
// 2 A MN-major, 3 both MN-major.
template <typename T, int N, bool kAcc, int kTr = 0>
__device__ __forceinline__ void wg_mma_ss(float (&d)[1][N / 8][4], uint64_t da, uint64_t db);

// The specializations: N / 2 accumulator registers per thread (operand lists FA_WG_OPS_<N>,
// register lists FA_WG_REGS_<N>, descriptor operands %<N/2> and %<N/2 + 1>); C is the
// accumulator constraint ("=f" for the first k16 step, which does not read d: scale-d false),
// TR the two transpose flags (kTr).
#define FA_WG_REGS_32 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define FA_WG_DA_32 "%16"
#define FA_WG_DB_32 "%17"
#define FA_WG_OPS_32(C)                                                                                        \
  C(d[0][0][0]), C(d[0][0][1]), C(d[0][0][2]), C(d[0][0][3]), C(d[0][1][0]), C(d[0][1][1]), C(d[0][1][2]),     \
      C(d[0][1][3]), C(d[0][2][0]), C(d[0][2][1]), C(d[0][2][2]), C(d[0][2][3]), C(d[0][3][0]), C(d[0][3][1]), \
      C(d[0][3][2]), C(d[0][3][3])
#define FA_WG_REGS_64                                                                                                \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%" \
  "30,%31}"
#define FA_WG_DA_64 "%32"
#define FA_WG_DB_64 "%33"
#define FA_WG_OPS_64(C)                                                                                        \
  FA_WG_OPS_32(C), C(d[0][4][0]), C(d[0][4][1]), C(d[0][4][2]), C(d[0][4][3]), C(d[0][5][0]), C(d[0][5][1]),   \
      C(d[0][5][2]), C(d[0][5][3]), C(d[0][6][0]), C(d[0][6][1]), C(d[0][6][2]), C(d[0][6][3]), C(d[0][7][0]), \
      C(d[0][7][1]), C(d[0][7][2]), C(d[0][7][3])
#define FA_WG_REGS_128                                                                                               \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%" \
  "30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%" \
  "58,%59,%60,%61,%62,%63}"
#define FA_WG_DA_128 "%64"
#define FA_WG_DB_128 "%65"
#define FA_WG_OPS_128(C)                                                                                              \
  FA_WG_OPS_64(C), C(d[0][8][0]), C(d[0][8][1]), C(d[0][8][2]), C(d[0][8][3]), C(d[0][9][0]), C(d[0][9][1]),          \
      C(d[0][9][2]), C(d[0][9][3]), C(d[0][10][0]), C(d[0][10][1]), C(d[0][10][2]), C(d[0][10][3]), C(d[0][11][0]),   \
      C(d[0][11][1]), C(d[0][11][2]), C(d[0][11][3]), C(d[0][12][0]), C(d[0][12][1]), C(d[0][12][2]), C(d[0][12][3]), \
      C(d[0][13][0]), C(d[0][13][1]), C(d[0][13][2]), C(d[0][13][3]), C(d[0][14][0]), C(d[0][14][1]), C(d[0][14][2]), \
      C(d[0][14][3]), C(d[0][15][0]), C(d[0][15][1]), C(d[0][15][2]), C(d[0][15][3])
// n96, n112, n192 (the fa3 forward's O at head_dim_v 96 and 192, S over 112-key blocks; n80
// below):
// the four accumulator registers of n8 tile j as operands with constraint C.
#define FA_WG_TILE(C, j) C(d[0][j][0]), C(d[0][j][1]), C(d[0][j][2]), C(d[0][j][3])
#define FA_WG_OPS_96(C)                                                                                       \
  FA_WG_TILE(C, 0), FA_WG_TILE(C, 1), FA_WG_TILE(C, 2), FA_WG_TILE(C, 3), FA_WG_TILE(C, 4), FA_WG_TILE(C, 5), \
      FA_WG_TILE(C, 6), FA_WG_TILE(C, 7), FA_WG_TILE(C, 8), FA_WG_TILE(C, 9), FA_WG_TILE(C, 10), FA_WG_TILE(C, 11)
#define FA_WG_OPS_112(C) FA_WG_OPS_96(C), FA_WG_TILE(C, 12), FA_WG_TILE(C, 13)
#define FA_WG_OPS_192(C)                                                                                           \
  FA_WG_OPS_112(C), FA_WG_TILE(C, 14), FA_WG_TILE(C, 15), FA_WG_TILE(C, 16), FA_WG_TILE(C, 17), FA_WG_TILE(C, 18), \
      FA_WG_TILE(C, 19), FA_WG_TILE(C, 20), FA_WG_TILE(C, 21), FA_WG_TILE(C, 22), FA_WG_TILE(C, 23)
#define FA_WG_REGS_96                                                                                       \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27," \
  "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}"
#define FA_WG_REGS_112                                                                                       \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"  \
  "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53," \
  "%54,%55}"
#define FA_WG_REGS_192                                                                                       \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"  \
  "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53," \
  "%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79," \
  "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95}"
#define FA_WG_DA_112 "%56"
#define FA_WG_DB_112 "%57"
// n80 (the fa3 backward's 80-query step at d = 128: S^T, dP^T and dQ^T).
#define FA_WG_OPS_80(C)                                                                                       \
  FA_WG_TILE(C, 0), FA_WG_TILE(C, 1), FA_WG_TILE(C, 2), FA_WG_TILE(C, 3), FA_WG_TILE(C, 4), FA_WG_TILE(C, 5), \
      FA_WG_TILE(C, 6), FA_WG_TILE(C, 7), FA_WG_TILE(C, 8), FA_WG_TILE(C, 9)
#define FA_WG_REGS_80                                                                                       \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27," \
  "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39}"
#define FA_WG_DA_80 "%40"
#define FA_WG_DB_80 "%41"
#define FA_WG_REGS_256                                                                                               \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%" \
  "30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%" \
  "58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%" \
  "86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%"  \
  "111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}"
#define FA_WG_DA_256 "%128"
#define FA_WG_DB_256 "%129"
#define FA_WG_OPS_256(C)                                                                                              \
  FA_WG_OPS_128(C), C(d[0][16][0]), C(d[0][16][1]), C(d[0][16][2]), C(d[0][16][3]), C(d[0][17][0]), C(d[0][17][1]),   \
      C(d[0][17][2]), C(d[0][17][3]), C(d[0][18][0]), C(d[0][18][1]), C(d[0][18][2]), C(d[0][18][3]), C(d[0][19][0]), \
      C(d[0][19][1]), C(d[0][19][2]), C(d[0][19][3]), C(d[0][20][0]), C(d[0][20][1]), C(d[0][20][2]), C(d[0][20][3]), \
      C(d[0][21][0]), C(d[0][21][1]), C(d[0][21][2]), C(d[0][21][3]), C(d[0][22][0]), C(d[0][22][1]), C(d[0][22][2]), \
      C(d[0][22][3]), C(d[0][23][0]), C(d[0][23][1]), C(d[0][23][2]), C(d[0][23][3]), C(d[0][24][0]), C(d[0][24][1]), \
      C(d[0][24][2]), C(d[0][24][3]), C(d[0][25][0]), C(d[0][25][1]), C(d[0][25][2]), C(d[0][25][3]), C(d[0][26][0]), \
      C(d[0][26][1]), C(d[0][26][2]), C(d[0][26][3]), C(d[0][27][0]), C(d[0][27][1]), C(d[0][27][2]), C(d[0][27][3]), \
      C(d[0][28][0]), C(d[0][28][1]), C(d[0][28][2]), C(d[0][28][3]), C(d[0][29][0]), C(d[0][29][1]), C(d[0][29][2]), \
      C(d[0][29][3]), C(d[0][30][0]), C(d[0][30][1]), C(d[0][30][2]), C(d[0][30][3]), C(d[0][31][0]), C(d[0][31][1]), \
      C(d[0][31][2]), C(d[0][31][3])
#define FA_WG_MMA(CTY, TY, N, ACC, C, SCALE, KTR, TR)                                                             \
  template <>                                                                                                     \
  __device__ __forceinline__ void wg_mma_ss<CTY, N, ACC, KTR>(float(&d)[1][N / 8][4], uint64_t da, uint64_t db) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE                                                        \
                 ", 0;\n"                                                                                         \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " FA_WG_REGS_##N ", " FA_WG_DA_##N \
                 ", " FA_WG_DB_##N ", p, 1, 1, " TR ";\n}\n"                                                      \
                 : FA_WG_OPS_##N(C)                                                                               \
                 : "l"(da), "l"(db));                                                                             \
  }
#define FA_WG_MMA_N(N, KTR, TR)                                  \
  FA_WG_MMA(__nv_bfloat16, "bf16", N, false, "=f", "0", KTR, TR) \
  FA_WG_MMA(__nv_bfloat16, "bf16", N, true, "+f", "1", KTR, TR)  \
  FA_WG_MMA(__half, "f16", N, false, "=f", "0", KTR, TR)         \
  FA_WG_MMA(__half, "f16", N, true, "+f", "1", KTR, TR)
FA_WG_MMA_N(32, 0, "0, 0")
FA_WG_MMA_N(64, 0, "0, 0")
FA_WG_MMA_N(128, 0, "0, 0")
FA_WG_MMA_N(112, 0, "0, 0")
FA_WG_MMA_N(80, 0, "0, 0")
FA_WG_MMA_N(80, 2, "1, 0")
FA_WG_MMA_N(64, 1, "0, 1")
FA_WG_MMA_N(128, 1, "0, 1")
FA_WG_MMA_N(32, 3, "1, 1")
FA_WG_MMA_N(64, 3, "1, 1")
FA_WG_MMA_N(128, 3, "1, 1")
#undef FA_WG_MMA_N
#undef FA_WG_MMA

// d (64 x N per warpgroup, fp32) += A (64 x 16, registers: this warp's 16 rows in the A
// fragment layout of mma.sync m16n8k16) * B (16 x N, MN-major in shared memory, descriptor db).
// Operands: d = %0 .. %(N/2 - 1), a = the next four, db the last.
template <typename T, int N>
__device__ __forceinline__ void wg_mma_rs(float (&d)[1][N / 8][4], const uint32_t (&a)[4], uint64_t db);
#define FA_WG_RS(CTY, TY, N, A0, A1, A2, A3, DB)                                                                  \
  template <>                                                                                                     \
  __device__ __forceinline__ void wg_mma_rs<CTY, N>(float(&d)[1][N / 8][4], const uint32_t(&a)[4], uint64_t db) { \
    asm volatile(                                                                                                 \
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                                \
        "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " FA_WG_REGS_##N                            \
        ", {" A0 ", " A1 ", " A2 ", " A3 "}, " DB ", p, 1, 1, 1;\n}\n"                                            \
        : FA_WG_OPS_##N("+f")                                                                                     \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));                                                   \
  }
FA_WG_RS(__nv_bfloat16, "bf16", 64, "%32", "%33", "%34", "%35", "%36")
FA_WG_RS(__half, "f16", 64, "%32", "%33", "%34", "%35", "%36")
FA_WG_RS(__nv_bfloat16, "bf16", 128, "%64", "%65", "%66", "%67", "%68")
FA_WG_RS(__half, "f16", 128, "%64", "%65", "%66", "%67", "%68")
FA_WG_RS(__nv_bfloat16, "bf16", 96, "%48", "%49", "%50", "%51", "%52")
FA_WG_RS(__half, "f16", 96, "%48", "%49", "%50", "%51", "%52")
FA_WG_RS(__nv_bfloat16, "bf16", 192, "%96", "%97", "%98", "%99", "%100")
FA_WG_RS(__half, "f16", 192, "%96", "%97", "%98", "%99", "%100")
FA_WG_RS(__nv_bfloat16, "bf16", 256, "%128", "%129", "%130", "%131", "%132")
FA_WG_RS(__half, "f16", 256, "%128", "%129", "%130", "%131", "%132")
#undef FA_WG_RS

// One warpgroup GEMM over K (a multiple of 16) on operands in swizzled tiles (kSwA- and
// kSwB-byte rows per column block, wg_desc), issued, not waited for (wg_commit / wg_wait by
// the caller): acc (64 x 8 NT per warpgroup) (+)= A * B.
//   A: kTr & 2 clear: K-major, a0 = the warpgroup's first row of a kRA-row tile, k across its
//      column blocks; set: MN-major, a0 = the tile's first row at the warpgroup's first column
//      block, k along kRA's rows (m across column blocks kRA * kSwA bytes apart).
//   B: kTr & 1 likewise with b0, kRB and kSwB (MN-major: n across column blocks kRB * kSwB
//      bytes apart).
// A K-major operand's k16 steps advance its descriptor's start address by 32 bytes within a
// column block and by the block's size across blocks; an MN-major operand's by 16 rows (16
// kSw bytes). Descriptor units are 16 bytes; no carry leaves the 14-bit field (shared
// addresses < 256 KB). kOverwrite: the first k16 step ignores acc's value.
template <typename T, int NT, int K, int kTr, int kRA, int kRB, bool kOverwrite, int kSwA = 128, int kSwB = kSwA>
__device__ __forceinline__ void wg_gemm(float (&acc)[1][NT][4], uint32_t a0, uint32_t b0) {
  constexpr bool kAMN = (kTr & 2) != 0, kBMN = (kTr & 1) != 0;
  constexpr int kStepsA = kSwA / 32, kStepsB = kSwB / 32;  // k16 steps per column block (K-major)
  const uint64_t da = kAMN ? wg_desc<kSwA>(a0, kRA * kSwA) : wg_desc<kSwA>(a0);
  const uint64_t db = kBMN ? wg_desc<kSwB>(b0, kRB * kSwB) : wg_desc<kSwB>(b0);
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    const uint64_t a =
        da + static_cast<uint64_t>(kAMN ? kk * kSwA : (kk / kStepsA) * (kRA * kSwA / 16) + (kk % kStepsA) * 2);
    const uint64_t b =
        db + static_cast<uint64_t>(kBMN ? kk * kSwB : (kk / kStepsB) * (kRB * kSwB / 16) + (kk % kStepsB) * 2);
    if (kOverwrite && kk == 0) wg_mma_ss<T, NT * 8, false, kTr>(acc, a, b);
    else wg_mma_ss<T, NT * 8, true, kTr>(acc, a, b);
  }
}

// One warpgroup GEMM over K = 16 KK with A from registers (a[kk]: k16 step kk's fragment, as
// for wg_mma_rs) and B MN-major in its swizzled tile (b0 = the tile's first row at the first
// column block; k16 step kk = rows 16 kk.., 16 kSw bytes further; N across column blocks kRB
// kSw bytes apart), issued, not waited for: acc (64 x 8 NT per warpgroup) += A * B.
template <typename T, int NT, int KK, int kRB, int kSw = 128>
__device__ __forceinline__ void wg_gemm_rs(float (&acc)[1][NT][4], const uint32_t (&a)[KK][4], uint32_t b0) {
  const uint64_t db = wg_desc<kSw>(b0, kRB * kSw);
#pragma unroll
  for (int kk = 0; kk < KK; ++kk) wg_mma_rs<T, NT * 8>(acc, a[kk], db + static_cast<uint64_t>(kk * kSw));
}

}  // namespace fa2
}  // namespace flashattn
