// Host-side entry points of the CUDA kernels, called by src/cuda/cuda_backend.cpp.
//
// Each takes a validated AttnParams whose pointers are device pointers (the layout
// pointer included), never allocates, never synchronizes, launches on `stream`, and
// turns every CUDA error into a status through fail().
#pragma once
#include <cuda_runtime.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "backends.hpp"
#include "fa3/bwd.h"
#include "fa3/fwd.h"
#include "fp32/launchers.h"

namespace flashattn {

// The opt-in shared memory per block that the fa2 backward chooses its kernel for, the fp32
// forward and backward their instances for and the decode kernel sizes its ring for, on a
// device that allows `optin` bytes.
// FLASHATTN_CUDA_SMEM_LIMIT (testing knob): a positive decimal byte count below optin
// caps it (e.g. 101376 takes the sm_86/sm_89 paths on an H100); unset or invalid (not a
// whole positive number): no cap. Read at every call, so a process may change it between
// runs.
inline int smem_limit(int optin) {
  const char* env = getenv("FLASHATTN_CUDA_SMEM_LIMIT");
  if (env == nullptr) return optin;
  char* end = nullptr;
  errno = 0;
  const long long v = strtoll(env, &end, 10);
  if (end == env || *end != '\0' || errno != 0 || v <= 0 || v >= optin) return optin;
  return static_cast<int>(v);
}

// *device = the calling thread's device, *limit = smem_limit() of its opt-in shared memory
// per block (src/cuda/smem_limit.cpp); CUDA_ERROR naming `who` when a query fails.
flashattn_status_t device_smem_limit(const char* who, int* device, int* limit);

// ---- the workspace of every CUDA path (src/cuda/workspace.cpp) ----
// *at = the workspace's first 256-byte boundary, where need bytes of buffers begin (null
// for a null workspace when need is 0); WORKSPACE_TOO_SMALL naming the workspace, its
// size, "<who> <need> bytes" and the padding when they do not fit, nothing written.
flashattn_status_t workspace_at_boundary(void* workspace, size_t workspace_bytes, size_t need, const char* who,
                                         char** at);

// ---- generation 1 (kernels/fa2, sm_80+): the FA2-design kernels ----
// Whether fa2 can run p (head dims, dtype, option combination); nothing launched.
flashattn_status_t fa2_check(const AttnParams& p, const cudaDeviceProp& prop);
CheckedSize fa2_fwd_workspace_size(const AttnParams& p);
CheckedSize fa2_bwd_workspace_size(const AttnParams& p);
flashattn_status_t fa2_fwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);
flashattn_status_t fa2_bwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---- shared by the fa2 and fa3 backward (src/cuda/fa2_bwd.cu) ----
// Delta, the fp32 dQ accumulator and (deterministic mode) the turn counters in the caller's
// workspace, at the places of fa2's layout (the workspace is fa2_bwd_workspace_size(p) bytes;
// WORKSPACE_TOO_SMALL, naming both sizes, when it cannot hold them). p: a problem fa2 runs
// without staged copies.
flashattn_status_t fa2_bwd_scratch(const AttnParams& p, void* workspace, size_t workspace_bytes, fa3::BwdScratch* out);
// Enqueues the copies of user's staged tensors (fa2_stage_in) where fa2_bwd puts them, after
// the layout of fa2_bwd_scratch(*kp) (kp: fa2_kernel_shape(user)), and points kp at them.
flashattn_status_t fa2_bwd_stage_in(const AttnParams& user, void* workspace, size_t workspace_bytes, AttnParams* kp,
                                    cudaStream_t stream);
// Enqueues Delta = rowsum(dO * O) and the zeroing of the dQ accumulator and of the turn
// counters (one kernel).
flashattn_status_t bwd_delta(const AttnParams& p, const fa3::BwdScratch& scratch, cudaStream_t stream);
// Enqueues dQ = scale * the accumulator, in p's dtype.
flashattn_status_t bwd_dq_convert(const AttnParams& p, const fa3::BwdScratch& scratch, cudaStream_t stream);

// ---- fa2 head dims not a multiple of 8 (src/cuda/fa2_staging.cu): zero-padded copies ----
// The head dim the fa2 kernels run for a problem's head dim d: d rounded up to a multiple of 8.
constexpr int64_t fa2_kernel_dim(int64_t d) { return (d + 7) / 8 * 8; }
// Whether the tensors of head dim d run on workspace copies (d % 8 != 0).
constexpr bool fa2_staged_dim(int64_t d) { return d % 8 != 0; }
// p with the head dims the kernels run (its pointers and strides unchanged).
AttnParams fa2_kernel_shape(const AttnParams& p);
// Workspace bytes of the pass's staged copies, each 256-byte aligned (0 when none).
CheckedSize fa2_staging_bytes(const AttnParams& p);
// Enqueues the copies of p's staged inputs into `staging` (256-byte aligned,
// fa2_staging_bytes(p) bytes) and points kp (fa2_kernel_shape(p)) at the copies of every
// staged tensor, outputs included.
flashattn_status_t fa2_stage_in(const AttnParams& p, char* staging, AttnParams* kp, cudaStream_t stream);
// Enqueues the copies of the staged outputs of a run of kp back into p's tensors.
flashattn_status_t fa2_stage_out(const AttnParams& p, const AttnParams& kp, cudaStream_t stream);

