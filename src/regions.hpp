// The memory regions of a run (tensors, LSE, bias, slopes, offsets, workspace): their
// byte extents, in checked arithmetic, and the rule that nothing a run writes may share a
// byte with any other region. Only pointers are compared, so the same check serves every
// backend.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "checked_size.hpp"
#include "flashattn.h"

namespace flashattn {

// A strided array of up to kMaxRegionDims dimensions at `base` (a contiguous buffer is one
// dimension of stride 1). Strides are in elements and >= 0.
constexpr int kMaxRegionDims = 5;  // the split partials of flashattn_combine have 5
struct Region {
  const char* name;  // as the caller knows it: "args.dq", "workspace"
  const void* base;  // NULL: not part of this run
  int dims;
  int64_t extents[kMaxRegionDims];
  int64_t strides[kMaxRegionDims];
  int64_t elem_bytes;
  int64_t align;  // required alignment of base, in bytes
  bool written;   // an output of the run, or the workspace
};

// "(a, b, c, d)": n values for a message.
struct DimsText {
  char text[112];
};
DimsText dims_text(int n, const int64_t* values);

// MISALIGNED_POINTER naming the region and its address unless base is a multiple of align.
flashattn_status_t check_alignment(const Region& r);

// INVALID_SHAPE naming the first region whose byte extent overflows.
flashattn_status_t check_extents(const Region* regions, int count);

// Bytes from the first to one past the last element: (max offset + 1) * elem_bytes, or 0
// when some extent is 0. Not ok() when that overflows.
CheckedSize extent_bytes(int dims, const int64_t* extents, const int64_t* strides, int64_t elem_bytes);

// INVALID_ARGUMENT naming both regions when a written region may share a byte with
// another region. Regions that are not written may overlap each other (Q and K may be the
// same buffer). Two regions whose byte ranges interleave are accepted only when they have
// the same strides and element size and provably share no element (dQ, dK, dV packed in
// one dQKV buffer). Every region's extent_bytes must be ok() (check_extents); at most
// kMaxRegions regions.
constexpr int kMaxRegions = 32;
flashattn_status_t check_no_overlap(const Region* regions, int count);

}  // namespace flashattn
