// The FA3-design backward kernel (sm_90a only): warp specialization over a TMA / mbarrier
// pipeline and wgmma GEMMs, dK and dV in registers (stored at the end through shared memory
// and the copy engine, or from registers).
//
// One CTA per (key block of BwdTraits::kBlockN rows, key head, sequence), 384 threads:
//   warpgroup 0, the producer: drops to 32 registers (24 where a step has more than 64
//     queries, BwdTraits::kWideStep; setmaxnreg); warp 0's first thread loads K and V
//     once, then each step's Q and dO tiles with TMA into a 2-stage ring; warp 1 copies
//     the step's LSE and Delta rows beside them; warp 2 adds the staged dQ pieces into the
//     fp32 dQ workspace with the copy engine's tensor reduce-add, in deterministic mode in
//     key-block order (bwd_producer.cuh).
//   warpgroups 1 and 2, the consumers: raised to 232 registers (240 with kWideStep); each walks
//     the steps (one query block of one query head of the GQA group each) and owns its
//     share of the key block's dK and dV, split by keys up to d = 128 and by head-dim
//     columns above (bwd_consumer.cuh).
// A CTA whose keys no query sees (causal) writes dK = dV = 0.
//
// Serves: head_dim_qk and head_dim_v up to D (kernels/instances.json; the tensor maps span the
// real head dims, whose columns past them load as zeros; the dQ reduce-adds and the dK, dV
// tensor stores clip them, the dK and dV stores from registers skip them), no varlen, bias,
// softcap, dropout or block-sparse layout, band mask only causal (window_right 0,
// window_left unbounded) with either alignment, GQA (the CTA walks every query head of its
// key head's group), gradients written or accumulated, deterministic mode (the dQ adds of a
// query block in key-block order: turn counters, bwd_schedule.cuh). The host sends
// everything else to fa2.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "common/params.h"
#include "fa2/mma.cuh"
#include "fa3/bwd.h"
#include "fa3/bwd_consumer.cuh"
#include "fa3/bwd_producer.cuh"
#include "fa3/bwd_schedule.cuh"
#include "fa3/bwd_traits.h"
#include "hopper/tma.cuh"
#include "hopper/warpgroup.cuh"

namespace flashattn {
namespace fa3 {

template <class Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    bwd_kernel(const AttnParams p, const __grid_constant__ BwdMaps maps, const BwdScratch scratch) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const BwdSmem<Cfg> sm{(fa2::smem_u32(smem_raw) + 1023u) & ~1023u};
  const BwdWork w = bwd_work<Cfg>(p, scratch.chain_groups);

  if (threadIdx.x == 0) {
    hopper::mbar_init(sm.kv_full());
    for (int s = 0; s < Cfg::kStages; ++s) {
      hopper::mbar_init(sm.q_full(s), 1 + 32);  // the TMA thread (with the bytes) + warp 1's lanes
      hopper::mbar_init(sm.q_empty(s), 2 * 128);
    }
    if constexpr (Cfg::kSeparateDo)
      for (int s = 0; s < Cfg::kDoStages; ++s) {
        hopper::mbar_init(sm.do_full(s), 1);
        hopper::mbar_init(sm.do_empty(s), 2 * 128);
      }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  const int wg = static_cast<int>(threadIdx.x) / 128;
  if (wg == 0) {
    hopper::regs_dec<Cfg::kProducerRegs>();
    const int warp = static_cast<int>(threadIdx.x) / 32;
    if (threadIdx.x == 0) bwd_load_tiles<Cfg>(maps, sm, w);
    if (warp == 1) bwd_load_rows<Cfg>(p, scratch, sm, w, static_cast<int>(threadIdx.x) % 32);
    if (warp == 2) {
      if (scratch.dq_turns != nullptr)
        bwd_reduce_dq<Cfg, true>(p, maps, scratch, sm, w, static_cast<int>(threadIdx.x) % 32);
      else bwd_reduce_dq<Cfg, false>(p, maps, scratch, sm, w, static_cast<int>(threadIdx.x) % 32);
    }
    return;
  }

  hopper::regs_inc<Cfg::kConsumerRegs>();
  if constexpr (Cfg::kSplitD) {
    if (wg == 1) bwd_consumer<Cfg, T, 0>(p, maps, sm, w);
    else bwd_consumer<Cfg, T, 1>(p, maps, sm, w);
  } else {
    bwd_consumer<Cfg, T, kAnyWg>(p, maps, sm, w, wg - 1);
  }
}

}  // namespace fa3
}  // namespace flashattn
