// The plan: the configuration a user builds with the setters. Only src/api.cpp and
// src/validate.cpp see this struct; backends receive an AttnParams built from it.
#pragma once
#include <stdint.h>

#include <vector>

#include "common/params.h"
#include "flashattn.h"
#include "regions.hpp"

// A KV-cache configuration as a plan keeps it: the caller's values, stride arrays copied
// (given[t] false: contiguous, resolved against the shape whenever it is checked).
struct KvGeometry {
  int64_t page_size = 0, num_rows = 0, max_pages = 0, seqlen_new = 0;
  int32_t rotary = 0;  // flashattn_rotary_t value
  int64_t rotary_dim = 0, rotary_rows = 0, num_splits = 0;
  int64_t strides[4][4] = {};  // k_cache, v_cache, k_new, v_new
  bool given[4] = {false, false, false, false};
};

struct flashattn_plan_s {
  flashattn_backend_t backend = FLASHATTN_BACKEND_CPU;  // resolved, never AUTO
  int device = 0;
  int cpu_threads = 1;  // CPU plans: cpu_prepare_plan() at creation (workspace size and runs)

  bool has_shape = false;
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0, head_dim_qk = 0, head_dim_v = 0;
  flashattn_dtype_t dtype = FLASHATTN_DTYPE_FP16;
  flashattn::Strides4 strides[8] = {};  // indexed by flashattn_tensor_t; contiguous BSHD after set_shape

  float scale = 0.f;  // 0 = 1/sqrt(head_dim_qk)
  flashattn_algorithm_t algorithm = FLASHATTN_ALGORITHM_FLASH;

  bool varlen = false;
  int64_t total_q = 0, total_k = 0;
  bool deterministic = false;
  bool grad_accumulate = false;  // the backward adds into dQ, dK, dV

  flashattn_mask_align_t align = FLASHATTN_ALIGN_TOP_LEFT;
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.f;

  flashattn_bias_t bias_kind = FLASHATTN_BIAS_NONE;
  int64_t bias_stride[4] = {0, 0, 0, 0};
  int64_t alibi_batch_stride = 0;  // ALiBi kinds: 0 = slopes [heads_q], else [batch, heads_q]

  float dropout_p = 0.f;
  uint64_t seed = 0, offset = 0;

  // Block-sparse layout: host copy always; device copy for CUDA plans.
  std::vector<uint8_t> layout;
  int64_t layout_heads = 0, n_row_blocks = 0, n_col_blocks = 0, block_q = 0, block_k = 0;
  void* layout_device = nullptr;

  // KV-cache mode (flashattn_plan_set_kvcache). Only flashattn_fwd_kvcache runs a plan in
  // this mode.
  bool kvcache = false;
  KvGeometry kv;
};

namespace flashattn {

// Extents (batch, seq, head, dim) of a tensor under the plan's current shape and varlen
// mode (varlen: batch extent 1 and seq extent = total tokens).
void tensor_extents(const flashattn_plan_s& plan, flashattn_tensor_t tensor, int64_t extents[4]);

// Checks one tensor's strides against the plan (INVALID_STRIDE with a message).
flashattn_status_t check_tensor_strides(const flashattn_plan_s& plan, flashattn_tensor_t tensor,
                                        const Strides4& strides);

// Checks the bias strides (kind TENSOR) against the plan.
flashattn_status_t check_bias_strides(const flashattn_plan_s& plan, const int64_t strides[4], const char* what);

// Checks an ALiBi batch stride against the plan (INVALID_STRIDE with a message).
flashattn_status_t check_alibi_batch_stride(const flashattn_plan_s& plan, int64_t batch_stride);

// The region of a run's ALiBi slopes: [batch, heads_q] floats, rows alibi_batch_stride apart.
Region alibi_slopes_region(const flashattn_plan_s& plan, const float* slopes);

// Checks that a block-sparse layout's dimensions match the plan's shape.
flashattn_status_t check_layout_dims(const flashattn_plan_s& plan, int64_t layout_heads, int64_t n_row_blocks,
                                     int64_t n_col_blocks, int64_t block_q, int64_t block_k);

// AttnParams holding the plan's shape and options for `direction`, with no tensor pointers.
AttnParams params_from_plan(const flashattn_plan_s& plan, Direction direction);

// Workspace bytes of a pass (plan must have a shape); INVALID_SHAPE when the size overflows.
flashattn_status_t workspace_size(const flashattn_plan_s& plan, Direction direction, const AttnParams& params,
                                  size_t* bytes);

// Full validation of a run; fills params. Nothing is written anywhere on failure.
flashattn_status_t validate_fwd(const flashattn_plan_s& plan, const flashattn_fwd_args_t* args, void* workspace,
                                size_t workspace_bytes, struct CUstream_st* stream, AttnParams* params);
flashattn_status_t validate_bwd(const flashattn_plan_s& plan, const flashattn_bwd_args_t* args, void* workspace,
                                size_t workspace_bytes, struct CUstream_st* stream, AttnParams* params);

// ---- KV cache (validate_kvcache.cpp) ----

// Reads a caller's configuration (struct_size, rotary enum, stride arrays copied).
flashattn_status_t read_kvcache_config(const flashattn_kvcache_config_t* config, KvGeometry* out);

// Checks a KV-cache geometry against the plan's shape; out gets it with every stride resolved.
flashattn_status_t check_kvcache_geometry(const flashattn_plan_s& plan, const KvGeometry& geometry, KvGeometry* out);

// INCOMPATIBLE_OPTIONS naming `function` when the plan is in KV-cache mode.
flashattn_status_t refuse_kvcache_plan(const flashattn_plan_s& plan, const char* function);

// Workspace bytes of flashattn_fwd_kvcache (PLAN_INCOMPLETE without a configuration).
flashattn_status_t kvcache_workspace_size(const flashattn_plan_s& plan, size_t* bytes);

// Full validation of a KV-cache run; fills params. Nothing is written anywhere on failure.
flashattn_status_t validate_kvcache(const flashattn_plan_s& plan, const flashattn_kvcache_args_t* args, void* workspace,
                                    size_t workspace_bytes, struct CUstream_st* stream, AttnParams* params);

// Validation of a flashattn_combine call (shapes, strides, pointers, overlap).
flashattn_status_t validate_combine(const flashattn_combine_args_t* args, CombineParams* params);
// The backend a (backend, device) pair of flashattn_plan_create or flashattn_combine selects,
// `backend` being the int the caller passed (read with enum_value: any int is well-defined):
// INVALID_ENUM / INVALID_VALUE for bad values; AUTO resolves to CUDA when it is built in and
// `device` exists, else to the CPU. *resolved untouched on failure.
flashattn_status_t resolve_backend(int backend, int device, flashattn_backend_t* resolved);

}  // namespace flashattn
