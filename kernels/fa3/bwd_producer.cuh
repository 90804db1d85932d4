// The producer warpgroup of the FA3-design backward: warp 0's first thread loads K and V
// once and each step's Q and dO tiles with TMA; warp 1 copies each step's LSE (in base 2)
// and Delta into shared memory. Both fill the same ring stage and complete its full barrier
// (1 arrival with the TMA bytes + 32 of warp 1); both wait for its empty barrier (all 256
// consumer threads arrive once their last GEMM of the stage is done). Warp 2 adds the dQ
// pieces the consumers stage in shared memory into the fp32 workspace with the copy
// engine's tensor reduce-adds (the dQ barriers of bwd_schedule.cuh), in deterministic mode in
// the order of the turn counters.
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/exp2.h"
#include "common/params.h"
#include "common/turns.cuh"
#include "fa3/bwd.h"
#include "fa3/bwd_schedule.cuh"
#include "hopper/tma.cuh"
#include "hopper/warpgroup.cuh"

namespace flashattn {
namespace fa3 {

// Warp 0, lane 0: K and V of the CTA's keys on kv_full, then Q and dO of every step (on the
// stage's full barrier, or with Cfg::kSeparateDo dO on its own ring's).
template <class Cfg>
__device__ __forceinline__ void bwd_load_tiles(const BwdMaps& maps, const BwdSmem<Cfg>& sm, const BwdWork& w) {
  constexpr int kBlocks = Cfg::kColBlocks, kCols = Cfg::kCols, kSw = Cfg::kSwizzle;
  hopper::tma_prefetch_map(&maps.q);
  hopper::tma_prefetch_map(&maps.k);
  hopper::tma_prefetch_map(&maps.v);
  hopper::tma_prefetch_map(&maps.dout);
  if (maps.grads_by_copy) {  // the epilogue's maps: fetched now, not on the CTA's last step
    hopper::tma_prefetch_map(&maps.dk);
    hopper::tma_prefetch_map(&maps.dv);
  }
  hopper::mbar_expect(sm.kv_full(), 2 * Cfg::kKVBytes);
#pragma unroll
  for (int c = 0; c < kBlocks; ++c) {
    const uint32_t off = static_cast<uint32_t>(c * Cfg::kBlockN * kSw);
    hopper::tma_load(sm.k() + off, &maps.k, c * kCols, w.n0, w.kvh, w.b, sm.kv_full());
    hopper::tma_load(sm.v() + off, &maps.v, c * kCols, w.n0, w.kvh, w.b, sm.kv_full());
  }
  // A fresh barrier counts as having completed the phase before its first: the first round
  // through the ring does not wait.
  for (int it = 0; it < w.steps(); ++it) {
    const int s = bwd_stage<Cfg>(it), h = w.head(it), m0 = w.m0<Cfg>(it);
    hopper::mbar_wait(sm.q_empty(s), bwd_parity<Cfg>(it) ^ 1u);
    if constexpr (Cfg::kSeparateDo) {
      // Q into its stage, then dO once the step before has done its dV GEMM.
      const int sd = bwd_stage<Cfg, Cfg::kDoStages>(it);
      hopper::mbar_expect(sm.q_full(s), Cfg::kQBytes);
#pragma unroll
      for (int c = 0; c < kBlocks; ++c)
        hopper::tma_load(sm.q(s) + static_cast<uint32_t>(c * Cfg::kBlockM * kSw), &maps.q, c * kCols, m0, h, w.b,
                         sm.q_full(s));
      hopper::mbar_wait(sm.do_empty(sd), bwd_parity<Cfg, Cfg::kDoStages>(it) ^ 1u);
      hopper::mbar_expect(sm.do_full(sd), Cfg::kQBytes);
#pragma unroll
      for (int c = 0; c < kBlocks; ++c)
        hopper::tma_load(sm.dout(sd) + static_cast<uint32_t>(c * Cfg::kBlockM * kSw), &maps.dout, c * kCols, m0, h, w.b,
                         sm.do_full(sd));
    } else {
      hopper::mbar_expect(sm.q_full(s), 2 * Cfg::kQBytes);
#pragma unroll
      for (int c = 0; c < kBlocks; ++c) {
        const uint32_t off = static_cast<uint32_t>(c * Cfg::kBlockM * kSw);
        hopper::tma_load(sm.q(s) + off, &maps.q, c * kCols, m0, h, w.b, sm.q_full(s));
        hopper::tma_load(sm.dout(s) + off, &maps.dout, c * kCols, m0, h, w.b, sm.q_full(s));
      }
    }
  }
}

// Warp 1: LSE * log2(e) and Delta of every step's queries, then each lane arrives on the
// stage's full barrier. A query that sees no key (LSE -inf) gets +inf, so its probabilities
// are exactly exp2(-inf) = 0 with or without the mask (as in fa2); queries past len_q get 0,
// and the consumers mask them.
template <class Cfg>
__device__ __forceinline__ void bwd_load_rows(const AttnParams& p, const BwdScratch& scratch, const BwdSmem<Cfg>& sm,
                                              const BwdWork& w, int lane) {
  for (int it = 0; it < w.steps(); ++it) {
    const int s = bwd_stage<Cfg>(it), m0 = w.m0<Cfg>(it);
    const int64_t row0 = (static_cast<int64_t>(w.b) * p.heads_q + w.head(it)) * p.seqlen_q + m0;
    const float* const lse_in = p.lse_in + row0;
    const float* const delta_in = scratch.delta + row0;
    const int valid = w.len_q - m0;
    // The rows are read before the stage is free, so their latency is not the stage's.
    // Row lane + 32 k for k < kPerLane; the last k only where it is a row of the step (an
    // 80-query step).
    constexpr int kPerLane = (Cfg::kBlockM + 31) / 32;
    const auto in_step = [&](int k) { return Cfg::kBlockM % 32 == 0 || lane + 32 * k < Cfg::kBlockM; };
    float lse[kPerLane], delta[kPerLane];
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int r = lane + 32 * k;
      const bool load = in_step(k) && r < valid;
      const float l = load ? lse_in[r] : 0.f;
      lse[k] = l == -INFINITY ? INFINITY : l * kLog2e;
      delta[k] = load ? delta_in[r] : 0.f;
    }
    hopper::mbar_wait(sm.q_empty(s), bwd_parity<Cfg>(it) ^ 1u);
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      if (!in_step(k)) continue;
      const uint32_t r = static_cast<uint32_t>(lane + 32 * k);
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(sm.lse(s) + 4u * r), "f"(lse[k]) : "memory");
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(sm.delta(s) + 4u * r), "f"(delta[k]) : "memory");
    }
    hopper::mbar_arrive(sm.q_full(s));
  }
}

