// Host side of KV-cache runs on CUDA (flashattn_fwd_kvcache): the support checks, the
// workspace (split parts), and per run the decode kernel's architecture policy (after the
// tensor-map encode), its split count, and the launches on the caller's stream: append
// (kernels/decode/append_kernel.cuh), decode (decode_kernel.cuh), then, with more than one
// split, combine (kernels/combine) unless the splits merge in clusters. No allocation, no
// synchronization.
#include <stdint.h>

#include <atomic>

#include "cuda/fa2_arch.hpp"
#include "cuda/launch.hpp"
#include "cuda/tensor_map.hpp"
#include "decode/append_kernel.cuh"
#include "decode/launch.cuh"
#include "error.hpp"

namespace flashattn {
namespace {

constexpr int64_t kMaxIndex = 2147483647;  // the grids are 1-D
constexpr size_t kPartsAlign = 256;

int padded_dim(const AttnParams& p) {
  const int64_t d = p.head_dim_qk > p.head_dim_v ? p.head_dim_qk : p.head_dim_v;
  return d <= 64 ? 64 : d <= 128 ? 128 : 256;
}

int64_t row_chunks(const AttnParams& p) {
  return (p.heads_q / p.heads_kv * p.seqlen_q + decode::kRows - 1) / decode::kRows;
}

// fp32 parts of `splits` split-KV runs: O [splits, batch, heads_q, seqlen_q, head_dim_v],
// then LSE [splits, batch, heads_q, seqlen_q].
CheckedSize parts_lse_floats(const AttnParams& p, int64_t splits) {
  return CheckedSize(splits) * CheckedSize(p.batch) * CheckedSize(p.heads_q) * CheckedSize(p.seqlen_q);
}
CheckedSize parts_o_floats(const AttnParams& p, int64_t splits) {
  return parts_lse_floats(p, splits) * CheckedSize(p.head_dim_v);
}
CheckedSize parts_bytes(const AttnParams& p, int64_t splits) {
  if (splits <= 1) return 0;
  return (parts_o_floats(p, splits) + parts_lse_floats(p, splits)) * CheckedSize(sizeof(float)) +
         CheckedSize(kPartsAlign);
}

// The per-policy, per-head-dim constants the host sizes a decode launch by: the kernel's
// dynamic shared memory with its full ring (kStages tiles) and with two, the full ring's
// depth, the CTAs per SM its registers are budgeted for (the same for fp16 and bf16), and
// whether a producer warp issues its tiles (decode_kernel.cuh, kProducer).
struct DimPlan {
  size_t smem_full, smem_two;
  int full_stages;
  int64_t min_blocks;
  bool producer;
};
template <typename Arch, int D>
constexpr DimPlan dim_plan() {
  return {decode::smem_size<Arch, __half, D, decode::kStages<Arch, D>>(), decode::smem_size<Arch, __half, D, 2>(),
          decode::kStages<Arch, D>, decode::kMinBlocks<Arch, D>, decode::kProducer<Arch, D>};
}
template <typename Arch>
const DimPlan& plan_for(const AttnParams& p) {
  static constexpr DimPlan k64 = dim_plan<Arch, 64>(), k128 = dim_plan<Arch, 128>(), k256 = dim_plan<Arch, 256>();
  const int d = padded_dim(p);
  return d == 64 ? k64 : d == 128 ? k128 : k256;
}

// Keys per copy-engine box of the Sm90a kernel: the page size for pages of 16 or 32 (a box
// a page); for a contiguous cache or pages of a multiple of 64 keys 16 where a producer warp
// issues (head dims 128 and 256: four boxes a tile, which the copy engine completes sooner
// than one of 64: b = 1 32/8 d = 128 32k contiguous 66.2 -> 59.3 us, as pages of 16 ran;
// docs/internals/kernels-decode.md), else 64 (thread 0 issues every box at head dim 64); 0
// for other page sizes, whose rows the Sm80 kernel gathers.
int box_rows(const AttnParams& p) {
  if (p.kv_page_size == 0 || p.kv_page_size % decode::kTileK == 0)  // 0: contiguous
    return plan_for<fa2::Sm90a>(p).producer ? 16 : decode::kTileK;
  return p.kv_page_size == 16 || p.kv_page_size == 32 ? static_cast<int>(p.kv_page_size) : 0;
}

// Whether the shape of p takes the Sm90a kernel where its pointers allow (bulk_maps): a
// compute capability 9.0 device with the policy built, a page size box_rows takes, and
// tiles at multiples of the box (no left window, which starts the key range anywhere).
bool bulk_shape(const AttnParams& p, const cudaDeviceProp& prop) {
  return fa2_arch_for(prop.major, prop.minor) == fa2::kArchSm90a && box_rows(p) > 0 &&
         !(p.has_band && p.window_left >= 0);
}

// The opt-in shared memory per block the decode ring is sized for (capped by
// FLASHATTN_CUDA_SMEM_LIMIT): read once by decode_workspace_size and once by decode_fwd
// (a run asks both: its workspace check, then its launch).
size_t smem_cap(const cudaDeviceProp& prop) {
  return static_cast<size_t>(smem_limit(static_cast<int>(prop.sharedMemPerBlockOptin)));
}
size_t smem_bytes(const DimPlan& dp, int stages) { return stages == 2 ? dp.smem_two : dp.smem_full; }

// The most splits the library chooses (as FlashAttention's heuristic): each is a part of
// every output row that the combine reads in turn.
constexpr int64_t kMaxChosenSplits = 128;

// The gather kernel's split count for p with `slots` resident CTAs: FlashAttention's
// heuristic (num_splits_heuristic). With fewer CTAs than 80% of the slots, take the fewest
// splits whose efficiency (CTAs over whole waves) is within 85% of the best, keeping at
// least one tile of the capacity per split.
int64_t heuristic_splits(const AttnParams& p, int64_t slots) {
  const int64_t ctas = p.batch * p.heads_kv * row_chunks(p);
  if (ctas * 10 >= slots * 8) return 1;
  const int64_t tiles = (p.seqlen_k + decode::kTileK - 1) / decode::kTileK;
  int64_t max_splits = slots < tiles ? slots : tiles;
  if (max_splits > kMaxChosenSplits) max_splits = kMaxChosenSplits;
  if (max_splits < 1) return 1;
  double best = 0;
  double eff[kMaxChosenSplits + 1];
  for (int64_t s = 1; s <= max_splits; ++s) {
    const double waves = static_cast<double>(ctas * s) / static_cast<double>(slots);
    eff[s] = waves / static_cast<double>(static_cast<int64_t>(waves + 0.999999));
    if (eff[s] > best) best = eff[s];
  }
  for (int64_t s = 1; s <= max_splits; ++s)
    if (eff[s] >= 0.85 * best) return s;
  return 1;
}

// The copy-engine kernel's split count for p with `per_sm` resident CTAs per SM and a ring
// of `stages` tiles: the fewest splits that keep enough tile bytes in flight on every SM,
// as the sweep in docs/internals/kernels-decode.md measured: 64 KiB from a contiguous
// cache, 128 KiB from a paged one where thread 0 refills (d = 64: a tile's boxes wait on
// its block-table reads), 64 KiB from a paged one where a producer warp does (d >= 128:
// it reads the table a window of 32 pages ahead, so a paged tile goes out as a contiguous
// one does, and one CTA per SM at d = 128 leaves its 16 splits of a batch-1 32k cache to
// the cluster's merge instead of 33 to the combine). A CTA holds stages - 1 tiles in
// flight, so w CTAs per SM carry those bytes (rounded up, at most per_sm), and splits =
// w x SMs / CTAs (rounded down: one wave of equal CTAs), from 1 to a split per
// kMinSplitTiles tiles and at most kMaxChosenSplits. Each further CTA only adds its start,
// its merge and a part to combine, which short caches (4k keys) feel below four tiles per
// split.
constexpr int64_t kMinSplitTiles = 4;
constexpr int64_t kInFlightContiguous = 64 << 10, kInFlightPaged = 128 << 10;
int64_t bulk_splits(const AttnParams& p, int stages, int64_t per_sm, bool producer, const cudaDeviceProp& prop) {
  const int64_t ctas = p.batch * p.heads_kv * row_chunks(p);
  int64_t most = (p.seqlen_k + decode::kTileK - 1) / decode::kTileK / kMinSplitTiles;
  if (most > kMaxChosenSplits) most = kMaxChosenSplits;
  const int64_t in_flight =
      int64_t{stages - 1} * 2 * decode::kTileK * padded_dim(p) * int64_t{sizeof(uint16_t)};  // K, V
  const int64_t want = p.kv_page_size > 0 && !producer ? kInFlightPaged : kInFlightContiguous;
  int64_t w = (want + in_flight - 1) / in_flight;
  if (w > per_sm) w = per_sm;
  const int64_t splits = w * prop.multiProcessorCount / ctas;
  return splits > most ? (most > 1 ? most : 1) : splits < 1 ? 1 : splits;
}

// One kernel's launch on this device for p, fixed once per call: its ring depth (kStages
// where the capped opt-in shared memory holds it, else two: decode_check has refused what
// two do not fit), dynamic shared memory, and split count (the caller's, or the kernel's
// rule for its resident CTAs: as many per SM as shared memory holds, at most the
// kMinBlocks its registers are budgeted for).
struct KernelFit {
  int stages;
  size_t smem;
  int64_t splits;
};
template <typename Arch>
KernelFit fit_of(const AttnParams& p, const cudaDeviceProp& prop, size_t cap) {
  const DimPlan& dp = plan_for<Arch>(p);
  KernelFit f;
  f.stages = dp.smem_full <= cap ? dp.full_stages : 2;
  f.smem = smem_bytes(dp, f.stages);
  if (p.kv_num_splits > 0) {
    f.splits = p.kv_num_splits;
    return f;
  }
  const int64_t fit = static_cast<int64_t>(prop.sharedMemPerMultiprocessor / (f.smem + prop.reservedSharedMemPerBlock));
  const int64_t per_sm = fit < 1 ? 1 : fit > dp.min_blocks ? dp.min_blocks : fit;
  f.splits = Arch::kSm90 ? bulk_splits(p, f.stages, per_sm, dp.producer, prop)
                         : heuristic_splits(p, per_sm * static_cast<int64_t>(prop.multiProcessorCount));
  return f;
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

// Whether every cache row starts 16 bytes aligned, so tiles load with 16-byte cp.async.
// The stride of a cache dim of extent 1 (one row or page, pages of one token, one KV
// head) never multiplies a nonzero index, so its value does not matter.
bool vector_loads(const AttnParams& p) {
  const int64_t rows = p.kv_num_rows, tokens = p.kv_block_table != nullptr ? p.kv_page_size : p.seqlen_k;
  const Strides4* st[2] = {&p.k_stride, &p.v_stride};
  for (const Strides4* s : st)
    if ((rows > 1 && s->b % 8 != 0) || (tokens > 1 && s->s % 8 != 0) || (p.heads_kv > 1 && s->h % 8 != 0)) return false;
  return p.head_dim_qk % 8 == 0 && p.head_dim_v % 8 == 0 && aligned16(p.k) && aligned16(p.v);
}

// The decode launch of p (its split count set) with policy Arch, its fit and its maps.
template <typename Arch>
decode::Launch<Arch> launch_of(const AttnParams& p, const KernelFit& fit, const decode::Parts& parts,
                               const decode::MapsOf<Arch>& maps) {
  decode::Launch<Arch> l{};
  l.dim = padded_dim(p);
  l.stages = fit.stages;
  l.smem = fit.smem;
  l.chunks = static_cast<int>(row_chunks(p));
  l.splits = static_cast<int>(p.kv_num_splits);
  l.blocks = static_cast<unsigned>(p.kv_num_splits * l.chunks * p.heads_kv * p.batch);
  l.cluster = 1;
  l.parts = parts;
  l.vec = vector_loads(p);
  l.maps = maps;
  return l;
}

// Append (with seqlen_new >= 1), then decode. The decode kernel's shared memory is
// granted first, so a refusal leaves the cache untouched.
template <typename Arch>
flashattn_status_t launch(const AttnParams& p, const decode::Launch<Arch>& l, cudaStream_t st) {
  cudaError_t err = decode::reserve(p, l);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(FLASHATTN_STATUS_LAUNCH_FAILED, "decode kernel: %zu bytes of shared memory refused: %s (%s)", l.smem,
                cudaGetErrorName(err), cudaGetErrorString(err));
  }
  if (p.kv_seqlen_new > 0) {
    const int64_t rows = p.batch * p.kv_seqlen_new * p.heads_kv;
    const unsigned blocks = static_cast<unsigned>((rows + decode::kAppendWarps - 1) / decode::kAppendWarps);
    if (p.dtype == kBf16) decode::append_kernel<__nv_bfloat16><<<blocks, decode::kAppendWarps * 32, 0, st>>>(p);
    else decode::append_kernel<__half><<<blocks, decode::kAppendWarps * 32, 0, st>>>(p);
    err = cudaGetLastError();
    if (err != cudaSuccess)
      return fail(FLASHATTN_STATUS_LAUNCH_FAILED, "KV-cache append kernel launch failed: %s (%s)",
                  cudaGetErrorName(err), cudaGetErrorString(err));
  }
  err = decode::enqueue(p, l, st);
  if (err != cudaSuccess)
    return fail(FLASHATTN_STATUS_LAUNCH_FAILED, "decode kernel launch failed: %s (%s)", cudaGetErrorName(err),
                cudaGetErrorString(err));
  return FLASHATTN_STATUS_SUCCESS;
}

#if FLASHATTN_FA2_SM90A
// The Sm90a kernel's tensor maps of p's caches (keys of a cache row, or of a page, by
// kv heads by rows or pages); false when the copy engine cannot take a pointer, stride or
// extent (encode_rows_map_16bit), and the Sm80 kernel runs instead.
bool bulk_maps(const AttnParams& p, decode::BulkMaps* m) {
  const int64_t keys = p.kv_page_size > 0 ? p.kv_page_size : p.seqlen_k;
  m->box_rows = box_rows(p);
  return encode_rows_map_16bit(&m->k, p.k, p.head_dim_qk, keys, p.heads_kv, p.kv_num_rows, p.k_stride, m->box_rows) &&
         encode_rows_map_16bit(&m->v, p.v, p.head_dim_v, keys, p.heads_kv, p.kv_num_rows, p.v_stride, m->box_rows);
}
#endif

// The CTAs per cluster of the launch l of p: Sm90a, the split count where it is 2 to
// kMaxCluster, the splits are short (at most kClusterSplitTiles tiles) and every cluster of
// the grid can be resident at once (the library's counts fill one wave), so the splits of
// each row chunk merge in distributed shared memory (decode_kernel.cuh, cluster_merge) and
// no parts or combine launch are needed; else 1. The merge saves the combine's fixed cost,
// but clusters are placed less evenly over the SMs than free CTAs, which long splits feel
// (docs/internals/kernels-decode.md: 16 splits of 128 tiles 1.09x the combine's time, of
// 32 tiles 0.97x). The resident clusters are asked once per device, kernel and size, never
// while st is being captured into a CUDA graph (the run then takes the combine, which gives
// the same bits); a failed query counts as no cluster fitting.
constexpr int64_t kClusterSplitTiles = 32;
template <typename Arch>
unsigned cluster_of(const AttnParams& p, decode::Launch<Arch> l, cudaStream_t st) {
  const int64_t tiles = (p.seqlen_k + decode::kTileK - 1) / decode::kTileK;
  if (!Arch::kSm90 || l.splits < 2 || l.splits > static_cast<int>(decode::kMaxCluster) ||
      (tiles + l.splits - 1) / l.splits > kClusterSplitTiles)
    return 1;
  l.cluster = static_cast<unsigned>(l.splits);
  constexpr int kKnownDevices = 64;
  static std::atomic<int> known[kKnownDevices][2][3][2][decode::kMaxCluster + 1];  // clusters + 1; 0: not asked
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kKnownDevices) {
    (void)cudaGetLastError();
    return 1;
  }
  std::atomic<int>& k = known[dev][p.dtype == kBf16][l.dim == 64 ? 0 : l.dim == 128 ? 1 : 2][l.stages == 2][l.cluster];
  int n = k.load(std::memory_order_relaxed) - 1;
  if (n < 0) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
      (void)cudaGetLastError();
      return 1;
    }
    if (decode::reserve(p, l) != cudaSuccess || decode::resident_clusters(p, l, &n) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
    }
    k.store(n + 1, std::memory_order_relaxed);
  }
  return static_cast<int64_t>(n) * l.cluster >= l.blocks ? l.cluster : 1;
}

