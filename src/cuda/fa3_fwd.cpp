// Host side of the FA3-design forward (kernels/fa3): which problems it serves, the TMA
// maps of Q, K and V, and the launch of the (head dim, dtype) instance, on fa2's zero-padded
// copies for head dims that are not a multiple of 8.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <algorithm>
#include <utility>

#include "cuda/fa3_serves.hpp"
#include "cuda/launch.hpp"
#include "error.hpp"
#include "fa3/fwd_traits.h"
#include "fa3/launchers.h"

namespace flashattn {
namespace {

template <int Dqk, int Dv>
bool encode_maps(const AttnParams& p, fa3::FwdMaps* m, char* why, size_t why_size) {
  using Cfg = fa3::FwdTraits<Dqk, Dv>;
  // The maps span the tensors' own head dims: the columns of the instance's tiles past them
  // load as zeros (adding nothing to Q K^T; V's give O columns that are never stored).
  const Fa3Map maps[] = {{"q", &m->q, p.q, p.q_stride, p.head_dim_qk, p.seqlen_q, p.heads_q, Cfg::kBoxRows},
                         {"k", &m->k, p.k, p.k_stride, p.head_dim_qk, p.seqlen_k, p.heads_kv, Cfg::kBlockN},
                         {"v", &m->v, p.v, p.v_stride, p.head_dim_v, p.seqlen_k, p.heads_kv, Cfg::kBlockN},
                         {"o", &m->o, p.o, p.o_stride, p.head_dim_v, p.seqlen_q, p.heads_q, Cfg::kBoxRows}};
  return fa3_encode_maps(p, maps, 4, Cfg::kSwizzle, why, why_size);
}

// What the host needs of each instance of fa3::kFwdDims, same index: its map encoder, its
// query tile rows, whether O leaves through a buffer of its own, and the columns of its
// tiles' column blocks (fa3/fwd_traits.h).
struct Config {
  bool (*encode)(const AttnParams&, fa3::FwdMaps*, char*, size_t);
  int block_m;
  bool own_o;
  int cols;
};
template <size_t I>
struct ConfigOf {
  static constexpr fa3::FwdDims kDims = fa3::kFwdDims[I];
  using Cfg = fa3::FwdTraits<kDims.qk, kDims.v>;
  static constexpr Config value{&encode_maps<kDims.qk, kDims.v>, Cfg::kBlockM, Cfg::kOwnO, Cfg::kCols};
};
constexpr auto kConfigs = fa3_table<ConfigOf>(std::make_index_sequence<fa3::kNumFwd>{});

// Whether instance i serves head dims (qk, v) (fa3_serves_dim).
constexpr bool serves(int i, int64_t qk, int64_t v) {
  return fa3_serves_dim(qk, fa3::kFwdDims[i].qk, kConfigs[i].cols) &&
         fa3_serves_dim(v, fa3::kFwdDims[i].v, kConfigs[i].cols);
}

// fa3 serves no head dim that fa2 runs on zero-padded workspace copies directly: it runs
// those only on the copies (fa3_fwd_staged).
constexpr bool no_staged_dims() {
  for (int d = 1; d <= 256; ++d)
    for (int i = 0; i < fa3::kNumFwd; ++i)
      if (fa2_staged_dim(d) && (serves(i, d, fa3::kFwdDims[i].v) || serves(i, fa3::kFwdDims[i].qk, d))) return false;
  return true;
}
static_assert(no_staged_dims(), "fa3 serves a head dim fa2 stages directly: it must run on the copies");

// Index in fa3::kFwdDims of the first (smallest) instance that serves p's head dims, or -1.
// Its tiles hold the instance's head dims; the tensor maps, p's. An instance of 32-column
// boxes (96) is passed over where more than half a box of its columns would be padding: at
// head dim 72 its last box reads 8 columns of 144-byte rows, and its forward ran L2-bound,
// 1.11-1.25x slower than on the 128 instance's 64-column boxes; at 80 and 88 the 96 instance
// stays as fast or faster (docs/internals/head-dims.md).
int fa3_config(const AttnParams& p) {
  for (int i = 0; i < fa3::kNumFwd; ++i) {
    const int64_t pad = std::max<int64_t>(fa3::kFwdDims[i].qk - p.head_dim_qk, fa3::kFwdDims[i].v - p.head_dim_v);
    const bool narrow = kConfigs[i].cols == 32 && pad > kConfigs[i].cols / 2;
    if (!narrow && serves(i, p.head_dim_qk, p.head_dim_v)) return i;
  }
  return -1;
}

// The query tiles of p under configuration cfg: blocks of its rows, per head and sequence.
int64_t query_tiles(const AttnParams& p, int cfg) {
  const int64_t block_m = kConfigs[cfg].block_m;
  return (p.seqlen_q + block_m - 1) / block_m * p.heads_q * p.batch;
}

// Whether p's query tiles differ in length, so that the CTAs claim them from a counter in the
// workspace (those with short tiles then take more): under the causal mask, and where each
// sequence's last tile leaves a consumer warpgroup without rows (it computes nothing there).
bool uneven_tiles(const AttnParams& p, int cfg) {
  const int64_t block_m = kConfigs[cfg].block_m, rest = p.seqlen_q % block_m;
  return p.has_band || (rest != 0 && rest <= block_m - 64);
}

// fa3_fwd_prepare without the tensor maps (the staged path encodes them once the copies'
// addresses are set): the device, options, head dims and 32-bit counts.
bool check(const AttnParams& p, Fa3Fwd* run, char* why, size_t why_size) {
  constexpr int64_t kMaxIndex = 2147483647;
  if (!fa3_serves_options(p, why, why_size)) return false;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&run->sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fa3_refuse(why, why_size, "querying the device's SM count failed: %s", cudaGetErrorString(err));
  }
  const int cfg = fa3_config(p);
  if (cfg < 0) {
    char dims[96];
    fa3_dims_text(dims, sizeof dims, fa3::kNumFwd, [](int i) {
      return Fa3HeadDims{fa3::kFwdDims[i].qk, fa3::kFwdDims[i].v};
    });
    return fa3_refuse(why, why_size,
                      "head_dim_qk=%lld, head_dim_v=%lld: the fa3 forward serves multiples of 8 up to the head dims "
                      "(qk/v) of an instance, %s, within its last column block (64 columns, 32 at 96)",
                      ll(p.head_dim_qk), ll(p.head_dim_v), dims);
  }
  const int64_t tiles = query_tiles(p, cfg);
  if (p.seqlen_q > kMaxIndex || p.seqlen_k > kMaxIndex || tiles > kMaxIndex)
    return fa3_refuse(why, why_size,
                      "seqlen_q=%lld, seqlen_k=%lld, %lld query tiles (heads_q=%lld, batch=%lld): fa3 counts positions "
                      "and tiles in 32 bits",
                      ll(p.seqlen_q), ll(p.seqlen_k), ll(tiles), ll(p.heads_q), ll(p.batch));
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return true;  // nothing to launch (fa3_fwd)
  if (p.seqlen_k == 0) return fa3_refuse(why, why_size, "seqlen_k=0: fa3 needs keys to load");
  return true;
}

// The tensor maps of p (after check): none where there is nothing to launch.
bool encode(const AttnParams& p, Fa3Fwd* run, char* why, size_t why_size) {
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return true;
  return kConfigs[fa3_config(p)].encode(p, &run->maps, why, why_size);
}

}  // namespace

