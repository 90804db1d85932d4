#include "regions.hpp"

#include <stdio.h>

#include <algorithm>
#include <utility>

#include "error.hpp"

namespace flashattn {
namespace {

using Wide = __int128;  // offsets and their differences, free of overflow

Wide floor_div(Wide a, Wide b) { return a / b - ((a % b != 0 && a < 0) ? 1 : 0); }  // b > 0
Wide ceil_div(Wide a, Wide b) { return a / b + ((a % b != 0 && a > 0) ? 1 : 0); }   // b > 0

// The set {sum_k j_k * stride_k : lo_k <= j_k <= hi_k}: the differences between element
// offsets of two arrays with the same strides. Dimensions sorted by decreasing stride;
// rest_lo[k] and rest_hi[k] bound the sum over dimensions k.. so that each level tries
// only the few j_k that the remaining dimensions can complete.
struct DifferenceSet {
  static constexpr int kMaxDims = kMaxRegionDims;
  int n = 0;  // <= kMaxDims
  Wide stride[kMaxDims] = {}, lo[kMaxDims] = {}, hi[kMaxDims] = {};
  Wide rest_lo[kMaxDims + 1] = {}, rest_hi[kMaxDims + 1] = {};
  int budget = 256;  // nodes visited before giving up (then: treated as overlapping)

