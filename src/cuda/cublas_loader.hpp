// cuBLAS, loaded at first use with dlopen: the library has no link-time dependency on
// libcublas (readelf -d shows no NEEDED libcublas), so a user who never selects the
// standard algorithm never needs cuBLAS installed.
//
// Only the handful of types and functions the standard path uses are declared here,
// with the values of cublas_api.h (CUDA 12/13; these enum values are ABI and stable).
#pragma once
#include <cuda_runtime.h>
#include <library_types.h>
#include <stddef.h>

#include "flashattn.h"

namespace flashattn {
namespace cublas {

struct Context;  // cuBLAS' struct cublasContext
using Handle = Context*;
using Status = int;  // cublasStatus_t
constexpr Status kSuccess = 0;
constexpr int kOpN = 0;           // CUBLAS_OP_N
constexpr int kOpT = 1;           // CUBLAS_OP_T
constexpr int kCompute32F = 68;   // CUBLAS_COMPUTE_32F: fp32 accumulation, no TF32 downgrade
constexpr int kGemmDefault = -1;  // CUBLAS_GEMM_DEFAULT

struct Api {
  Status (*create)(Handle*);                       // cublasCreate_v2
  Status (*destroy)(Handle);                       // cublasDestroy_v2
  Status (*set_stream)(Handle, cudaStream_t);      // cublasSetStream_v2
  Status (*set_workspace)(Handle, void*, size_t);  // cublasSetWorkspace_v2
  Status (*gemm_strided_batched)(Handle, int transa, int transb, int m, int n, int k, const void* alpha, const void* A,
                                 cudaDataType Atype, int lda, long long strideA, const void* B, cudaDataType Btype,
                                 int ldb, long long strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
                                 long long strideC, int batch_count, int compute_type,
                                 int algo);  // cublasGemmStridedBatchedEx
  const char* (*status_string)(Status);      // cublasGetStatusString (optional: may be null)
};

// Loads libcublas once per process (thread-safe). On failure returns
// LIBRARY_UNAVAILABLE with the dlopen/dlsym error in the message.
flashattn_status_t load(const Api** api);

// The calling thread's handle for the current CUDA device, created on first use
// (creation allocates device memory: call this from the check phase, never mid-run).
// Handles live until the thread exits.
flashattn_status_t thread_handle(int device, Handle* handle);

// "CUBLAS_STATUS_...: text" for messages.
const char* status_text(Status s);

}  // namespace cublas
}  // namespace flashattn
