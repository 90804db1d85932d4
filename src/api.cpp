// The extern "C" boundary: every exported function but the inference ones
// (api_kvcache.cpp). Each one that returns a status clears the thread's error message,
// checks its own arguments before touching any state, and catches every C++ exception
// (api_guard.hpp); the functions that cannot fail leave the message alone (the rule
// documented at flashattn_last_error).
#include <math.h>

#include "api_guard.hpp"
#include "backends.hpp"
#include "error.hpp"
#include "plan.hpp"

using flashattn::enum_value;
using flashattn::fail;
using flashattn::guarded;

namespace {

void set_contiguous_strides(flashattn_plan_s& plan) {
  // Extents of the fixed-length shape, whatever the varlen mode: the strides must stay
  // contiguous when varlen is switched off later.
  const bool varlen = plan.varlen;
  plan.varlen = false;
  for (int t = 0; t < 8; ++t) {
    int64_t e[4];
    flashattn::tensor_extents(plan, static_cast<flashattn_tensor_t>(t), e);
    // Contiguous [batch, seq, head, dim]; in varlen mode the batch stride is ignored and
    // the rest is exactly the packed [token, head, dim] layout.
    plan.strides[t].d = 1;
    plan.strides[t].h = e[3];
    plan.strides[t].s = e[2] * e[3];
    plan.strides[t].b = e[1] * e[2] * e[3];
  }
  plan.varlen = varlen;
}

}  // namespace

extern "C" {

FLASHATTN_API int flashattn_get_version(int* major, int* minor, int* patch) {
  if (major) *major = FLASHATTN_VERSION_MAJOR;
  if (minor) *minor = FLASHATTN_VERSION_MINOR;
  if (patch) *patch = FLASHATTN_VERSION_PATCH;
  return FLASHATTN_VERSION_NUMBER;
}

FLASHATTN_API const char* flashattn_status_string(flashattn_status_t status) {
  switch (enum_value(status)) {
#define FA_CASE(name) \
  case name: return #name;
    FA_CASE(FLASHATTN_STATUS_SUCCESS)
    FA_CASE(FLASHATTN_STATUS_INVALID_ARGUMENT)
    FA_CASE(FLASHATTN_STATUS_NULL_POINTER)
    FA_CASE(FLASHATTN_STATUS_INVALID_SHAPE)
    FA_CASE(FLASHATTN_STATUS_INVALID_HEADS)
    FA_CASE(FLASHATTN_STATUS_INVALID_STRIDE)
    FA_CASE(FLASHATTN_STATUS_INVALID_ENUM)
    FA_CASE(FLASHATTN_STATUS_INVALID_VALUE)
    FA_CASE(FLASHATTN_STATUS_INVALID_LAYOUT)
    FA_CASE(FLASHATTN_STATUS_INVALID_STRUCT_SIZE)
    FA_CASE(FLASHATTN_STATUS_WORKSPACE_TOO_SMALL)
    FA_CASE(FLASHATTN_STATUS_PLAN_INCOMPLETE)
    FA_CASE(FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS)
    FA_CASE(FLASHATTN_STATUS_INVALID_SEQLENS)
    FA_CASE(FLASHATTN_STATUS_MISALIGNED_POINTER)
    FA_CASE(FLASHATTN_STATUS_NOT_SUPPORTED)
    FA_CASE(FLASHATTN_STATUS_BACKEND_UNAVAILABLE)
    FA_CASE(FLASHATTN_STATUS_HEAD_DIM_NOT_SUPPORTED)
    FA_CASE(FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED)
    FA_CASE(FLASHATTN_STATUS_LIBRARY_UNAVAILABLE)
    FA_CASE(FLASHATTN_STATUS_OUT_OF_MEMORY)
    FA_CASE(FLASHATTN_STATUS_CUDA_ERROR)
    FA_CASE(FLASHATTN_STATUS_NO_DEVICE)
    FA_CASE(FLASHATTN_STATUS_LAUNCH_FAILED)
    FA_CASE(FLASHATTN_STATUS_WRONG_MEMORY_SPACE)
    FA_CASE(FLASHATTN_STATUS_INTERNAL_ERROR)
#undef FA_CASE
    case FLASHATTN_STATUS_MAX_ENUM: break;
  }
  return "FLASHATTN_STATUS_UNKNOWN";
}

FLASHATTN_API const char* flashattn_last_error(void) { return flashattn::last_error_message(); }

FLASHATTN_API int flashattn_cuda_device_count(void) {
  try {
    return flashattn::cuda_device_count();
  } catch (...) {
    return 0;
  }
}

FLASHATTN_API int flashattn_has_cuda_backend(void) { return flashattn::cuda_built() ? 1 : 0; }

FLASHATTN_API flashattn_status_t flashattn_plan_create(flashattn_plan_t* plan, flashattn_backend_t backend,
                                                       int device) {
  return guarded([&]() -> flashattn_status_t {
    if (plan == nullptr) return fail(FLASHATTN_STATUS_NULL_POINTER, "plan (out-parameter) is NULL");
    flashattn_backend_t resolved = FLASHATTN_BACKEND_CPU;
    FA_TRY(flashattn::resolve_backend(enum_value(backend), device, &resolved));
    if (resolved == FLASHATTN_BACKEND_CUDA) FA_TRY(flashattn::cuda_check_device(device));
    int cpu_threads = 1;
    if (resolved == FLASHATTN_BACKEND_CPU) FA_TRY(flashattn::cpu_prepare_plan(&cpu_threads));
    flashattn_plan_s* p = new (std::nothrow) flashattn_plan_s();
    if (p == nullptr) return flashattn::fail_allocation("the plan state", sizeof(flashattn_plan_s));
    p->backend = resolved;
    p->device = device;
    p->cpu_threads = cpu_threads;
    *plan = p;
    return FLASHATTN_STATUS_SUCCESS;
  });
}

FLASHATTN_API void flashattn_plan_destroy(flashattn_plan_t plan) {
  if (plan == nullptr) return;
  if (plan->layout_device != nullptr) flashattn::cuda_free(plan->device, plan->layout_device);
  delete plan;
}

FLASHATTN_API flashattn_status_t flashattn_plan_get_backend(flashattn_plan_t plan, flashattn_backend_t* backend) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    if (backend == nullptr) return fail(FLASHATTN_STATUS_NULL_POINTER, "backend (out-parameter) is NULL");
    *backend = plan->backend;
    return FLASHATTN_STATUS_SUCCESS;
  });
}

