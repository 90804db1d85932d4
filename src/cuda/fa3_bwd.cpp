// Host side of the FA3-design backward (kernels/fa3): which problems it serves, the TMA
// maps of Q, K, V, dO (and of dK, dV where they encode), and the sequence on the caller's
// stream: Delta (which zeroes the fp32 dQ accumulator and, in deterministic mode, the dQ
// turn counters), the (head dim, dtype) instance of the main kernel, the dQ conversion. The
// workspace is fa2's (fa2_bwd_scratch): the same Delta, dQ accumulator and turn counters,
// and for head dims that are not a multiple of 8 the same zero-padded copies
// (fa2_bwd_stage_in).
#include <stdint.h>

#include <algorithm>
#include <utility>

#include "cuda/fa3_serves.hpp"
#include "cuda/launch.hpp"
#include "cuda/tensor_map.hpp"
#include "error.hpp"
#include "fa3/bwd_traits.h"
#include "fa3/launchers.h"

namespace flashattn {
namespace {

// Whether instance i (head dim fa3::kBwdDims[i]) serves head dims (qk, v): fa3_serves_dim
// with column blocks of the dQ reduce-adds' 32 columns (narrower than the tiles' or as
// wide), so every box of every map holds columns of its tensor.
constexpr bool serves(int i, int64_t qk, int64_t v) {
  constexpr int kBlock = fa3::BwdTraits<64>::kDqBoxCols;
  return fa3_serves_dim(qk, fa3::kBwdDims[i], kBlock) && fa3_serves_dim(v, fa3::kBwdDims[i], kBlock);
}

// fa3 serves no head dim that fa2 runs on zero-padded workspace copies directly: it runs
// those only on the copies (fa3_bwd_staged), where fa2_bwd puts them.
constexpr bool no_staged_dims() {
  for (int d = 1; d <= 256; ++d)
    for (int i = 0; i < fa3::kNumBwd; ++i)
      if (fa2_staged_dim(d) && (serves(i, d, fa3::kBwdDims[i]) || serves(i, fa3::kBwdDims[i], d))) return false;
  return true;
}
static_assert(no_staged_dims(), "the fa3 backward serves a head dim fa2 stages directly: it must run on the copies");

// Index in fa3::kBwdDims of the first (smallest) instance that serves p's head dims, or -1.
int bwd_config(const AttnParams& p) {
  for (int i = 0; i < fa3::kNumBwd; ++i)
    if (serves(i, p.head_dim_qk, p.head_dim_v)) return i;
  return -1;
}

// The key blocks of the launch (one CTA each), the TMA maps of Q, K, V, dO (and dK, dV:
// BwdMaps::grads_by_copy) in the tiles of head dim D's kernel for p's mask (false and the
// refusal, naming the tensor, if the encoder refuses one; fa3::run_bwd picks the same
// kernel), and the rows of its staged dQ pieces (the dQ map's boxes). The kernels of one
// head dim differ in their step only.
template <int D>
int64_t key_blocks(const AttnParams& p) {
  constexpr int64_t kBlockN = fa3::BwdTraits<D>::kBlockN;
  return (p.seqlen_k + kBlockN - 1) / kBlockN * p.heads_kv * p.batch;
}
template <int D>
bool encode_maps(const AttnParams& p, fa3::BwdMaps* m, char* why, size_t why_size) {
  using Cfg = fa3::BwdTraits<D>;
  const int rows_q = fa3::bwd_block_m(D, p.has_band != 0);
  // The maps span the tensors' own head dims: the tiles' columns past them load as zeros.
  const Fa3Map maps[] = {{"q", &m->q, p.q, p.q_stride, p.head_dim_qk, p.seqlen_q, p.heads_q, rows_q},
                         {"k", &m->k, p.k, p.k_stride, p.head_dim_qk, p.seqlen_k, p.heads_kv, Cfg::kBlockN},
                         {"v", &m->v, p.v, p.v_stride, p.head_dim_v, p.seqlen_k, p.heads_kv, Cfg::kBlockN},
                         {"dout", &m->dout, p.dout, p.do_stride, p.head_dim_v, p.seqlen_q, p.heads_q, rows_q}};
  if (!fa3_encode_maps(p, maps, 4, Cfg::kSwizzle, why, why_size)) return false;
  // dK and dV by the copy engine where their maps encode and nothing is added to them;
  // else (a gradient the engine cannot address, or accumulation) from registers.
  m->grads_by_copy = !p.grad_accumulate &&
                     encode_rows_map_16bit(&m->dk, p.dk, p.head_dim_qk, p.seqlen_k, p.heads_kv, p.batch, p.dk_stride,
                                           Cfg::kBlockN, Cfg::kSwizzle) &&
                     encode_rows_map_16bit(&m->dv, p.dv, p.head_dim_v, p.seqlen_k, p.heads_kv, p.batch, p.dv_stride,
                                           Cfg::kBlockN, Cfg::kSwizzle);
  return true;
}
template <int D>
int dq_box_rows(const AttnParams& p) {
  return p.has_band ? fa3::BwdTraits<D, fa3::bwd_block_m(D, true)>::kDqRows
                    : fa3::BwdTraits<D, fa3::bwd_block_m(D, false)>::kDqRows;
}
// The kernel of each served head dim (indexed like fa3::kBwdDims): its key blocks, maps and
// dQ rows.
struct DimOps {
  int64_t (*blocks)(const AttnParams&);
  bool (*maps)(const AttnParams&, fa3::BwdMaps*, char*, size_t);
  int (*dq_box_rows)(const AttnParams&);
};
template <size_t I>
struct DimOpsOf {
  static constexpr DimOps value{&key_blocks<fa3::kBwdDims[I]>, &encode_maps<fa3::kBwdDims[I]>,
                                &dq_box_rows<fa3::kBwdDims[I]>};
};
constexpr auto kDimOps = fa3_table<DimOpsOf>(std::make_index_sequence<fa3::kNumBwd>{});

// dK and dV leave the registers in 4-byte pairs of elements: pointers and the batch,
// sequence and head strides must keep every pair 4-byte aligned.
bool pairs_aligned(const void* base, const Strides4& s) {
  return reinterpret_cast<uintptr_t>(base) % 4 == 0 && s.b % 2 == 0 && s.s % 2 == 0 && s.h % 2 == 0;
}

// fa3_bwd_prepare but for the gradients' pointers and the tensor maps (the staged path checks
// those once the copies' addresses are set): the options, head dims and 32-bit counts.
bool check(const AttnParams& p, char* why, size_t why_size) {
  constexpr int64_t kMaxIndex = 2147483647;
  if (!fa3_serves_options(p, why, why_size)) return false;
  const int cfg = bwd_config(p);
  if (cfg < 0) {
    char dims[96];
    fa3_dims_text(dims, sizeof dims, fa3::kNumBwd, [](int i) {
      return Fa3HeadDims{fa3::kBwdDims[i], fa3::kBwdDims[i]};
    });
    return fa3_refuse(why, why_size,
                      "head_dim_qk=%lld, head_dim_v=%lld: the fa3 backward serves multiples of 8 up to the head "
                      "dims (qk/v) of an instance, %s, within its last 32 columns",
                      ll(p.head_dim_qk), ll(p.head_dim_v), dims);
  }
  const int64_t blocks = kDimOps[cfg].blocks(p);
  // The dQ accumulator's rows (batch x seqlen_q) are coordinates of its TMA map.
  if (p.seqlen_q > kMaxIndex || p.seqlen_k > kMaxIndex || blocks > kMaxIndex || p.batch * p.seqlen_q > kMaxIndex)
    return fa3_refuse(why, why_size,
                      "seqlen_q=%lld, seqlen_k=%lld, %lld key blocks (heads_kv=%lld, batch=%lld): fa3 counts "
                      "positions, query rows of the batch and blocks in 32 bits",
                      ll(p.seqlen_q), ll(p.seqlen_k), ll(blocks), ll(p.heads_kv), ll(p.batch));
  if (p.batch == 0 || p.heads_q == 0) return true;  // nothing to launch (fa3_bwd)
  if (p.seqlen_q == 0 || p.seqlen_k == 0)
    return fa3_refuse(why, why_size, "seqlen_q=%lld, seqlen_k=%lld: the fa3 backward needs queries and keys to load",
                      ll(p.seqlen_q), ll(p.seqlen_k));
  return true;
}

// After check: the dK, dV pointers and strides, and the tensor maps (none where there is
// nothing to launch).
bool encode(const AttnParams& p, Fa3Bwd* run, char* why, size_t why_size) {
  if (p.batch == 0 || p.heads_q == 0) return true;
  if (!pairs_aligned(p.dk, p.dk_stride) || !pairs_aligned(p.dv, p.dv_stride))
    return fa3_refuse(why, why_size,
                      "dk or dv: the fa3 backward stores element pairs, so pointers must be 4-byte aligned and the "
                      "batch, sequence and head strides even");
  return kDimOps[bwd_config(p)].maps(p, &run->maps, why, why_size);
}

// BwdScratch::chain_groups: in deterministic runs without a mask, chunks of the (key head,
// sequence) pairs whose CTAs start in about two steps' time on all SMs (one CTA per SM, each
// a step per query block of every query head it serves; bwd_work says why); else 1. A device
// whose SM count cannot be read keeps the plain order (only its speed differs).
int chain_groups(const AttnParams& p, int cfg) {
  if (!p.deterministic || p.has_band) return 1;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  const int64_t rows = fa3::bwd_block_m(fa3::kBwdDims[cfg], false);
  const int64_t steps = p.heads_q / p.heads_kv * ((p.seqlen_q + rows - 1) / rows);
  const int64_t chunk = (2 * static_cast<int64_t>(sms) + steps / 2) / steps;
  return static_cast<int>(std::max<int64_t>(1, std::min(chunk, p.heads_kv * p.batch)));
}

}  // namespace

bool fa3_bwd_prepare(const AttnParams& p, Fa3Bwd* run, char* why, size_t why_size) {
  return check(p, why, why_size) && encode(p, run, why, why_size);
}

bool fa3_bwd_staged(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                    flashattn_status_t* status, char* why, size_t why_size) {
  AttnParams kp = fa2_kernel_shape(p);
  char rounded[256];
  if (!check(kp, rounded, sizeof rounded))
    return fa3_refuse(why, why_size, "head dims %lld/%lld run on copies padded to %lld/%lld: %s", ll(p.head_dim_qk),
                      ll(p.head_dim_v), ll(kp.head_dim_qk), ll(kp.head_dim_v), rounded);
  *status = fa2_bwd_stage_in(p, workspace, workspace_bytes, &kp, stream);
  if (*status != FLASHATTN_STATUS_SUCCESS) return true;
  // The copies are dense with 16-byte rows; a tensor that is not staged may still be one the
  // copy engine or the gradient stores cannot address: then fa2 runs p (staging it again).
  Fa3Bwd run;
  if (!encode(kp, &run, why, why_size)) return false;
  *status = fa3_bwd(kp, run, workspace, workspace_bytes, stream);
  if (*status == FLASHATTN_STATUS_SUCCESS) *status = fa2_stage_out(p, kp, stream);
  return true;
}

flashattn_status_t fa3_bwd(const AttnParams& p, const Fa3Bwd& run, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream) {
  if (p.batch == 0 || p.heads_q == 0) return FLASHATTN_STATUS_SUCCESS;
  fa3::BwdScratch scratch{};
  if (const flashattn_status_t s = fa2_bwd_scratch(p, workspace, workspace_bytes, &scratch)) return s;
  if (const flashattn_status_t s = bwd_delta(p, scratch, stream)) return s;
  const int cfg = bwd_config(p);
  scratch.chain_groups = chain_groups(p, cfg);
  // The map of the dQ accumulator, which lives in this call's workspace; 4-D in deterministic
  // mode (fa3/bwd.h). fa3_bwd_prepare checked what the encoder checks (extents within 32
  // bits; the accumulator is dense and 256-byte aligned): only a driver's refusal fails here.
  fa3::BwdMaps maps = run.maps;
  constexpr int kBoxCols = fa3::BwdTraits<64>::kDqBoxCols;
  const int box_rows = kDimOps[cfg].dq_box_rows(p);
  const bool mapped = p.deterministic ? encode_dq_accum_map_seqs(&maps.dq, scratch.dq_accum, p.head_dim_qk, p.heads_q,
                                                                 p.seqlen_q, p.batch, kBoxCols, box_rows)
                                      : encode_dq_accum_map(&maps.dq, scratch.dq_accum, p.head_dim_qk, p.heads_q,
                                                            p.batch * p.seqlen_q, kBoxCols, box_rows);
  if (!mapped)
    return fail(FLASHATTN_STATUS_LAUNCH_FAILED,
                "fa3 backward (d=%d): the driver refused the TMA map of the dQ accumulator (%lld rows x %lld heads x "
                "%lld columns, fp32)",
                fa3::kBwdDims[cfg], static_cast<long long>(p.batch * p.seqlen_q), static_cast<long long>(p.heads_q),
                static_cast<long long>(p.head_dim_qk));
  const fa3::BwdLaunchResult r = fa3::kBwdRun[cfg][p.dtype](p, maps, scratch, stream);
  if (r.err != cudaSuccess) {
    (void)cudaGetLastError();
    if (r.step == fa3::kBwdSetSmem)
      return fail(FLASHATTN_STATUS_LAUNCH_FAILED,
                  "fa3 backward (d=%d): cudaFuncSetAttribute(max dynamic shared memory = %d bytes) failed: %s",
                  fa3::kBwdDims[cfg], r.smem, cudaGetErrorString(r.err));
    return fail(FLASHATTN_STATUS_LAUNCH_FAILED,
                "fa3 backward kernel (d=%d, grid %u, %d bytes of shared memory, stream %p) launch failed: %s (%s)",
                fa3::kBwdDims[cfg], r.grid.x, r.smem, static_cast<void*>(stream), cudaGetErrorName(r.err),
                cudaGetErrorString(r.err));
  }
  return bwd_dq_convert(p, scratch, stream);
}

}  // namespace flashattn
