// dQ of one step of the FA2-design backward main kernel: dQ_partial = dS K in column passes
// of the warp tile, added into the fp32 dQ workspace by bulk tensor reductions of the copy
// engine (kDqBulk), by staged 16-byte reductions (kDqStage) or by direct ones; in
// deterministic mode in ascending k-block order (the per-(sequence, head, q-block) turn).
#pragma once
#include <stdint.h>

#include "common/params.h"
#include "fa2/bwd.h"
#include "fa2/bwd_ctx.cuh"
#include "fa2/bwd_primitives.cuh"
#include "fa2/bwd_state.cuh"
#include "fa2/mma.cuh"
#include "fa2/wgmma.cuh"

namespace flashattn {
namespace fa2 {

// One block of a dQ pass: m16 tiles x 32 columns from (wq_m0, wq_n0) of the q-block at
// row r0 of head h, and this lane's place in the warp.
struct BwdDqBlk {
  float* dq_base;   // row r0 of head h in the workspace
  int64_t dq_row0;  // the sequence's first workspace row
  int64_t dq_rs;    // workspace row stride
  int r0, h, len_q, dqk, wq_m0, wq_n0;
  int warp, lane, g, t;
};

// Block mt of the pass: the warp stores its fragments into buffer mt in the
// map's 128-byte swizzle (row R at R * 128 B, 16-byte chunk c at c ^ (R & 7): the
// fragment stores hit every bank pair at most twice), makes them visible to the
// copy engine (proxy fence), and lane 0 issues one tensor reduction of the 16 x 32
// box at (column wq_n0, head h, row dq_row0 + r0 + wq_m0 + 16 mt); the engine
// skips columns >= head_dim_qk and rows past the accumulator. Rows past len_q
// would land in the next sequence's rows: in the last block they are stored as 0
// (they hold dS K of zero-filled Q rows, which NaN or Inf keys can make NaN).
// Both blocks of the pass are stored before one fence and issued together; the
// buffers are refilled once the previous pass's group is done reading them.
template <class Arch, class Tr, typename T, int kMTq, int kNTqp, int kBlk>
__device__ __forceinline__ void bwd_dq_bulk(const BwdKernel<Arch, Tr, T>& k, const float (&acc_dq)[kMTq][kNTqp][4],
                                            const BwdDqBlk& q, int blk) {
  const uint32_t s_base = k.s_base;
  const int warp = q.warp, lane = q.lane, g = q.g, t = q.t;
  const int len_q = q.len_q, r0 = q.r0, wq_m0 = q.wq_m0, wq_n0 = q.wq_n0, h = q.h;
  const int64_t dq_row0 = q.dq_row0;
  const uint32_t bufs = (s_base + Tr::kOffStg + 1023u) & ~1023u;  // the swizzle needs 1024-byte alignment
  const uint32_t buf0 = bufs + static_cast<uint32_t>((warp * 2 + blk) * Tr::kBulkBufBytes);
  const uint32_t lane_o = static_cast<uint32_t>(g * 128 + ((((t >> 1) ^ g) << 4) | ((t & 1) << 3)));
  const int rows_left = len_q - r0 - wq_m0;
  const int row0 = static_cast<int>(dq_row0 + r0 + wq_m0);
  const uint64_t map = reinterpret_cast<uint64_t>(&k.dq_map);
  static_assert(kMTq * kBlk <= 2, "one buffer per m16 block of the pass");
  if (lane == 0 && blk == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < kMTq; ++mt) {
    const uint32_t buf = buf0 + static_cast<uint32_t>(mt * Tr::kBulkBufBytes);
    const bool partial = mt * 16 + 16 > rows_left;  // uniform
#pragma unroll
    for (int nt = 0; nt < kNTqp; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float x = acc_dq[mt][nt][2 * hf], y = acc_dq[mt][nt][2 * hf + 1];
        if (partial && mt * 16 + g + 8 * hf >= rows_left) x = y = 0.f;
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(
                         buf + ((lane_o ^ static_cast<uint32_t>(nt << 5)) + static_cast<uint32_t>(hf * 1024))),
                     "f"(x), "f"(y)
                     : "memory");
      }
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncwarp();
  if (lane == 0) {
#pragma unroll
    for (int mt = 0; mt < kMTq; ++mt)
      if (mt * 16 < rows_left)
        asm volatile(
            "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                map),
            "r"(buf0 + static_cast<uint32_t>(mt * Tr::kBulkBufBytes)), "r"(wq_n0), "r"(h), "r"(row0 + mt * 16)
            : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
  }
}

// Stage one m16 x 32 block of the warp's pass tile at a time: row R at R * 128 B,
// 16-byte chunk c stored at c ^ (2 * (R & 3)) (conflict-free for both the 8-byte
// fragment stores and the row-wise 16-byte reads), then 4 reductions of 4 rows each.
template <int kMTq, int kNTqp>
__device__ __forceinline__ void bwd_dq_staged(const float (&acc_dq)[kMTq][kNTqp][4], const BwdDqBlk& q, uint32_t stg) {
  const int lane = q.lane, g = q.g, t = q.t;
  const int len_q = q.len_q, r0 = q.r0, wq_m0 = q.wq_m0, wq_n0 = q.wq_n0, dqk = q.dqk;
  float* const dq_base = q.dq_base;
  const int64_t dq_rs = q.dq_rs;
  // This lane's row (lane / 8 + 4 i + 16 mt) and 4 columns as one base pointer plus
  // 4-row steps, and the row bound as one compare per reduction.
  const int row_l = lane >> 3;
  float* const lane_dq = dq_base + static_cast<int64_t>(wq_m0 + row_l) * dq_rs + wq_n0 + (lane & 7) * 4;
  const int64_t step4 = 4 * dq_rs;
  const int rows_left = len_q - r0 - wq_m0 - row_l;  // row 4 i + 16 mt exists iff < rows_left
  const bool col_ok = wq_n0 + (lane & 7) * 4 < dqk;
  // The global address of reduction k (row 4 k of this lane, k = 4 mt + i) is the
  // previous one plus 4 rows, by an add the compiler cannot re-associate into a wide
  // multiply; the reduction is predicated (no branch to sink address math into).
  uint64_t red_ptr = 0;
  asm("cvta.to.global.u64 %0, %1;\n" : "=l"(red_ptr) : "l"(lane_dq));
  const uint64_t red_step = static_cast<uint64_t>(step4) * sizeof(float);
  // Staging store of (row g + 8 hf, cols nt * 8 + 2 t): chunk 2 nt + (t >> 1) XOR 2 (g & 3),
  // i.e. tile 0's offset XOR (nt << 5), + 1024 for hf.
  const uint32_t stg_o0 = static_cast<uint32_t>(g * 128 + ((((t >> 1) ^ (2 * (g & 3))) << 4) | ((t & 1) << 3)));
#pragma unroll
  for (int mt = 0; mt < kMTq; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNTqp; ++nt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const uint32_t off = (stg_o0 ^ static_cast<uint32_t>(nt << 5)) + static_cast<uint32_t>(hf * 1024);
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(stg + off), "f"(acc_dq[mt][nt][2 * hf]),
                     "f"(acc_dq[mt][nt][2 * hf + 1])
                     : "memory");
      }
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = 4 * i + (lane >> 3), ch = lane & 7;
      const uint32_t off = static_cast<uint32_t>(row * 128 + ((ch ^ (2 * (row & 3))) << 4));
      float4 v;
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                   : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                   : "r"(stg + off)
                   : "memory");
      const int ok = col_ok && mt * 16 + 4 * i < rows_left;
      asm volatile(
          "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
          " @p red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n}\n" ::"l"(red_ptr),
          "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(ok)
          : "memory");
      asm("add.u64 %0, %0, %1;\n" : "+l"(red_ptr) : "l"(red_step));
    }
    __syncwarp();
  }
}