FLASHATTN_API flashattn_status_t flashattn_plan_set_shape(flashattn_plan_t plan, int64_t batch, int64_t seqlen_q,
                                                          int64_t seqlen_k, int64_t heads_q, int64_t heads_kv,
                                                          int64_t head_dim_qk, int64_t head_dim_v) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    // Sequence positions feed 32-bit Philox counters and int32 cu_seqlens.
    const int64_t kMaxSeq = INT64_C(2147483647);
    const struct {
      int64_t value;
      int64_t max;
      const char* name;
    } dims[] = {{batch, INT64_C(1) << 31, "batch"},
                {seqlen_q, kMaxSeq, "seqlen_q"},
                {seqlen_k, kMaxSeq, "seqlen_k"},
                {heads_q, INT64_C(1) << 24, "heads_q"},
                {heads_kv, INT64_C(1) << 24, "heads_kv"},
                {head_dim_qk, FLASHATTN_MAX_HEAD_DIM, "head_dim_qk"},
                {head_dim_v, FLASHATTN_MAX_HEAD_DIM, "head_dim_v"}};
    for (const auto& d : dims) {
      if (d.value < 1)
        return fail(FLASHATTN_STATUS_INVALID_SHAPE, "%s=%lld must be >= 1", d.name, static_cast<long long>(d.value));
      if (d.value > d.max)
        return fail(FLASHATTN_STATUS_INVALID_SHAPE, "%s=%lld exceeds the supported maximum %lld", d.name,
                    static_cast<long long>(d.value), static_cast<long long>(d.max));
    }
    if (heads_q % heads_kv != 0)
      return fail(FLASHATTN_STATUS_INVALID_HEADS, "heads_q=%lld is not a multiple of heads_kv=%lld",
                  static_cast<long long>(heads_q), static_cast<long long>(heads_kv));
    // Byte sizes of every tensor and of a bias tensor must fit in int64 in the largest
    // dtype (fp32), so that no later dtype, stride or workspace computation starts from a
    // count that is already out of range.
    const int64_t kMaxElemBytes = 4;
    const struct {
      flashattn::CheckedSize bytes;
      const char* what;
      int64_t a, b, c, d;
    } sizes[] = {{flashattn::checked_product(batch, seqlen_q, heads_q, head_dim_qk, kMaxElemBytes),
                  "q (batch x seqlen_q x heads_q x head_dim_qk)", batch, seqlen_q, heads_q, head_dim_qk},
                 {flashattn::checked_product(batch, seqlen_q, heads_q, head_dim_v, kMaxElemBytes),
                  "o (batch x seqlen_q x heads_q x head_dim_v)", batch, seqlen_q, heads_q, head_dim_v},
                 {flashattn::checked_product(batch, seqlen_k, heads_kv, head_dim_qk, kMaxElemBytes),
                  "k (batch x seqlen_k x heads_kv x head_dim_qk)", batch, seqlen_k, heads_kv, head_dim_qk},
                 {flashattn::checked_product(batch, seqlen_k, heads_kv, head_dim_v, kMaxElemBytes),
                  "v (batch x seqlen_k x heads_kv x head_dim_v)", batch, seqlen_k, heads_kv, head_dim_v},
                 {flashattn::checked_product(batch, heads_q, seqlen_q, seqlen_k, kMaxElemBytes),
                  "the bias (batch x heads_q x seqlen_q x seqlen_k)", batch, heads_q, seqlen_q, seqlen_k}};
    for (const auto& z : sizes)
      if (!z.bytes.ok())
        return fail(FLASHATTN_STATUS_INVALID_SHAPE, "%s = %lld x %lld x %lld x %lld fp32 elements exceed 2^63-1 bytes",
                    z.what, static_cast<long long>(z.a), static_cast<long long>(z.b), static_cast<long long>(z.c),
                    static_cast<long long>(z.d));
    // The checks run on a copy of the plan that leaves the block-sparse layout's bytes
    // behind (they need only its dimensions), so the call allocates nothing.
    std::vector<uint8_t> layout;
    layout.swap(plan->layout);
    flashattn_plan_s next = *plan;
    plan->layout.swap(layout);
    next.has_shape = true;
    next.batch = batch;
    next.seqlen_q = seqlen_q;
    next.seqlen_k = seqlen_k;
    next.heads_q = heads_q;
    next.heads_kv = heads_kv;
    next.head_dim_qk = head_dim_qk;
    next.head_dim_v = head_dim_v;
    if (!plan->layout.empty())
      FA_TRY(flashattn::check_layout_dims(next, next.layout_heads, next.n_row_blocks, next.n_col_blocks, next.block_q,
                                          next.block_k));
    if (next.bias_kind == FLASHATTN_BIAS_TENSOR)
      FA_TRY(flashattn::check_bias_strides(next, next.bias_stride, "bias strides"));
    FA_TRY(flashattn::check_alibi_batch_stride(next, next.alibi_batch_stride));
    set_contiguous_strides(next);
    next.layout.swap(plan->layout);
    *plan = std::move(next);  // layout_device (if any) is carried over unchanged
    return FLASHATTN_STATUS_SUCCESS;
  });
}