// Head dims that are not a multiple of 8 run on fa2's zero-padded copies (fa2_staging.cu) at
// the dims rounded up to 8 (fa2_kernel_shape, p itself where nothing is staged): the copies
// first (from the workspace's first 256-byte boundary, hence 255 bytes of slack), then the
// tile counter.
size_t fa3_fwd_workspace_size(const AttnParams& p) {
  const AttnParams kp = fa2_kernel_shape(p);
  const int cfg = fa3_config(kp);
  if (cfg < 0) return 0;
  const size_t counter = uneven_tiles(kp, cfg) ? kFa3FwdWorkspaceBytes : 0;
  const CheckedSize staging = fa2_staging_bytes(p);
  if (!staging.ok() || staging.value() == 0) return counter;
  return 255 + static_cast<size_t>(staging.value()) + counter;
}

bool fa3_fwd_prepare(const AttnParams& p, Fa3Fwd* run, char* why, size_t why_size) {
  return check(p, run, why, why_size) && encode(p, run, why, why_size);
}

bool fa3_fwd_staged(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                    flashattn_status_t* status, char* why, size_t why_size) {
  AttnParams kp = fa2_kernel_shape(p);
  Fa3Fwd run;
  char rounded[256];
  if (!check(kp, &run, rounded, sizeof rounded))
    return fa3_refuse(why, why_size, "head dims %lld/%lld run on copies padded to %lld/%lld: %s", ll(p.head_dim_qk),
                      ll(p.head_dim_v), ll(kp.head_dim_qk), ll(kp.head_dim_v), rounded);
  const size_t staging = static_cast<size_t>(fa2_staging_bytes(p).value());  // ok(): the API layer checked it
  char who[96];
  snprintf(who, sizeof who, "the fa3 forward's zero-padded copies (head dims %lld, %lld) need", ll(p.head_dim_qk),
           ll(p.head_dim_v));
  char* ws = nullptr;
  *status = workspace_at_boundary(workspace, workspace_bytes, staging, who, &ws);
  if (*status != FLASHATTN_STATUS_SUCCESS) return true;
  *status = fa2_stage_in(p, ws, &kp, stream);
  if (*status != FLASHATTN_STATUS_SUCCESS) return true;
  // The copies are dense with 16-byte rows; a tensor that is not staged may still be one the
  // copy engine cannot address: then fa2 runs p (staging it again).
  if (!encode(kp, &run, why, why_size)) return false;
  const size_t used = static_cast<size_t>(ws - static_cast<char*>(workspace)) + staging;
  *status = fa3_fwd(kp, run, ws + staging, workspace_bytes - used, stream);
  if (*status == FLASHATTN_STATUS_SUCCESS) *status = fa2_stage_out(p, kp, stream);
  return true;
}