// The combine of the split parts into O and LSE.
flashattn_status_t combine_parts(const AttnParams& p, const decode::Parts& parts, cudaStream_t st) {
  CombineParams c;
  const int64_t sq = p.seqlen_q, dv = p.head_dim_v, rows = p.batch * p.heads_q * sq;
  c.num_splits = p.kv_num_splits;
  c.batch = p.batch;
  c.seqlen_q = sq;
  c.heads = p.heads_q;
  c.head_dim = dv;
  c.o_partial = parts.o;
  const int64_t o_st[5] = {rows * dv, p.heads_q * sq * dv, dv, sq * dv, 1};
  const int64_t l_st[4] = {rows, p.heads_q * sq, sq, 1};
  for (int i = 0; i < 5; ++i) c.o_partial_stride[i] = o_st[i];
  c.lse_partial = parts.lse;
  for (int i = 0; i < 4; ++i) c.lse_partial_stride[i] = l_st[i];
  c.dtype = p.dtype;
  c.o = p.o;
  c.o_stride = p.o_stride;
  c.lse = p.lse;
  return combine_launch(c, st, true);
}

// A run of p with policy Arch and its maps: the kernel's fit (its split count), the parts
// in the workspace (sized by decode_workspace_size, which bounds them), the launches.
template <typename Arch>
flashattn_status_t run(const AttnParams& plan_p, const cudaDeviceProp& prop, size_t cap,
                       const decode::MapsOf<Arch>& maps, void* workspace, size_t workspace_bytes, cudaStream_t st) {
  const KernelFit fit = fit_of<Arch>(plan_p, prop, cap);
  AttnParams p = plan_p;
  p.kv_num_splits = fit.splits;
  decode::Parts parts{nullptr, nullptr};
  if (p.kv_num_splits > 1) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(workspace);
    const uintptr_t start = (base + kPartsAlign - 1) / kPartsAlign * kPartsAlign;
    if (workspace == nullptr || workspace_bytes < static_cast<size_t>(parts_bytes(p, p.kv_num_splits).value()))
      return fail(FLASHATTN_STATUS_INTERNAL_ERROR, "decode: workspace of %zu bytes is smaller than its query",
                  workspace_bytes);
    parts.o = reinterpret_cast<float*>(start);
    parts.lse = parts.o + parts_o_floats(p, p.kv_num_splits).value();
  }
  decode::Launch<Arch> l = launch_of<Arch>(p, fit, parts, maps);
  l.cluster = cluster_of(p, l, st);
  const flashattn_status_t s = launch(p, l, st);
  if (s != FLASHATTN_STATUS_SUCCESS || p.kv_num_splits == 1 || l.cluster > 1) return s;
  return combine_parts(p, parts, st);
}

}  // namespace

