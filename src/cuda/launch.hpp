// Host-side entry points of the CUDA kernels, called by src/cuda/cuda_backend.cpp.
//
// Each takes a validated AttnParams whose pointers are device pointers (the layout
// pointer included), never allocates, never synchronizes, launches on `stream`, and
// turns every CUDA error into a status through fail().
#pragma once
#include <cuda_runtime.h>
#include <stddef.h>

#include "backends.hpp"
#include "fa3/fwd.h"

namespace flashattn {

// ---- generation 1 (kernels/fa2, sm_80+): the FA2-design kernels ----
// Whether fa2 can run p (head dims, dtype, option combination); nothing launched.
flashattn_status_t fa2_check(const AttnParams& p, const cudaDeviceProp& prop);
CheckedSize fa2_fwd_workspace_size(const AttnParams& p);
CheckedSize fa2_bwd_workspace_size(const AttnParams& p);
flashattn_status_t fa2_fwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);
flashattn_status_t fa2_bwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---- generation 2 (kernels/fa3, sm_90a): the FA3-design forward ----
// What fa3_fwd launches with: the tensor maps of Q, K and V.
struct Fa3Fwd {
  fa3::FwdMaps maps;
};
// Whether fa3 serves p on the current device (then *run is ready for fa3_fwd); if not, `why`
// (why_size bytes) says why: the device, an option or shape fa3 does not implement, or
// tensors the copy engine cannot address. Nothing launched.
bool fa3_fwd_prepare(const AttnParams& p, Fa3Fwd* run, char* why, size_t why_size);
flashattn_status_t fa3_fwd(const AttnParams& p, const Fa3Fwd& run, cudaStream_t stream);

// ---- standard attention on cuBLAS (src/cuda/standard*.cu): materialized S and P ----
flashattn_status_t standard_check(const AttnParams& p);  // LIBRARY_UNAVAILABLE when cuBLAS cannot be loaded
CheckedSize standard_workspace_size(const AttnParams& p);
flashattn_status_t standard_fwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);
flashattn_status_t standard_bwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---- combine of partial results (kernels/combine): c is validated, pointers on this device ----
flashattn_status_t combine_launch(const CombineParams& c, cudaStream_t stream);
// ---- shared by both algorithms (src/cuda/varlen_tail.cu) ----
// Varlen: writes the rows of tokens past the last offset (O = 0, LSE = -inf forward; zero
// dQ, dK, dV backward); a no-op launch-free return without varlen.
flashattn_status_t write_varlen_tail(const AttnParams& p, cudaStream_t stream);

}  // namespace flashattn
