// Which kernel family runs a CUDA forward: fp32 (kernels/fp32) for fp32; for fp16/bf16, fa3
// (kernels/fa3, sm_90a) for the problems it serves on a compute capability 9.0 device, fa2
// for everything else, unless the environment variable FLASHATTN_CUDA_FORWARD forces one
// (tests and benchmarks; it does not apply to fp32, which only the fp32 family serves).
#pragma once
#include <cuda_runtime.h>
#include <stddef.h>

#include "backends.hpp"

namespace flashattn {

// The forward pass of the fa2 algorithm (FLASHATTN_ALGORITHM_FLASH) on the family that serves p.
// FLASHATTN_CUDA_FORWARD (read once per process): unset or empty picks automatically; `fa2`
// never runs fa3; `fa3` runs fa3 and fails with NOT_SUPPORTED, naming the reason, for a
// problem or device it does not serve; any other value fails with INVALID_ARGUMENT.
// workspace, workspace_bytes: at least cuda_flash_fwd_workspace_size(p) bytes, passed on to the family.
flashattn_status_t cuda_flash_fwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// Workspace bytes of cuda_flash_fwd(p) whichever family runs it (the choice depends on the
// device and FLASHATTN_CUDA_FORWARD, which the size must not): the larger of fa2's (the
// zero-padded copies of head dims that are not a multiple of 8) and fa3's (its tile counter
// where its tiles differ in length, after the same copies where it runs on them:
// fa3_fwd_workspace_size).
CheckedSize cuda_flash_fwd_workspace_size(const AttnParams& p);

}  // namespace flashattn
