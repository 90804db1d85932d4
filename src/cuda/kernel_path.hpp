// The environment variables that force a kernel family for the CUDA forward
// (FLASHATTN_CUDA_FORWARD) and backward (FLASHATTN_CUDA_BACKWARD): tests and benchmarks.
#pragma once

namespace flashattn {

enum class PathVar { kForward, kBackward };
enum class ForcedPath { kAuto, kFa2, kFa3, kInvalid };

// The variable's name.
const char* path_var_name(PathVar var);
// Its value ("" when unset), copied at the first call of the process (no allocation: a
// longer value is cut to the buffer, which keeps it invalid).
const char* forced_path_value(PathVar var);
// Unset or empty: kAuto; "fa2", "fa3": that family; anything else: kInvalid.
ForcedPath forced_path(PathVar var);

}  // namespace flashattn
