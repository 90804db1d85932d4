// KV-cache runs on the CPU: the append of new keys/values (with rotary embedding) before
// attending, and the split-KV partial buffers and their merge. The attention itself is
// the flash forward (flash_fwd.cpp), reading K/V rows through cache_row_offset.
#include "cpu/kvcache.hpp"

#include <math.h>
#include <string.h>

#include "cpu/cpu_impl.hpp"
#include "cpu/tensor_view.hpp"
#include "cpu/thread_pool.hpp"
#include "flashattn.h"

namespace flashattn {
namespace cpu {

void rotate_row(const AttnParams& p, float* x, int64_t pos) {
  const int64_t half = p.rotary_dim / 2;
  float cs[FLASHATTN_MAX_HEAD_DIM / 2], sn[FLASHATTN_MAX_HEAD_DIM / 2];
  row_to_float(elem_ptr(p.rotary_cos, p.dtype, pos * half), p.dtype, cs, half);
  row_to_float(elem_ptr(p.rotary_sin, p.dtype, pos * half), p.dtype, sn, half);
  const bool interleaved = p.rotary == FLASHATTN_ROTARY_INTERLEAVED;
  for (int64_t k = 0; k < half; ++k) {
    const int64_t a = interleaved ? 2 * k : k, b = interleaved ? 2 * k + 1 : k + half;
    const float x1 = x[a], x2 = x[b];
    x[a] = x1 * cs[k] - x2 * sn[k];
    x[b] = x2 * cs[k] + x1 * sn[k];
  }
  if (p.dtype == kFp32) return;
  uint16_t rounded[FLASHATTN_MAX_HEAD_DIM];
  row_from_float(x, p.dtype, rounded, p.rotary_dim);
  row_to_float(rounded, p.dtype, x, p.rotary_dim);
}

void append_new_rows(const AttnParams& p, int threads) {
  if (p.kv_seqlen_new == 0) return;
  const int64_t n_tasks = p.batch * p.heads_kv;
  const size_t es = dtype_size(p.dtype);
  TaskCounter tasks(n_tasks);
  const double work = static_cast<double>(n_tasks * p.kv_seqlen_new * (p.head_dim_qk + p.head_dim_v));
  run_team(team_size(threads, n_tasks, work), [&](const TeamMember&) {
    float row[FLASHATTN_MAX_HEAD_DIM];
    for (int64_t t = tasks.next(); t >= 0; t = tasks.next()) {
      const int64_t b = t / p.heads_kv, hk = t % p.heads_kv;
      for (int64_t i = 0; i < p.kv_seqlen_new; ++i) {
        const int64_t j = int64_t{p.kv_seqused[b]} + i;
        const char* k_src =
            elem_ptr(p.k_new, p.dtype, b * p.k_new_stride.b + i * p.k_new_stride.s + hk * p.k_new_stride.h);
        const char* v_src =
            elem_ptr(p.v_new, p.dtype, b * p.v_new_stride.b + i * p.v_new_stride.s + hk * p.v_new_stride.h);
        char* k_dst = elem_ptr(const_cast<void*>(p.k), p.dtype, cache_row_offset(p, p.k_stride, b, hk, j));
        char* v_dst = elem_ptr(const_cast<void*>(p.v), p.dtype, cache_row_offset(p, p.v_stride, b, hk, j));
        if (p.rotary != 0) {
          row_to_float(k_src, p.dtype, row, p.head_dim_qk);
          rotate_row(p, row, j);
          row_from_float(row, p.dtype, k_dst, p.head_dim_qk);
        } else {
          memcpy(k_dst, k_src, static_cast<size_t>(p.head_dim_qk) * es);
        }
        memcpy(v_dst, v_src, static_cast<size_t>(p.head_dim_v) * es);
      }
    }
  });
}

namespace {

SplitParts carve_split_parts(const AttnParams& p, Carver& cv) {
  SplitParts parts;
  const int64_t n = forward_splits(p);
  parts.o = cv.floats(n, p.batch, p.heads_q, p.seqlen_q, p.head_dim_v);
  parts.lse = cv.floats(n, p.batch, p.heads_q, p.seqlen_q);
  return parts;
}

}  // namespace

CheckedSize split_parts_bytes(const AttnParams& p) {
  Carver cv{nullptr};
  carve_split_parts(p, cv);
  return cv.used;
}

CheckedSize kv_shared_bytes(const AttnParams& p) {
  return (forward_splits(p) > 1 ? split_parts_bytes(p) : CheckedSize(0)) + append_targets_bytes(p);
}

char* append_targets_scratch(const AttnParams& p, char* shared) {
  // A part of the checked size kv_shared_bytes.
  return shared + (forward_splits(p) > 1 ? static_cast<size_t>(split_parts_bytes(p).value()) : 0);
}

SplitParts split_parts(const AttnParams& p, char* shared) {
  Carver cv{shared};
  return carve_split_parts(p, cv);
}

void combine_split_parts(const AttnParams& p, const SplitParts& parts, int threads) {
  const int64_t n_rows = p.batch * p.heads_q * p.seqlen_q, dv = p.head_dim_v, n_splits = forward_splits(p);
  const int64_t lse_step = split_row(p, 1, 0, 0, 0);
  TaskCounter tasks(n_rows);
  const double work = static_cast<double>(n_rows * n_splits * dv);
  run_team(team_size(threads, n_rows, work), [&](const TeamMember&) {
    float out[FLASHATTN_MAX_HEAD_DIM];
    for (int64_t t = tasks.next(); t >= 0; t = tasks.next()) {
      const int64_t i = t % p.seqlen_q, h = (t / p.seqlen_q) % p.heads_q, b = t / (p.seqlen_q * p.heads_q);
      const HeadCtx c = make_head_ctx(p, b, h);
      if (i >= c.len_q) continue;  // varlen: past this sequence's rows (no part was written)
      const int64_t row = split_row(p, 0, b, h, i);
      const float lse = combine_row(n_splits, parts.o + row * dv, lse_step * dv, parts.lse + row, lse_step, dv, out);
      row_from_float(out, p.dtype, elem_ptr(p.o, p.dtype, row_offset(p, p.o_stride, b, c.q0 + i, h)), dv);
      if (p.lse) p.lse[lse_index(p, c, i)] = lse;
    }
  });
}

}  // namespace cpu
}  // namespace flashattn
