// Where the FA3-design backward's results leave the registers of a consumer warpgroup:
// dS^T of a step into shared memory (the dQ GEMM's operand), the step's dQ piece into its
// shared-memory staging buffer, and at the end the CTA's dK (scaled) and dV to the outputs.
#pragma once
#include <stdint.h>

#include "common/params.h"
#include "fa2/mma.cuh"
#include "fa3/bwd_schedule.cuh"
#include "hopper/tma.cuh"

namespace flashattn {
namespace fa3 {

// dS^T (16-bit A fragments of the dK GEMM, hopper::pack_a's layout) into the dS^T tile
// (kBlockN key rows x kBlockM query columns) in the layout of a TMA load with the 128-byte
// swizzle: 64-column block cb at cb kBlockN 128 bytes, row r's 16-byte chunk c at c ^ (r % 8)
// (r % 8 = g here). rows = this warpgroup's first key row; chunk0 = the 16-byte chunk (8
// query columns) of its first query (kSplitD: each warpgroup holds half the queries). The
// kSplitD kernel stores P^T the same way.
template <class Cfg, int KK>
__device__ __forceinline__ void bwd_store_ds(uint32_t sds, int rows, const uint32_t (&ds)[KK][4], int warp, int g,
                                             int t, int chunk0 = 0) {
#pragma unroll
  for (int nt = 0; nt < 2 * KK; ++nt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = rows + warp * 16 + g + hh * 8, c = chunk0 + nt;
      const uint32_t a =
          sds + static_cast<uint32_t>((c / 8) * Cfg::kBlockN * 128 + r * 128 + (((c % 8) ^ g) << 4) + t * 4);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(ds[nt / 2][(nt % 2) * 2 + hh]) : "memory");
    }
}

// kDqTransposed: the same fragments into the dS tile, query-major (the K-major B operand of
// the dQ^T GEMM: kBlockM query rows x kBlockN key columns, 64-key column block cb at cb
// kBlockM 128 bytes, row q's 16-byte chunk c (keys 8 c ..) at c ^ (q % 8)), with
// stmatrix.trans: fragment kk's four 8 x 8 matrices (keys 0-7 / 8-15 of the warp's 16 x
// queries 16 kk + 0-7 / 8-15, in pack_a's order) stored transposed, lane 8 i + j giving the
// address of row j (a query, 8 keys in one chunk) of matrix i. The 8 rows of a matrix land
// in 8 different chunks: every bank once.
template <class Cfg, int KK>
__device__ __forceinline__ void bwd_store_ds_rows(uint32_t sds, int cw, const uint32_t (&ds)[KK][4], int warp,
                                                  int lane) {
  const int i = lane / 8, j = lane % 8;
  const int chunk = 2 * warp + i % 2;  // the 8 keys of matrix i within the warpgroup's 64
  const uint32_t col = sds + static_cast<uint32_t>(cw * Cfg::kBlockM * 128 + ((chunk ^ j) << 4));
#pragma unroll
  for (int kk = 0; kk < KK; ++kk) {
    const int q = 16 * kk + 8 * (i / 2) + j;  // q % 8 = j
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                     col + static_cast<uint32_t>(q * 128)),
                 "r"(ds[kk][0]), "r"(ds[kk][1]), "r"(ds[kk][2]), "r"(ds[kk][3])
                 : "memory");
  }
}

// acc (the step's queries 16 warp + g (+ 8) x the piece's columns 8 nt + 2t (+ 1); NT = 8, or
// 4 for d = 96's narrow piece) into the dQ staging buffer sdq in the layout of the dQ map's
// boxes (bwd_reduce_dq): columns 32 b .. in box b (kDqBoxBytes apart), row r at r 128 bytes,
// its 16-byte chunk c at c ^ (r % 8) (r % 8 = g). A warp's 8-byte stores go out by half-warp
// (lanes g < 4, g >= 4), each best as 16 different 8-byte slots of one 128-byte row span: in
// one store the lanes with t >= 2 take tile nt ^ 2 of the same box (chunk 2 ((nt ^ 2) % 4) + 1
// against the others' 2 (nt % 4), both then XOR g: the other four chunks of the row span),
// so every bank is hit once per half-warp. With every lane on tile nt the two groups of t
// shared four chunks: a 2-way conflict, twice the wavefronts (ncu, H100). Rows at or past
// rows_left (queries past len_q) are stored as 0: the reduce-add writes them into the next
// sequence's accumulator rows, and they hold dS K of zero-filled dO rows, which NaN or Inf
// values can make NaN.
template <class Cfg, int NT>
__device__ __forceinline__ void bwd_stage_dq(uint32_t sdq, const float (&acc)[1][NT][4], int rows_left, int warp, int g,
                                             int t) {
  static_assert(NT % 4 == 0, "whole 32-column boxes");
  const bool hi = t >= 2;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = warp * 16 + g + hh * 8;
    const bool keep = r < rows_left;
    const uint32_t row = sdq + static_cast<uint32_t>(r * 128 + (t & 1) * 8);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int ntl = hi ? nt ^ 2 : nt;  // the tile this lane stores
      const uint32_t a =
          row + static_cast<uint32_t>((nt / 4) * Cfg::kDqBoxBytes + (((2 * (ntl % 4) + (t >> 1)) ^ g) << 4));
      const float x = hi ? acc[0][nt ^ 2][2 * hh] : acc[0][nt][2 * hh];
      const float y = hi ? acc[0][nt ^ 2][2 * hh + 1] : acc[0][nt][2 * hh + 1];
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(a), "f"(keep ? x : 0.f), "f"(keep ? y : 0.f) : "memory");
    }
  }
}

