// Validation of the inference entry points (flashattn_plan_set_kvcache,
// flashattn_fwd_kvcache, flashattn_combine) and construction of their parameters. Same
// order as validate.cpp: the args struct, the plan, required pointers, option/pointer
// consistency, alignment, strides and extents, then the backend's checks of the values it
// can read, then the workspace and the overlap of written memory with every other
// argument (regions.hpp).
#include <stdint.h>

#include "api_guard.hpp"
#include "backends.hpp"
#include "common/philox.h"
#include "error.hpp"
#include "plan.hpp"
#include "regions.hpp"
#include "validate_util.hpp"

namespace flashattn {
namespace {

const int64_t kMaxIndex = INT64_C(2147483647);  // int32 tables index rows, pages and positions
const int64_t kMaxSplits = 1024;

// Strides (dims n, elements of es bytes) named `name` over extents e: given NULL selects
// the contiguous layout (written into st); otherwise the strides are >= 0, the last is 1
// when unit_last, and (written) no two elements alias. Either way the byte extent is at
// most 2^63-1 (checked arithmetic).
flashattn_status_t check_strides(const char* name, int n, const int64_t* e, const int64_t* given, int64_t* st,
                                 int64_t es, bool unit_last, bool written) {
  if (given == nullptr) {
    CheckedSize step = 1;
    for (int i = n - 1; i >= 0; --i) {
      st[i] = step.value();
      step *= CheckedSize(e[i]);
    }
    if (!(step * CheckedSize(es)).ok())
      return fail(FLASHATTN_STATUS_INVALID_SHAPE,
                  "%s: a contiguous tensor of extents %s and %lld-byte elements "
                  "has more than 2^63-1 bytes",
                  name, dims_text(n, e).text, static_cast<long long>(es));
    return FLASHATTN_STATUS_SUCCESS;
  }
  for (int i = 0; i < n; ++i) st[i] = given[i];
  if (unit_last && st[n - 1] != 1)
    return fail(FLASHATTN_STATUS_INVALID_STRIDE, "%s: dim stride=%lld must be 1 (last dim contiguous)", name,
                static_cast<long long>(st[n - 1]));
  for (int i = 0; i < n; ++i)
    if (st[i] < 0)
      return fail(FLASHATTN_STATUS_INVALID_STRIDE, "%s[%d]=%lld must be >= 0", name, i, static_cast<long long>(st[i]));
  if (!extent_bytes(n, e, st, es).ok())
    return fail(FLASHATTN_STATUS_INVALID_STRIDE, "%s %s over extents %s span more than 2^63-1 bytes", name,
                dims_text(n, st).text, dims_text(n, e).text);
  if (written && !non_overlapping(n, e, st))
    return fail(FLASHATTN_STATUS_INVALID_STRIDE, "%s make distinct elements of this written tensor share an address",
                name);
  return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status_t check_range(const char* name, int64_t value, int64_t lo, int64_t hi, flashattn_status_t status) {
  if (value < lo || value > hi)
    return fail(status, "%s=%lld must be in [%lld, %lld]", name, static_cast<long long>(value),
                static_cast<long long>(lo), static_cast<long long>(hi));
  return FLASHATTN_STATUS_SUCCESS;
}

Strides4 strides4(const int64_t* s) { return {s[0], s[1], s[2], s[3]}; }

// The plan's shape and options with the KV-cache geometry kv (strides resolved).
AttnParams kvcache_params(const flashattn_plan_s& plan, const KvGeometry& kv) {
  AttnParams p = params_from_plan(plan, kForward);
  p.kv_enabled = 1;
  p.k_stride = strides4(kv.strides[0]);
  p.v_stride = strides4(kv.strides[1]);
  p.k_new_stride = strides4(kv.strides[2]);
  p.v_new_stride = strides4(kv.strides[3]);
  p.kv_page_size = kv.page_size;
  p.kv_max_pages = kv.max_pages;
  p.kv_num_rows = kv.num_rows;
  p.kv_seqlen_new = kv.seqlen_new;
  p.rotary = kv.rotary;
  p.rotary_dim = kv.rotary_dim;
  p.rotary_rows = kv.rotary_rows;
  // 0 on CUDA: each run chooses for the kernel it takes (src/cuda/decode.cu).
  if (kv.num_splits > 0) p.kv_num_splits = kv.num_splits;
  else p.kv_num_splits = plan.backend == FLASHATTN_BACKEND_CPU ? cpu_kv_splits(p) : 0;
  return p;
}

flashattn_status_t kvcache_workspace(const flashattn_plan_s& plan, const AttnParams& p, size_t* bytes) {
  const CheckedSize n = plan.backend == FLASHATTN_BACKEND_CPU ? cpu_workspace_size(p, plan.cpu_threads)
                                                              : cuda_workspace_size(p, plan.device);
  if (!n.ok())
    return fail(FLASHATTN_STATUS_INVALID_SHAPE,
                "the KV-cache forward workspace exceeds 2^63-1 bytes for batch=%lld seqlen_q=%lld heads_q=%lld "
                "head_dim_v=%lld and %lld KV splits (0: chosen by each run)",
                static_cast<long long>(plan.batch), static_cast<long long>(plan.seqlen_q),
                static_cast<long long>(plan.heads_q), static_cast<long long>(plan.head_dim_v),
                static_cast<long long>(p.kv_num_splits));
  *bytes = static_cast<size_t>(n.value());
  return FLASHATTN_STATUS_SUCCESS;
}

// Options a KV-cache run does not take (INCOMPATIBLE_OPTIONS naming the option).
flashattn_status_t check_options(const flashattn_plan_s& plan) {
  const char* bad = nullptr;
  if (plan.varlen) bad = "varlen mode (flashattn_plan_set_varlen; per-sequence lengths are args.cache_seqlens)";
  else if (dropout_active(dropout_threshold(plan.dropout_p))) bad = "dropout";
  else if (plan.bias_kind == FLASHATTN_BIAS_TENSOR) bad = "bias tensor";
  else if (!plan.layout.empty()) bad = "block-sparse layout";
  else if (plan.algorithm == FLASHATTN_ALGORITHM_STANDARD) bad = "algorithm STANDARD";
  if (bad != nullptr)
    return fail(FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS, "plan option %s cannot be combined with a KV cache", bad);
  const bool band = plan.window_left >= 0 || plan.window_right >= 0;
  const bool alibi = plan.bias_kind == FLASHATTN_BIAS_ALIBI || plan.bias_kind == FLASHATTN_BIAS_ALIBI_SYMMETRIC;
  if ((band || alibi) && plan.align != FLASHATTN_ALIGN_BOTTOM_RIGHT)
    return fail(FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS,
                "align=%d: with a KV cache the band mask and ALiBi are aligned bottom-right against each "
                "sequence's keys; set FLASHATTN_ALIGN_BOTTOM_RIGHT",
                static_cast<int>(plan.align));
  return FLASHATTN_STATUS_SUCCESS;
}

// A pointer is required exactly when `needed`: NULL_POINTER or INCOMPATIBLE_OPTIONS naming it.
flashattn_status_t require_iff(const void* ptr, bool needed, const char* name, const char* why) {
  if (needed && ptr == nullptr) return fail(FLASHATTN_STATUS_NULL_POINTER, "%s is NULL but required (%s)", name, why);
  if (!needed && ptr != nullptr)
    return fail(FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS, "%s=%p is given but unused: only with %s", name, ptr, why);
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace

flashattn_status_t refuse_kvcache_plan(const flashattn_plan_s& plan, const char* function) {
  if (plan.kvcache)
    return fail(FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS,
                "%s: the plan is in KV-cache mode; run it with flashattn_fwd_kvcache or leave the mode with "
                "flashattn_plan_set_kvcache(plan, NULL)",
                function);
  return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status_t read_kvcache_config(const flashattn_kvcache_config_t* config, KvGeometry* out) {
  if (config->struct_size < sizeof(flashattn_kvcache_config_t))
    return fail(FLASHATTN_STATUS_INVALID_STRUCT_SIZE,
                "config.struct_size=%zu is smaller than sizeof(flashattn_kvcache_config_t)=%zu of this library "
                "version; initialize it with FLASHATTN_KVCACHE_CONFIG_INIT",
                config->struct_size, sizeof(flashattn_kvcache_config_t));
  KvGeometry g;
  g.page_size = config->page_size;
  g.num_rows = config->num_rows;
  g.max_pages = config->max_pages_per_seq;
  g.seqlen_new = config->seqlen_new;
  g.rotary = enum_value(config->rotary);
  g.rotary_dim = config->rotary_dim;
  g.rotary_rows = config->rotary_rows;
  g.num_splits = config->num_splits;
  const int64_t* given[4] = {config->k_cache_strides, config->v_cache_strides, config->k_new_strides,
                             config->v_new_strides};
  for (int t = 0; t < 4; ++t) {
    g.given[t] = given[t] != nullptr;
    for (int i = 0; i < 4 && g.given[t]; ++i) g.strides[t][i] = given[t][i];
  }
  *out = g;
  return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status_t check_kvcache_geometry(const flashattn_plan_s& plan, const KvGeometry& in, KvGeometry* out) {
  KvGeometry c = in;
  FA_TRY(check_range("config.page_size", c.page_size, 0, kMaxIndex, FLASHATTN_STATUS_INVALID_SHAPE));
  FA_TRY(check_range("config.num_rows", c.num_rows, 1, kMaxIndex, FLASHATTN_STATUS_INVALID_SHAPE));
  const bool paged = c.page_size > 0;
  if (paged) {
    const int64_t need = (plan.seqlen_k + c.page_size - 1) / c.page_size;
    if (c.max_pages < need || c.max_pages > kMaxIndex)
      return fail(FLASHATTN_STATUS_INVALID_SHAPE,
                  "config.max_pages_per_seq=%lld must be in [ceil(seqlen_k=%lld / page_size=%lld)=%lld, 2^31-1]",
                  static_cast<long long>(c.max_pages), static_cast<long long>(plan.seqlen_k),
                  static_cast<long long>(c.page_size), static_cast<long long>(need));
  } else if (c.max_pages != 0) {
    return fail(FLASHATTN_STATUS_INVALID_SHAPE,
                "config.max_pages_per_seq=%lld must be 0 for a contiguous cache (page_size=0)",
                static_cast<long long>(c.max_pages));
  }
  FA_TRY(check_range("config.seqlen_new", c.seqlen_new, 0, plan.seqlen_k, FLASHATTN_STATUS_INVALID_SHAPE));
  if (c.rotary < FLASHATTN_ROTARY_NONE || c.rotary > FLASHATTN_ROTARY_INTERLEAVED)
    return fail(FLASHATTN_STATUS_INVALID_ENUM, "config.rotary=%d is not a flashattn_rotary_t value", c.rotary);
  if (c.rotary == FLASHATTN_ROTARY_NONE) {
    FA_TRY(check_range("config.rotary_dim (no rotary form)", c.rotary_dim, 0, 0, FLASHATTN_STATUS_INVALID_VALUE));
    FA_TRY(check_range("config.rotary_rows (no rotary form)", c.rotary_rows, 0, 0, FLASHATTN_STATUS_INVALID_VALUE));
  } else {
    if (c.seqlen_new == 0)
      return fail(FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS,
                  "config.rotary=%d needs appended keys (config.seqlen_new >= 1): the cache holds rotated keys",
                  c.rotary);
    FA_TRY(check_range("config.rotary_dim", c.rotary_dim, 2, plan.head_dim_qk, FLASHATTN_STATUS_INVALID_VALUE));
    if (c.rotary_dim % 2 != 0)
      return fail(FLASHATTN_STATUS_INVALID_VALUE, "config.rotary_dim=%lld must be even",
                  static_cast<long long>(c.rotary_dim));
    FA_TRY(check_range("config.rotary_rows", c.rotary_rows, 1, kMaxIndex, FLASHATTN_STATUS_INVALID_VALUE));
  }
  FA_TRY(check_range("config.num_splits", c.num_splits, 0, kMaxSplits, FLASHATTN_STATUS_INVALID_VALUE));
  const bool append = c.seqlen_new > 0;
  const int64_t cache_tokens = paged ? c.page_size : plan.seqlen_k;
  const int64_t extents[4][4] = {{c.num_rows, cache_tokens, plan.heads_kv, plan.head_dim_qk},
                                 {c.num_rows, cache_tokens, plan.heads_kv, plan.head_dim_v},
                                 {plan.batch, c.seqlen_new, plan.heads_kv, plan.head_dim_qk},
                                 {plan.batch, c.seqlen_new, plan.heads_kv, plan.head_dim_v}};
  static const char* const names[4] = {"config.k_cache_strides", "config.v_cache_strides", "config.k_new_strides",
                                       "config.v_new_strides"};
  for (int t = 0; t < 4; ++t)
    FA_TRY(check_strides(names[t], 4, extents[t], in.given[t] ? in.strides[t] : nullptr, c.strides[t],
                         dtype_size(plan.dtype), true, append && t < 2));
  *out = c;
  return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status_t kvcache_workspace_size(const flashattn_plan_s& plan, size_t* bytes) {
  if (!plan.kvcache)
    return fail(FLASHATTN_STATUS_PLAN_INCOMPLETE,
                "pass=FLASHATTN_PASS_FORWARD_KVCACHE: the plan has no KV-cache configuration "
                "(flashattn_plan_set_kvcache)");
  KvGeometry kv;
  FA_TRY(check_kvcache_geometry(plan, plan.kv, &kv));
  return kvcache_workspace(plan, kvcache_params(plan, kv), bytes);
}

flashattn_status_t validate_kvcache(const flashattn_plan_s& plan, const flashattn_kvcache_args_t* user_args,
                                    void* workspace, size_t workspace_bytes, struct CUstream_st* stream,
                                    AttnParams* params) {
  flashattn_kvcache_args_t a;
  FA_TRY(read_args(user_args, &a, "flashattn_kvcache_args_t"));
  if (!plan.has_shape)
    return fail(FLASHATTN_STATUS_PLAN_INCOMPLETE, "plan has no shape: call flashattn_plan_set_shape first");
  if (!plan.kvcache)
    return fail(FLASHATTN_STATUS_PLAN_INCOMPLETE,
                "plan has no KV-cache configuration: call flashattn_plan_set_kvcache first");
  KvGeometry kv;  // checked again: the shape may have changed since flashattn_plan_set_kvcache
  FA_TRY(check_kvcache_geometry(plan, plan.kv, &kv));
  FA_TRY(require(a.q, "args.q"));
  FA_TRY(require(a.k_cache, "args.k_cache"));
  FA_TRY(require(a.v_cache, "args.v_cache"));
  FA_TRY(require(a.o, "args.o"));
  FA_TRY(require(a.cache_seqlens, "args.cache_seqlens"));
  if (plan.backend == FLASHATTN_BACKEND_CPU && stream != nullptr)
    return fail(FLASHATTN_STATUS_INVALID_ARGUMENT, "stream=%p must be NULL for the CPU backend",
                static_cast<void*>(stream));
  FA_TRY(check_options(plan));
  const bool paged = kv.page_size > 0, append = kv.seqlen_new > 0, rotary = kv.rotary != FLASHATTN_ROTARY_NONE;
  const bool alibi = plan.bias_kind == FLASHATTN_BIAS_ALIBI || plan.bias_kind == FLASHATTN_BIAS_ALIBI_SYMMETRIC;
  FA_TRY(require_iff(a.block_table, paged, "args.block_table", "a paged cache (config.page_size >= 1)"));
  if (paged && a.cache_batch_idx != nullptr)
    return fail(FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS,
                "args.cache_batch_idx=%p is given but the cache is paged: the block table picks the pages",
                static_cast<const void*>(a.cache_batch_idx));
  FA_TRY(require_iff(a.k_new, append, "args.k_new", "appended tokens (config.seqlen_new >= 1)"));
  FA_TRY(require_iff(a.v_new, append, "args.v_new", "appended tokens (config.seqlen_new >= 1)"));
  FA_TRY(require_iff(a.rotary_cos, rotary, "args.rotary_cos", "a rotary form (config.rotary)"));
  FA_TRY(require_iff(a.rotary_sin, rotary, "args.rotary_sin", "a rotary form (config.rotary)"));
  FA_TRY(require_iff(a.alibi_slopes, alibi, "args.alibi_slopes", "an ALiBi bias kind"));

  // The run's memory (regions.hpp) in the order of the args struct, then the workspace
  // (its extent set once the size is known). The caches are written when appending.
  const int64_t es = dtype_size(plan.dtype);
  const Strides4& qs = plan.strides[FLASHATTN_TENSOR_Q];
  const Strides4& os = plan.strides[FLASHATTN_TENSOR_O];
  const int64_t cache_tokens = paged ? kv.page_size : plan.seqlen_k;
  const int64_t half = kv.rotary_dim / 2, pages = paged ? kv.max_pages : 1;
  const int64_t* ks = kv.strides[0];
  const int64_t* vs = kv.strides[1];
  const int64_t* kns = kv.strides[2];
  const int64_t* vns = kv.strides[3];
  const int64_t ws_align = plan.backend == FLASHATTN_BACKEND_CPU ? static_cast<int64_t>(kCpuWorkspaceAlignment) : 1;
  // One row per argument.
  // clang-format off
  Region regions[] = {
      {"args.q", a.q, 4, {plan.batch, plan.seqlen_q, plan.heads_q, plan.head_dim_qk}, {qs.b, qs.s, qs.h, qs.d}, es, es,
       false},
      {"args.k_cache", a.k_cache, 4, {kv.num_rows, cache_tokens, plan.heads_kv, plan.head_dim_qk},
       {ks[0], ks[1], ks[2], ks[3]}, es, es, append},
      {"args.v_cache", a.v_cache, 4, {kv.num_rows, cache_tokens, plan.heads_kv, plan.head_dim_v},
       {vs[0], vs[1], vs[2], vs[3]}, es, es, append},
      {"args.o", a.o, 4, {plan.batch, plan.seqlen_q, plan.heads_q, plan.head_dim_v}, {os.b, os.s, os.h, os.d}, es, es,
       true},
      // [batch, heads_q, seqlen_q] floats; heads_q x seqlen_q is bounded by set_shape.
      {"args.lse", a.lse, 3, {plan.batch, plan.heads_q, plan.seqlen_q}, {plan.heads_q * plan.seqlen_q, plan.seqlen_q, 1},
       4, 4, true},
      {"args.cache_seqlens", a.cache_seqlens, 1, {plan.batch}, {1}, 4, 4, false},
      {"args.cache_batch_idx", a.cache_batch_idx, 1, {plan.batch}, {1}, 4, 4, false},
      {"args.block_table", a.block_table, 2, {plan.batch, pages}, {pages, 1}, 4, 4, false},
      {"args.k_new", a.k_new, 4, {plan.batch, kv.seqlen_new, plan.heads_kv, plan.head_dim_qk},
       {kns[0], kns[1], kns[2], kns[3]}, es, es, false},
      {"args.v_new", a.v_new, 4, {plan.batch, kv.seqlen_new, plan.heads_kv, plan.head_dim_v},
       {vns[0], vns[1], vns[2], vns[3]}, es, es, false},
      {"args.rotary_cos", a.rotary_cos, 2, {kv.rotary_rows, half}, {half, 1}, es, es, false},
      {"args.rotary_sin", a.rotary_sin, 2, {kv.rotary_rows, half}, {half, 1}, es, es, false},
      alibi_slopes_region(plan, a.alibi_slopes),
      {"workspace", workspace, 1, {0}, {1}, 1, ws_align, true}};
  // clang-format on
  const int n_regions = static_cast<int>(sizeof regions / sizeof regions[0]);
  for (const Region& r : regions) FA_TRY(check_alignment(r));
  FA_TRY(check_tensor_strides(plan, FLASHATTN_TENSOR_Q, plan.strides[FLASHATTN_TENSOR_Q]));
  FA_TRY(check_tensor_strides(plan, FLASHATTN_TENSOR_O, plan.strides[FLASHATTN_TENSOR_O]));
  FA_TRY(check_alibi_batch_stride(plan, plan.alibi_batch_stride));
  FA_TRY(check_extents(regions, n_regions));

  AttnParams p = kvcache_params(plan, kv);
  p.q = a.q;
  p.k = a.k_cache;
  p.v = a.v_cache;
  p.o = a.o;
  p.lse = a.lse;
  p.alibi_slopes = a.alibi_slopes;
  p.kv_seqused = a.cache_seqlens;
  p.kv_batch_idx = a.cache_batch_idx;
  p.kv_block_table = a.block_table;
  p.k_new = a.k_new;
  p.v_new = a.v_new;
  p.rotary_cos = a.rotary_cos;
  p.rotary_sin = a.rotary_sin;
  if (plan.backend == FLASHATTN_BACKEND_CPU) {
    FA_TRY(cpu_check(p));
  } else {
    FA_TRY(cuda_check(p, plan.device));
  }
  size_t needed = 0;
  FA_TRY(kvcache_workspace(plan, p, &needed));
  FA_TRY(check_workspace(needed, workspace, workspace_bytes));
  // Nothing the run writes may share memory with anything else it reads or writes.
  regions[n_regions - 1].extents[0] = static_cast<int64_t>(needed);
  FA_TRY(check_no_overlap(regions, n_regions));
  *params = p;
  return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status_t validate_combine(const flashattn_combine_args_t* user_args, CombineParams* params) {
  flashattn_combine_args_t a;
  FA_TRY(read_args(user_args, &a, "flashattn_combine_args_t"));
  FA_TRY(check_range("args.num_splits", a.num_splits, 1, kMaxIndex, FLASHATTN_STATUS_INVALID_SHAPE));
  FA_TRY(check_range("args.batch", a.batch, 1, kMaxIndex, FLASHATTN_STATUS_INVALID_SHAPE));
  FA_TRY(check_range("args.seqlen_q", a.seqlen_q, 1, kMaxIndex, FLASHATTN_STATUS_INVALID_SHAPE));
  FA_TRY(check_range("args.heads", a.heads, 1, INT64_C(1) << 24, FLASHATTN_STATUS_INVALID_SHAPE));
  FA_TRY(check_range("args.head_dim", a.head_dim, 1, FLASHATTN_MAX_HEAD_DIM, FLASHATTN_STATUS_INVALID_SHAPE));
  // The largest extent: each of the five is at most 2^31-1, their product may not be.
  if (!checked_product(a.num_splits, a.batch, a.seqlen_q, a.heads, a.head_dim, sizeof(float)).ok())
    return fail(FLASHATTN_STATUS_INVALID_SHAPE,
                "args.num_splits=%lld x batch=%lld x seqlen_q=%lld x heads=%lld x head_dim=%lld floats of "
                "args.o_partial exceed 2^63-1 bytes",
                static_cast<long long>(a.num_splits), static_cast<long long>(a.batch),
                static_cast<long long>(a.seqlen_q), static_cast<long long>(a.heads),
                static_cast<long long>(a.head_dim));
  const int dt = enum_value(a.dtype);
  if (dt < FLASHATTN_DTYPE_FP16 || dt > FLASHATTN_DTYPE_FP32)
    return fail(FLASHATTN_STATUS_INVALID_ENUM, "args.dtype=%d is not a flashattn_dtype_t value", dt);
  FA_TRY(require(a.o_partial, "args.o_partial"));
  FA_TRY(require(a.lse_partial, "args.lse_partial"));
  FA_TRY(require(a.o, "args.o"));
  const int64_t es = dtype_size(a.dtype);
  const int64_t eop[5] = {a.num_splits, a.batch, a.seqlen_q, a.heads, a.head_dim};
  const int64_t elp[4] = {a.num_splits, a.batch, a.heads, a.seqlen_q};
  const int64_t eo[4] = {a.batch, a.seqlen_q, a.heads, a.head_dim};
  CombineParams c;
  int64_t o_st[4];
  // Alignment first (before strides), as in every run; extents are filled in below.
  Region regions[] = {
      {"args.o_partial", a.o_partial, 5, {}, {}, 4, 4, false},
      {"args.lse_partial", a.lse_partial, 4, {}, {}, 4, 4, false},
      {"args.o", a.o, 4, {}, {}, es, es, true},
      // [batch, heads, seqlen_q] floats, bounded by the check above.
      {"args.lse", a.lse, 3, {a.batch, a.heads, a.seqlen_q}, {a.heads * a.seqlen_q, a.seqlen_q, 1}, 4, 4, true}};
  for (const Region& r : regions) FA_TRY(check_alignment(r));
  FA_TRY(check_strides("args.o_partial_strides", 5, eop, a.o_partial_strides, c.o_partial_stride, 4, true, false));
  FA_TRY(
      check_strides("args.lse_partial_strides", 4, elp, a.lse_partial_strides, c.lse_partial_stride, 4, false, false));
  FA_TRY(check_strides("args.o_strides", 4, eo, a.o_strides, o_st, es, true, true));
  c.o_stride = strides4(o_st);
  const int64_t* extents[3] = {eop, elp, eo};
  const int64_t* strides[3] = {c.o_partial_stride, c.lse_partial_stride, o_st};
  for (int r = 0; r < 3; ++r)
    for (int k = 0; k < regions[r].dims; ++k) {
      regions[r].extents[k] = extents[r][k];
      regions[r].strides[k] = strides[r][k];
    }
  FA_TRY(check_no_overlap(regions, 4));
  c.num_splits = a.num_splits;
  c.batch = a.batch;
  c.seqlen_q = a.seqlen_q;
  c.heads = a.heads;
  c.head_dim = a.head_dim;
  c.o_partial = a.o_partial;
  c.lse_partial = a.lse_partial;
  c.dtype = dt;
  c.o = a.o;
  c.lse = a.lse;
  *params = c;
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace flashattn
