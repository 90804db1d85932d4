// Host launcher of the generation-1 backward pass (kernels/fa2/bwd*), plus its small
// memory-bound kernels: Delta = rowsum(dO * O), dQ fp32 -> dtype, dBias zero-fill and
// fp32 -> dtype.
//
// Sequence on the caller's stream (no allocation, no synchronization):
//   1. memset of the deterministic turn counters and the broadcast-dBias accumulator
//      (one contiguous workspace range);
//   2. dBias zero-fill (direct mode, only when masks or varlen leave elements unwritten);
//   3. Delta, which also zeroes the fp32 dQ accumulator;
//   4. main kernel (+ zero dK/dV of varlen tokens outside every sequence);
//   5. dQ convert (applies the softmax scale);
//   6. dBias convert (broadcast mode) or, deterministic, the fixed-order slab reduction.
// Head dims that are not a multiple of 8 run on zero-padded copies (fa2_staging.cu): the
// inputs are copied before step 1, the gradients back after step 6.
#include <cuda_runtime.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include <algorithm>
#include <array>
#include <utility>

#include "cuda/fa2_arch.hpp"
#include "cuda/launch.hpp"
#include "cuda/tensor_map.hpp"
#include "error.hpp"
#include "fa2/bwd_ctx.cuh"
#include "fa2/bwd_traits.h"
#include "fa2/launchers.h"
#include "fa3/bwd_traits.h"