  // 1: delta is in the set (from dimension k on); 0: it is not; -1: budget exhausted.
  int contains(int k, Wide delta) {
    if (--budget < 0) return -1;
    if (k >= n || k >= kMaxDims) return delta == 0 ? 1 : 0;
    const Wide jlo = std::max(lo[k], ceil_div(delta - rest_hi[k + 1], stride[k]));
    const Wide jhi = std::min(hi[k], floor_div(delta - rest_lo[k + 1], stride[k]));
    for (Wide j = jlo; j <= jhi; ++j) {
      const int r = contains(k + 1, delta - j * stride[k]);
      if (r != 0) return r;
    }
    return 0;
  }
};

// Whether a and b, same strides and element size, share an element when b starts
// delta_elems elements after a (delta may be negative).
bool share_element(const Region& a, const Region& b, Wide delta_elems) {
  DifferenceSet set;
  const int dims = std::min(a.dims, DifferenceSet::kMaxDims);
  int order[DifferenceSet::kMaxDims] = {0, 1, 2, 3, 4};
  for (int i = 1; i < dims; ++i)  // insertion sort by decreasing stride
    for (int j = i; j > 0 && a.strides[order[j]] > a.strides[order[j - 1]]; --j) std::swap(order[j], order[j - 1]);
  for (int i = 0; i < dims; ++i) {
    const int k = order[i];
    if (a.strides[k] == 0) continue;  // contributes nothing to any offset
    set.stride[set.n] = a.strides[k];
    set.lo[set.n] = -(b.extents[k] - 1);  // offset of a minus offset of b, in units of the stride
    set.hi[set.n] = a.extents[k] - 1;
    ++set.n;
  }
  set.rest_lo[set.n] = set.rest_hi[set.n] = 0;
  for (int k = set.n - 1; k >= 0; --k) {
    set.rest_lo[k] = set.rest_lo[k + 1] + set.lo[k] * set.stride[k];
    set.rest_hi[k] = set.rest_hi[k + 1] + set.hi[k] * set.stride[k];
  }
  // a's element at offset i equals b's at offset j iff i - j = delta.
  return set.contains(0, delta_elems) != 0;
}

bool same_layout(const Region& a, const Region& b) {
  if (a.dims != b.dims || a.elem_bytes != b.elem_bytes) return false;
  for (int k = 0; k < a.dims; ++k)
    if (a.strides[k] != b.strides[k]) return false;
  return true;
}

// Whether a and b (non-empty, extents ok) may share a byte.
bool may_overlap(const Region& a, const Region& b, int64_t a_bytes, int64_t b_bytes) {
  const uintptr_t pa = reinterpret_cast<uintptr_t>(a.base), pb = reinterpret_cast<uintptr_t>(b.base);
  const bool ranges_meet =
      pb >= pa ? pb - pa < static_cast<uintptr_t>(a_bytes) : pa - pb < static_cast<uintptr_t>(b_bytes);
  if (!ranges_meet) return false;
  const Wide delta_bytes = static_cast<Wide>(pb) - static_cast<Wide>(pa);
  if (!same_layout(a, b) || delta_bytes % a.elem_bytes != 0) return true;
  return share_element(a, b, delta_bytes / a.elem_bytes);
}

}  // namespace

CheckedSize extent_bytes(int dims, const int64_t* extents, const int64_t* strides, int64_t elem_bytes) {
  CheckedSize last = 0;  // offset of the last element
  for (int k = 0; k < dims; ++k) {
    if (extents[k] == 0) return 0;
    last += checked_product(strides[k], extents[k] - 1);
  }
  return (last + CheckedSize(1)) * CheckedSize(elem_bytes);
}

flashattn_status_t check_alignment(const Region& r) {
  if (reinterpret_cast<uintptr_t>(r.base) % static_cast<uintptr_t>(r.align) == 0) return FLASHATTN_STATUS_SUCCESS;
  return fail(FLASHATTN_STATUS_MISALIGNED_POINTER, "%s=%p is not aligned to %lld bytes (%s)", r.name, r.base,
              static_cast<long long>(r.align),
              r.align == r.elem_bytes ? "its element size" : "required by the backend");
}

DimsText dims_text(int n, const int64_t* values) {
  DimsText d;
  int at = snprintf(d.text, sizeof d.text, "(");
  for (int k = 0; k < n; ++k)
    at += snprintf(d.text + at, sizeof d.text - at, "%s%lld", k ? ", " : "", static_cast<long long>(values[k]));
  snprintf(d.text + at, sizeof d.text - at, ")");
  return d;
}

flashattn_status_t check_extents(const Region* regions, int count) {
  for (int i = 0; i < count; ++i) {
    const Region& r = regions[i];
    if (r.base == nullptr || extent_bytes(r.dims, r.extents, r.strides, r.elem_bytes).ok()) continue;
    return fail(FLASHATTN_STATUS_INVALID_SHAPE, "%s of extents %s and %lld-byte elements spans more than 2^63-1 bytes",
                r.name, dims_text(r.dims, r.extents).text, static_cast<long long>(r.elem_bytes));
  }
  return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status_t check_no_overlap(const Region* regions, int count) {
  if (count > kMaxRegions) return fail(FLASHATTN_STATUS_INTERNAL_ERROR, "check_no_overlap: %d regions", count);
  int64_t bytes[kMaxRegions];
  for (int i = 0; i < count; ++i) {
    const Region& r = regions[i];
    bytes[i] = r.base == nullptr ? 0 : extent_bytes(r.dims, r.extents, r.strides, r.elem_bytes).value();
  }
  for (int i = 0; i < count; ++i) {
    for (int j = i + 1; j < count && bytes[i] > 0; ++j) {
      const Region& a = regions[i];
      const Region& b = regions[j];
      if ((!a.written && !b.written) || bytes[j] == 0 || !may_overlap(a, b, bytes[i], bytes[j])) continue;
      const int w = a.written ? i : j, o = a.written ? j : i;  // name the written one first
      return fail(FLASHATTN_STATUS_INVALID_ARGUMENT,
                  "%s=%p (%lld bytes) overlaps %s=%p (%lld bytes): memory a run writes must not be shared with "
                  "any other argument",
                  regions[w].name, regions[w].base, static_cast<long long>(bytes[w]), regions[o].name, regions[o].base,
                  static_cast<long long>(bytes[o]));
    }
  }
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace flashattn