// Warp 2: every staged dQ piece, in the consumers' step order, added into the fp32 dQ
// accumulator by the copy engine: lane 0 issues a tensor reduce-add per 32-column box of a
// piece (two; one for d = 96's narrow piece), maps.dq: (column, head, batch * seqlen_q +
// query). A step's pieces come in slots (kDqSlots, more than one where a warpgroup stages
// several pieces a step in its buffer).
// The handshake with consumer warpgroup cw, per piece (kDqBarThreads = 128 + 32 each):
//   the warp arrives on kBarDqEmpty + cw once lane 0's reduce-adds of the buffer's previous
//     pieces have read it (cp.async.bulk.wait_group.read 0, then __syncwarp); the
//     warpgroup's 128 threads sync there before they stage the piece, so that phase
//     completes;
//   the warpgroup's 128 threads arrive on kBarDqFull + cw after staging it (and
//     fence.proxy.async: the generic-proxy stores become visible to the copy engine); the
//     warp syncs there, so that phase completes, then lane 0 issues the piece.
// A later slot's pieces take the same handshake after the earlier slot's have been read:
// lane 0 commits each slot's reduce-adds as a bulk group of their own, since
// cp.async.bulk.wait_group(.read) waits for committed groups only.
// Each side takes every phase of both barriers once per piece in the same order, so neither
// runs a phase ahead, and no arrival is left pending at exit. Before it exits lane 0 waits
// for its reduce-adds to complete.
// kDet (deterministic mode; scratch.dq_turns set): before a step's pieces lane 0 waits for its
// turn at the step's query block (bwd_dq_turn); it passes the turn on once that step's
// reduce-adds have completed (cp.async.bulk.wait_group 0, not .read), at the next step, after
// the buffers are handed back on the reads as in plain runs: the consumers stage the next
// pieces while the adds complete, and the next CTA in the order waits no longer than the
// adds take. maps.dq is then 4-D (column, head, query, sequence): the engine skips the rows a
// piece holds past len_q, which through the 3-D map would add zeros into the next sequence's
// first rows outside its turns (not always a no-op: +0 turns an accumulated -0 into +0). A
// template argument, chosen at run time by the kernel: the loop without turns compiles as it
// did before deterministic mode existed.
template <class Cfg, bool kDet>
__device__ __forceinline__ void bwd_reduce_dq(const AttnParams& p, const BwdMaps& maps, const BwdScratch& scratch,
                                              const BwdSmem<Cfg>& sm, const BwdWork& w, int lane) {
  hopper::tma_prefetch_map(&maps.dq);
  int32_t* held = nullptr;  // kDet: the previous step's counter, until its adds complete,
  int held_turn = 0;        // and the turn this CTA took there
  for (int it = 0; it < w.steps(); ++it) {
    if (lane == 0) hopper::bulk_wait_read_all();
    __syncwarp();
#pragma unroll
    for (int cw = 0; cw < 2; ++cw)
      if (bwd_dq_cols<Cfg>(it, cw) > 0) hopper::bar_arrive(kBarDqEmpty + cw, kDqBarThreads);
    const int h = w.head(it), m0 = w.m0<Cfg>(it), row = w.b * static_cast<int>(p.seqlen_q) + m0;
    int32_t* const counter = kDet ? bwd_dq_counter<Cfg>(scratch.dq_turns, p, w, it) : nullptr;
    const int turn = kDet ? bwd_dq_turn<Cfg>(p, w, m0) : 0;
    if constexpr (kDet) {
      if (lane == 0) {
        if (held != nullptr) {
          hopper::bulk_wait_all();
          hopper::fence_proxy_async_global();
          turn_pass(held, held_turn + 1);
        }
        turn_wait(counter, turn);
        hopper::fence_proxy_async_global();
      }
      __syncwarp();
    }
#pragma unroll
    for (int k = 0; k < Cfg::kDqSlots; ++k) {
      if (k > 0) {  // the buffers again, once the slot before's pieces have been read
        if (lane == 0) hopper::bulk_wait_read_all();
        __syncwarp();
#pragma unroll
        for (int cw = 0; cw < 2; ++cw)
          if (bwd_dq_cols<Cfg>(it, cw, k) > 0) hopper::bar_arrive(kBarDqEmpty + cw, kDqBarThreads);
      }
#pragma unroll
      for (int cw = 0; cw < 2; ++cw) {
        const int cols = bwd_dq_cols<Cfg>(it, cw, k);
        if (cols == 0) continue;
        hopper::bar_sync(kBarDqFull + cw, kDqBarThreads);
        if (lane == 0)
#pragma unroll
          for (int box = 0; box < 2; ++box) {
            if (Cfg::kD % 64 != 0 && box * Cfg::kDqBoxCols >= cols) break;  // d = 96's narrow piece: one box
            const uint32_t src = sm.dq(cw) + static_cast<uint32_t>(box * Cfg::kDqBoxBytes);
            const int col = bwd_dq_col<Cfg>(it, cw, k) + box * Cfg::kDqBoxCols;
            const int q0 = bwd_dq_query<Cfg>(cw);
            if constexpr (kDet) hopper::tma_reduce_add_4d(&maps.dq, src, col, h, m0 + q0, w.b);
            else hopper::tma_reduce_add_3d(&maps.dq, src, col, h, row + q0);
          }
      }
      // The slot's reduce-adds as one bulk group: a wait covers committed groups only, so
      // the next slot's wait for the reads would not see them uncommitted.
      if (lane == 0) hopper::bulk_commit();
    }
    held = counter;
    held_turn = turn;
  }
  if (lane == 0) {
    hopper::bulk_wait_all();
    if (kDet && held != nullptr) {
      hopper::fence_proxy_async_global();
      turn_pass(held, held_turn + 1);
    }
  }
}

}  // namespace fa3
}  // namespace flashattn