FLASHATTN_API flashattn_status_t flashattn_plan_set_dtype(flashattn_plan_t plan, flashattn_dtype_t dtype) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    const int d = enum_value(dtype);
    if (d < FLASHATTN_DTYPE_FP16 || d > FLASHATTN_DTYPE_FP32)
      return fail(FLASHATTN_STATUS_INVALID_ENUM, "dtype=%d is not a flashattn_dtype_t value", d);
    plan->dtype = dtype;
    return FLASHATTN_STATUS_SUCCESS;
  });
}

FLASHATTN_API flashattn_status_t flashattn_plan_set_strides(flashattn_plan_t plan, flashattn_tensor_t tensor,
                                                            const int64_t strides[4]) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    const int t = enum_value(tensor);
    if (t < FLASHATTN_TENSOR_Q || t > FLASHATTN_TENSOR_DV)
      return fail(FLASHATTN_STATUS_INVALID_ENUM, "tensor=%d is not a flashattn_tensor_t value", t);
    if (strides == nullptr) return fail(FLASHATTN_STATUS_NULL_POINTER, "strides is NULL");
    if (!plan->has_shape)
      return fail(FLASHATTN_STATUS_PLAN_INCOMPLETE, "plan has no shape: call flashattn_plan_set_shape before strides");
    const flashattn::Strides4 s = {strides[0], strides[1], strides[2], strides[3]};
    FA_TRY(flashattn::check_tensor_strides(*plan, tensor, s));
    plan->strides[t] = s;
    return FLASHATTN_STATUS_SUCCESS;
  });
}