// Reductions straight from the fragments.
template <class Arch, class Tr, int kMTq, int kNTqp>
__device__ __forceinline__ void bwd_dq_direct(const float (&acc_dq)[kMTq][kNTqp][4], const BwdDqBlk& q) {
  const int g = q.g, t = q.t;
  const int len_q = q.len_q, r0 = q.r0, wq_m0 = q.wq_m0, wq_n0 = q.wq_n0, dqk = q.dqk;
  float* const dq_base = q.dq_base;
  const int64_t dq_rs = q.dq_rs;
#pragma unroll
  for (int mt = 0; mt < kMTq; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNTqp; ++nt) {
      const int r = wq_m0 + mt * 16 + g, c = wq_n0 + nt * 8 + 2 * t;
      if constexpr (Arch::kSm90 && Tr::kDqV4) {
        // Lanes t, t^1 swap half their fragment so each holds 4 consecutive columns of
        // one row: one 16-byte vector reduction instead of two 8-byte ones (the atomics
        // share the L1/LSU pipe with the shared-memory traffic).
        const bool odd = (t & 1) != 0;
        const float s0 = odd ? acc_dq[mt][nt][0] : acc_dq[mt][nt][2];
        const float s1 = odd ? acc_dq[mt][nt][1] : acc_dq[mt][nt][3];
        const float x0 = __shfl_xor_sync(0xffffffffu, s0, 1);
        const float x1 = __shfl_xor_sync(0xffffffffu, s1, 1);
        const float4 v = odd ? make_float4(x0, x1, acc_dq[mt][nt][2], acc_dq[mt][nt][3])
                             : make_float4(acc_dq[mt][nt][0], acc_dq[mt][nt][1], x0, x1);
        const int rv = odd ? r + 8 : r, cv = odd ? c - 2 : c;
        if (cv < dqk && r0 + rv < len_q) bwd_red_vec(dq_base + rv * dq_rs + cv, v);
      } else {
        // Two 8-byte reductions (at d=256 with one pass, the swap's extra registers
        // cost more than the narrower atomics: 104 vs 142 TFLOP/s on H100).
        if (c < dqk) {
          if (r0 + r < len_q) bwd_red_add2<Arch>(dq_base + r * dq_rs + c, acc_dq[mt][nt][0], acc_dq[mt][nt][1]);
          if (r0 + r + 8 < len_q)
            bwd_red_add2<Arch>(dq_base + (r + 8) * dq_rs + c, acc_dq[mt][nt][2], acc_dq[mt][nt][3]);
        }
      }
    }
  }
}

