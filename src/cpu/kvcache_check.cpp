// Checks of the host values a CPU KV-cache run reads: used lengths, cache rows, block
// tables and rotary positions (cpu_check_kvcache, before the workspace is checked), and
// that no cache row or page is appended to by two sequences (check_append_targets, in
// the run, sorting in the workspace). Both run before anything is written, so a bad
// value never leaves a half-appended cache behind.
#include <stdint.h>

#include <algorithm>

#include "backends.hpp"
#include "cpu/cpu_impl.hpp"
#include "cpu/kvcache.hpp"
#include "error.hpp"

namespace flashattn {
namespace {

// A cache row or page and the sequence (or block-table entry) appending to it.
struct Write {
  int64_t target, writer;
  bool operator<(const Write& o) const { return target != o.target ? target < o.target : writer < o.writer; }
};

// Entries of the write list: one per block-table entry, or one per sequence.
int64_t max_writes(const AttnParams& p) { return p.batch * (p.kv_page_size > 0 ? p.kv_max_pages : 1); }

// Sorts the n writes; returns the index of the first one whose target repeats the one
// before it, or -1.
int64_t first_shared(Write* writes, int64_t n) {
  std::sort(writes, writes + n);  // in place: introsort allocates nothing
  for (int64_t i = 1; i < n; ++i)
    if (writes[i].target == writes[i - 1].target) return i;
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
  if (p.kv_block_table == nullptr) {
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t row = p.kv_batch_idx != nullptr ? p.kv_batch_idx[b] : b;
      if (row < 0 || row >= p.kv_num_rows)
        return fail(FLASHATTN_STATUS_INVALID_VALUE, "cache_batch_idx[%lld]=%lld is outside [0, num_rows=%lld)",
                    static_cast<long long>(b), static_cast<long long>(row), static_cast<long long>(p.kv_num_rows));
    }
    return FLASHATTN_STATUS_SUCCESS;
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t n_pages = (p.kv_seqused[b] + p.kv_seqlen_new + p.kv_page_size - 1) / p.kv_page_size;
    for (int64_t lp = 0; lp < n_pages; ++lp) {
      const int64_t page = p.kv_block_table[b * p.kv_max_pages + lp];
      if (page < 0 || page >= p.kv_num_rows)
        return fail(FLASHATTN_STATUS_INVALID_VALUE,
                    "block_table[%lld][%lld]=%lld is outside [0, num_rows=%lld) (pages in the pool)",
                    static_cast<long long>(b), static_cast<long long>(lp), static_cast<long long>(page),
                    static_cast<long long>(p.kv_num_rows));
    }
  }
  return FLASHATTN_STATUS_SUCCESS;
}

namespace cpu {

CheckedSize append_targets_bytes(const AttnParams& p) {
  if (p.kv_seqlen_new == 0) return CheckedSize(0);
  return checked_product(max_writes(p), sizeof(Write)).round_up(kAlign);
}

flashattn_status_t check_append_targets(const AttnParams& p, char* scratch) {
  if (p.kv_seqlen_new == 0) return FLASHATTN_STATUS_SUCCESS;
  Write* writes = reinterpret_cast<Write*>(scratch);
  int64_t n = 0;
  if (p.kv_block_table == nullptr) {
    for (int64_t b = 0; b < p.batch; ++b) writes[n++] = Write{p.kv_batch_idx != nullptr ? p.kv_batch_idx[b] : b, b};
    const int64_t dup = first_shared(writes, n);
    if (dup >= 0)
      return fail(FLASHATTN_STATUS_INVALID_VALUE,
                  "cache_batch_idx[%lld] and cache_batch_idx[%lld] are both %lld: appending would write one cache "
                  "row for two sequences",
                  static_cast<long long>(writes[dup - 1].writer), static_cast<long long>(writes[dup].writer),
                  static_cast<long long>(writes[dup].target));
    return FLASHATTN_STATUS_SUCCESS;
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t used = p.kv_seqused[b];
    const int64_t n_pages = (used + p.kv_seqlen_new + p.kv_page_size - 1) / p.kv_page_size;
    for (int64_t lp = 0; lp < n_pages; ++lp) {
      const int64_t entry = b * p.kv_max_pages + lp;
      if ((lp + 1) * p.kv_page_size > used) writes[n++] = Write{p.kv_block_table[entry], entry};
    }
  }
  const int64_t dup = first_shared(writes, n);
  if (dup >= 0) {
    const int64_t e0 = writes[dup - 1].writer, e1 = writes[dup].writer;
    return fail(FLASHATTN_STATUS_INVALID_VALUE,
                "block_table[%lld][%lld] and block_table[%lld][%lld] are both page %lld, and new keys are appended "
                "to both",
                static_cast<long long>(e0 / p.kv_max_pages), static_cast<long long>(e0 % p.kv_max_pages),
                static_cast<long long>(e1 / p.kv_max_pages), static_cast<long long>(e1 % p.kv_max_pages),
                static_cast<long long>(writes[dup].target));
  }
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace cpu
}  // namespace flashattn
