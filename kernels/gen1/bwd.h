// Host-side view of the generation-1 backward kernels: the configurations that exist,
// the argument block of the main kernel, and the per-instantiation launchers (defined in
// the generated kernels/gen1/bwd_<d>x<dv>_<dtype>.cu translation units).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/params.h"

namespace flashattn {
namespace gen1 {

// Instantiated (head_dim_qk, head_dim_v) configurations; a problem runs on the first
// whose dims are >= its own (zero-filled loads and masked stores cover the rest).
struct BwdConfigId {
  int d, dv;
};
inline constexpr BwdConfigId kBwdConfigs[] = {{32, 32},   {64, 64},   {96, 96},  {128, 128},
                                              {192, 128}, {192, 192}, {256, 256}};
inline constexpr int kNumBwdConfigs = static_cast<int>(sizeof(kBwdConfigs) / sizeof(kBwdConfigs[0]));

// Index into kBwdConfigs for the problem's head dims, or -1 when none fits. The unequal
// (192, 128) config serves only problems with dqk > 128 and dv <= 128; any other pair
// runs on the square config of max(dqk, dv).
inline int select_bwd_config(int64_t dqk, int64_t dv) {
  for (int i = 0; i < kNumBwdConfigs; ++i) {
    const BwdConfigId& c = kBwdConfigs[i];
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
  int32_t* dq_sema;    // deterministic mode: [batch, heads_q, n_qblocks_max] k-block turn counters
  float* dbias_accum;  // kDbiasAccum: compact fp32 [B', H', SQ', SK'] (1 along broadcast dims); kDbiasSlab: the slab
  int64_t dbias_accum_stride[4];  // strides of dbias_accum in (b, h, i, j); 0 along broadcast dims (accum mode)
  int32_t dbias_slab_kvhead;      // kDbiasSlab: the slab's head index is the kv head
  int32_t dbias_mode;  // BwdDbiasMode
  int32_t n_kblocks;   // ceil(seqlen_k / Bc): grid.x = n_kblocks * heads_kv * batch
  int32_t n_qblocks;   // ceil(seqlen_q / Br) (semaphore row length)
  int32_t stages;      // 1 or 2 shared-memory stages for Q/dO
};

// Tile sizes of a configuration (the host needs them for grids and workspace).
struct BwdTileInfo {
  int br, bc;
};
BwdTileInfo bwd_tile_info(int config_index);

// Dynamic shared memory bytes of config (D, DV) with `stages` Q/dO stages.
int bwd_smem_bytes(int config_index, int stages);

// Launches the main kernel of configuration (D, DV) for dtype kDtype (kFp16/kBf16).
// smem_bytes is bwd_smem_bytes(config, args.stages). Returns the CUDA error of the
// attribute call or the launch.
template <int D, int DV, int kDtype>
cudaError_t launch_bwd_main(const BwdArgs& args, int smem_bytes, cudaStream_t stream);

// Instantiated only in the generated translation units (one per config and dtype).
#define FLASHATTN_BWD_EXTERN(D, DV)                                                                  \
  extern template cudaError_t launch_bwd_main<D, DV, kFp16>(const BwdArgs&, int, cudaStream_t); \
  extern template cudaError_t launch_bwd_main<D, DV, kBf16>(const BwdArgs&, int, cudaStream_t);
FLASHATTN_BWD_EXTERN(32, 32)
FLASHATTN_BWD_EXTERN(64, 64)
FLASHATTN_BWD_EXTERN(96, 96)
FLASHATTN_BWD_EXTERN(128, 128)
FLASHATTN_BWD_EXTERN(192, 128)
FLASHATTN_BWD_EXTERN(192, 192)
FLASHATTN_BWD_EXTERN(256, 256)
#undef FLASHATTN_BWD_EXTERN

}  // namespace gen1
}  // namespace flashattn