// dQ of the step on (head h, q-block m from row r0), dS in sdS, in kQPx column passes of
// the warp tile.
template <class Arch, class Tr, typename T>
__device__ __forceinline__ void bwd_dq_phase(const BwdKernel<Arch, Tr, T>& k, int h, int m, int r0, uint32_t sdS) {
  using G = BwdGrid<Arch, Tr>;
  constexpr int Br = Tr::Br, Bc = Tr::Bc;
  constexpr bool kWgQ = G::kWgQ;
  constexpr int kWQ_M = G::kWQ_M, kQM = G::kQM, kQN = G::kQN, kQPx = G::kQPx;
  constexpr int kBlk = G::kBlk, kMTq = G::kMTq, kNTqp = G::kNTqp;
  const AttnParams& p = k.p;
  const BwdArgs& args = k.args;
  BwdCtx& ctx = k.ctx;
  const bool det = k.det;
  const uint32_t sK = k.sK;
  const int warp = bwd_tid() >> 5, lane = bwd_tid() & 31;
  const int g = lane >> 2, t = lane & 3;
  const int wq_m0 = (kWgQ ? warp % kWQ_M : warp / Tr::WQ_N) * kQM;
  const int b = bwd_lds(ctx.b);
  int32_t* sem = det ? args.dq_turns + (static_cast<int64_t>(b) * p.heads_q + h) * args.n_qblocks + m : nullptr;
#pragma unroll 1
  for (int qp = 0; qp < kQPx; ++qp) {
    const int wq_p0 = (kWgQ ? warp / kWQ_M : warp % Tr::WQ_N) * kQN + qp * (kQN / kQPx);
    float acc_q[kMTq][kBlk * kNTqp][4];
    if constexpr (kWgQ) {
      wg_fence();
      wg_gemm<T, kBlk * kNTqp, Bc, 1, Br, Bc, true>(acc_q, sdS + static_cast<uint32_t>(wq_m0 - (warp & 3) * 16) * 128u,
                                                    sK + static_cast<uint32_t>((wq_p0 >> 6) * Bc * 128));
      wg_commit();
      wg_wait<0>();
      wg_hold(acc_q);
    } else {
      bwd_zero(acc_q);
      bwd_warp_gemm<Arch, T, kMTq, kNTqp, Bc, false, true, Br, Bc>(acc_q, sdS, wq_m0, sK, wq_p0);
    }
    if (det && qp == 0) {
      if (bwd_tid() == 0) turn_wait(sem, bwd_lds(ctx.n_blk));
      __syncthreads();
    }
#pragma unroll
    for (int blk = 0; blk < kBlk; ++blk) {
      // Block blk of the pass: columns wq_n0 .. + 8 kNTqp - 1 (its fragments acc_dq).
      float(&acc_dq)[kMTq][kNTqp][4] = *reinterpret_cast<float(*)[kMTq][kNTqp][4]>(&acc_q[0][blk * kNTqp][0]);
      const int wq_n0 = wq_p0 + blk * 8 * kNTqp;
      const int dqk = static_cast<int>(p.head_dim_qk);
      const int len_q = bwd_lds(ctx.len_q);
      const int64_t dq_row0 = p.varlen ? bwd_lds64(ctx.q_tok0) : static_cast<int64_t>(b) * p.seqlen_q;
      float* dq_base = args.dq_accum + ((dq_row0 + r0) * p.heads_q + h) * dqk;
      const int64_t dq_rs = p.heads_q * dqk;
      const BwdDqBlk q{dq_base, dq_row0, dq_rs, r0, h, len_q, dqk, wq_m0, wq_n0, warp, lane, g, t};
      if constexpr (Arch::kSm90 && Tr::kDqStage) {
        const uint32_t stg = k.s_base + Tr::kOffStg + static_cast<uint32_t>(warp * Tr::kStgWarpBytes);
        if constexpr (Tr::kDqBulk) {
          if (args.dq_map_ok) {  // uniform; never in deterministic mode (the host sets it)
            bwd_dq_bulk<Arch, Tr, T, kMTq, kNTqp, kBlk>(k, acc_dq, q, blk);
            continue;  // next block (or column pass)
          }
        }
        bwd_dq_staged(acc_dq, q, stg);
      } else {
        bwd_dq_direct<Arch, Tr>(acc_dq, q);
      }
    }  // block
  }    // column pass
  if (det) {
    __threadfence();
    __syncthreads();
    if (bwd_tid() == 0) turn_pass(sem, bwd_lds(ctx.n_blk) + 1);
  }
}

}  // namespace fa2
}  // namespace flashattn