// The parts of the most splits a run of p may take, before its pointers are known: the
// caller's count, or the gather kernel's, and the larger of the two kernels' where the
// shape lets a run take the copy-engine kernel (each run chooses once the encode has taken
// or refused its pointers: decode_fwd).
CheckedSize decode_workspace_size(const AttnParams& p, const cudaDeviceProp& prop) {
  if (p.kv_num_splits > 0) return parts_bytes(p, p.kv_num_splits);
  const size_t cap = smem_cap(prop);
  const int64_t gather = fit_of<fa2::Sm80>(p, prop, cap).splits;
  const int64_t bulk = bulk_shape(p, prop) ? fit_of<fa2::Sm90a>(p, prop, cap).splits : 0;
  return parts_bytes(p, bulk > gather ? bulk : gather);
}

flashattn_status_t decode_check(const AttnParams& p, const cudaDeviceProp& prop) {
  if (prop.major < 8)
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                "device %s has compute capability %d.%d; the CUDA KV-cache kernels need 8.0 (Ampere) or later",
                prop.name, prop.major, prop.minor);
  if (p.dtype != kFp16 && p.dtype != kBf16)
    return fail(FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED,
                "dtype=FP32: the CUDA KV-cache kernels take fp16/bf16 tensors; run fp32 KV-cache plans on the CPU "
                "backend");
  const DimPlan& sm80 = plan_for<fa2::Sm80>(p);  // the larger rows; every run can take this kernel
  if (smem_bytes(sm80, 2) > prop.sharedMemPerBlockOptin)
    return fail(FLASHATTN_STATUS_HEAD_DIM_NOT_SUPPORTED,
                "head_dim_qk=%lld, head_dim_v=%lld: the CUDA KV-cache kernel needs %zu bytes of shared memory per "
                "block; device %s allows %zu",
                static_cast<long long>(p.head_dim_qk), static_cast<long long>(p.head_dim_v), smem_bytes(sm80, 2),
                prop.name, static_cast<size_t>(prop.sharedMemPerBlockOptin));
  if (p.seqlen_k > kMaxIndex)
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                "seqlen_k=%lld: the CUDA KV-cache kernels hold key positions in 32 bits (at most 2^31-1 keys)",
                static_cast<long long>(p.seqlen_k));
  // The library's counts are bounded (at most kMaxChosenSplits; the gather kernel's heuristic
  // takes one split from 80% of the resident CTA slots up, the copy-engine rule at most its
  // resident CTAs in all): only the caller's count or the CTAs of one split can exceed it.
  const int64_t splits = p.kv_num_splits > 0 ? p.kv_num_splits : 1;
  const int64_t blocks = splits * row_chunks(p) * p.heads_kv * p.batch;
  if (blocks > kMaxIndex)
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                "num_splits=%lld x query-row chunks=%lld x heads_kv=%lld x batch=%lld CTAs exceed the CUDA grid "
                "limit 2^31-1",
                static_cast<long long>(splits), static_cast<long long>(row_chunks(p)),
                static_cast<long long>(p.heads_kv), static_cast<long long>(p.batch));
  if (p.batch * p.kv_seqlen_new * p.heads_kv > kMaxIndex)
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                "batch=%lld x seqlen_new=%lld x heads_kv=%lld appended rows exceed the append kernel's grid (one "
                "warp per row, at most 2^31-1 rows)",
                static_cast<long long>(p.batch), static_cast<long long>(p.kv_seqlen_new),
                static_cast<long long>(p.heads_kv));
  return FLASHATTN_STATUS_SUCCESS;
}

// The kernel is chosen once per run, after the encode: Sm90a where the shape allows it and
// the copy engine takes the pointers, else Sm80; then its fit (split count) once.
flashattn_status_t decode_fwd(const AttnParams& p, const cudaDeviceProp& prop, void* workspace, size_t workspace_bytes,
                              cudaStream_t st) {
  const size_t cap = smem_cap(prop);
#if FLASHATTN_FA2_SM90A
  decode::BulkMaps maps;
  if (bulk_shape(p, prop) && bulk_maps(p, &maps))
    return run<fa2::Sm90a>(p, prop, cap, maps, workspace, workspace_bytes, st);
#endif
  return run<fa2::Sm80>(p, prop, cap, decode::NoMaps{}, workspace, workspace_bytes, st);
}

}  // namespace flashattn
