// Which kernel family runs a CUDA backward: fp32 (kernels/fp32) for fp32; for fp16/bf16, fa3
// (kernels/fa3, sm_90a) for the problems it serves on a compute capability 9.0 device, fa2
// (kernels/fa2) for everything else, unless the environment variable
// FLASHATTN_CUDA_BACKWARD forces one (tests and benchmarks; it does not apply to fp32,
// which only the fp32 family serves).
#pragma once
#include <cuda_runtime.h>
#include <stddef.h>

#include "backends.hpp"

namespace flashattn {

// The backward pass of the fa2 algorithm (FLASHATTN_ALGORITHM_FLASH) on the family chosen for p.
// FLASHATTN_CUDA_BACKWARD (read once per process): unset or empty picks automatically; `fa2`
// never runs fa3; `fa3` runs fa3 and fails with NOT_SUPPORTED, naming the reason, for a problem or device it does not
// serve; any other value fails with INVALID_ARGUMENT.
// workspace, workspace_bytes: at least cuda_flash_bwd_workspace_size(p) bytes.
flashattn_status_t cuda_flash_bwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// Workspace bytes of cuda_flash_bwd(p) whichever family runs it: for fp32 family's (its Delta
// vector), else fa2's, whose Delta and dQ accumulator fa3 uses in place (fa2_bwd_scratch).
CheckedSize cuda_flash_bwd_workspace_size(const AttnParams& p);

}  // namespace flashattn