namespace flashattn {
namespace fa2 {
namespace {

// Every instantiated main kernel (kBwdInstances, same indices): its traits' tiles and
// shared memory.
struct BwdKernel {
  int d, dv, variant, br, bc;
  bool dq_bulk;    // the Sm90a code reduces staged dQ blocks with a TMA map (BwdTraits::kDqBulk)
  bool tma_qdo;    // the Sm90a code prefetches Q/dO tiles with TMA maps (BwdTraits::kTmaQdo)
  int smem[2][3];  // dynamic shared memory by [Sm90a code][stage count (index 1, 2)]
};
template <int I>
constexpr BwdKernel kernel_entry() {
  constexpr BwdInstance in = kBwdInstances[I];
  using Tr = typename BwdCfgFor<in.d, in.dv, in.variant>::type;
  static_assert(Tr::D == in.d && Tr::DV == in.dv, "BwdCfgFor dims");
  return {
      in.d,
      in.dv,
      in.variant,
      Tr::Br,
      Tr::Bc,
      Tr::kDqBulk,
      Tr::kTmaQdo,
      {{0, Tr::smem_bytes(1, false), Tr::smem_bytes(2, false)}, {0, Tr::smem_bytes(1, true), Tr::smem_bytes(2, true)}}};
}
template <int... I>
constexpr std::array<BwdKernel, sizeof...(I)> kernel_table(std::integer_sequence<int, I...>) {
  return {{kernel_entry<I>()...}};
}
constexpr std::array<BwdKernel, kNumBwdInstances> kKernels =
    kernel_table(std::make_integer_sequence<int, kNumBwdInstances>());
static_assert(sizeof(BwdCtx) <= kBwdStaticSmemSlack, "the main kernel's static shared memory outgrew the budget");

// The kernel of config `cfg` under an opt-in shared memory limit of `limit` bytes per
// block: variant 0 with 2 stages, then 1 stage, then the small variant likewise, in the
// code of policy `arch` (its shared-memory layout: BwdTraits::smem_bytes).
bool choose_kernel(int cfg, int limit, int arch, BwdChoice* out) {
  const bool sm90 = arch == kArchSm90a;
  const int cand[2] = {cfg, kBwdInstances[cfg].small};
  for (int k : cand) {
    if (k < 0) continue;
    for (int stages = 2; stages >= 1; --stages) {
      const BwdKernel& e = kKernels[k];
      if (e.smem[sm90][stages] + kBwdStaticSmemSlack > limit) continue;
      *out = BwdChoice{static_cast<ArchId>(arch), k, e.d, e.dv, e.variant, stages, e.smem[sm90][stages], e.br, e.bc};
      return true;
    }
  }
  return false;
}

// Least shared memory config `cfg` can run with (for the refusal message).
int min_smem(int cfg, bool sm90) {
  const int s = kBwdInstances[cfg].small;
  int m = kKernels[cfg].smem[sm90][1];
  if (s >= 0 && kKernels[s].smem[sm90][1] < m) m = kKernels[s].smem[sm90][1];
  return m + kBwdStaticSmemSlack;
}

// Smallest query tile among the kernels config `cfg` may run on: the workspace (sized
// before the device is known to the query) covers whichever one a run takes.
int min_br(int cfg) {
  const int s = kBwdInstances[cfg].small;
  int br = kKernels[cfg].br;
  if (s >= 0 && kKernels[s].br < br) br = kKernels[s].br;
  return br;
}

// ---------------------------------------------------------------------------------
// Workspace layout
// ---------------------------------------------------------------------------------
struct DbiasLayout {
  bool broadcast = false;             // some dim has stride 0 and size > 1
  int64_t size[4] = {0, 0, 0, 0};     // logical sizes (batch, heads_q, seqlen_q, seqlen_k)
  int64_t csize[4] = {0, 0, 0, 0};    // compact accumulator sizes (1 along broadcast dims)
  int64_t cstride[4] = {0, 0, 0, 0};  // compact accumulator strides (0 along broadcast dims)
  int64_t celems = 0;
};

DbiasLayout dbias_layout(const AttnParams& p) {
  DbiasLayout d;
  if (p.bias_kind != kBiasTensor) return d;
  d.size[0] = p.batch;
  d.size[1] = p.heads_q;
  d.size[2] = p.seqlen_q;
  d.size[3] = p.seqlen_k;
  for (int i = 0; i < 4; ++i) {
    const bool bc = p.bias_stride[i] == 0 && d.size[i] > 1;
    d.broadcast = d.broadcast || bc;
    d.csize[i] = bc ? 1 : d.size[i];
  }
  int64_t s = 1;
  for (int i = 3; i >= 0; --i) {
    d.cstride[i] = d.csize[i] == 1 ? 0 : s;
    s *= d.csize[i];
  }
  d.celems = s;
  return d;
}

// Head extent of the deterministic dBias slab: kv heads when dBias is summed over heads
// (each CTA then adds its GQA group in order), query heads otherwise.
int64_t slab_heads(const AttnParams& p) { return (p.bias_stride[1] == 0 && p.heads_q > 1) ? p.heads_kv : p.heads_q; }

// Byte offsets of the workspace buffers, from the first 256-byte boundary. Sizes come from
// caller input, so they are computed in checked arithmetic: the offsets are meaningful only
// when total.ok() (the API layer refuses the run or query otherwise).
struct WsLayout {
  size_t delta = 0, dq = 0, dq_turns = 0, dbias = 0;
  int64_t n_turns = 0;  // turn counters at dq_turns (deterministic mode; the Delta kernel zeroes them)
  CheckedSize total;
};

WsLayout ws_layout(const AttnParams& p, int cfg) {
  WsLayout w;
  const CheckedSize rows = p.varlen ? CheckedSize(p.total_q) : checked_product(p.batch, p.seqlen_q);
  // The turn counters (deterministic mode) serve the fa3 backward too: one per query block
  // of the smaller of the two families' query tiles.
  const int br = std::min(min_br(cfg < 0 ? 0 : cfg), fa3::kBwdMinBlockM);
  const int64_t n_qblocks = (p.seqlen_q + br - 1) / br;
  CheckedSize off = 0;
  w.delta = static_cast<size_t>(off.value());
  off = (off + rows * checked_product(p.heads_q, sizeof(float))).round_up(256);
  w.dq = static_cast<size_t>(off.value());
  off = (off + rows * checked_product(p.heads_q, p.head_dim_qk, sizeof(float))).round_up(256);
  w.dq_turns = static_cast<size_t>(off.value());
  if (p.deterministic) {
    const CheckedSize turns = checked_product(p.batch, p.heads_q, n_qblocks);
    off = (off + turns * CheckedSize(sizeof(int32_t))).round_up(256);
    w.n_turns = turns.value();
  }
  w.dbias = static_cast<size_t>(off.value());
  const DbiasLayout db = dbias_layout(p);
  // dbias is not known at workspace-query time: reserve the accumulator whenever the
  // bias is broadcast (a run without dbias simply leaves it unused). Deterministic mode
  // needs the full-size slab (see kDbiasSlab), otherwise the compact atomic target.
  if (db.broadcast) {
    const CheckedSize n =
        p.deterministic ? checked_product(p.batch, slab_heads(p), p.seqlen_q, p.seqlen_k) : CheckedSize(db.celems);
    off = (off + n * CheckedSize(sizeof(float))).round_up(256);
  }
  w.total = off;
  return w;
}

// ---------------------------------------------------------------------------------
// Small kernels
// ---------------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void bwd_unpack8(const uint4& u, float (&f)[8]) {
  const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = ElemTraits<T>::to_float(h[i]);
}

// Delta[row, h] = sum_c dO * O over head_dim_v. `lanes` threads (a power of two <= 32)
// share one (token, head) row; the loop runs per warp so shuffles stay converged. The same
// threads zero the row's head_dim_qk fp32 dQ accumulators (row-major like the rows here)
// and, one per thread, the n_turns turn counters: one pass instead of memsets of either
// (the main kernel, which reads both, follows on the same stream).
template <typename T>
__global__ void __launch_bounds__(256)
    bwd_delta_kernel(const AttnParams p, float* __restrict__ delta, float* __restrict__ dq_accum,
                     int32_t* __restrict__ dq_turns, int64_t n_turns, int lanes) {
  for (int64_t x = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < n_turns;
       x += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dq_turns[x] = 0;
  const int64_t rows = lse_row_count(p);
  const int rows_per_warp = 32 / lanes;
  const int64_t n_warps = (rows + rows_per_warp - 1) / rows_per_warp;
  const int lane = threadIdx.x & 31;
  const int sub = lane / lanes, li = lane % lanes;
  const int chunks = static_cast<int>(p.head_dim_v / 8);
  const int64_t warp0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warp_step = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t w = warp0; w < n_warps; w += warp_step) {
    const int64_t row = w * rows_per_warp + sub;
    float acc = 0.f;
    int64_t out_idx = -1;
    if (row < rows) {
      const int64_t tok = row / p.heads_q;
      const int64_t h = row % p.heads_q;
      int64_t o_off, do_off;
      if (p.varlen) {
        o_off = tok * p.o_stride.s + h * p.o_stride.h;
        do_off = tok * p.do_stride.s + h * p.do_stride.h;
        out_idx = h * p.total_q + tok;
      } else {
        const int64_t b = tok / p.seqlen_q, i = tok % p.seqlen_q;
        o_off = b * p.o_stride.b + i * p.o_stride.s + h * p.o_stride.h;
        do_off = b * p.do_stride.b + i * p.do_stride.s + h * p.do_stride.h;
        out_idx = (b * p.heads_q + h) * p.seqlen_q + i;
      }
      const T* o = static_cast<const T*>(p.o_in) + o_off;
      const T* d = static_cast<const T*>(p.dout) + do_off;
      if (dq_accum != nullptr) {
        float4* const dq_row = reinterpret_cast<float4*>(dq_accum + row * p.head_dim_qk);
        for (int c = li; c < static_cast<int>(p.head_dim_qk / 4); c += lanes)
          dq_row[c] = make_float4(0.f, 0.f, 0.f, 0.f);
      }
      for (int c = li; c < chunks; c += lanes) {
        float fo[8], fd[8];
        bwd_unpack8<T>(*reinterpret_cast<const uint4*>(o + c * 8), fo);
        bwd_unpack8<T>(*reinterpret_cast<const uint4*>(d + c * 8), fd);
#pragma unroll
        for (int k = 0; k < 8; ++k) acc = fmaf(fo[k], fd[k], acc);
      }
    }
    for (int off = lanes / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (li == 0 && out_idx >= 0) delta[out_idx] = acc;
  }
}

// dQ = scale * dq_accum in the output dtype, 8 elements per thread-step; when accumulating
// (p.grad_accumulate) the fp32 sum of that and the stored dQ, rounded once.
template <typename T>
__global__ void __launch_bounds__(256) bwd_dq_convert_kernel(const AttnParams p, const float* __restrict__ acc) {
  const int64_t rows = p.varlen ? p.total_q : p.batch * p.seqlen_q;
  const int64_t cpr = p.head_dim_qk / 8;  // chunks per (token, head)
  const int64_t n = rows * p.heads_q * cpr;
  const float scale = p.scale;
  for (int64_t x = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < n;
       x += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = x % cpr;
    const int64_t th = x / cpr;
    const int64_t h = th % p.heads_q, tok = th / p.heads_q;
    const float4 a0 = *reinterpret_cast<const float4*>(acc + x * 8);
    const float4 a1 = *reinterpret_cast<const float4*>(acc + x * 8 + 4);
    const float f[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    int64_t off;
    if (p.varlen) {
      off = tok * p.dq_stride.s;
    } else {
      off = (tok / p.seqlen_q) * p.dq_stride.b + (tok % p.seqlen_q) * p.dq_stride.s;
    }
    off += h * p.dq_stride.h + c * 8;
    uint4* const dst = reinterpret_cast<uint4*>(static_cast<T*>(p.dq) + off);
    float g[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) g[k] = __fmul_rn(f[k], scale);
    if (p.grad_accumulate) {
      float old[8];
      bwd_unpack8<T>(*dst, old);
#pragma unroll
      for (int k = 0; k < 8; ++k) g[k] = __fadd_rn(old[k], g[k]);
    }
    uint4 u;
    uint32_t* w = reinterpret_cast<uint32_t*>(&u);
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = pack2<T>(g[2 * k], g[2 * k + 1]);
    *dst = u;
  }
}

// Zero every element of the logical dBias [batch, heads_q, seqlen_q, seqlen_k].
template <typename T>
__global__ void __launch_bounds__(256) bwd_dbias_zero_kernel(const AttnParams p) {
  const int64_t n = p.batch * p.heads_q * p.seqlen_q * p.seqlen_k;
  T* db = static_cast<T*>(p.dbias);
  const T zero = ElemTraits<T>::from_float(0.f);
  for (int64_t x = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < n;
       x += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = x % p.seqlen_k;
    int64_t r = x / p.seqlen_k;
    const int64_t i = r % p.seqlen_q;
    r /= p.seqlen_q;
    const int64_t h = r % p.heads_q, b = r / p.heads_q;
    db[b * p.bias_stride[0] + h * p.bias_stride[1] + i * p.bias_stride[2] + j * p.bias_stride[3]] = zero;
  }
}

// dBias (user strides) = compact fp32 accumulator [csize0, csize1, csize2, csize3].
template <typename T>
__global__ void __launch_bounds__(256) bwd_dbias_convert_kernel(const AttnParams p, const float* __restrict__ acc,
                                                                int64_t c1, int64_t c2, int64_t c3, int64_t n) {
  T* db = static_cast<T*>(p.dbias);
  for (int64_t x = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < n;
       x += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = x % c3;
    int64_t r = x / c3;
    const int64_t i = r % c2;
    r /= c2;
    const int64_t h = r % c1, b = r / c1;
    db[b * p.bias_stride[0] + h * p.bias_stride[1] + i * p.bias_stride[2] + j * p.bias_stride[3]] =
        ElemTraits<T>::from_float(acc[x]);
  }
}

// Deterministic broadcast dBias: each output element sums the slab over the broadcast
// dims in a fixed order (batch, head, query, key), so the result is bitwise reproducible.
struct SlabReduce {
  int64_t csize[4];  // output (compact) extents
  int32_t bcast[4];  // dims summed over
  int64_t slab_h;    // slab head extent (heads_kv when heads are summed, else heads_q)
  int64_t n;         // output elements
};

template <typename T>
__global__ void __launch_bounds__(256)
    bwd_dbias_slab_reduce_kernel(const AttnParams p, const float* __restrict__ slab, const SlabReduce r) {
  T* db = static_cast<T*>(p.dbias);
  const int64_t nb = r.bcast[0] ? p.batch : 1, nh = r.bcast[1] ? r.slab_h : 1;
  const int64_t ni = r.bcast[2] ? p.seqlen_q : 1, nj = r.bcast[3] ? p.seqlen_k : 1;
  for (int64_t x = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < r.n;
       x += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j0 = x % r.csize[3];
    int64_t q = x / r.csize[3];
    const int64_t i0 = q % r.csize[2];
    q /= r.csize[2];
    const int64_t h0 = q % r.csize[1], b0 = q / r.csize[1];
    float sum = 0.f;
    for (int64_t bb = 0; bb < nb; ++bb) {
      const int64_t b = r.bcast[0] ? bb : b0;
      for (int64_t hh = 0; hh < nh; ++hh) {
        const int64_t h = r.bcast[1] ? hh : h0;
        for (int64_t ii = 0; ii < ni; ++ii) {
          const int64_t i = r.bcast[2] ? ii : i0;
          const float* row = slab + ((b * r.slab_h + h) * p.seqlen_q + i) * p.seqlen_k;
          for (int64_t jj = 0; jj < nj; ++jj) sum += row[r.bcast[3] ? jj : j0];
        }
      }
    }
    db[b0 * p.bias_stride[0] + h0 * p.bias_stride[1] + i0 * p.bias_stride[2] + j0 * p.bias_stride[3]] =
        ElemTraits<T>::from_float(sum);
  }
}

unsigned grid_for(int64_t work_items, int64_t per_block) {
  int64_t g = (work_items + per_block - 1) / per_block;
  if (g < 1) g = 1;
  if (g > (int64_t{1} << 20)) g = int64_t{1} << 20;  // grid-stride loops cover the rest
  return static_cast<unsigned>(g);
}

flashattn_status_t launch_error(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return FLASHATTN_STATUS_SUCCESS;
  return fail(FLASHATTN_STATUS_LAUNCH_FAILED, "fa2 backward: launching %s failed: %s (%s)", what, cudaGetErrorName(err),
              cudaGetErrorString(err));
}

// Delta = rowsum(dO * O), the fp32 dQ accumulator and the n_turns turn counters zeroed in
// the same pass (varlen: the counters may outnumber the rows).
template <typename T>
flashattn_status_t launch_delta(const AttnParams& p, float* delta, float* dq_accum, int32_t* dq_turns, int64_t n_turns,
                                cudaStream_t stream) {
  int lanes = 1;
  while (lanes < 32 && lanes * 8 < p.head_dim_v) lanes *= 2;
  const int64_t threads = std::max(lse_row_count(p) * lanes, n_turns);
  if (threads == 0) return FLASHATTN_STATUS_SUCCESS;
  bwd_delta_kernel<T><<<grid_for(threads, 256), 256, 0, stream>>>(p, delta, dq_accum, dq_turns, n_turns, lanes);
  return launch_error("the Delta preprocess kernel");
}

// dQ = scale * the accumulator, in the output dtype (also zero for query tokens outside
// every sequence: nothing was added there).
template <typename T>
flashattn_status_t launch_dq_convert(const AttnParams& p, const float* dq_accum, cudaStream_t stream) {
  const int64_t rows = p.varlen ? p.total_q : p.batch * p.seqlen_q;
  const int64_t nchunks = rows * p.heads_q * (p.head_dim_qk / 8);
  if (nchunks == 0) return FLASHATTN_STATUS_SUCCESS;
  bwd_dq_convert_kernel<T><<<grid_for(nchunks, 256), 256, 0, stream>>>(p, dq_accum);
  return launch_error("the dQ convert kernel");
}

template <typename T>
flashattn_status_t run_aux(const AttnParams& p, const BwdArgs& a, const DbiasLayout& db, const BwdChoice& kc,
                           cudaStream_t stream, char* ws, const WsLayout& wl) {
  // 1. zero the broadcast dBias accumulator (the Delta kernel zeroes the dQ accumulator,
  // +0..1% over a memset of it on an H100, and the turn counters).
  const size_t z0 = wl.dbias;
  const size_t total = static_cast<size_t>(wl.total.value());
  if (total > z0) {
    const cudaError_t err = cudaMemsetAsync(ws + z0, 0, total - z0, stream);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return fail(FLASHATTN_STATUS_CUDA_ERROR, "fa2 backward: cudaMemsetAsync of %zu workspace bytes failed: %s (%s)",
                  total - z0, cudaGetErrorName(err), cudaGetErrorString(err));
    }
  }
  // 2. direct dBias: elements of skipped tiles and past varlen ends are never written.
  if (a.dbias_mode == kDbiasDirect && (p.has_band || p.layout != nullptr || p.varlen)) {
    const int64_t n = p.batch * p.heads_q * p.seqlen_q * p.seqlen_k;
    if (n > 0) {
      bwd_dbias_zero_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(p);
      if (const flashattn_status_t s = launch_error("the dBias zero-fill kernel")) return s;
    }
  }
  // 3. Delta, and the dQ accumulator and turn counters zeroed.
  if (const flashattn_status_t s = launch_delta<T>(p, a.delta, a.dq_accum, a.dq_turns, wl.n_turns, stream)) return s;
  // 4. main kernel.
  const int64_t ctas = static_cast<int64_t>(a.n_kblocks) * p.heads_kv * p.batch;
  if (ctas > 0) {
    const cudaError_t err = kBwdLaunch[kc.arch][kc.kernel][p.dtype](a, kc.smem_bytes, stream);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return fail(FLASHATTN_STATUS_LAUNCH_FAILED,
                  "fa2 backward: launching the main kernel (head dims %d/%d config%s, %d stage(s), %d bytes shared "
                  "memory) failed: %s (%s)",
                  kc.d, kc.dv, kc.variant ? " small variant" : "", kc.stages, kc.smem_bytes, cudaGetErrorName(err),
                  cudaGetErrorString(err));
    }
  }
  // 5. dQ (also zero for query tokens outside every sequence: nothing was added there).
  // dK/dV of key tokens outside every sequence: src/cuda/varlen_tail.cu, after the run.
  if (const flashattn_status_t s = launch_dq_convert<T>(p, a.dq_accum, stream)) return s;
  // 6. broadcast dBias.
  if (a.dbias_mode == kDbiasSlab && db.celems > 0) {
    SlabReduce r;
    for (int i = 0; i < 4; ++i) {
      r.csize[i] = db.csize[i];
      r.bcast[i] = db.csize[i] != db.size[i];
    }
    r.slab_h = slab_heads(p);
    r.n = db.celems;
    bwd_dbias_slab_reduce_kernel<T><<<grid_for(db.celems, 256), 256, 0, stream>>>(p, a.dbias_accum, r);
    if (const flashattn_status_t s = launch_error("the deterministic dBias reduction kernel")) return s;
  }
  if (a.dbias_mode == kDbiasAccum && db.celems > 0) {
    bwd_dbias_convert_kernel<T><<<grid_for(db.celems, 256), 256, 0, stream>>>(p, a.dbias_accum, db.csize[1],
                                                                              db.csize[2], db.csize[3], db.celems);
    if (const flashattn_status_t s = launch_error("the dBias convert kernel")) return s;
  }
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace

}  // namespace fa2

// The caller's workspace may have any alignment: the layout starts at the first 256-byte
// boundary inside it (the dQ accumulator takes float4 atomics), hence 255 bytes of slack.
constexpr size_t kWsAlignSlack = 255;

// The staged copies (fa2_staging.cu) follow the kernels' layout, at its 256-byte rounded end.
CheckedSize fa2_bwd_workspace_size(const AttnParams& user) {
  const AttnParams p = fa2_kernel_shape(user);
  const int cfg = fa2::select_bwd_config(p.head_dim_qk, p.head_dim_v);
  return fa2::ws_layout(p, cfg).total + fa2_staging_bytes(user) + CheckedSize(kWsAlignSlack);
}

flashattn_status_t fa2_bwd(const AttnParams& user, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  using namespace fa2;
  AttnParams p = fa2_kernel_shape(user);
  // ---- every check before anything is written ----
  if (p.dtype != kFp16 && p.dtype != kBf16) {
    return fail(FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED, "dtype=%d: the CUDA fa2 backward supports fp16 and bf16 only",
                static_cast<int>(p.dtype));
  }
  const int cfg = select_bwd_config(p.head_dim_qk, p.head_dim_v);
  if (cfg < 0) {
    return fail(FLASHATTN_STATUS_HEAD_DIM_NOT_SUPPORTED,
                "head_dim_qk=%lld, head_dim_v=%lld: the CUDA fa2 backward serves head dims up to 256",
                static_cast<long long>(user.head_dim_qk), static_cast<long long>(user.head_dim_v));
  }
  const DbiasLayout db = dbias_layout(p);
  const int32_t dbias_mode = p.dbias == nullptr ? kDbiasNone
                             : !db.broadcast    ? kDbiasDirect
                             : p.deterministic  ? kDbiasSlab
                                                : kDbiasAccum;
  if (p.seqlen_q >= (int64_t{1} << 30) || p.seqlen_k >= (int64_t{1} << 30)) {
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                "seqlen_q=%lld, seqlen_k=%lld: the CUDA fa2 backward supports sequence lengths below 2^30",
                static_cast<long long>(p.seqlen_q), static_cast<long long>(p.seqlen_k));
  }
  int dev = 0, optin = 0;
  int arch = -1;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (err == cudaSuccess) err = fa2_device_arch(dev, &arch);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(FLASHATTN_STATUS_CUDA_ERROR, "fa2 backward: querying the shared memory limit failed: %s (%s)",
                cudaGetErrorName(err), cudaGetErrorString(err));
  }
  const int limit = smem_limit(optin);
  BwdChoice kc{};
  if (arch < 0) {
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                "fa2 backward: device %d: this build has no kernels for its compute capability "
                "(FLASHATTN_CUDA_ARCHITECTURES)",
                dev);
  }
  const bool sm90 = arch == kArchSm90a;
  if (!choose_kernel(cfg, limit, arch, &kc)) {
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                "head_dim_qk=%lld, head_dim_v=%lld: the CUDA fa2 backward needs at least %d bytes of shared memory "
                "per block for these head dims; device %d allows %d%s",
                static_cast<long long>(user.head_dim_qk), static_cast<long long>(user.head_dim_v), min_smem(cfg, sm90),
                dev, limit, limit < optin ? " (capped by FLASHATTN_CUDA_SMEM_LIMIT)" : "");
  }
  const int64_t n_kblocks = (p.seqlen_k + kc.bc - 1) / kc.bc;
  const int64_t n_qblocks = (p.seqlen_q + kc.br - 1) / kc.br;
  const int64_t ctas = n_kblocks * p.heads_kv * p.batch;
  if (ctas > INT32_MAX) {
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                "batch=%lld x heads_kv=%lld x %lld key blocks = %lld thread blocks exceeds the CUDA grid limit",
                static_cast<long long>(p.batch), static_cast<long long>(p.heads_kv), static_cast<long long>(n_kblocks),
                static_cast<long long>(ctas));
  }
  const WsLayout wl = ws_layout(p, cfg);
  // ok(): checked by the API layer
  const size_t total = static_cast<size_t>((wl.total + fa2_staging_bytes(user)).value());
  char* ws = nullptr;
  if (const flashattn_status_t s =
          workspace_at_boundary(workspace, workspace_bytes, total, "the CUDA fa2 backward needs", &ws))
    return s;
  if (const flashattn_status_t s = fa2_stage_in(user, ws + wl.total.value(), &p, stream)) return s;
  BwdArgs a{};
  a.p = p;
  a.delta = reinterpret_cast<float*>(ws + wl.delta);
  a.dq_accum = reinterpret_cast<float*>(ws + wl.dq);
  a.dq_turns = p.deterministic ? reinterpret_cast<int32_t*>(ws + wl.dq_turns) : nullptr;
  a.dbias_accum =
      (dbias_mode == kDbiasAccum || dbias_mode == kDbiasSlab) ? reinterpret_cast<float*>(ws + wl.dbias) : nullptr;
  if (dbias_mode == kDbiasSlab) {
    a.dbias_accum_stride[3] = 1;
    a.dbias_accum_stride[2] = p.seqlen_k;
    a.dbias_accum_stride[1] = p.seqlen_q * p.seqlen_k;
    a.dbias_accum_stride[0] = slab_heads(p) * p.seqlen_q * p.seqlen_k;
    a.dbias_slab_kvhead = (p.bias_stride[1] == 0 && p.heads_q > 1) ? 1 : 0;  // as slab_heads()
  } else {
    for (int i = 0; i < 4; ++i) a.dbias_accum_stride[i] = db.cstride[i];
  }
  a.dbias_mode = dbias_mode;
  a.n_kblocks = static_cast<int32_t>(n_kblocks);
  a.n_qblocks = static_cast<int32_t>(n_qblocks);
  a.stages = kc.stages;
  // The TMA map of the dQ accumulator for kernels that reduce through the copy engine
  // (sm_90 devices; not in deterministic mode, whose adds are ordered by turn counters).
  // Without an encoder in the driver the kernel keeps its register reductions.
  TensorMap128 dq_map;
  a.dq_map_ok = 0;
  a.dq_map = &dq_map;
  if (kKernels[kc.kernel].dq_bulk && sm90 && !p.deterministic &&
      encode_dq_accum_map(&dq_map, a.dq_accum, p.head_dim_qk, p.heads_q, p.varlen ? p.total_q : p.batch * p.seqlen_q,
                          32, 16))
    a.dq_map_ok = 1;
  // TMA maps of Q and dO for kernels that prefetch through the copy engine (two stages on
  // an sm_90 device; otherwise, or when the engine cannot take the strides, cp.async).
  TensorMap128 qdo_maps[2];
  a.qdo_map_ok = 0;
  a.qdo_maps = qdo_maps;
  if (kKernels[kc.kernel].tma_qdo && sm90 && kc.stages == 2) {
    const int64_t rows = p.varlen ? p.total_q : p.seqlen_q, nb = p.varlen ? 1 : p.batch;
    auto map_of = [&](TensorMap128* mp, const void* base, int64_t cols, const Strides4& s) {
      return encode_rows_map_16bit(mp, base, cols, rows, p.heads_q, nb, s, kc.br);
    };
    if (map_of(&qdo_maps[0], p.q, p.head_dim_qk, p.q_stride) && map_of(&qdo_maps[1], p.dout, p.head_dim_v, p.do_stride))
      a.qdo_map_ok = 1;
  }
  const flashattn_status_t s = p.dtype == kBf16 ? run_aux<__nv_bfloat16>(p, a, db, kc, stream, ws, wl)
                                                : run_aux<__half>(p, a, db, kc, stream, ws, wl);
  return s != FLASHATTN_STATUS_SUCCESS ? s : fa2_stage_out(user, p, stream);
}

