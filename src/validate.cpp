// Validation of tensor layouts and of whole runs, and construction of AttnParams.
//
// Everything a run needs to know is checked here, in a fixed order, before a backend
// sees the run; backends add only their own support checks. This is what makes the
// "nothing written on failure" promise hold.
#include <math.h>
#include <stdint.h>

#include <cstring>
#include <utility>

#include "backends.hpp"
#include "common/philox.h"
#include "error.hpp"
#include "plan.hpp"
#include "regions.hpp"
#include "validate_util.hpp"

namespace flashattn {
namespace {

const char* tensor_name(flashattn_tensor_t t) {
  static const char* const names[] = {"q", "k", "v", "o", "dout", "dq", "dk", "dv"};
  return names[static_cast<int>(t)];
}

bool is_output(flashattn_tensor_t t) {
  return t == FLASHATTN_TENSOR_O || t == FLASHATTN_TENSOR_DQ || t == FLASHATTN_TENSOR_DK || t == FLASHATTN_TENSOR_DV;
}

}  // namespace

// True when no two distinct in-range indices map to the same offset. Dimensions of
// extent 1 are irrelevant; the others, sorted by stride, must each step past the whole
// span of the smaller ones (the usual sufficient condition for non-overlap).
bool non_overlapping(int n, const int64_t* extents, const int64_t* strides) {
  struct Dim {
    int64_t extent, stride;
  };
  Dim dims[4];
  int m = 0;
  for (int i = 0; i < n; ++i)
    if (extents[i] == 0) return true;  // an empty tensor has no elements to alias
  for (int i = 0; i < n; ++i) {
    if (extents[i] <= 1) continue;
    if (strides[i] == 0) return false;
    dims[m++] = {extents[i], strides[i]};
  }
  for (int i = 1; i < m; ++i)  // insertion sort by stride (at most 4 dims)
    for (int j = i; j > 0 && dims[j].stride < dims[j - 1].stride; --j) std::swap(dims[j], dims[j - 1]);
  int64_t span = 0;  // largest offset reachable with the dims so far
  for (int i = 0; i < m; ++i) {
    if (dims[i].stride <= span) return false;
    span += dims[i].stride * (dims[i].extent - 1);
  }
  return true;
}

int64_t dtype_size(flashattn_dtype_t d) { return d == FLASHATTN_DTYPE_FP32 ? 4 : 2; }

namespace {

const char* backend_name(const flashattn_plan_s& plan) {
  return plan.backend == FLASHATTN_BACKEND_CPU ? "CPU" : "CUDA";
}

// The memory regions of a run (regions.hpp): every pointer of p with its extent and
// alignment, in the order of the args structs, then the workspace (last, its extent 0
// until the pass's size is known). Tensors are aligned to their element size, the
// workspace to what the backend requires.
constexpr int kRunRegions = 17;
constexpr int kWorkspaceRegion = kRunRegions - 1;
void run_regions(const flashattn_plan_s& plan, const AttnParams& p, const void* workspace, Region* out) {
  const int64_t es = dtype_size(plan.dtype);
  const struct {
    const char* name;
    const void* ptr;
    flashattn_tensor_t tensor;
    bool written;
  } tensors[] = {{"args.q", p.q, FLASHATTN_TENSOR_Q, false},    {"args.k", p.k, FLASHATTN_TENSOR_K, false},
                 {"args.v", p.v, FLASHATTN_TENSOR_V, false},    {"args.o", p.o, FLASHATTN_TENSOR_O, true},
                 {"args.o", p.o_in, FLASHATTN_TENSOR_O, false}, {"args.dout", p.dout, FLASHATTN_TENSOR_DO, false},
                 {"args.dq", p.dq, FLASHATTN_TENSOR_DQ, true},  {"args.dk", p.dk, FLASHATTN_TENSOR_DK, true},
                 {"args.dv", p.dv, FLASHATTN_TENSOR_DV, true}};
  int n = 0;
  for (const auto& t : tensors) {
    Region& r = out[n++];
    r = Region{t.name, t.ptr, 4, {}, {}, es, es, t.written};
    tensor_extents(plan, t.tensor, r.extents);
    const Strides4& st = plan.strides[t.tensor];
    const int64_t strides[4] = {st.b, st.s, st.h, st.d};
    for (int k = 0; k < 4; ++k) r.strides[k] = strides[k];
  }
  // LSE [batch, heads_q, seqlen_q] or [heads_q, total_q]: heads_q x rows contiguous floats.
  const int64_t rows = plan.varlen ? plan.total_q : plan.batch * plan.seqlen_q;  // bounded by set_shape
  out[n++] = Region{"args.lse", p.lse, 2, {plan.heads_q, rows}, {rows, 1}, 4, 4, true};
  out[n++] = Region{"args.lse", p.lse_in, 2, {plan.heads_q, rows}, {rows, 1}, 4, 4, false};
  const Region bias{"args.bias",
                    p.bias,
                    4,
                    {plan.batch, plan.heads_q, plan.seqlen_q, plan.seqlen_k},
                    {plan.bias_stride[0], plan.bias_stride[1], plan.bias_stride[2], plan.bias_stride[3]},
                    es,
                    es,
                    false};
  out[n++] = bias;
  out[n] = bias;
  out[n].name = "args.dbias";
  out[n].base = p.dbias;
  out[n++].written = true;
  out[n++] = alibi_slopes_region(plan, p.alibi_slopes);
  out[n++] = Region{"args.cu_seqlens_q", p.cu_seqlens_q, 1, {plan.batch + 1}, {1}, 4, 4, false};
  out[n++] = Region{"args.cu_seqlens_k", p.cu_seqlens_k, 1, {plan.batch + 1}, {1}, 4, 4, false};
  const int64_t ws_align = plan.backend == FLASHATTN_BACKEND_CPU ? static_cast<int64_t>(kCpuWorkspaceAlignment) : 1;
  out[n] = Region{"workspace", workspace, 1, {0}, {1}, 1, ws_align, true};
  static_assert(sizeof tensors / sizeof tensors[0] + 8 == kRunRegions && kRunRegions <= kMaxRegions,
                "the regions listed here");
}

}  // namespace

template <class Args>
flashattn_status_t read_args(const Args* args, Args* out, const char* type_name) {
  if (args == nullptr) return fail(FLASHATTN_STATUS_NULL_POINTER, "args is NULL");
  // Every field of version 0 is required; later fields are read only when struct_size covers them.
  if (args->struct_size < sizeof(Args))
    return fail(FLASHATTN_STATUS_INVALID_STRUCT_SIZE,
                "args.struct_size=%zu is smaller than sizeof(%s)=%zu of this library version; initialize it "
                "with the _INIT macro",
                args->struct_size, type_name, sizeof(Args));
  std::memcpy(out, args, sizeof(Args));
  return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status_t check_workspace(size_t needed, const void* workspace, size_t workspace_bytes) {
  if (needed > 0 && workspace == nullptr)
    return fail(FLASHATTN_STATUS_WORKSPACE_TOO_SMALL, "workspace is NULL but this pass needs %zu bytes", needed);
  if (workspace_bytes < needed)
    return fail(FLASHATTN_STATUS_WORKSPACE_TOO_SMALL, "workspace_bytes=%zu is smaller than the required %zu",
                workspace_bytes, needed);
  return FLASHATTN_STATUS_SUCCESS;
}

template flashattn_status_t read_args(const flashattn_kvcache_args_t*, flashattn_kvcache_args_t*, const char*);
template flashattn_status_t read_args(const flashattn_combine_args_t*, flashattn_combine_args_t*, const char*);

flashattn_status_t require(const void* ptr, const char* name) {
  if (ptr == nullptr) return fail(FLASHATTN_STATUS_NULL_POINTER, "%s is NULL but required", name);
  return FLASHATTN_STATUS_SUCCESS;
}

namespace {

// The prologue of both passes: the args struct, the plan's shape, and the q, k, v, o
// pointers every pass needs (in this order, so the first problem is the one reported).
template <class Args>
flashattn_status_t read_run_args(const flashattn_plan_s& plan, const Args* user_args, Args* a, const char* type_name) {
  FA_TRY(read_args(user_args, a, type_name));
  if (!plan.has_shape)
    return fail(FLASHATTN_STATUS_PLAN_INCOMPLETE, "plan has no shape: call flashattn_plan_set_shape first");
  FA_TRY(require(a->q, "args.q"));
  FA_TRY(require(a->k, "args.k"));
  FA_TRY(require(a->v, "args.v"));
  return require(a->o, "args.o");
}

// Checks shared by both passes: plan state, option/pointer consistency, strides, stream,
// workspace, then the backend's own checks. `tensors` lists the tensors this pass uses.
flashattn_status_t validate_common(const flashattn_plan_s& plan, const AttnParams& p, const flashattn_tensor_t* tensors,
                                   int n_tensors, void* workspace, size_t workspace_bytes, struct CUstream_st* stream) {
  const bool cpu = plan.backend == FLASHATTN_BACKEND_CPU;
  if (cpu && stream != nullptr)
    return fail(FLASHATTN_STATUS_INVALID_ARGUMENT, "stream=%p must be NULL for the CPU backend",
                static_cast<void*>(stream));

  // Option/pointer consistency.
  if (plan.bias_kind == FLASHATTN_BIAS_TENSOR) {
    FA_TRY(require(p.bias, "args.bias (bias kind TENSOR)"));
  } else if (p.bias != nullptr) {
    return fail(FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS,
                "args.bias=%p is given but the plan's bias kind is %d, not FLASHATTN_BIAS_TENSOR", p.bias,
                static_cast<int>(plan.bias_kind));
  }
  if (p.dbias != nullptr && plan.bias_kind != FLASHATTN_BIAS_TENSOR)
    return fail(FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS,
                "args.dbias=%p is given but the plan's bias kind is %d, not FLASHATTN_BIAS_TENSOR", p.dbias,
                static_cast<int>(plan.bias_kind));
  if (p.dbias != nullptr && plan.grad_accumulate)
    return fail(FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS,
                "args.dbias=%p is given but the plan accumulates gradients (flashattn_plan_set_grad_accumulate), "
                "which serves dQ, dK and dV only: pass args.dbias=NULL or turn accumulation off",
                p.dbias);
  const bool alibi = plan.bias_kind == FLASHATTN_BIAS_ALIBI || plan.bias_kind == FLASHATTN_BIAS_ALIBI_SYMMETRIC;
  if (alibi) {
    FA_TRY(require(p.alibi_slopes, "args.alibi_slopes (ALiBi bias)"));
  } else if (p.alibi_slopes != nullptr) {
    return fail(FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS,
                "args.alibi_slopes=%p is given but the plan's bias kind is %d, not ALiBi",
                static_cast<const void*>(p.alibi_slopes), static_cast<int>(plan.bias_kind));
  }
  if (plan.varlen) {
    FA_TRY(require(p.cu_seqlens_q, "args.cu_seqlens_q (varlen mode)"));
    FA_TRY(require(p.cu_seqlens_k, "args.cu_seqlens_k (varlen mode)"));
  } else if (p.cu_seqlens_q != nullptr || p.cu_seqlens_k != nullptr) {
    return fail(FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS,
                "args.cu_seqlens_%s is given but varlen mode is off (flashattn_plan_set_varlen)",
                p.cu_seqlens_q != nullptr ? "q" : "k");
  }

  // Alignment: tensors to their element size, the workspace to the backend's requirement.
  Region regions[kRunRegions];
  run_regions(plan, p, workspace, regions);
  for (const Region& r : regions) FA_TRY(check_alignment(r));

  // Strides (re-checked here: shape or varlen mode may have changed since they were set).
  for (int t = 0; t < n_tensors; ++t) FA_TRY(check_tensor_strides(plan, tensors[t], plan.strides[tensors[t]]));
  if (plan.bias_kind == FLASHATTN_BIAS_TENSOR) FA_TRY(check_bias_strides(plan, plan.bias_stride, "bias strides"));
  FA_TRY(check_alibi_batch_stride(plan, plan.alibi_batch_stride));
  // A block-sparse layout always fits the shape: set_shape and set_block_sparse check it.

  // Backend support checks that need no pointers first, so the workspace size is meaningful.
  if (cpu) {
    FA_TRY(cpu_check(p));
  } else {
    FA_TRY(cuda_check(p, plan.device));
  }
  size_t needed = 0;
  FA_TRY(workspace_size(plan, static_cast<Direction>(p.direction), p, &needed));
  FA_TRY(check_workspace(needed, workspace, workspace_bytes));

  // Nothing the run writes may share memory with anything else it reads or writes; the
  // workspace's region is the part a run touches.
  regions[kWorkspaceRegion].extents[0] = static_cast<int64_t>(needed);
  FA_TRY(check_extents(regions, kRunRegions));
  return check_no_overlap(regions, kRunRegions);
}

}  // namespace

void tensor_extents(const flashattn_plan_s& plan, flashattn_tensor_t tensor, int64_t e[4]) {
  const bool q_side = tensor == FLASHATTN_TENSOR_Q || tensor == FLASHATTN_TENSOR_O || tensor == FLASHATTN_TENSOR_DO ||
                      tensor == FLASHATTN_TENSOR_DQ;
  e[0] = plan.varlen ? 1 : plan.batch;
  e[1] = q_side ? (plan.varlen ? plan.total_q : plan.seqlen_q) : (plan.varlen ? plan.total_k : plan.seqlen_k);
  e[2] = q_side ? plan.heads_q : plan.heads_kv;
  const bool v_dim = tensor == FLASHATTN_TENSOR_V || tensor == FLASHATTN_TENSOR_O || tensor == FLASHATTN_TENSOR_DO ||
                     tensor == FLASHATTN_TENSOR_DV;
  e[3] = v_dim ? plan.head_dim_v : plan.head_dim_qk;
}

flashattn_status_t check_tensor_strides(const flashattn_plan_s& plan, flashattn_tensor_t tensor, const Strides4& s) {
  const char* name = tensor_name(tensor);
  const int64_t st[4] = {s.b, s.s, s.h, s.d};
  if (s.d != 1)
    return fail(FLASHATTN_STATUS_INVALID_STRIDE, "strides of %s: dim stride=%lld must be 1 (last dim contiguous)", name,
                static_cast<long long>(s.d));
  static const char* const dim_names[] = {"batch", "seq", "head", "dim"};
  for (int i = 0; i < 3; ++i)
    if (st[i] < 0)
      return fail(FLASHATTN_STATUS_INVALID_STRIDE, "strides of %s: %s stride=%lld must be >= 0", name, dim_names[i],
                  static_cast<long long>(st[i]));
  int64_t e[4];
  tensor_extents(plan, tensor, e);
  const int64_t es = dtype_size(plan.dtype);
  if (!checked_product(e[0], e[1], e[2], e[3], es).ok())
    return fail(FLASHATTN_STATUS_INVALID_SHAPE,
                "tensor %s of extents %s and %lld-byte elements has more than 2^63-1 bytes", name, dims_text(4, e).text,
                static_cast<long long>(es));
  if (!extent_bytes(4, e, st, es).ok())
    return fail(FLASHATTN_STATUS_INVALID_STRIDE, "strides of %s %s over extents %s span more than 2^63-1 bytes", name,
                dims_text(4, st).text, dims_text(4, e).text);
  if (is_output(tensor) && !non_overlapping(4, e, st))
    return fail(FLASHATTN_STATUS_INVALID_STRIDE,
                "strides of output %s (batch, seq, head, dim) = %s make distinct elements of extents %s share an "
                "address",
                name, dims_text(4, st).text, dims_text(4, e).text);
  return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status_t check_bias_strides(const flashattn_plan_s& plan, const int64_t s[4], const char* what) {
  static const char* const dim_names[] = {"batch", "head", "q", "k"};
  for (int i = 0; i < 4; ++i)
    if (s[i] < 0)
      return fail(FLASHATTN_STATUS_INVALID_STRIDE, "%s: %s stride=%lld must be >= 0", what, dim_names[i],
                  static_cast<long long>(s[i]));
  if (s[3] != 0 && s[3] != 1)
    return fail(FLASHATTN_STATUS_INVALID_STRIDE, "%s: k stride=%lld must be 0 (broadcast) or 1", what,
                static_cast<long long>(s[3]));
  if (plan.has_shape) {
    const int64_t e[4] = {plan.batch, plan.heads_q, plan.seqlen_q, plan.seqlen_k};
    if (!extent_bytes(4, e, s, dtype_size(plan.dtype)).ok())
      return fail(FLASHATTN_STATUS_INVALID_STRIDE, "%s %s over the bias extents %s span more than 2^63-1 bytes", what,
                  dims_text(4, s).text, dims_text(4, e).text);
    // dBias uses the same strides: the non-broadcast dims must not overlap.
    int64_t ne[4], ns[4];
    int n = 0;
    for (int i = 0; i < 4; ++i)
      if (s[i] != 0) {
        ne[n] = e[i];
        ns[n] = s[i];
        ++n;
      }
    if (!non_overlapping(n, ne, ns))
      return fail(FLASHATTN_STATUS_INVALID_STRIDE,
                  "%s (%lld, %lld, %lld, %lld): non-broadcast dimensions overlap, so dbias would alias", what,
                  static_cast<long long>(s[0]), static_cast<long long>(s[1]), static_cast<long long>(s[2]),
                  static_cast<long long>(s[3]));
  }
  return FLASHATTN_STATUS_SUCCESS;
}

Region alibi_slopes_region(const flashattn_plan_s& plan, const float* slopes) {
  return Region{"args.alibi_slopes", slopes, 2, {plan.batch, plan.heads_q}, {plan.alibi_batch_stride, 1}, 4, 4, false};
}

flashattn_status_t check_alibi_batch_stride(const flashattn_plan_s& plan, int64_t batch_stride) {
  if (batch_stride < 0)
    return fail(FLASHATTN_STATUS_INVALID_STRIDE, "ALiBi batch_stride=%lld must be >= 0 (0: one slope per head)",
                static_cast<long long>(batch_stride));
  if (plan.has_shape) {
    const int64_t e[2] = {plan.batch, plan.heads_q}, s[2] = {batch_stride, 1};
    if (!extent_bytes(2, e, s, 4).ok())
      return fail(FLASHATTN_STATUS_INVALID_STRIDE,
                  "ALiBi batch_stride=%lld over the slopes' extents (batch=%lld, heads_q=%lld) spans more than "
                  "2^63-1 bytes",
                  static_cast<long long>(batch_stride), static_cast<long long>(plan.batch),
                  static_cast<long long>(plan.heads_q));
  }
  return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status_t check_layout_dims(const flashattn_plan_s& plan, int64_t layout_heads, int64_t n_row_blocks,
                                     int64_t n_col_blocks, int64_t block_q, int64_t block_k) {
  if (block_q < 1)
    return fail(FLASHATTN_STATUS_INVALID_LAYOUT, "block_q=%lld must be >= 1", static_cast<long long>(block_q));
  if (block_k < 1)
    return fail(FLASHATTN_STATUS_INVALID_LAYOUT, "block_k=%lld must be >= 1", static_cast<long long>(block_k));
  if (layout_heads != 1 && layout_heads != plan.heads_q)
    return fail(FLASHATTN_STATUS_INVALID_LAYOUT, "layout_heads=%lld must be 1 or heads_q=%lld",
                static_cast<long long>(layout_heads), static_cast<long long>(plan.heads_q));
  // Ceiling divisions that cannot overflow for block sizes up to INT64_MAX.
  const int64_t want_rows = plan.seqlen_q / block_q + (plan.seqlen_q % block_q != 0 ? 1 : 0);
  const int64_t want_cols = plan.seqlen_k / block_k + (plan.seqlen_k % block_k != 0 ? 1 : 0);
  if (n_row_blocks != want_rows)
    return fail(FLASHATTN_STATUS_INVALID_LAYOUT, "num_row_blocks=%lld must be ceil(seqlen_q=%lld / block_q=%lld)=%lld",
                static_cast<long long>(n_row_blocks), static_cast<long long>(plan.seqlen_q),
                static_cast<long long>(block_q), static_cast<long long>(want_rows));
  if (n_col_blocks != want_cols)
    return fail(FLASHATTN_STATUS_INVALID_LAYOUT, "num_col_blocks=%lld must be ceil(seqlen_k=%lld / block_k=%lld)=%lld",
                static_cast<long long>(n_col_blocks), static_cast<long long>(plan.seqlen_k),
                static_cast<long long>(block_k), static_cast<long long>(want_cols));
  if (!checked_product(layout_heads, n_row_blocks, n_col_blocks).ok())
    return fail(FLASHATTN_STATUS_INVALID_LAYOUT,
                "layout of layout_heads=%lld x num_row_blocks=%lld x num_col_blocks=%lld bytes exceeds 2^63-1 bytes",
                static_cast<long long>(layout_heads), static_cast<long long>(n_row_blocks),
                static_cast<long long>(n_col_blocks));
  return FLASHATTN_STATUS_SUCCESS;
}

AttnParams params_from_plan(const flashattn_plan_s& plan, Direction direction) {
  AttnParams p;
  std::memset(&p, 0, sizeof p);
  p.batch = plan.batch;
  p.seqlen_q = plan.seqlen_q;
  p.seqlen_k = plan.seqlen_k;
  p.heads_q = plan.heads_q;
  p.heads_kv = plan.heads_kv;
  p.head_dim_qk = plan.head_dim_qk;
  p.head_dim_v = plan.head_dim_v;
  p.dtype = static_cast<int32_t>(plan.dtype);
  p.algorithm = static_cast<int32_t>(plan.algorithm);
  p.direction = direction;
  p.deterministic = plan.deterministic ? 1 : 0;
  p.grad_accumulate = plan.grad_accumulate ? 1 : 0;
  p.varlen = plan.varlen ? 1 : 0;
  p.total_q = plan.varlen ? plan.total_q : plan.batch * plan.seqlen_q;
  p.total_k = plan.varlen ? plan.total_k : plan.batch * plan.seqlen_k;
  p.q_stride = plan.strides[FLASHATTN_TENSOR_Q];
  p.k_stride = plan.strides[FLASHATTN_TENSOR_K];
  p.v_stride = plan.strides[FLASHATTN_TENSOR_V];
  p.o_stride = plan.strides[FLASHATTN_TENSOR_O];
  p.do_stride = plan.strides[FLASHATTN_TENSOR_DO];
  p.dq_stride = plan.strides[FLASHATTN_TENSOR_DQ];
  p.dk_stride = plan.strides[FLASHATTN_TENSOR_DK];
  p.dv_stride = plan.strides[FLASHATTN_TENSOR_DV];
  p.scale = plan.scale > 0.f ? plan.scale : static_cast<float>(1.0 / sqrt(static_cast<double>(plan.head_dim_qk)));
  p.softcap = plan.softcap;
  p.has_band = (plan.window_left >= 0 || plan.window_right >= 0) ? 1 : 0;
  p.align = static_cast<int32_t>(plan.align);
  p.window_left = plan.window_left;
  p.window_right = plan.window_right;
  p.bias_kind = static_cast<int32_t>(plan.bias_kind);
  for (int i = 0; i < 4; ++i) p.bias_stride[i] = plan.bias_stride[i];
  p.alibi_batch_stride = plan.alibi_batch_stride;
  p.p_drop = plan.dropout_p;
  p.drop_threshold = dropout_threshold(plan.dropout_p);
  p.rp_keep = static_cast<float>(dropout_keep_scale(p.drop_threshold));
  p.seed = plan.seed;
  p.offset = plan.offset;
  if (!plan.layout.empty()) {
    p.layout =
        plan.backend == FLASHATTN_BACKEND_CUDA ? static_cast<const uint8_t*>(plan.layout_device) : plan.layout.data();
    p.layout_heads = plan.layout_heads;
    p.n_row_blocks = plan.n_row_blocks;
    p.n_col_blocks = plan.n_col_blocks;
    p.block_q = plan.block_q;
    p.block_k = plan.block_k;
  }
  return p;
}

flashattn_status_t workspace_size(const flashattn_plan_s& plan, Direction direction, const AttnParams& params,
                                  size_t* bytes) {
  AttnParams p = params;
  p.direction = direction;
  const CheckedSize n = plan.backend == FLASHATTN_BACKEND_CPU ? cpu_workspace_size(p, plan.cpu_threads)
                                                              : cuda_workspace_size(p, plan.device);
  if (!n.ok())
    return fail(FLASHATTN_STATUS_INVALID_SHAPE,
                "the %s workspace of the %s algorithm on the %s backend exceeds 2^63-1 bytes for batch=%lld "
                "seqlen_q=%lld seqlen_k=%lld heads_q=%lld heads_kv=%lld head_dim_qk=%lld head_dim_v=%lld",
                direction == kBackward ? "backward" : "forward",
                plan.algorithm == FLASHATTN_ALGORITHM_STANDARD ? "STANDARD" : "FLASH", backend_name(plan),
                static_cast<long long>(plan.batch), static_cast<long long>(plan.seqlen_q),
                static_cast<long long>(plan.seqlen_k), static_cast<long long>(plan.heads_q),
                static_cast<long long>(plan.heads_kv), static_cast<long long>(plan.head_dim_qk),
                static_cast<long long>(plan.head_dim_v));
  *bytes = static_cast<size_t>(n.value());
  return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status_t validate_fwd(const flashattn_plan_s& plan, const flashattn_fwd_args_t* user_args, void* workspace,
                                size_t workspace_bytes, struct CUstream_st* stream, AttnParams* params) {
  flashattn_fwd_args_t a;
  FA_TRY(read_run_args(plan, user_args, &a, "flashattn_fwd_args_t"));
  AttnParams p = params_from_plan(plan, kForward);
  p.q = a.q;
  p.k = a.k;
  p.v = a.v;
  p.o = a.o;
  p.lse = a.lse;
  p.bias = a.bias;
  p.alibi_slopes = a.alibi_slopes;
  p.cu_seqlens_q = a.cu_seqlens_q;
  p.cu_seqlens_k = a.cu_seqlens_k;
  static const flashattn_tensor_t tensors[] = {FLASHATTN_TENSOR_Q, FLASHATTN_TENSOR_K, FLASHATTN_TENSOR_V,
                                               FLASHATTN_TENSOR_O};
  FA_TRY(validate_common(plan, p, tensors, 4, workspace, workspace_bytes, stream));
  *params = p;
  return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status_t validate_bwd(const flashattn_plan_s& plan, const flashattn_bwd_args_t* user_args, void* workspace,
                                size_t workspace_bytes, struct CUstream_st* stream, AttnParams* params) {
  flashattn_bwd_args_t a;
  FA_TRY(read_run_args(plan, user_args, &a, "flashattn_bwd_args_t"));
  FA_TRY(require(a.lse, "args.lse"));
  FA_TRY(require(a.dout, "args.dout"));
  FA_TRY(require(a.dq, "args.dq"));
  FA_TRY(require(a.dk, "args.dk"));
  FA_TRY(require(a.dv, "args.dv"));
  AttnParams p = params_from_plan(plan, kBackward);
  p.q = a.q;
  p.k = a.k;
  p.v = a.v;
  p.o_in = a.o;
  p.lse_in = a.lse;
  p.dout = a.dout;
  p.dq = a.dq;
  p.dk = a.dk;
  p.dv = a.dv;
  p.bias = a.bias;
  p.dbias = a.dbias;
  p.alibi_slopes = a.alibi_slopes;
  p.cu_seqlens_q = a.cu_seqlens_q;
  p.cu_seqlens_k = a.cu_seqlens_k;
  static const flashattn_tensor_t tensors[] = {FLASHATTN_TENSOR_Q,  FLASHATTN_TENSOR_K,  FLASHATTN_TENSOR_V,
                                               FLASHATTN_TENSOR_O,  FLASHATTN_TENSOR_DO, FLASHATTN_TENSOR_DQ,
                                               FLASHATTN_TENSOR_DK, FLASHATTN_TENSOR_DV};
  FA_TRY(validate_common(plan, p, tensors, 8, workspace, workspace_bytes, stream));
  *params = p;
  return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status_t resolve_backend(int backend, int device, flashattn_backend_t* resolved) {
  if (backend < FLASHATTN_BACKEND_AUTO || backend > FLASHATTN_BACKEND_CUDA)
    return fail(FLASHATTN_STATUS_INVALID_ENUM, "backend=%d is not a flashattn_backend_t value", backend);
  if (device < 0) return fail(FLASHATTN_STATUS_INVALID_VALUE, "device=%d must be >= 0", device);
  *resolved = static_cast<flashattn_backend_t>(backend);
  if (backend == FLASHATTN_BACKEND_AUTO)
    *resolved = (cuda_built() && device < cuda_device_count()) ? FLASHATTN_BACKEND_CUDA : FLASHATTN_BACKEND_CPU;
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace flashattn
