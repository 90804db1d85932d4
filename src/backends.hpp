// The interface between the API layer (src/api.cpp, src/validate.cpp) and the backends.
//
// The API layer validates everything that does not need the backend (shapes, strides,
// pointers, workspace size, options) and builds an AttnParams; a backend may still
// refuse a valid configuration (e.g. a head dim with no kernel) but must do so before
// writing any output. Backends report failures through fail() (error.hpp).
#pragma once
#include <stddef.h>

#include "checked_size.hpp"
#include "common/params.h"
#include "flashattn.h"

namespace flashattn {

// ---- CPU backend (src/cpu/) ----
// Alignment the CPU backend requires of a workspace pointer: what malloc, operator new
// and NumPy return. Its buffers hold floats; carving them at 64-byte offsets from a
// 64-byte aligned workspace is fastest, but not required.
constexpr size_t kCpuWorkspaceAlignment = 16;
// Threads a CPU plan runs with: FLASHATTN_CPU_THREADS if set to a positive number, else
// the hardware threads (at most 256). Read once per plan, when it is created, so the
// workspace a caller queried and the run that uses it always agree; the process's worker
// pool is grown for them then, so that the plan's runs start no thread. Also checks
// FLASHATTN_CPU_ISA (isa.hpp), which the first call fixes for the process.
flashattn_status_t cpu_prepare_plan(int* threads);
// Scratch bytes for a pass run by `threads` threads; p holds shapes and options
// (pointers may be null). Not ok() when the size overflows.
CheckedSize cpu_workspace_size(const AttnParams& p, int threads);
// Backend-specific checks on host data (varlen offsets); nothing written.
flashattn_status_t cpu_check(const AttnParams& p);
// Run p.direction with p.algorithm on at most `threads` threads. workspace has at least
// cpu_workspace_size(p, threads) bytes.
flashattn_status_t cpu_run(const AttnParams& p, int threads, void* workspace, size_t workspace_bytes);
// KV-cache runs (p.kv_enabled): every host value the run reads (used lengths, cache rows,
// block-table entries, rotary positions) in range, and no cache row or page appended to
// by two sequences; nothing written.
flashattn_status_t cpu_check_kvcache(const AttnParams& p);
// KV-cache splits the library chooses for p (p.kv_num_splits unset): a function of the
// shape only, so results never depend on the machine.
int64_t cpu_kv_splits(const AttnParams& p);
// Merges partial results (flashattn_combine); c is validated.
flashattn_status_t cpu_combine(const CombineParams& c);

// ---- CUDA backend (src/cuda/; stubs in src/cuda_disabled.cpp without CUDA) ----
bool cuda_built();
int cuda_device_count();
// Validates a device ordinal (NO_DEVICE, BACKEND_UNAVAILABLE) with a message.
flashattn_status_t cuda_check_device(int device);
// Copies a host block-sparse layout to device memory owned by the caller (freed with cuda_free).
flashattn_status_t cuda_upload(int device, const void* host, size_t bytes, void** device_copy);
void cuda_free(int device, void* device_ptr);
// Scratch bytes for a pass (any workspace alignment: the layout starts at the first
// 256-byte boundary inside it). Not ok() when the size overflows.
CheckedSize cuda_workspace_size(const AttnParams& p, int device);
// Support checks (head dims, dtypes, pointer memory spaces, alignment) before any launch.
flashattn_status_t cuda_check(const AttnParams& p, int device);
// Enqueues the pass on stream; no allocation, no host synchronization.
flashattn_status_t cuda_run(const AttnParams& p, int device, void* workspace, size_t workspace_bytes,
                            struct CUstream_st* stream);
// Merges partial results (flashattn_combine) on stream: pointer memory spaces checked,
// then one kernel launch; no allocation, no host synchronization.
flashattn_status_t cuda_combine(const CombineParams& c, int device, struct CUstream_st* stream);

}  // namespace flashattn
