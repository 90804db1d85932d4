// KV-cache pieces of the CPU backend (kvcache.cpp, combine.cpp): appending new keys and
// values into the cache, rotary embedding, the split-KV partial buffers and the merge of
// partial (O, LSE) results shared by split-KV and flashattn_combine.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "checked_size.hpp"
#include "common/params.h"
#include "flashattn.h"

namespace flashattn {
namespace cpu {

// Rotates the first p.rotary_dim elements of the fp32 row x at position pos with the
// caller's cos/sin tables, then rounds the row to the plan's dtype (the values a caller
// who rotated in that dtype would have passed).
void rotate_row(const AttnParams& p, float* x, int64_t pos);

// Position at which query row i of sequence b is rotated (FlashAttention's rule: i past
// the used length under a band mask, else the used length for every row).
inline int64_t query_rotary_position(const AttnParams& p, int64_t b, int64_t i) {
  return int64_t{p.kv_seqused[b]} + (p.has_band ? i : 0);
}

// Scratch of check_append_targets: a list of the cache rows or pages the run appends to
// (0 without appended keys). Not ok() when the size overflows.
CheckedSize append_targets_bytes(const AttnParams& p);
// INVALID_VALUE naming both writers when one cache row or page would be appended to by
// two sequences; writes only scratch (append_targets_bytes(p) bytes). The ranges were
// checked by cpu_check_kvcache.
flashattn_status_t check_append_targets(const AttnParams& p, char* scratch);

// Writes the (rotated) new keys and the new values at each sequence's used length.
void append_new_rows(const AttnParams& p, int threads);

// Split partials at the start of the shared workspace region of a forward with
// forward_splits(p) > 1 (cpu_impl.hpp): O parts fp32 [splits, batch, heads_q, seqlen_q,
// head_dim_v] and LSE parts fp32 [splits, batch, heads_q, seqlen_q]; with varlen, row i of
// sequence b is its query row i (seqlen_q: the longest sequence's rows).
struct SplitParts {
  float* o;
  float* lse;
};
// Not ok() when the size overflows.
CheckedSize split_parts_bytes(const AttnParams& p);
SplitParts split_parts(const AttnParams& p, char* shared);
// Index of row (split s, b, h, i) in SplitParts::lse (times head_dim_v for SplitParts::o).
inline int64_t split_row(const AttnParams& p, int64_t s, int64_t b, int64_t h, int64_t i) {
  return ((s * p.batch + b) * p.heads_q + h) * p.seqlen_q + i;
}

// Shared workspace region of a KV-cache forward: the split parts (kv_num_splits > 1),
// then the scratch of check_append_targets. Not ok() when the size overflows.
CheckedSize kv_shared_bytes(const AttnParams& p);
// The scratch of check_append_targets inside that region.
char* append_targets_scratch(const AttnParams& p, char* shared);

// Merges n parts of one row: part i has O at o + i * o_step (dim floats) and LSE at
// lse[i * lse_step]. Parts with LSE -inf are skipped; all -inf gives out = 0 and -inf.
// Sums run over i in increasing order. Returns the merged LSE.
float combine_row(int64_t n, const float* o, int64_t o_step, const float* lse, int64_t lse_step, int64_t dim,
                  float* out);

// Merges the split parts into O and LSE.
void combine_split_parts(const AttnParams& p, const SplitParts& parts, int threads);

}  // namespace cpu
}  // namespace flashattn
