// Host-side view of the generation-1 backward kernels: how a problem maps onto one of the
// instantiated configurations (instances.h), the argument block of the main kernel, and the
// launcher template (instantiated in kernels/fa2/instances/bwd_<cfg>_<dtype>_<arch>.cu).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/params.h"
#include "common/tensor_map.h"
#include "fa2/instances.h"

namespace flashattn {
namespace fa2 {

// Index into kBwdInstances (a config: variant 0) for the problem's head dims, or -1 when
// none fits. An unequal config (dqk > dv) serves only problems with dqk > 128 and dv within
// it; any other pair runs on the square config of max(dqk, dv).
inline int select_bwd_config(int64_t dqk, int64_t dv) {
  for (int i = 0; i < kNumBwdConfigs; ++i) {
    const BwdInstance& c = kBwdInstances[i];
    if (c.d != c.dv && !(dqk > 128 && dv <= c.dv)) continue;
    if (dqk <= c.d && dv <= c.dv) return i;
  }
  return -1;
}

// dBias handling of one run.
enum BwdDbiasMode : int32_t {
  kDbiasNone = 0,    // no dbias requested
  kDbiasDirect = 1,  // no broadcast dim: every element written once by the main kernel
  kDbiasAccum = 2,   // some dim broadcast: fp32 atomics into a compact workspace, converted afterwards
  kDbiasSlab = 3     // some dim broadcast, deterministic mode: every (sequence, head, i, j) has one owner
                     // thread that read-modify-writes an fp32 slab [batch, H', seqlen_q, seqlen_k]
                     // (H' = heads_kv when the head dim is broadcast: the CTA adds its GQA group in
                     // order); a reduction kernel then sums the broadcast dims in a fixed order
};

// Everything the main kernel reads, passed by value.
struct BwdArgs {
  AttnParams p;
  float* delta;        // rowsum(dO * O), same layout as the LSE
  float* dq_accum;     // fp32 [rows, heads_q, head_dim_qk], rows = batch*seqlen_q or total_q
  int32_t* dq_turns;   // deterministic mode: [batch, heads_q, n_qblocks_max] k-block turn counters
  float* dbias_accum;  // kDbiasAccum: compact fp32 [B', H', SQ', SK'] (1 along broadcast dims); kDbiasSlab: the slab
  int64_t dbias_accum_stride[4];  // strides of dbias_accum in (b, h, i, j); 0 along broadcast dims (accum mode)
  int32_t dbias_slab_kvhead;      // kDbiasSlab: the slab's head index is the kv head
  int32_t dbias_mode;             // BwdDbiasMode
  int32_t n_kblocks;              // ceil(seqlen_k / Bc): grid.x = n_kblocks * heads_kv * batch
  int32_t n_qblocks;              // ceil(seqlen_q / Br) (semaphore row length)
  int32_t stages;                 // 1 or 2 shared-memory stages for Q/dO (BwdChoice::stages)
  int32_t dq_map_ok;              // 1: *dq_map is valid and the kernel reduces staged dQ with it (kDqBulk)
  // Host memory: the TMA map of dq_accum (cols, heads_q, rows), boxes 32 x 1 x 16, which
  // launch_bwd_main passes by value as a second parameter to the kernels that use it (the
  // 128-byte, 64-byte-aligned map inside this block made ptxas spill at d=128).
  const TensorMap128* dq_map;
  int32_t qdo_map_ok;  // 1: qdo_maps[0] (Q) and [1] (dO) are valid, for kernels with BwdTraits::kTmaQdo
  // Host memory: TMA maps of Q and dO as (cols, rows, heads, batch) with 64 x Br x 1 x 1
  // boxes (varlen: rows = total_q, batch 1), passed to the kernel like dq_map.
  const TensorMap128* qdo_maps;
};

// Static shared memory of the main kernel (BwdCtx) on top of the dynamic part, as the
// host budgets it: a kernel fits when dynamic bytes + this <= the opt-in limit per block
// (fa2_bwd.cu checks sizeof(BwdCtx) against it).
inline constexpr int kBwdStaticSmemSlack = 512;

// The kernel one backward runs on: config kBwdInstances[config] itself (variant 0) or its
// small-shared-memory form (variant 1), with 1 or 2 Q/dO stages. The host takes the first
// that fits the device's opt-in shared memory per block, in the order: variant 0 with 2
// stages, with 1 stage, then variant 1 with 2 stages, with 1 stage (fa2_bwd.cu).
struct BwdChoice {
  ArchId arch;     // the code it runs (arch.h)
  int kernel;      // index into kBwdInstances
  int d, dv;       // instantiated head dims (>= the problem's)
  int variant;     // 0 or 1
  int stages;      // 1 or 2
  int smem_bytes;  // dynamic shared memory of the launch
  int br, bc;      // tile rows (queries) and columns (keys)
};

// Launches the main kernel of instantiation (D, DV, kVariant) for dtype kDtype
// (kFp16/kBf16) in the code of architecture policy Arch (arch.h). smem_bytes is the traits'
// smem_bytes(args.stages, Arch::kSm90). Returns the CUDA error of the attribute call or the
// launch.
template <class Arch, int D, int DV, int kDtype, int kVariant>
cudaError_t launch_bwd_main(const BwdArgs& args, int smem_bytes, cudaStream_t stream);

}  // namespace fa2
}  // namespace flashattn
