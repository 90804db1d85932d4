// Host-side entry points of the CUDA kernels, called by src/cuda/cuda_backend.cpp.
//
// Each takes a validated AttnParams whose pointers are device pointers (the layout
// pointer included), never allocates, never synchronizes, launches on `stream`, and
// turns every CUDA error into a status through fail().
#pragma once
#include <cuda_runtime.h>
#include <stddef.h>

#include "backends.hpp"

namespace flashattn {

// ---- generation 1 (kernels/fa2, sm_80+): the FA2-design kernels ----
// Whether fa2 can run p (head dims, dtype, option combination); nothing launched.
flashattn_status_t fa2_check(const AttnParams& p, const cudaDeviceProp& prop);
CheckedSize fa2_fwd_workspace_size(const AttnParams& p);
CheckedSize fa2_bwd_workspace_size(const AttnParams& p);
flashattn_status_t fa2_fwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);
flashattn_status_t fa2_bwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---- standard attention on cuBLAS (src/cuda/standard*.cu): materialized S and P ----
flashattn_status_t standard_check(const AttnParams& p);  // LIBRARY_UNAVAILABLE when cuBLAS cannot be loaded
CheckedSize standard_workspace_size(const AttnParams& p);
flashattn_status_t standard_fwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);
flashattn_status_t standard_bwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---- combine of partial results (kernels/combine): c is validated, pointers on this device ----
flashattn_status_t combine_launch(const CombineParams& c, cudaStream_t stream);
// ---- KV-cache runs (kernels/decode, src/cuda/decode.cu): append, split-KV decode, combine ----
// Splits the library chooses for p on a device with prop (FlashAttention's heuristic).
int64_t decode_splits(const AttnParams& p, const cudaDeviceProp& prop);
CheckedSize decode_workspace_size(const AttnParams& p);
flashattn_status_t decode_check(const AttnParams& p, const cudaDeviceProp& prop);
flashattn_status_t decode_fwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---- shared by both algorithms (src/cuda/varlen_tail.cu) ----
// Varlen: writes the rows of tokens past the last offset (O = 0, LSE = -inf forward; zero
// dQ, dK, dV backward); a no-op launch-free return without varlen.
flashattn_status_t write_varlen_tail(const AttnParams& p, cudaStream_t stream);

}  // namespace flashattn