// ---- generation 2 (kernels/fa3, sm_90a): the FA3-design forward ----
// What fa3_fwd launches with: the tensor maps of Q, K, V and O, and the device's SM count.
struct Fa3Fwd {
  fa3::FwdMaps maps;
  int sms;
};
// Whether fa3 serves p on the current device (then *run is ready for fa3_fwd); if not, `why`
// (why_size bytes) says why: the device, an option or shape fa3 does not implement (ALiBi
// with any batch stride, head dims fa2 stages among them: fa3_fwd_staged runs those), or
// tensors the copy engine cannot address. Nothing launched.
bool fa3_fwd_prepare(const AttnParams& p, Fa3Fwd* run, char* why, size_t why_size);
// The workspace fa3_fwd takes where its query tiles differ in length (under a band mask, or
// where a sequence's last tile leaves a consumer warpgroup without rows): its tile counter, an
// int at the workspace's first 4-byte boundary, kFa3FwdWorkspaceBytes. None elsewhere, and
// none for head dims fa3 does not serve. For head dims that are not a multiple of 8
// (fa3_fwd_staged): fa2's zero-padded copies from the first 256-byte boundary, then that.
constexpr size_t kFa3FwdWorkspaceBytes = sizeof(int) + alignof(int) - 1;
size_t fa3_fwd_workspace_size(const AttnParams& p);
flashattn_status_t fa3_fwd(const AttnParams& p, const Fa3Fwd& run, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream);
// A forward whose head dims are not both multiples of 8, on fa3 over fa2's zero-padded copies
// (fa2_stage_in, fa3_fwd at the rounded dims, fa2_stage_out). False (and `why`) if fa3 does not
// serve the rounded problem or cannot map a tensor that is not staged: then nothing was
// written but workspace copies, and fa2 may run it. True once it ran: *status is the outcome.
bool fa3_fwd_staged(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                    flashattn_status_t* status, char* why, size_t why_size);

// ---- generation 2 (kernels/fa3, sm_90a): the FA3-design backward ----
// What fa3_bwd launches with: the tensor maps of Q, K, V, dO and, where they encode, dK, dV.
struct Fa3Bwd {
  fa3::BwdMaps maps;
};
// Whether fa3 serves the backward p on the current device (then *run is ready for fa3_bwd);
// if not, `why` (why_size bytes) says why: the device, an option or shape the fa3 backward
// does not implement, or tensors the copy engine or its 4-byte gradient stores cannot
// address. Nothing launched.
bool fa3_bwd_prepare(const AttnParams& p, Fa3Bwd* run, char* why, size_t why_size);
// (Deterministic mode: the turn counters zeroed,) Delta, the main kernel and the dQ
// conversion, in fa2's workspace layout (fa2_bwd_scratch).
flashattn_status_t fa3_bwd(const AttnParams& p, const Fa3Bwd& run, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream);
// A backward whose head dims are not both multiples of 8, on fa3 over fa2's zero-padded copies
// (fa2_bwd_stage_in, fa3_bwd at the rounded dims, fa2_stage_out). False (and `why`) if fa3
// does not serve the rounded problem or cannot map a tensor that is not staged: then nothing
// was written but workspace copies, and fa2 may run it. True once it ran: *status is the
// outcome.
bool fa3_bwd_staged(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                    flashattn_status_t* status, char* why, size_t why_size);

// ---- fp32 flash attention (kernels/fp32, sm_80+): FA2 with 3xTF32 tensor-core products ----
// Whether the fp32 family serves p's flash passes (fp32 tensors; fa2 and fa3 take fp16/bf16).
inline bool fp32_serves(const AttnParams& p) { return p.dtype == kFp32; }
// The index in fp32::kBuckets of the head-dim bucket both of p's head dims run padded to
// (-1 for head dims beyond the last).
inline int fp32_bucket(const AttnParams& p) {
  const int64_t d = p.head_dim_qk > p.head_dim_v ? p.head_dim_qk : p.head_dim_v;
  for (int i = 0; i < fp32::kNumBuckets; ++i)
    if (d <= fp32::kBuckets[i].d) return i;
  return -1;
}
// Whether the fp32 kernels can run p on a device with prop (sizes, alignment, shared memory); nothing launched.
flashattn_status_t fp32_check(const AttnParams& p, const cudaDeviceProp& prop);
CheckedSize fp32_bwd_workspace_size(const AttnParams& p);  // the forward takes none
flashattn_status_t fp32_fwd(const AttnParams& p, cudaStream_t stream);
flashattn_status_t fp32_bwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---- standard attention on cuBLAS (src/cuda/standard*.cu): materialized S and P ----
flashattn_status_t standard_check(const AttnParams& p);  // LIBRARY_UNAVAILABLE when cuBLAS cannot be loaded
CheckedSize standard_workspace_size(const AttnParams& p);
flashattn_status_t standard_fwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);
flashattn_status_t standard_bwd(const AttnParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---- combine of partial results (kernels/combine): c is validated, pointers on this device ----
flashattn_status_t combine_launch(const CombineParams& c, cudaStream_t stream, bool after_decode);
// ---- KV-cache runs (kernels/decode, src/cuda/decode.cu): append, split-KV decode, combine ----
// p.kv_num_splits is the caller's count, or 0: each run chooses it for the kernel it takes
// (after the tensor-map encode), within the bound the workspace size and checks use.
CheckedSize decode_workspace_size(const AttnParams& p, const cudaDeviceProp& prop);
flashattn_status_t decode_check(const AttnParams& p, const cudaDeviceProp& prop);
flashattn_status_t decode_fwd(const AttnParams& p, const cudaDeviceProp& prop, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream);

// ---- shared by both algorithms (src/cuda/varlen_tail.cu) ----
// Varlen: writes the rows of tokens past the last offset (O = 0, LSE = -inf forward; zero
// dQ, dK, dV backward); a no-op launch-free return without varlen.
flashattn_status_t write_varlen_tail(const AttnParams& p, cudaStream_t stream);

}  // namespace flashattn