// kDqTransposed: dQ^T (the warpgroup's 64 head-dim columns 16 warp + g (+ 8) x the step's
// queries 8 nt + 2t (+ 1)) into the staging buffer sdq in the layout of bwd_stage_dq: column
// m in box m / 32 (kDqBoxBytes apart), query q at q 128 bytes, its 16-byte chunk (m % 32) / 4
// at that XOR (q % 8). One 4-byte store per value: in each, the lanes' 8 columns (two chunks)
// by 4 rows 2t + (0 or 1) apart take 8 different chunks, every bank once. q % 8 is 2t + e
// for every n8 tile, so a thread's stores are four addresses plus 1024 nt bytes (the
// instruction's offset). Queries at or past rows_left are stored as 0, as in bwd_stage_dq
// (a step's last tile only: the other steps store without the test).
template <class Cfg, int NT, bool kWhole>
__device__ __forceinline__ void bwd_stage_dq_t_rows(uint32_t sdq, const float (&acc)[1][NT][4], int rows_left, int warp,
                                                    int g, int t) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const uint32_t m = static_cast<uint32_t>(warp * 16 + g + hh * 8);
    const uint32_t box = sdq + (m / 32) * Cfg::kDqBoxBytes + (m % 4) * 4, chunk = (m % 32) / 4;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const uint32_t r = static_cast<uint32_t>(2 * t + e);
      const uint32_t a = box + r * 128 + ((chunk ^ r) << 4);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float x = acc[0][nt][2 * hh + e];
        const float v = kWhole || nt * 8 + 2 * t + e < rows_left ? x : 0.f;
        asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a + static_cast<uint32_t>(nt * 1024)), "f"(v) : "memory");
      }
    }
  }
}
template <class Cfg, int NT>
__device__ __forceinline__ void bwd_stage_dq_t(uint32_t sdq, const float (&acc)[1][NT][4], int rows_left, int warp,
                                               int g, int t) {
  if (rows_left >= NT * 8) bwd_stage_dq_t_rows<Cfg, NT, true>(sdq, acc, rows_left, warp, g, t);
  else bwd_stage_dq_t_rows<Cfg, NT, false>(sdq, acc, rows_left, warp, g, t);
}

// The copy of the gradients (BwdMaps::grads_by_copy): acc * scale (the warpgroup's keys
// rows + 16 warp + g (+ 8) of the CTA's block x columns col0 + 8 nv + 2t (+ 1)), rounded to T,
// into the K or V tile at tile (done with by then), in the layout of the tensor maps' boxes
// (hopper::swizzled_chunk, kBlockN rows a column block; as the forward's O). Each store's 32
// lanes hit 32 different banks.
template <class Cfg, typename T, int NV>
__device__ __forceinline__ void bwd_stage_grad(uint32_t tile, int rows, int col0, const float (&acc)[1][NV][4],
                                               float scale, int warp, int g, int t) {
#pragma unroll
  for (int nv = 0; nv < NV; ++nv)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const uint32_t a =
          tile + hopper::swizzled_chunk<Cfg::kSwizzle, Cfg::kBlockN>(rows + warp * 16 + g + hh * 8, col0 / 8 + nv) +
          t * 4;
      const uint32_t v = fa2::pack2<T>(__fmul_rn(acc[0][nv][2 * hh], scale), __fmul_rn(acc[0][nv][2 * hh + 1], scale));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
    }
}

// acc * scale (keys key0, key0 + 8 x its 8 NV columns) into out (dK or dV of the CTA's key head, strides st), or with
// `add` (flashattn_plan_set_grad_accumulate) its fp32 sum with the value stored there, rounded once; keys past len_k
// and columns at or past `cols` (the tensor's head dim from out's first column on, a multiple of 8: whole n8 tiles)
// are skipped. The host checks that out and its strides allow 4-byte stores.
template <typename T, int NV>
__device__ __forceinline__ void bwd_store_rows(void* out, const Strides4& st, const BwdWork& w, int key0, int cols,
                                               const float (&acc)[1][NV][4], float scale, bool add, int t) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int j = key0 + hh * 8;
    if (j >= w.len_k) continue;
    T* const row = static_cast<T*>(out) + w.b * st.b + static_cast<int64_t>(j) * st.s + w.kvh * st.h;
#pragma unroll
    for (int nv = 0; nv < NV; ++nv)
      if (nv * 8 < cols)
        fa2::store_grad2<T>(row + nv * 8 + 2 * t, __fmul_rn(acc[0][nv][2 * hh], scale),
                            __fmul_rn(acc[0][nv][2 * hh + 1], scale), add);
  }
}

}  // namespace fa3
}  // namespace flashattn
