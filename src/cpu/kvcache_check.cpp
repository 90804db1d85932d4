// Checks of the host values a CPU KV-cache run reads: used lengths, cache rows, block
// tables and rotary positions. They run before anything is written, so a bad value never
// leaves a half-appended cache behind.
#include <stdint.h>

#include <algorithm>
#include <new>
#include <utility>
#include <vector>

#include "backends.hpp"
#include "error.hpp"

namespace flashattn {
namespace {

// Sorted (written row or page, writer) pairs: a row written by two writers is an error.
// Returns the index of the first duplicate pair, or -1.
int64_t first_shared(std::vector<std::pair<int64_t, int64_t>>& writes) {
  std::sort(writes.begin(), writes.end());
  for (size_t i = 1; i < writes.size(); ++i)
    if (writes[i].first == writes[i - 1].first) return static_cast<int64_t>(i);
  return -1;
}

flashattn_status_t check_rotary_positions(const AttnParams& p, int64_t b) {
  const int64_t used = p.kv_seqused[b];
  const int64_t last_k = used + p.kv_seqlen_new - 1;
  const int64_t last_q = used + (p.has_band ? p.seqlen_q - 1 : 0);
  const int64_t last = last_k > last_q ? last_k : last_q;
  if (last >= p.rotary_rows)
    return fail(FLASHATTN_STATUS_INVALID_SEQLENS,
                "cache_seqlens[%lld]=%lld needs rotary position %lld, past the cos/sin tables' rotary_rows=%lld",
                static_cast<long long>(b), static_cast<long long>(used), static_cast<long long>(last),
                static_cast<long long>(p.rotary_rows));
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace

flashattn_status_t cpu_check_kvcache(const AttnParams& p) {
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t used = p.kv_seqused[b];
    if (used < 0)
      return fail(FLASHATTN_STATUS_INVALID_SEQLENS, "cache_seqlens[%lld]=%lld must be >= 0", static_cast<long long>(b),
                  static_cast<long long>(used));
    if (used + p.kv_seqlen_new > p.seqlen_k)
      return fail(FLASHATTN_STATUS_INVALID_SEQLENS,
                  "cache_seqlens[%lld]=%lld plus seqlen_new=%lld exceeds the cache capacity seqlen_k=%lld",
                  static_cast<long long>(b), static_cast<long long>(used), static_cast<long long>(p.kv_seqlen_new),
                  static_cast<long long>(p.seqlen_k));
    if (p.rotary != 0) FA_TRY(check_rotary_positions(p, b));
  }
  const bool append = p.kv_seqlen_new > 0;
  std::vector<std::pair<int64_t, int64_t>> writes;  // (cache row or page, writer)
  if (append) {
    // At most one entry per block-table entry (or per sequence): the table's extent was checked.
    const size_t n = static_cast<size_t>(p.batch * (p.kv_block_table != nullptr ? p.kv_max_pages : 1));
    try {
      writes.reserve(n);
    } catch (const std::bad_alloc&) {
      return fail_allocation("the list of cache rows and pages a KV-cache run appends to", n * sizeof writes[0]);
    }
  }
  if (p.kv_block_table == nullptr) {
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t row = p.kv_batch_idx != nullptr ? p.kv_batch_idx[b] : b;
      if (row < 0 || row >= p.kv_num_rows)
        return fail(FLASHATTN_STATUS_INVALID_VALUE, "cache_batch_idx[%lld]=%lld is outside [0, num_rows=%lld)",
                    static_cast<long long>(b), static_cast<long long>(row), static_cast<long long>(p.kv_num_rows));
      if (append) writes.emplace_back(row, b);
    }
    const int64_t dup = first_shared(writes);
    if (dup >= 0)
      return fail(FLASHATTN_STATUS_INVALID_VALUE,
                  "cache_batch_idx[%lld] and cache_batch_idx[%lld] are both %lld: appending would write one cache "
                  "row for two sequences",
                  static_cast<long long>(writes[dup - 1].second), static_cast<long long>(writes[dup].second),
                  static_cast<long long>(writes[dup].first));
    return FLASHATTN_STATUS_SUCCESS;
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t used = p.kv_seqused[b], total = used + p.kv_seqlen_new;
    const int64_t n_pages = (total + p.kv_page_size - 1) / p.kv_page_size;
    for (int64_t lp = 0; lp < n_pages; ++lp) {
      const int64_t entry = b * p.kv_max_pages + lp;
      const int64_t page = p.kv_block_table[entry];
      if (page < 0 || page >= p.kv_num_rows)
        return fail(FLASHATTN_STATUS_INVALID_VALUE,
                    "block_table[%lld][%lld]=%lld is outside [0, num_rows=%lld) (pages in the pool)",
                    static_cast<long long>(b), static_cast<long long>(lp), static_cast<long long>(page),
                    static_cast<long long>(p.kv_num_rows));
      if (append && (lp + 1) * p.kv_page_size > used) writes.emplace_back(page, entry);
    }
  }
  const int64_t dup = first_shared(writes);
  if (dup >= 0) {
    const int64_t e0 = writes[dup - 1].second, e1 = writes[dup].second;
    return fail(FLASHATTN_STATUS_INVALID_VALUE,
                "block_table[%lld][%lld] and block_table[%lld][%lld] are both page %lld, and new keys are appended "
                "to both",
                static_cast<long long>(e0 / p.kv_max_pages), static_cast<long long>(e0 % p.kv_max_pages),
                static_cast<long long>(e1 / p.kv_max_pages), static_cast<long long>(e1 % p.kv_max_pages),
                static_cast<long long>(writes[dup].first));
  }
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace flashattn
