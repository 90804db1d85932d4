// CPU backend entry points (backends.hpp): varlen offset checks, workspace sizing and
// dispatch to the flash or standard implementation.
#include <math.h>

#include "backends.hpp"
#include "cpu/cpu_impl.hpp"
#include "cpu/isa.hpp"
#include "cpu/kvcache.hpp"
#include "cpu/tensor_view.hpp"
#include "cpu/thread_pool.hpp"
#include "error.hpp"

namespace flashattn {

namespace cpu {
namespace {

CheckedSize slot_bytes(const AttnParams& p) {
  if (p.algorithm == FLASHATTN_ALGORITHM_STANDARD) return standard_slot_bytes(p);
  return p.direction == kBackward ? flash_bwd_slot_bytes(p) : flash_fwd_slot_bytes(p);
}

CheckedSize shared_bytes(const AttnParams& p) {
  if (p.algorithm == FLASHATTN_ALGORITHM_STANDARD && !p.kv_enabled) return standard_shared_bytes(p);
  return p.direction == kForward || p.kv_enabled ? flash_fwd_shared_bytes(p) : CheckedSize(0);
}

flashattn_status_t check_offsets(const int32_t* cu, const char* name, int64_t batch, int64_t total, int64_t max_len,
                                 const char* max_name) {
  if (cu[0] != 0) return fail(FLASHATTN_STATUS_INVALID_SEQLENS, "%s[0]=%d must be 0", name, cu[0]);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = int64_t{cu[b + 1]} - cu[b];
    if (len < 0) {
      return fail(FLASHATTN_STATUS_INVALID_SEQLENS, "%s[%lld]=%d is less than %s[%lld]=%d (offsets must not decrease)",
                  name, static_cast<long long>(b + 1), cu[b + 1], name, static_cast<long long>(b), cu[b]);
    }
    if (len > max_len) {
      return fail(FLASHATTN_STATUS_INVALID_SEQLENS, "%s[%lld]=%d gives sequence %lld length %lld, more than %s=%lld",
                  name, static_cast<long long>(b + 1), cu[b + 1], static_cast<long long>(b),
                  static_cast<long long>(len), max_name, static_cast<long long>(max_len));
    }
  }
  if (cu[batch] > total) {
    return fail(FLASHATTN_STATUS_INVALID_SEQLENS, "%s[%lld]=%d exceeds the total token count %lld", name,
                static_cast<long long>(batch), cu[batch], static_cast<long long>(total));
  }
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace

void write_uncovered_tokens(const AttnParams& p) {
  if (!p.varlen) return;
  const int64_t end_q = p.cu_seqlens_q[p.batch], end_k = p.cu_seqlens_k[p.batch];
  for (int64_t h = 0; h < p.heads_q; ++h) {
    for (int64_t t = end_q; t < p.total_q; ++t) {
      if (p.direction == kForward) {
        zero_rows(p, p.o, p.o_stride, 0, t, h, 0, 1, p.head_dim_v);
        if (p.lse) p.lse[h * p.total_q + t] = -INFINITY;
      } else if (!p.grad_accumulate) {
        zero_rows(p, p.dq, p.dq_stride, 0, t, h, 0, 1, p.head_dim_qk);
      }
    }
  }
  if (p.direction == kBackward && !p.grad_accumulate) {
    for (int64_t h = 0; h < p.heads_kv; ++h) {
      for (int64_t t = end_k; t < p.total_k; ++t) {
        zero_rows(p, p.dk, p.dk_stride, 0, t, h, 0, 1, p.head_dim_qk);
        zero_rows(p, p.dv, p.dv_stride, 0, t, h, 0, 1, p.head_dim_v);
      }
    }
  }
}

double attention_work(const AttnParams& p) {
  return static_cast<double>(p.batch) * static_cast<double>(p.heads_q) * static_cast<double>(p.seqlen_q) *
         static_cast<double>(p.seqlen_k) * static_cast<double>(p.head_dim_qk + p.head_dim_v);
}

}  // namespace cpu

flashattn_status_t cpu_prepare_plan(int* threads) {
  FA_TRY(cpu::check_forced_isa());
  *threads = cpu::default_thread_count();
  cpu::reserve_workers(*threads);
  return FLASHATTN_STATUS_SUCCESS;
}

int64_t cpu_kv_splits(const AttnParams& p) {
  if (cpu::decode_schedule(p)) return cpu::decode_splits(p);
  // The forward's tasks: (sequence, head, block of kFwdBlockRows query rows).
  const int64_t blocks = (p.seqlen_q + cpu::kFwdBlockRows - 1) / cpu::kFwdBlockRows;
  return cpu::key_splits_for(p.batch * p.heads_q * blocks, p.seqlen_k);
}

CheckedSize cpu_workspace_size(const AttnParams& p, int threads) {
  return cpu::shared_bytes(p) + CheckedSize(threads) * cpu::slot_bytes(p);
}

flashattn_status_t cpu_check(const AttnParams& p) {
  FA_TRY(cpu::check_host_memory(p));
  if (p.kv_enabled) return cpu_check_kvcache(p);
  if (!p.varlen) return FLASHATTN_STATUS_SUCCESS;
  if (p.cu_seqlens_q == nullptr || p.cu_seqlens_k == nullptr) {
    return fail(FLASHATTN_STATUS_NULL_POINTER, "cu_seqlens_%s is NULL in varlen mode", p.cu_seqlens_q ? "k" : "q");
  }
  flashattn_status_t st =
      cpu::check_offsets(p.cu_seqlens_q, "cu_seqlens_q", p.batch, p.total_q, p.seqlen_q, "max_seqlen_q");
  if (st != FLASHATTN_STATUS_SUCCESS) return st;
  return cpu::check_offsets(p.cu_seqlens_k, "cu_seqlens_k", p.batch, p.total_k, p.seqlen_k, "max_seqlen_k");
}

flashattn_status_t cpu_run(const AttnParams& p, int threads, void* workspace, size_t workspace_bytes) {
  // Both sizes are parts of the checked workspace size the API layer validated.
  const size_t shared = static_cast<size_t>(cpu::shared_bytes(p).value());
  const size_t slot = static_cast<size_t>(cpu::slot_bytes(p).value());
  if (workspace == nullptr || workspace_bytes < shared + slot) {
    return fail(FLASHATTN_STATUS_WORKSPACE_TOO_SMALL, "workspace_bytes=%zu is less than the %zu bytes one thread needs",
                workspace_bytes, shared + slot);
  }
  FA_TRY(cpu::check_host_memory(workspace, "workspace"));
  // As many threads as the workspace has slots for (the queried size has one per
  // thread of the plan); results do not depend on the count.
  const size_t fit = (workspace_bytes - shared) / slot;
  if (fit < static_cast<size_t>(threads)) threads = static_cast<int>(fit);
  char* ws = static_cast<char*>(workspace);
  const bool standard = p.algorithm == FLASHATTN_ALGORITHM_STANDARD;
  if (p.kv_enabled) {
    FA_TRY(cpu::check_append_targets(p, cpu::append_targets_scratch(p, ws)));
    cpu::append_new_rows(p, threads);
    cpu::flash_forward(p, ws, threads);
  } else if (p.direction == kForward) {
    standard ? cpu::standard_forward(p, ws, threads) : cpu::flash_forward(p, ws, threads);
  } else {
    standard ? cpu::standard_backward(p, ws, threads) : cpu::flash_backward(p, ws, threads);
  }
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace flashattn
