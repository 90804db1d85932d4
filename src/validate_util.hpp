// Checks shared by the validation of the training passes (validate.cpp) and of the
// inference entry points (validate_kvcache.cpp).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"

namespace flashattn {

// True when no two distinct in-range indices of n dims map to the same offset.
bool non_overlapping(int n, const int64_t* extents, const int64_t* strides);
int64_t dtype_size(flashattn_dtype_t d);
// NULL_POINTER naming `name` when ptr is NULL.
flashattn_status_t require(const void* ptr, const char* name);
// WORKSPACE_TOO_SMALL unless workspace holds `needed` bytes (NULL is fine for 0).
flashattn_status_t check_workspace(size_t needed, const void* workspace, size_t workspace_bytes);
// Copies a caller's args struct after checking it and its struct_size (instantiated in
// validate.cpp for each args type).
template <class Args>
flashattn_status_t read_args(const Args* args, Args* out, const char* type_name);

}  // namespace flashattn