// ---- the parts the fa3 backward shares (launch.hpp) ----

namespace {
// fa2's workspace layout, which the fa3 backward shares.
fa2::WsLayout shared_ws_layout(const AttnParams& p) {
  return fa2::ws_layout(p, fa2::select_bwd_config(p.head_dim_qk, p.head_dim_v));
}
}  // namespace

flashattn_status_t fa2_bwd_stage_in(const AttnParams& user, void* workspace, size_t workspace_bytes, AttnParams* kp,
                                    cudaStream_t stream) {
  const fa2::WsLayout wl = shared_ws_layout(*kp);
  const size_t total = static_cast<size_t>((wl.total + fa2_staging_bytes(user)).value());  // ok(): the API layer
  char* ws = nullptr;
  if (const flashattn_status_t s =
          workspace_at_boundary(workspace, workspace_bytes, total, "the CUDA backward needs", &ws))
    return s;
  return fa2_stage_in(user, ws + wl.total.value(), kp, stream);
}

flashattn_status_t fa2_bwd_scratch(const AttnParams& p, void* workspace, size_t workspace_bytes, fa3::BwdScratch* out) {
  const fa2::WsLayout wl = shared_ws_layout(p);
  const size_t need = static_cast<size_t>(wl.total.value());  // ok(): checked by the API layer
  char* ws = nullptr;
  if (const flashattn_status_t s =
          workspace_at_boundary(workspace, workspace_bytes, need, "the CUDA backward needs", &ws))
    return s;
  out->delta = reinterpret_cast<float*>(ws + wl.delta);
  out->dq_accum = reinterpret_cast<float*>(ws + wl.dq);
  out->dq_turns = p.deterministic ? reinterpret_cast<int32_t*>(ws + wl.dq_turns) : nullptr;
  return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status_t bwd_delta(const AttnParams& p, const fa3::BwdScratch& s, cudaStream_t stream) {
  const int64_t n_turns = shared_ws_layout(p).n_turns;
  return p.dtype == kBf16 ? fa2::launch_delta<__nv_bfloat16>(p, s.delta, s.dq_accum, s.dq_turns, n_turns, stream)
                          : fa2::launch_delta<__half>(p, s.delta, s.dq_accum, s.dq_turns, n_turns, stream);
}

flashattn_status_t bwd_dq_convert(const AttnParams& p, const fa3::BwdScratch& scratch, cudaStream_t stream) {
  return p.dtype == kBf16 ? fa2::launch_dq_convert<__nv_bfloat16>(p, scratch.dq_accum, stream)
                          : fa2::launch_dq_convert<__half>(p, scratch.dq_accum, stream);
}

}  // namespace flashattn