flashattn_status_t fa3_fwd(const AttnParams& p, const Fa3Fwd& run, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream) {
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return FLASHATTN_STATUS_SUCCESS;
  const int cfg = fa3_config(p);
  const int64_t tiles = query_tiles(p, cfg);  // < 2^31 (prepare)
  // Without a mask, min(tiles, SMs) CTAs walk the tiles. Where tiles differ in length
  // (uneven_tiles), the CTAs claim tiles past the first grid from a zeroed counter, else
  // with a static stride. Causal runs whose O leaves through the Q tile (the next tile's loads
  // cannot overlap the last one's work) launch one CTA per tile, and the hardware's dispatch
  // balances them (docs/internals/kernels-fa3-forward.md, the persistent walk).
  const bool walk = !p.has_band || kConfigs[cfg].own_o;
  fa3::FwdLaunch launch{run.maps, static_cast<unsigned>(walk && tiles > run.sms ? run.sms : tiles), nullptr};
  if (uneven_tiles(p, cfg) && launch.grid < tiles) {
    const auto at = (reinterpret_cast<uintptr_t>(workspace) + alignof(int) - 1) & ~uintptr_t{alignof(int) - 1};
    if (workspace == nullptr || at + sizeof(int) > reinterpret_cast<uintptr_t>(workspace) + workspace_bytes)
      return fail(FLASHATTN_STATUS_INTERNAL_ERROR,
                  "fa3 forward: a workspace of %zu bytes has no room for its tile counter", workspace_bytes);
    launch.next_tile = reinterpret_cast<int*>(at);
    const cudaError_t err = cudaMemsetAsync(launch.next_tile, 0, sizeof(int), stream);
    if (err != cudaSuccess)
      return fail(FLASHATTN_STATUS_CUDA_ERROR, "fa3 forward: zeroing the tile counter on stream %p failed: %s (%s)",
                  static_cast<void*>(stream), cudaGetErrorName(err), cudaGetErrorString(err));
  }
  const fa3::FwdLaunchResult r = fa3::kFwdRun[cfg][p.dtype](p, launch, stream);
  if (r.err == cudaSuccess) return FLASHATTN_STATUS_SUCCESS;
  if (r.step == fa3::kFwdSetSmem)
    return fail(FLASHATTN_STATUS_LAUNCH_FAILED,
                "fa3 forward (d=%d/%d): cudaFuncSetAttribute(max dynamic shared memory = %d bytes) failed: %s",
                fa3::kFwdDims[cfg].qk, fa3::kFwdDims[cfg].v, r.smem, cudaGetErrorString(r.err));
  return fail(FLASHATTN_STATUS_LAUNCH_FAILED,
              "fa3 forward kernel (d=%d/%d, grid %u, %d bytes of shared memory, stream %p) launch failed: %s (%s)",
              fa3::kFwdDims[cfg].qk, fa3::kFwdDims[cfg].v, launch.grid, r.smem, static_cast<void*>(stream),
              cudaGetErrorName(r.err), cudaGetErrorString(r.err));
}

}  // namespace flashattn