FLASHATTN_API flashattn_status_t flashattn_plan_set_softmax_scale(flashattn_plan_t plan, float scale) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    if (!(isfinite(scale) && scale >= 0.f))
      return fail(FLASHATTN_STATUS_INVALID_VALUE, "scale=%g must be finite and > 0 (0 = default)",
                  static_cast<double>(scale));
    plan->scale = scale;
    return FLASHATTN_STATUS_SUCCESS;
  });
}

FLASHATTN_API flashattn_status_t flashattn_plan_set_algorithm(flashattn_plan_t plan, flashattn_algorithm_t algorithm) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    const int a = enum_value(algorithm);
    if (a < FLASHATTN_ALGORITHM_FLASH || a > FLASHATTN_ALGORITHM_STANDARD)
      return fail(FLASHATTN_STATUS_INVALID_ENUM, "algorithm=%d is not a flashattn_algorithm_t value", a);
    plan->algorithm = algorithm;
    return FLASHATTN_STATUS_SUCCESS;
  });
}

FLASHATTN_API flashattn_status_t flashattn_plan_set_varlen(flashattn_plan_t plan, int enabled, int64_t total_q,
                                                           int64_t total_k) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    if (enabled) {
      const int64_t kMax = INT64_C(2147483647);  // cu_seqlens are int32
      if (total_q < 0 || total_q > kMax)
        return fail(FLASHATTN_STATUS_INVALID_SHAPE, "total_q=%lld must be in [0, 2^31-1]",
                    static_cast<long long>(total_q));
      if (total_k < 0 || total_k > kMax)
        return fail(FLASHATTN_STATUS_INVALID_SHAPE, "total_k=%lld must be in [0, 2^31-1]",
                    static_cast<long long>(total_k));
    }
    // Strides keep their values: contiguous BSHD strides are also the packed [token, head,
    // dim] strides (the batch stride is ignored), and every stride is re-checked at run time.
    plan->varlen = enabled != 0;
    plan->total_q = enabled ? total_q : 0;
    plan->total_k = enabled ? total_k : 0;
    return FLASHATTN_STATUS_SUCCESS;
  });
}

FLASHATTN_API flashattn_status_t flashattn_plan_set_deterministic(flashattn_plan_t plan, int enabled) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    plan->deterministic = enabled != 0;
    return FLASHATTN_STATUS_SUCCESS;
  });
}

FLASHATTN_API flashattn_status_t flashattn_plan_set_grad_accumulate(flashattn_plan_t plan, int enabled) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    plan->grad_accumulate = enabled != 0;
    return FLASHATTN_STATUS_SUCCESS;
  });
}

FLASHATTN_API flashattn_status_t flashattn_plan_set_band_mask(flashattn_plan_t plan, flashattn_mask_align_t align,
                                                              int64_t window_left, int64_t window_right) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    const int a = enum_value(align);
    if (a < FLASHATTN_ALIGN_TOP_LEFT || a > FLASHATTN_ALIGN_BOTTOM_RIGHT)
      return fail(FLASHATTN_STATUS_INVALID_ENUM, "align=%d is not a flashattn_mask_align_t value", a);
    plan->align = align;
    plan->window_left = window_left < 0 ? -1 : window_left;
    plan->window_right = window_right < 0 ? -1 : window_right;
    return FLASHATTN_STATUS_SUCCESS;
  });
}

