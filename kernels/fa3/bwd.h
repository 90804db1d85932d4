// Host-side view of the FA3-design backward kernels (sm_90a): what they read besides the
// plan's tensors, and the launcher template (instantiated in fa3/instances/bwd_<cfg>_<dtype>_sm90a.cu).
#pragma once
#include <cuda_runtime.h>

#include "common/params.h"
#include "common/tensor_map.h"

namespace flashattn {
namespace fa3 {

// TMA maps of Q, dO (boxes of BwdTraits<D>::kCols columns x the step's rows, bwd_block_m of
// the run's mask) and K, V (kCols x kBlockN) as 4-D tensors (head dim, seq, head, batch)
// over the plan's strides, in the kSwizzle-byte swizzle; loads zero-fill rows past the
// sequence. dq: the fp32 dQ accumulator of BwdScratch as a 3-D tensor (head dim, head,
// batch * seqlen_q), boxes of kDqBoxCols x 1 x kDqRows (the kernel's), 128-byte swizzle, for
// the reduce-adds; in deterministic mode 4-D (head dim, head, seqlen_q, batch), boxes
// kDqBoxCols x 1 x kDqRows x 1. dk, dv: the gradients' maps in K's and V's boxes, for the
// epilogue's stores, where grads_by_copy is 1 (both encodable and the run does not accumulate
// into them; else the consumers store from registers). src/cuda/tensor_map.hpp encodes them.
struct BwdMaps {
  TensorMap128 q, k, v, dout, dq, dk, dv;
  int grads_by_copy;
};

// The workspace the kernel reads and adds to (laid out by the fa2 backward, whose Delta
// kernel fills Delta and zeroes the accumulator and the turn counters first): Delta = rowsum(dO * O) like the LSE
// ([batch, heads_q, seqlen_q]); the fp32 dQ accumulator [batch * seqlen_q, heads_q, head_dim],
// which the kernel adds to through BwdMaps::dq; in deterministic mode the turn counters of
// the dQ adds, [batch, heads_q, query blocks of BwdTraits::kBlockM rows] (bwd_schedule.cuh),
// else null (their count stays with the host's workspace layout). chain_groups: the launch
// order of the CTAs (bwd_work): 1, key blocks fastest; above 1 (deterministic runs without a
// mask), chunks of that many (key head, sequence) pairs, key blocks slowest within a chunk.
struct BwdScratch {
  float* delta;
  float* dq_accum;
  int32_t* dq_turns;
  int chain_groups;
};

// The outcome of a launch: err is cudaSuccess, or the error of the CUDA call made at `step`.
enum BwdLaunchStep : int {
  kBwdSetSmem,  // cudaFuncSetAttribute(max dynamic shared memory = smem)
  kBwdLaunch    // the launch of grid (key blocks x heads_kv x batch)
};
struct BwdLaunchResult {
  cudaError_t err;
  BwdLaunchStep step;
  int smem;
  dim3 grid;
};

// Launches the kernel of head dim D for dtype kDtype (kFp16/kBf16).
template <int D, int kDtype>
BwdLaunchResult run_bwd(const AttnParams& p, const BwdMaps& maps, const BwdScratch& scratch, cudaStream_t stream);

}  // namespace fa3
}  // namespace flashattn