FLASHATTN_API flashattn_status_t flashattn_plan_set_softcap(flashattn_plan_t plan, float softcap) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    if (!(isfinite(softcap) && softcap >= 0.f))
      return fail(FLASHATTN_STATUS_INVALID_VALUE, "softcap=%g must be finite and >= 0 (0 disables)",
                  static_cast<double>(softcap));
    plan->softcap = softcap;
    return FLASHATTN_STATUS_SUCCESS;
  });
}

FLASHATTN_API flashattn_status_t flashattn_plan_set_bias(flashattn_plan_t plan, flashattn_bias_t kind,
                                                         const int64_t strides[4]) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    const int k = enum_value(kind);
    if (k < FLASHATTN_BIAS_NONE || k > FLASHATTN_BIAS_ALIBI_SYMMETRIC)
      return fail(FLASHATTN_STATUS_INVALID_ENUM, "kind=%d is not a flashattn_bias_t value", k);
    if (kind == FLASHATTN_BIAS_TENSOR) {
      if (strides == nullptr) return fail(FLASHATTN_STATUS_NULL_POINTER, "strides is NULL but kind is TENSOR");
      FA_TRY(flashattn::check_bias_strides(*plan, strides, "strides"));
      for (int i = 0; i < 4; ++i) plan->bias_stride[i] = strides[i];
    } else {
      if (strides != nullptr)
        return fail(FLASHATTN_STATUS_INVALID_ARGUMENT,
                    "strides must be NULL for bias kind=%d (only TENSOR takes strides)", k);
      for (int i = 0; i < 4; ++i) plan->bias_stride[i] = 0;
    }
    plan->bias_kind = kind;
    plan->alibi_batch_stride = 0;
    return FLASHATTN_STATUS_SUCCESS;
  });
}

FLASHATTN_API flashattn_status_t flashattn_plan_set_alibi_batch_stride(flashattn_plan_t plan, int64_t batch_stride) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    if (plan->bias_kind != FLASHATTN_BIAS_ALIBI && plan->bias_kind != FLASHATTN_BIAS_ALIBI_SYMMETRIC)
      return fail(FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS,
                  "batch_stride=%lld: the plan's bias kind is %d, not ALiBi (call flashattn_plan_set_bias with "
                  "FLASHATTN_BIAS_ALIBI or FLASHATTN_BIAS_ALIBI_SYMMETRIC first)",
                  static_cast<long long>(batch_stride), static_cast<int>(plan->bias_kind));
    FA_TRY(flashattn::check_alibi_batch_stride(*plan, batch_stride));
    plan->alibi_batch_stride = batch_stride;
    return FLASHATTN_STATUS_SUCCESS;
  });
}

FLASHATTN_API flashattn_status_t flashattn_plan_set_dropout(flashattn_plan_t plan, float p, uint64_t seed,
                                                            uint64_t offset) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    if (!(p >= 0.f && p < 1.f))
      return fail(FLASHATTN_STATUS_INVALID_VALUE, "p=%g must be in [0, 1)", static_cast<double>(p));
    plan->dropout_p = p;
    plan->seed = seed;
    plan->offset = offset;
    return FLASHATTN_STATUS_SUCCESS;
  });
}

FLASHATTN_API flashattn_status_t flashattn_plan_set_block_sparse(flashattn_plan_t plan, const uint8_t* layout,
                                                                 int64_t layout_heads, int64_t num_row_blocks,
                                                                 int64_t num_col_blocks, int64_t block_q,
                                                                 int64_t block_k) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    if (layout == nullptr) {  // clear
      if (plan->layout_device != nullptr) flashattn::cuda_free(plan->device, plan->layout_device);
      plan->layout_device = nullptr;
      plan->layout.clear();
      plan->layout_heads = plan->n_row_blocks = plan->n_col_blocks = plan->block_q = plan->block_k = 0;
      return FLASHATTN_STATUS_SUCCESS;
    }
    if (!plan->has_shape)
      return fail(FLASHATTN_STATUS_PLAN_INCOMPLETE,
                  "plan has no shape: call flashattn_plan_set_shape before flashattn_plan_set_block_sparse");
    FA_TRY(flashattn::check_layout_dims(*plan, layout_heads, num_row_blocks, num_col_blocks, block_q, block_k));
    const size_t bytes = static_cast<size_t>(  // checked by check_layout_dims
        flashattn::checked_product(layout_heads, num_row_blocks, num_col_blocks).value());
    std::vector<uint8_t> host;
    try {
      host.assign(layout, layout + bytes);
    } catch (const std::bad_alloc&) {
      return flashattn::fail_allocation("the plan's copy of the block-sparse layout", bytes);
    }
    void* device_copy = nullptr;
    if (plan->backend == FLASHATTN_BACKEND_CUDA)
      FA_TRY(flashattn::cuda_upload(plan->device, host.data(), bytes, &device_copy));
    if (plan->layout_device != nullptr) flashattn::cuda_free(plan->device, plan->layout_device);
    plan->layout_device = device_copy;
    plan->layout.swap(host);
    plan->layout_heads = layout_heads;
    plan->n_row_blocks = num_row_blocks;
    plan->n_col_blocks = num_col_blocks;
    plan->block_q = block_q;
    plan->block_k = block_k;
    return FLASHATTN_STATUS_SUCCESS;
  });
}

FLASHATTN_API flashattn_status_t flashattn_plan_get_workspace_size(flashattn_plan_t plan, flashattn_pass_t pass,
                                                                   size_t* bytes) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    const int ps = enum_value(pass);
    if (ps < FLASHATTN_PASS_FORWARD || ps > FLASHATTN_PASS_FORWARD_KVCACHE)
      return fail(FLASHATTN_STATUS_INVALID_ENUM, "pass=%d is not a flashattn_pass_t value", ps);
    if (bytes == nullptr) return fail(FLASHATTN_STATUS_NULL_POINTER, "bytes (out-parameter) is NULL");
    if (!plan->has_shape)
      return fail(FLASHATTN_STATUS_PLAN_INCOMPLETE, "plan has no shape: call flashattn_plan_set_shape first");
    if (pass == FLASHATTN_PASS_FORWARD_KVCACHE) return flashattn::kvcache_workspace_size(*plan, bytes);
    const flashattn::Direction dir = pass == FLASHATTN_PASS_FORWARD ? flashattn::kForward : flashattn::kBackward;
    const flashattn::AttnParams p = flashattn::params_from_plan(*plan, dir);
    return flashattn::workspace_size(*plan, dir, p, bytes);
  });
}

FLASHATTN_API flashattn_status_t flashattn_fwd(flashattn_plan_t plan, const flashattn_fwd_args_t* args, void* workspace,
                                               size_t workspace_bytes, struct CUstream_st* stream) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    FA_TRY(flashattn::refuse_kvcache_plan(*plan, "flashattn_fwd"));
    flashattn::AttnParams p;
    FA_TRY(flashattn::validate_fwd(*plan, args, workspace, workspace_bytes, stream, &p));
    if (plan->backend == FLASHATTN_BACKEND_CPU)
      return flashattn::cpu_run(p, plan->cpu_threads, workspace, workspace_bytes);
    return flashattn::cuda_run(p, plan->device, workspace, workspace_bytes, stream);
  });
}

FLASHATTN_API flashattn_status_t flashattn_bwd(flashattn_plan_t plan, const flashattn_bwd_args_t* args, void* workspace,
                                               size_t workspace_bytes, struct CUstream_st* stream) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    FA_TRY(flashattn::refuse_kvcache_plan(*plan, "flashattn_bwd"));
    flashattn::AttnParams p;
    FA_TRY(flashattn::validate_bwd(*plan, args, workspace, workspace_bytes, stream, &p));
    if (plan->backend == FLASHATTN_BACKEND_CPU)
      return flashattn::cpu_run(p, plan->cpu_threads, workspace, workspace_bytes);
    return flashattn::cuda_run(p, plan->device, workspace, workspace_bytes, stream);
  });
}

}  // extern "C"
