/**
 * @file flashattn.h
 * @brief libflashattn: exact, IO-aware attention (FlashAttention) behind a stable C ABI.
 *
 * The whole public API. C99, self-contained (includes only <stddef.h> and <stdint.h>),
 * usable from C, C++, and any language with a C FFI.
 *
 * Workflow: create a plan (::flashattn_plan_create), describe the problem with the
 * setters (shape first, then any options), ask for the workspace size of a pass
 * (::flashattn_plan_get_workspace_size), then run ::flashattn_fwd / ::flashattn_bwd as
 * many times as needed, from any number of threads and streams.
 *
 * Conventions that hold for every function:
 * - Every function that can fail returns a ::flashattn_status_t; on failure a
 *   thread-local message naming the argument and its value is available from
 *   ::flashattn_last_error, and no output (out-parameter, tensor, plan state) has been
 *   modified. Each function documents the statuses it returns under `@return`; any of
 *   them may also return INTERNAL_ERROR, which only a library bug produces.
 * - The library never prints, aborts or exits, and no C++ exception crosses the API.
 * - Tensor strides are in elements, never bytes.
 * - "Host" pointers point to CPU memory; "device" pointers point to memory of the
 *   plan's CUDA device. For the CPU backend every pointer is a host pointer.
 *
 * Threading: a plan whose configuration is complete may be run (fwd/bwd, workspace
 * queries) by many threads and on many streams at once. Setters must not race with
 * each other or with runs of the same plan. Distinct plans are independent.
 *
 * Environment variables (read with secure_getenv, so a setuid process ignores them):
 * - `FLASHATTN_CPU_THREADS`: threads of a CPU plan (a positive number; otherwise the
 *   hardware threads, at most 256). Read once per plan, by ::flashattn_plan_create: the
 *   plan's workspace sizes and runs use that value, whatever the variable says later.
 * - `FLASHATTN_CPU_ISA`: the instruction set of the CPU kernels, `baseline`, `avx2`,
 *   `avx512` or `amx` (avx512 with the bf16 forward's and backward's products on AMX-BF16
 *   tiles; needs Linux's tile data permission) (unset: the best the CPU supports). For
 *   tests of every path; fixed for the process by its first CPU ::flashattn_plan_create,
 *   which refuses a name that is no set (INVALID_VALUE) or a set this CPU or build lacks
 *   (NOT_SUPPORTED).
 *   On a CPU with AMX-BF16 that choice (and `flashattn info`) asks Linux for the
 *   permission (arch_prctl ARCH_REQ_XCOMP_PERM), unless the variable names another set:
 *   granted for the whole process and not revocable, it makes signal frames larger, so a
 *   process that installs small alternate signal stacks (sigaltstack) should set the
 *   variable to `avx512`.
 * - `FLASHATTN_CUBLAS_PATH`: the absolute path of the cuBLAS library the CUDA STANDARD
 *   algorithm loads (read once per process, at its first use). A relative path is
 *   refused with LIBRARY_UNAVAILABLE. Unset, cuBLAS is searched for as the documentation
 *   (docs/concepts.md, "Environment variables") describes: the nvidia-cublas Python wheel
 *   beside libflashattn, then the system loader, then the CUDA toolkit.
 */
#ifndef FLASHATTN_H
#define FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

/**
 * @defgroup version Version and errors
 * @brief Library version, status codes and error messages.
 * @{
 */

/** Major version; the SONAME is libflashattn.so.MAJOR. */
#define FLASHATTN_VERSION_MAJOR 0
/** Minor version: grows when functions or struct fields are added. */
#define FLASHATTN_VERSION_MINOR 1
/** Patch version: fixes with no API change. */
#define FLASHATTN_VERSION_PATCH 0
/** The version as one number, MAJOR*10000 + MINOR*100 + PATCH. */
#define FLASHATTN_VERSION_NUMBER \
  (FLASHATTN_VERSION_MAJOR * 10000 + FLASHATTN_VERSION_MINOR * 100 + FLASHATTN_VERSION_PATCH)

/** Marks a symbol exported from libflashattn.so (everything else is hidden). */
#if defined(_WIN32)
#define FLASHATTN_API
#elif defined(__GNUC__) || defined(__clang__)
#define FLASHATTN_API __attribute__((visibility("default")))
#else
#define FLASHATTN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @brief Result of every fallible call. Values are grouped in bands and never renumbered:
 * 0 success; 1xx invalid argument; 2xx not supported; 3xx resources; 4xx device/CUDA;
 * 9xx internal.
 */
typedef enum flashattn_status_t {
  FLASHATTN_STATUS_SUCCESS = 0,                /**< The call succeeded. */
  FLASHATTN_STATUS_INVALID_ARGUMENT = 100,     /**< An argument is invalid (generic), or memory a run writes overlaps another argument. */
  FLASHATTN_STATUS_NULL_POINTER = 101,         /**< A required pointer is NULL. */
  FLASHATTN_STATUS_INVALID_SHAPE = 102,        /**< A dimension is zero, negative or too large, or a size derived from the shape exceeds 2^63-1 bytes. */
  FLASHATTN_STATUS_INVALID_HEADS = 103,        /**< heads_q is not a multiple of heads_kv. */
  FLASHATTN_STATUS_INVALID_STRIDE = 104,       /**< A stride is negative, not last-dim contiguous, or makes an output alias itself. */
  FLASHATTN_STATUS_INVALID_ENUM = 105,         /**< An enum argument has an unknown value. */
  FLASHATTN_STATUS_INVALID_VALUE = 106,        /**< A scalar (scale, softcap, dropout p, window) is out of range. */
  FLASHATTN_STATUS_INVALID_LAYOUT = 107,       /**< A block-sparse layout has the wrong size or block sizes. */
  FLASHATTN_STATUS_INVALID_STRUCT_SIZE = 108,  /**< An args struct's struct_size is too small. */
  FLASHATTN_STATUS_WORKSPACE_TOO_SMALL = 109,  /**< The workspace is NULL or smaller than the queried size. */
  FLASHATTN_STATUS_PLAN_INCOMPLETE = 110,      /**< The plan has no shape yet. */
  FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS = 111, /**< Options that cannot be combined (e.g. bias tensor and ALiBi). */
  FLASHATTN_STATUS_INVALID_SEQLENS = 112,      /**< cu_seqlens are not monotonic, exceed totals or max lengths. */
  FLASHATTN_STATUS_MISALIGNED_POINTER = 113,   /**< A tensor pointer is not aligned to its element size (CUDA FLASH fp16/bf16: 16 bytes, see ::flashattn_plan_set_strides), or a CPU workspace to 16 bytes. */
  FLASHATTN_STATUS_NOT_SUPPORTED = 200,        /**< The configuration is valid but not supported by this backend. */
  FLASHATTN_STATUS_BACKEND_UNAVAILABLE = 201,  /**< The backend was not built in or has no device. */
  FLASHATTN_STATUS_HEAD_DIM_NOT_SUPPORTED = 202, /**< A head dimension has no kernel on this backend. */
  FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED = 203,  /**< The dtype has no kernel on this backend. */
  FLASHATTN_STATUS_LIBRARY_UNAVAILABLE = 204,  /**< A runtime-loaded library (cuBLAS) could not be loaded. */
  FLASHATTN_STATUS_OUT_OF_MEMORY = 300,        /**< A host allocation failed; the message names the buffer and its size in bytes. */
  FLASHATTN_STATUS_CUDA_ERROR = 400,           /**< A CUDA runtime call failed; the message holds the CUDA error. */
  FLASHATTN_STATUS_NO_DEVICE = 401,            /**< No CUDA device, driver, or the device index is out of range. */
  FLASHATTN_STATUS_LAUNCH_FAILED = 402,        /**< A kernel launch failed. */
  FLASHATTN_STATUS_WRONG_MEMORY_SPACE = 403,   /**< A pointer lives in the wrong memory (host vs device) for the backend. */
  FLASHATTN_STATUS_INTERNAL_ERROR = 900,       /**< A bug in the library; please report the message. */
  FLASHATTN_STATUS_MAX_ENUM = 0x7FFFFFFF       /**< Not a status: keeps the enum 32-bit with every int value valid. */
} flashattn_status_t;

/**
 * @brief Runtime version of the loaded library.
 * @param[out] major Receives FLASHATTN_VERSION_MAJOR of the library (may be NULL).
 * @param[out] minor Receives the minor version (may be NULL).
 * @param[out] patch Receives the patch version (may be NULL).
 * @return The version as MAJOR*10000 + MINOR*100 + PATCH. Never fails. Thread-safe.
 */
FLASHATTN_API int flashattn_get_version(int* major, int* minor, int* patch);

/**
 * @brief Name of a status code, e.g. "FLASHATTN_STATUS_INVALID_SHAPE".
 * @param status Any value; unknown values give "FLASHATTN_STATUS_UNKNOWN".
 * @return A static NUL-terminated string; never NULL. Thread-safe.
 */
FLASHATTN_API const char* flashattn_status_string(flashattn_status_t status);

/**
 * @brief Message describing the last failure on the calling thread.
 *
 * Names the argument and its value, e.g. "head_dim_qk=300 exceeds the supported
 * maximum 256". The rule: every function that returns a ::flashattn_status_t clears the
 * calling thread's message when it starts and sets it when it fails. The functions that
 * cannot fail (::flashattn_get_version, ::flashattn_status_string, ::flashattn_last_error,
 * ::flashattn_plan_destroy, ::flashattn_cuda_device_count, ::flashattn_has_cuda_backend)
 * never touch it, so they may be called between a failed call and reading its message.
 * The returned pointer stays valid for the life of the thread; its text is that of the
 * last status-returning call on this thread until the next one.
 * @return A NUL-terminated string owned by the library; "" if the last status-returning
 *         call on this thread succeeded (or there was none).
 */
FLASHATTN_API const char* flashattn_last_error(void);

/** @} */

/**
 * @defgroup plans Plans
 * @brief Creating plans and describing shapes, dtypes and layouts.
 * @{
 */

/** CUDA stream; identical to cudaStream_t, so CUDA users pass their stream, others NULL. */
struct CUstream_st;

/** Opaque plan: a full description of one attention problem. */
typedef struct flashattn_plan_s* flashattn_plan_t;

/** Where a plan runs. int32_t-compatible enum. */
typedef enum flashattn_backend_t {
  FLASHATTN_BACKEND_AUTO = 0, /**< CUDA if a device is present and the build has CUDA, else CPU. */
  FLASHATTN_BACKEND_CPU = 1,  /**< Multithreaded CPU implementation of every option. */
  FLASHATTN_BACKEND_CUDA = 2, /**< CUDA kernels on the given device (sm_80 or later). */
  FLASHATTN_BACKEND_MAX_ENUM = 0x7FFFFFFF /**< Not a value: keeps the enum 32-bit with every int value valid. */
} flashattn_backend_t;

/** Element type of Q, K, V, O, dO, dQ, dK, dV and the bias tensor. Accumulation is always fp32. */
typedef enum flashattn_dtype_t {
  FLASHATTN_DTYPE_FP16 = 0, /**< IEEE binary16. */
  FLASHATTN_DTYPE_BF16 = 1, /**< bfloat16. */
  FLASHATTN_DTYPE_FP32 = 2, /**< IEEE binary32. CUDA FLASH: 3xTF32 tensor-core products (each operand split into two TF32 terms), fp32 softmax. */
  FLASHATTN_DTYPE_MAX_ENUM = 0x7FFFFFFF /**< Not a value: keeps the enum 32-bit with every int value valid. */
} flashattn_dtype_t;

/** Identifies a tensor whose strides are set with ::flashattn_plan_set_strides. */
typedef enum flashattn_tensor_t {
  FLASHATTN_TENSOR_Q = 0,  /**< Query, [batch, seqlen_q, heads_q, head_dim_qk]. */
  FLASHATTN_TENSOR_K = 1,  /**< Key, [batch, seqlen_k, heads_kv, head_dim_qk]. */
  FLASHATTN_TENSOR_V = 2,  /**< Value, [batch, seqlen_k, heads_kv, head_dim_v]. */
  FLASHATTN_TENSOR_O = 3,  /**< Output, [batch, seqlen_q, heads_q, head_dim_v]. */
  FLASHATTN_TENSOR_DO = 4, /**< Output gradient, like O. */
  FLASHATTN_TENSOR_DQ = 5, /**< Query gradient, like Q. */
  FLASHATTN_TENSOR_DK = 6, /**< Key gradient, like K. */
  FLASHATTN_TENSOR_DV = 7, /**< Value gradient, like V. */
  FLASHATTN_TENSOR_MAX_ENUM = 0x7FFFFFFF /**< Not a value: keeps the enum 32-bit with every int value valid. */
} flashattn_tensor_t;

/** Which algorithm a plan runs. */
typedef enum flashattn_algorithm_t {
  FLASHATTN_ALGORITHM_FLASH = 0,   /**< Default: tiled FlashAttention, O(N) extra memory. */
  FLASHATTN_ALGORITHM_STANDARD = 1, /**< Standard attention materializing S and P (O(N^2) workspace):
                                         the baseline and GPU reference. CUDA: cuBLAS, loaded at first use. */
  FLASHATTN_ALGORITHM_MAX_ENUM = 0x7FFFFFFF /**< Not a value: keeps the enum 32-bit with every int value valid. */
} flashattn_algorithm_t;

/**
 * @brief Create a plan with default options (no mask, no bias, no dropout, dense,
 * fp16, contiguous BSHD strides, scale 1/sqrt(head_dim_qk), flash algorithm).
 * @param[out] plan Receives the new plan (host pointer, not NULL). Untouched on failure.
 * @param backend Backend to run on; AUTO resolves now (CUDA if usable, else CPU).
 * @param device CUDA device ordinal (>= 0); ignored (but must be >= 0) for the CPU backend.
 *
 * Reads `FLASHATTN_CPU_THREADS` and `FLASHATTN_CPU_ISA` (see the file's notes on
 * environment variables): the thread count of a CPU plan is fixed here, and the CPU
 * library's worker pool grown to it.
 * @return SUCCESS; NULL_POINTER; INVALID_ENUM; INVALID_VALUE (device < 0, or
 *         FLASHATTN_CPU_ISA naming no instruction set);
 *         BACKEND_UNAVAILABLE (CUDA requested but not built in or no driver);
 *         NO_DEVICE (device ordinal out of range); NOT_SUPPORTED (FLASHATTN_CPU_ISA naming
 *         a set this CPU lacks); OUT_OF_MEMORY.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_create(flashattn_plan_t* plan, flashattn_backend_t backend,
                                                       int device);

/**
 * @brief Destroy a plan and free everything it owns. NULL is a no-op.
 * @param plan Plan from ::flashattn_plan_create, or NULL. Must not be in use by a run.
 */
FLASHATTN_API void flashattn_plan_destroy(flashattn_plan_t plan);

/**
 * @brief The backend a plan resolved to (never AUTO).
 * @param plan The plan.
 * @param[out] backend Receives CPU or CUDA.
 * @return SUCCESS; NULL_POINTER.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_get_backend(flashattn_plan_t plan, flashattn_backend_t* backend);

/** Largest supported head_dim_qk and head_dim_v. */
#define FLASHATTN_MAX_HEAD_DIM 256

/**
 * @brief Set the problem shape (required before any run). Resets strides to contiguous BSHD.
 *
 * In variable-length mode (::flashattn_plan_set_varlen) seqlen_q and seqlen_k are the
 * maximum sequence lengths (max_seqlen_q/k) and batch is the number of sequences.
 * @param plan The plan.
 * @param batch Number of sequences, >= 1.
 * @param seqlen_q Query length, >= 1.
 * @param seqlen_k Key/value length, >= 1.
 * @param heads_q Query heads, >= 1.
 * @param heads_kv Key/value heads, >= 1, dividing heads_q (MHA, GQA, MQA).
 * @param head_dim_qk Head dimension of Q and K, 1..FLASHATTN_MAX_HEAD_DIM.
 * @param head_dim_v Head dimension of V and O, 1..FLASHATTN_MAX_HEAD_DIM.
 * @return SUCCESS; NULL_POINTER; INVALID_SHAPE (also when Q, K, V, O or a bias tensor of
 *         the shape would exceed 2^63-1 bytes in fp32); INVALID_HEADS; INVALID_LAYOUT (a
 *         block-sparse layout already set does not fit the new shape); INVALID_STRIDE
 *         (bias tensor strides or an ALiBi batch stride already set overflow 64-bit offsets
 *         under the new shape).
 */
FLASHATTN_API flashattn_status_t flashattn_plan_set_shape(flashattn_plan_t plan, int64_t batch, int64_t seqlen_q,
                                                          int64_t seqlen_k, int64_t heads_q, int64_t heads_kv,
                                                          int64_t head_dim_qk, int64_t head_dim_v);

/**
 * @brief Set the element type of all tensors (default FP16).
 *
 * Every backend and algorithm serves all three (the CUDA FLASH algorithm runs fp16/bf16 on
 * tensor cores, fp32 on its fp32 kernels with O(N) memory; KV-cache runs on CUDA take
 * fp16/bf16 only).
 * @param plan The plan.
 * @param dtype FP16, BF16 or FP32.
 * @return SUCCESS; NULL_POINTER; INVALID_ENUM.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_set_dtype(flashattn_plan_t plan, flashattn_dtype_t dtype);

/**
 * @brief Set one tensor's strides, in elements, in the order (batch, seq, head, dim).
 *
 * Default: contiguous BSHD. BHSD and others are just other strides. The dim stride must
 * be 1; the others must be >= 0, and for outputs (O, dQ, dK, dV) no two distinct
 * elements may share an address. In varlen mode the batch stride is ignored and the
 * seq stride steps through packed tokens. Checked against the shape at each run, in
 * bytes of the plan's dtype: the tensor's extent must not exceed 2^63-1 bytes.
 *
 * CUDA, FLASH algorithm, fp16/bf16 (fp32 needs only element alignment): a tensor whose
 * head dim is a multiple of 8 is read and written by 16-byte vector accesses, so its
 * pointer must be 16-byte aligned and its batch, seq and head strides multiples of 8
 * elements (else the run returns MISALIGNED_POINTER). A tensor
 * whose head dim is not a multiple of 8 is copied through the workspace (zero-padded to
 * the next multiple of 8; the workspace size includes the copies) and needs only element
 * alignment.
 * @param plan The plan (shape must be set).
 * @param tensor Which tensor.
 * @param strides Host array of 4 strides.
 * @return SUCCESS; NULL_POINTER; PLAN_INCOMPLETE; INVALID_ENUM; INVALID_STRIDE;
 *         INVALID_SHAPE (varlen: the packed tensor itself exceeds 2^63-1 bytes).
 */
FLASHATTN_API flashattn_status_t flashattn_plan_set_strides(flashattn_plan_t plan, flashattn_tensor_t tensor,
                                                            const int64_t strides[4]);

/**
 * @brief Set the softmax scale applied to Q.K (default 1/sqrt(head_dim_qk)).
 * @param plan The plan.
 * @param scale Finite and > 0; 0 restores the default.
 * @return SUCCESS; NULL_POINTER; INVALID_VALUE.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_set_softmax_scale(flashattn_plan_t plan, float scale);

/**
 * @brief Select the algorithm (default FLASH).
 * @param plan The plan.
 * @param algorithm FLASH or STANDARD.
 * @return SUCCESS; NULL_POINTER; INVALID_ENUM.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_set_algorithm(flashattn_plan_t plan,
                                                              flashattn_algorithm_t algorithm);

/**
 * @brief Enable packed variable-length sequences, or disable them (enabled = 0).
 *
 * Q/O/dO/dQ are [total_q, heads_q, dim] and K/V/dK/dV are [total_k, heads_kv, dim]
 * (batch stride ignored). Sequence b spans tokens cu_seqlens_q[b] .. cu_seqlens_q[b+1]
 * (int32, batch+1 entries, passed in the run's args). LSE becomes [heads_q, total_q].
 * Positions i, j in masks, bias, ALiBi, block-sparse layouts and dropout are within the
 * sequence. Sequences may be empty. The plan's seqlen_q/k are the maximum lengths. The
 * offsets may end before total_q/total_k: tokens past the last offset get O = 0,
 * LSE = -inf and zero dQ, dK, dV.
 * @param plan The plan.
 * @param enabled Nonzero enables.
 * @param total_q Total query tokens (>= 0 when enabled).
 * @param total_k Total key tokens (>= 0 when enabled).
 * @return SUCCESS; NULL_POINTER; INVALID_SHAPE.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_set_varlen(flashattn_plan_t plan, int enabled, int64_t total_q,
                                                           int64_t total_k);

/**
 * @brief Request bitwise run-to-run reproducible gradients (default off).
 *
 * The CPU backend is always deterministic; on CUDA this replaces dQ atomics by an
 * ordered accumulation (slower, and the workspace may grow).
 * @param plan The plan.
 * @param enabled Nonzero enables.
 * @return SUCCESS; NULL_POINTER.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_set_deterministic(flashattn_plan_t plan, int enabled);

/**
 * @brief Make the backward add its gradients to dQ, dK and dV instead of overwriting them (default off).
 *
 * With accumulation on, ::flashattn_bwd reads each element of dQ, dK and dV and writes
 * dX = round(float(dX) + g): g is the fp32 value the run would otherwise round and store
 * (for dQ and dK already multiplied by the softmax scale), the sum is one fp32 addition,
 * and round() converts it to the plan's dtype once, to nearest even (for fp32 it is the
 * identity; the CUDA STANDARD algorithm leaves the order of scaling and addition to
 * cuBLAS, alpha * g' + dX in fp32; the CUDA FLASH algorithm's non-deterministic fp32 dQ
 * sums its partial products into dQ itself with atomics, so there dX joins that unordered
 * sum). Each accumulating run thus rounds the sum once to the
 * dtype, as a run without accumulation rounds its gradient once; a sum of several runs
 * into fp16/bf16 tensors carries one such rounding per run. Every element is read and
 * written, also where the run adds nothing (masked rows and keys, empty sequences);
 * varlen tokens past the last offset keep their values. Deterministic runs stay bitwise
 * reproducible. dBias cannot be accumulated: a run with accumulation and args.dbias fails
 * with INCOMPATIBLE_OPTIONS. The forward ignores the setting.
 *
 * Use it to sum gradients over calls without a temporary, e.g. over the key blocks of a
 * sequence split across devices (ring attention) or over micro-batches.
 * @param plan The plan.
 * @param enabled Nonzero enables.
 * @return SUCCESS; NULL_POINTER.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_set_grad_accumulate(flashattn_plan_t plan, int enabled);

/** @} */

/**
 * @defgroup masks Masks and bias
 * @brief Band (causal, sliding-window) masks, softcap, bias tensors and ALiBi.
 * @{
 */

/** How query row i lines up with key column j in masks and ALiBi. */
typedef enum flashattn_mask_align_t {
  FLASHATTN_ALIGN_TOP_LEFT = 0,    /**< i' = i. */
  FLASHATTN_ALIGN_BOTTOM_RIGHT = 1, /**< i' = i + seqlen_k - seqlen_q (per sequence in varlen mode). */
  FLASHATTN_ALIGN_MAX_ENUM = 0x7FFFFFFF /**< Not a value: keeps the enum 32-bit with every int value valid. */
} flashattn_mask_align_t;

/** A window value meaning "no bound on this side". Any negative value means the same. */
#define FLASHATTN_WINDOW_UNBOUNDED (-1)

/**
 * @brief Set the band mask: keep (i, j) iff i' - window_left <= j <= i' + window_right.
 *
 * Causal is (window_left = UNBOUNDED, window_right = 0); sliding window has both bounded;
 * both negative disables the mask (the default). The alignment also sets i' for ALiBi.
 * @param plan The plan.
 * @param align TOP_LEFT or BOTTOM_RIGHT.
 * @param window_left Keys allowed before the diagonal; negative = unbounded.
 * @param window_right Keys allowed after the diagonal; negative = unbounded.
 * @return SUCCESS; NULL_POINTER; INVALID_ENUM.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_set_band_mask(flashattn_plan_t plan, flashattn_mask_align_t align,
                                                              int64_t window_left, int64_t window_right);

/**
 * @brief Set the softcap: s = softcap * tanh(s / softcap), applied to scale*q.k before the bias.
 * @param plan The plan.
 * @param softcap 0 disables (default); otherwise finite and > 0.
 * @return SUCCESS; NULL_POINTER; INVALID_VALUE.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_set_softcap(flashattn_plan_t plan, float softcap);

/** Additive score bias kinds. */
typedef enum flashattn_bias_t {
  FLASHATTN_BIAS_NONE = 0,            /**< No bias (default). */
  FLASHATTN_BIAS_TENSOR = 1,          /**< bias[b, h, i, j] from args.bias, in the plan's dtype, strided. */
  FLASHATTN_BIAS_ALIBI = 2,           /**< slope[b, h] * (j - i'), slopes fp32 from args.alibi_slopes: [heads_q]
                                           shared by every sequence, or [batch, heads_q] (see
                                           ::flashattn_plan_set_alibi_batch_stride). */
  FLASHATTN_BIAS_ALIBI_SYMMETRIC = 3, /**< -slope[b, h] * |i' - j|, slopes as for ALIBI. */
  FLASHATTN_BIAS_MAX_ENUM = 0x7FFFFFFF /**< Not a value: keeps the enum 32-bit with every int value valid. */
} flashattn_bias_t;

/**
 * @brief Set the additive bias added to the (softcapped) scores.
 *
 * For TENSOR, strides (in elements) are (batch, head, q, k) over the logical shape
 * [batch, heads_q, seqlen_q, seqlen_k]; a stride of 0 broadcasts that dimension. In the
 * backward pass args.dbias (optional) receives dBias with the same strides: along a
 * broadcast dimension it holds the sum of the gradient. The k stride must be 0 or 1.
 * For NONE and the ALiBi kinds, strides must be NULL. Resets the ALiBi batch stride to 0.
 * @param plan The plan.
 * @param kind Bias kind.
 * @param strides Host array of 4 strides for TENSOR, else NULL.
 * @return SUCCESS; NULL_POINTER (TENSOR without strides); INVALID_ENUM; INVALID_STRIDE;
 *         INVALID_ARGUMENT (strides given for a kind that takes none).
 */
FLASHATTN_API flashattn_status_t flashattn_plan_set_bias(flashattn_plan_t plan, flashattn_bias_t kind,
                                                         const int64_t strides[4]);

/**
 * @brief Give ALiBi one slope per (sequence, head) instead of one per head.
 *
 * With batch_stride 0 (the default) args.alibi_slopes is fp32 [heads_q] and every sequence
 * b uses slope[b, h] = alibi_slopes[h]. With batch_stride >= 1 it is fp32 [batch, heads_q],
 * rows batch_stride elements apart and heads contiguous: slope[b, h] =
 * alibi_slopes[b * batch_stride + h] (FlashAttention's (batch, nheads) slopes). b is the
 * sequence (in varlen and KV-cache runs too). Rows may overlap: slopes are only read.
 * Call it after ::flashattn_plan_set_bias with an ALiBi kind; set_bias resets it to 0.
 * @param plan The plan.
 * @param batch_stride Elements between the slopes of consecutive sequences, >= 0.
 * @return SUCCESS; NULL_POINTER; INVALID_STRIDE (negative, or the slopes of the plan's
 *         shape would span more than 2^63-1 bytes); INCOMPATIBLE_OPTIONS (the plan's bias
 *         kind is not ALIBI or ALIBI_SYMMETRIC).
 */
FLASHATTN_API flashattn_status_t flashattn_plan_set_alibi_batch_stride(flashattn_plan_t plan, int64_t batch_stride);

/** @} */

/**
 * @defgroup dropout Dropout
 * @brief Reproducible dropout on the attention probabilities.
 * @{
 */

/**
 * @brief Set dropout on the normalized probabilities: keep with probability 1 - t/65536,
 * t = min(floor(p * 65536 + 1/2), 65535) (within 2^-17 of 1-p), and scale kept values by
 * 65536 / (65536 - t), the reciprocal of that probability, so expectations are unchanged.
 *
 * The keep decision for (b, h, i, j) (b the sequence, h the query head, i and j
 * positions within the sequence) is a pure function of (seed, offset, b, h, i, j),
 * identical on every backend and in forward and backward:
 * Philox4x32-10 with key (lo32(seed), hi32(seed)) and counter
 * (j / 8, i, lo32(offset + b*heads_q + h), hi32(offset + b*heads_q + h)) yields four
 * 32-bit words w0..w3, eight 16-bit values; r = (w[(j % 8) / 2] >> (16 * (j % 2))) & 0xFFFF,
 * and (b, h, i, j) is kept iff r >= t.
 * To draw an independent mask for another call, advance offset by batch*heads_q.
 * @param plan The plan.
 * @param p Drop probability in [0, 1); 0 disables.
 * @param seed Philox key.
 * @param offset Philox counter offset.
 * @return SUCCESS; NULL_POINTER; INVALID_VALUE.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_set_dropout(flashattn_plan_t plan, float p, uint64_t seed,
                                                            uint64_t offset);

/** @} */

/**
 * @defgroup sparse Block-sparse layouts
 * @brief Skipping whole blocks of the attention matrix.
 * @{
 */

/**
 * @brief Set a block-sparse layout, or clear it (layout = NULL).
 *
 * layout is a host uint8 array [layout_heads, num_row_blocks, num_col_blocks] (row-major)
 * with num_row_blocks = ceil(seqlen_q / block_q) and num_col_blocks = ceil(seqlen_k /
 * block_k) (max lengths in varlen mode). Element (i, j) of query head h is attended only
 * if layout[h % layout_heads][i / block_q][j / block_k] != 0; zero blocks are skipped, not
 * computed. The plan copies the layout; the caller may free it on return. Any block size
 * is valid; multiples of 128 (q) and 64 (k) let the CUDA kernels skip whole tiles.
 * @param plan The plan (shape must be set).
 * @param layout Host array, or NULL to clear.
 * @param layout_heads 1 (shared by all heads) or heads_q.
 * @param num_row_blocks Must equal ceil(seqlen_q / block_q).
 * @param num_col_blocks Must equal ceil(seqlen_k / block_k).
 * @param block_q Rows per block, >= 1.
 * @param block_k Columns per block, >= 1.
 * @return SUCCESS; NULL_POINTER; PLAN_INCOMPLETE; INVALID_LAYOUT; OUT_OF_MEMORY;
 *         CUDA_ERROR (copying the layout to the device).
 */
FLASHATTN_API flashattn_status_t flashattn_plan_set_block_sparse(flashattn_plan_t plan, const uint8_t* layout,
                                                                 int64_t layout_heads, int64_t num_row_blocks,
                                                                 int64_t num_col_blocks, int64_t block_q,
                                                                 int64_t block_k);

/** @} */

/**
 * @defgroup passes Passes
 * @brief Workspace queries and the forward and backward passes.
 * @{
 */

/** A pass, for workspace queries. */
typedef enum flashattn_pass_t {
  FLASHATTN_PASS_FORWARD = 0, /**< ::flashattn_fwd. */
  FLASHATTN_PASS_BACKWARD = 1, /**< ::flashattn_bwd. */
  FLASHATTN_PASS_FORWARD_KVCACHE = 2, /**< ::flashattn_fwd_kvcache (needs ::flashattn_plan_set_kvcache). */
  FLASHATTN_PASS_MAX_ENUM = 0x7FFFFFFF /**< Not a value: keeps the enum 32-bit with every int value valid. */
} flashattn_pass_t;

/**
 * @brief Workspace bytes a pass needs with the plan's current configuration (may be 0).
 * @param plan The plan (shape must be set).
 * @param pass FORWARD, BACKWARD or FORWARD_KVCACHE.
 * @param[out] bytes Receives the size in bytes (at most 2^63-1).
 * @return SUCCESS; NULL_POINTER; PLAN_INCOMPLETE (also FORWARD_KVCACHE without a KV-cache
 *         configuration); INVALID_ENUM; INVALID_SHAPE (the size would exceed 2^63-1 bytes;
 *         FORWARD_KVCACHE: the KV-cache configuration no longer fits the shape);
 *         INVALID_STRIDE, INVALID_VALUE (FORWARD_KVCACHE: the configuration's strides or
 *         rotary_dim no longer fit the shape).
 */
FLASHATTN_API flashattn_status_t flashattn_plan_get_workspace_size(flashattn_plan_t plan, flashattn_pass_t pass,
                                                                   size_t* bytes);

/**
 * @brief Pointers of one forward run. Initialize with FLASHATTN_FWD_ARGS_INIT.
 *
 * Memory is device memory of the plan's device for CUDA, host memory for CPU. Shapes
 * and strides are the plan's; dtype is the plan's unless stated.
 */
typedef struct flashattn_fwd_args_t {
  size_t struct_size;           /**< sizeof(flashattn_fwd_args_t) as compiled by the caller. */
  const void* q;                /**< Query [batch, seqlen_q, heads_q, head_dim_qk]. Required. */
  const void* k;                /**< Key [batch, seqlen_k, heads_kv, head_dim_qk]. Required. */
  const void* v;                /**< Value [batch, seqlen_k, heads_kv, head_dim_v]. Required. */
  void* o;                      /**< Output [batch, seqlen_q, heads_q, head_dim_v]. Required. */
  float* lse;                   /**< fp32 log-sum-exp (natural log) [batch, heads_q, seqlen_q] contiguous, or
                                     [heads_q, total_q] in varlen mode. Optional (NULL). -inf for fully masked rows. */
  const void* bias;             /**< Bias tensor (plan dtype, plan bias strides). Required iff bias kind is TENSOR. */
  const float* alibi_slopes;    /**< fp32 [heads_q], or [batch, heads_q] with an ALiBi batch stride
                                     (::flashattn_plan_set_alibi_batch_stride). Required iff bias kind is
                                     ALIBI or ALIBI_SYMMETRIC. */
  const int32_t* cu_seqlens_q;  /**< int32 [batch+1] token offsets. Required iff varlen. */
  const int32_t* cu_seqlens_k;  /**< int32 [batch+1] token offsets. Required iff varlen. */
} flashattn_fwd_args_t;

/** Initializer for ::flashattn_fwd_args_t: sets struct_size, everything else NULL. */
#define FLASHATTN_FWD_ARGS_INIT {sizeof(flashattn_fwd_args_t), 0, 0, 0, 0, 0, 0, 0, 0, 0}

/**
 * @brief Pointers of one backward run. Initialize with FLASHATTN_BWD_ARGS_INIT.
 */
typedef struct flashattn_bwd_args_t {
  size_t struct_size;           /**< sizeof(flashattn_bwd_args_t) as compiled by the caller. */
  const void* q;                /**< Query, as in the forward. Required. */
  const void* k;                /**< Key, as in the forward. Required. */
  const void* v;                /**< Value, as in the forward. Required. */
  const void* o;                /**< Forward output O. Required. */
  const float* lse;             /**< Forward LSE (layout as in ::flashattn_fwd_args_t). Required. */
  const void* dout;             /**< Output gradient dO, like O (strides of TENSOR_DO). Required. */
  void* dq;                     /**< Receives dQ, like Q (strides of TENSOR_DQ). Required. */
  void* dk;                     /**< Receives dK, like K (summed over each GQA group). Required. */
  void* dv;                     /**< Receives dV, like V (summed over each GQA group). Required. */
  const void* bias;             /**< Bias tensor, as in the forward. Required iff bias kind is TENSOR. */
  void* dbias;                  /**< Receives dBias (plan dtype, bias strides; summed over broadcast dims).
                                     Optional; only with bias kind TENSOR. */
  const float* alibi_slopes;    /**< As in the forward. */
  const int32_t* cu_seqlens_q;  /**< As in the forward. */
  const int32_t* cu_seqlens_k;  /**< As in the forward. */
} flashattn_bwd_args_t;

/** Initializer for ::flashattn_bwd_args_t: sets struct_size, everything else NULL. */
#define FLASHATTN_BWD_ARGS_INIT {sizeof(flashattn_bwd_args_t), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

/**
 * @brief Forward pass: O = softmax(mask(scale * Q K^T + bias)) V (with dropout) and LSE.
 *
 * All checks run before anything is written. CUDA: asynchronous on stream, no
 * allocation, no host synchronization. CPU: synchronous, multithreaded; stream must be NULL.
 *
 * Memory the run writes (O, LSE, dQ, dK, dV, dBias, the workspace) must not share a byte
 * with any other argument; inputs may alias each other. Tensors interleaved in one buffer
 * (dQ, dK, dV in a packed [B, S, 3, H, D] buffer) are accepted when they have the same
 * strides and share no element; otherwise their extents [ptr, ptr + bytes) must be
 * disjoint. Overlap is INVALID_ARGUMENT naming both arguments.
 *
 * A CPU run allocates nothing: its scratch is the workspace, and its team is the calling
 * thread plus idle workers of the library's thread pool (one per process, started when
 * CPU plans are created, joined when the library is unloaded or the process exits), at
 * most min(the plan's threads, the workspace's per-thread slots, the run's tasks, one
 * per 2^18 multiply-adds of work). Workers busy with runs of other threads are not
 * waited for: the run goes on with fewer (bitwise the same results). OUT_OF_MEMORY is
 * CUDA only.
 * @param plan The plan (shape set).
 * @param args Pointers of this run (host struct).
 * @param workspace Scratch of at least the queried FORWARD size (device for CUDA); may be
 *        NULL if that size is 0. CPU: 16-byte aligned (what malloc returns; 64 is fastest);
 *        CUDA: any address (the queried size includes the slack to align inside it).
 * @param workspace_bytes Size of workspace.
 * @param stream CUDA stream (cudaStream_t) or NULL for the default stream; must be NULL for CPU.
 * @return SUCCESS; NULL_POINTER; PLAN_INCOMPLETE; INVALID_STRUCT_SIZE; INVALID_STRIDE;
 *         INVALID_SHAPE (a tensor, LSE or workspace size beyond 2^63-1 bytes);
 *         INVALID_SEQLENS; MISALIGNED_POINTER; WORKSPACE_TOO_SMALL; INCOMPATIBLE_OPTIONS;
 *         INVALID_ARGUMENT (a stream on CPU, a stream of another device than the plan's,
 *         or overlapping arguments);
 *         NOT_SUPPORTED; HEAD_DIM_NOT_SUPPORTED; DTYPE_NOT_SUPPORTED; LIBRARY_UNAVAILABLE;
 *         OUT_OF_MEMORY; CUDA_ERROR; LAUNCH_FAILED; WRONG_MEMORY_SPACE (host memory on CUDA;
 *         on CPU, device memory, detected once the process has loaded the CUDA driver).
 */
FLASHATTN_API flashattn_status_t flashattn_fwd(flashattn_plan_t plan, const flashattn_fwd_args_t* args,
                                               void* workspace, size_t workspace_bytes,
                                               struct CUstream_st* stream);

/**
 * @brief Backward pass: dQ, dK, dV (and dBias) by recomputation from Q, K, V, O, dO, LSE.
 *
 * Uses the plan's dropout seed/offset, so the mask equals the forward's. Fully masked
 * rows get zero gradients. Same checks, threading and stream rules as ::flashattn_fwd.
 * @param plan The plan (shape set).
 * @param args Pointers of this run (host struct).
 * @param workspace Scratch of at least the queried BACKWARD size, aligned as for ::flashattn_fwd.
 * @param workspace_bytes Size of workspace.
 * @param stream CUDA stream or NULL.
 * @return As ::flashattn_fwd.
 */
FLASHATTN_API flashattn_status_t flashattn_bwd(flashattn_plan_t plan, const flashattn_bwd_args_t* args,
                                               void* workspace, size_t workspace_bytes,
                                               struct CUstream_st* stream);

/** @} */

/**
 * @defgroup inference Inference: KV cache, paged KV, combine
 * @brief Attention of new query tokens against a (paged) KV cache, with optional in-place
 * append and rotary embedding, and the merge of partial results. Semantics follow
 * FlashAttention's flash_attn_with_kvcache; docs/inference.md is the user guide.
 *
 * Shapes live in the plan (::flashattn_plan_set_shape and ::flashattn_plan_set_kvcache),
 * pointers and per-sequence lengths in each run's ::flashattn_kvcache_args_t, so one plan
 * serves every decode step of a batch shape and a run allocates nothing.
 * @{
 */

/** Rotary embedding form (int32_t-compatible enum; default NONE). */
typedef enum flashattn_rotary_t {
  FLASHATTN_ROTARY_NONE = 0,        /**< No rotary embedding (default). */
  FLASHATTN_ROTARY_HALF = 1,        /**< GPT-NeoX form: dims k and k + rotary_dim/2 form a pair
                                         (FlashAttention's rotary_interleaved=False). */
  FLASHATTN_ROTARY_INTERLEAVED = 2, /**< GPT-J form: dims 2k and 2k+1 form a pair. */
  FLASHATTN_ROTARY_MAX_ENUM = 0x7FFFFFFF /**< Not a value: keeps the enum 32-bit with every int value valid. */
} flashattn_rotary_t;

/**
 * @brief KV-cache geometry of a plan. Initialize with FLASHATTN_KVCACHE_CONFIG_INIT.
 *
 * The plan's seqlen_q is the number of new query tokens per sequence and its seqlen_k the
 * capacity: the most keys one sequence may hold (used length plus appended tokens). K and
 * V are read from the cache, not from ::flashattn_plan_set_strides' K and V strides.
 * Strides are host arrays of 4 values in elements (copied by ::flashattn_plan_set_kvcache),
 * or NULL for the contiguous layout; for the caches the order is (row or page, token
 * within it, head, dim) and the dim stride must be 1. Heads-inner ([.., token, head, dim],
 * NHD) and heads-outer ([.., head, token, dim], HND) pages are both just strides.
 */
typedef struct flashattn_kvcache_config_t {
  size_t struct_size;         /**< sizeof(flashattn_kvcache_config_t) as compiled by the caller. */
  int64_t page_size;          /**< 0 (default): contiguous cache, one row of seqlen_k tokens per cache row.
                                   >= 1: paged pool of pages of page_size tokens (any size). */
  int64_t num_rows;           /**< Cache rows (contiguous) or pages in the pool (paged), >= 1. */
  int64_t max_pages_per_seq;  /**< Paged: columns of the block table, >= ceil(seqlen_k / page_size).
                                   Contiguous: must be 0. */
  const int64_t* k_cache_strides; /**< K cache [num_rows, seqlen_k or page_size, heads_kv, head_dim_qk]. */
  const int64_t* v_cache_strides; /**< V cache [num_rows, seqlen_k or page_size, heads_kv, head_dim_v]. */
  int64_t seqlen_new;         /**< Tokens appended to each sequence before attending, 0..seqlen_k
                                   (0, the default: no append). */
  const int64_t* k_new_strides;   /**< New keys [batch, seqlen_new, heads_kv, head_dim_qk]. */
  const int64_t* v_new_strides;   /**< New values [batch, seqlen_new, heads_kv, head_dim_v]. */
  flashattn_rotary_t rotary;  /**< Rotary form applied to q and the appended k (needs seqlen_new >= 1). */
  int64_t rotary_dim;         /**< Leading dims rotated: even, 2..head_dim_qk with a rotary form, else 0. */
  int64_t rotary_rows;        /**< Rows (positions) of the cos/sin tables, >= 1 with a rotary form, else 0. */
  int64_t num_splits;         /**< Key splits per (sequence, head): 0 (default) lets the library choose (CPU: from
                                   the shape, never from the thread count; CUDA: from the shape and the device's SM
                                   count); >= 1 forces. */
} flashattn_kvcache_config_t;

/** Initializer for ::flashattn_kvcache_config_t: contiguous cache, no append, no rotary. */
#define FLASHATTN_KVCACHE_CONFIG_INIT                                                                  \
  {sizeof(flashattn_kvcache_config_t), 0, 0, 0, 0, 0, 0, 0, 0, FLASHATTN_ROTARY_NONE, 0, 0, 0}

/**
 * @brief Put the plan in KV-cache mode with this geometry, or leave it (config = NULL).
 *
 * Checked against the plan's current shape now and again at every run. KV-cache runs go
 * through ::flashattn_fwd_kvcache only (::flashattn_fwd and ::flashattn_bwd refuse a plan in
 * this mode); they take the plan's dtype, Q and O strides, softmax scale, softcap, band
 * mask, ALiBi and GQA. Masks and ALiBi are aligned bottom-right against each sequence's
 * key count (used length + seqlen_new), so the band mask must use BOTTOM_RIGHT.
 * @param plan The plan (shape must be set).
 * @param config Host struct, copied; NULL leaves KV-cache mode.
 * @return SUCCESS; NULL_POINTER; PLAN_INCOMPLETE; INVALID_STRUCT_SIZE; INVALID_SHAPE
 *         (page_size, num_rows, max_pages_per_seq, seqlen_new); INVALID_STRIDE; INVALID_ENUM
 *         (rotary); INVALID_VALUE (rotary_dim, rotary_rows, num_splits); INCOMPATIBLE_OPTIONS
 *         (rotary without appended tokens).
 */
FLASHATTN_API flashattn_status_t flashattn_plan_set_kvcache(flashattn_plan_t plan,
                                                            const flashattn_kvcache_config_t* config);

/**
 * @brief Pointers and lengths of one KV-cache run. Initialize with FLASHATTN_KVCACHE_ARGS_INIT.
 *
 * Memory is device memory for CUDA plans, host memory for CPU plans; tensors are in the
 * plan's dtype unless stated. Sequence b attends to its first n_b = cache_seqlens[b] +
 * seqlen_new keys, after the new keys are written at positions cache_seqlens[b] ..
 * n_b - 1 of its cache row (or of its pages).
 */
typedef struct flashattn_kvcache_args_t {
  size_t struct_size;             /**< sizeof(flashattn_kvcache_args_t) as compiled by the caller. */
  const void* q;                  /**< Query [batch, seqlen_q, heads_q, head_dim_qk] (plan's Q strides). Required. */
  void* k_cache;                  /**< K cache (config strides); written only where new keys are appended. Required. */
  void* v_cache;                  /**< V cache (config strides); written only where new values are appended. Required. */
  void* o;                        /**< Output [batch, seqlen_q, heads_q, head_dim_v] (plan's O strides). Required. */
  float* lse;                     /**< fp32 [batch, heads_q, seqlen_q] contiguous. Optional (NULL). */
  const int32_t* cache_seqlens;   /**< int32 [batch]: keys already in each sequence's cache. Required. */
  const int32_t* cache_batch_idx; /**< int32 [batch]: cache row of each batch entry (contiguous cache only).
                                       Optional: NULL means row b. */
  const int32_t* block_table;     /**< int32 [batch, max_pages_per_seq] row-major: physical page of each
                                       sequence's logical page. Required iff paged; only the entries of pages
                                       holding the n_b keys are read. */
  const void* k_new;              /**< New keys (config strides). Required iff seqlen_new >= 1. */
  const void* v_new;              /**< New values (config strides). Required iff seqlen_new >= 1. */
  const void* rotary_cos;         /**< cos table [rotary_rows, rotary_dim/2] contiguous. Required iff rotary. */
  const void* rotary_sin;         /**< sin table, like rotary_cos. Required iff rotary. */
  const float* alibi_slopes;      /**< fp32 [heads_q] or [batch, heads_q], as in ::flashattn_fwd_args_t.
                                       Required iff the bias kind is ALiBi. */
} flashattn_kvcache_args_t;

/** Initializer for ::flashattn_kvcache_args_t: sets struct_size, everything else NULL. */
#define FLASHATTN_KVCACHE_ARGS_INIT {sizeof(flashattn_kvcache_args_t), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

/**
 * @brief Forward pass of new query tokens against a KV cache (decode, chunked prefill).
 *
 * In order: rotate the new keys (rotary form) and write them and the new values into the
 * cache at each sequence's used length; rotate q (at positions cache_seqlens[b] + i with
 * a band mask, else at cache_seqlens[b] for every row, as FlashAttention does; rotated
 * values are rounded to the plan's dtype); attend. Every value a CPU run reads from host
 * memory (lengths, cache rows, block-table entries) is checked before anything is
 * written. CUDA plans (fp16/bf16): values in device memory are checked by the kernels, which
 * never read or write outside the described buffers and give NaN rows for out-of-range
 * values (docs/inference.md).
 * @param plan The plan (shape and KV-cache configuration set).
 * @param args Pointers of this run (host struct).
 * @param workspace Scratch of at least the queried FORWARD_KVCACHE size; may be NULL if 0.
 * @param workspace_bytes Size of workspace.
 * @param stream CUDA stream, or NULL; must be NULL for CPU.
 * @return SUCCESS; NULL_POINTER; PLAN_INCOMPLETE; INVALID_STRUCT_SIZE; INVALID_SHAPE (a
 *         tensor or the workspace beyond 2^63-1 bytes, or a KV-cache configuration the shape
 *         no longer fits); INVALID_STRIDE;
 *         INVALID_SEQLENS (a used length < 0, used + seqlen_new > seqlen_k, or a position past
 *         the rotary tables); INVALID_VALUE (a cache row or block-table entry out of range, a
 *         cache row or page written by two sequences); INVALID_ARGUMENT (memory the run writes
 *         overlapping any other argument; a stream on CPU); MISALIGNED_POINTER (also a CPU
 *         workspace not 16-byte aligned); WORKSPACE_TOO_SMALL;
 *         INCOMPATIBLE_OPTIONS (varlen, dropout, bias tensor, block-sparse layout, STANDARD
 *         algorithm or a TOP_LEFT band mask with KV cache; pointers given that the
 *         configuration does not use); DTYPE_NOT_SUPPORTED (CUDA: fp32); HEAD_DIM_NOT_SUPPORTED
 *         (CUDA: head dims above 128 on a device with less than 160 KB of shared memory per block,
 *         such as sm_86/sm_89); NOT_SUPPORTED (CUDA: a
 *         device before sm_80, more than 2^31-1 keys or CTAs); WRONG_MEMORY_SPACE; LAUNCH_FAILED;
 *         CUDA_ERROR (a device or stream the runtime refuses);
 *         OUT_OF_MEMORY (CUDA: the host-side cache of device properties; a CPU run allocates
 *         nothing).
 */
FLASHATTN_API flashattn_status_t flashattn_fwd_kvcache(flashattn_plan_t plan, const flashattn_kvcache_args_t* args,
                                                       void* workspace, size_t workspace_bytes,
                                                       struct CUstream_st* stream);

/**
 * @brief Shapes and pointers of ::flashattn_combine. Initialize with FLASHATTN_COMBINE_ARGS_INIT.
 *
 * Strides are host arrays in elements (read during the call), or NULL for the contiguous
 * layout.
 */
typedef struct flashattn_combine_args_t {
  size_t struct_size;              /**< sizeof(flashattn_combine_args_t) as compiled by the caller. */
  int64_t num_splits;              /**< Parts merged per output row, >= 1. */
  int64_t batch;                   /**< >= 1. */
  int64_t seqlen_q;                /**< Rows per sequence, >= 1. */
  int64_t heads;                   /**< >= 1. */
  int64_t head_dim;                /**< 1..FLASHATTN_MAX_HEAD_DIM. */
  const float* o_partial;          /**< fp32 partial outputs [num_splits, batch, seqlen_q, heads, head_dim]. Required. */
  const int64_t* o_partial_strides; /**< 5 strides (split, batch, seq, head, dim); dim stride 1. */
  const float* lse_partial;        /**< fp32 partial LSE [num_splits, batch, heads, seqlen_q]. Required. */
  const int64_t* lse_partial_strides; /**< 4 strides (split, batch, head, seq). */
  flashattn_dtype_t dtype;         /**< Element type of o (default FP16). */
  void* o;                         /**< Merged output [batch, seqlen_q, heads, head_dim]. Required. */
  const int64_t* o_strides;        /**< 4 strides (batch, seq, head, dim); dim stride 1; no two elements may alias. */
  float* lse;                      /**< Merged LSE fp32 [batch, heads, seqlen_q] contiguous. Optional (NULL). */
} flashattn_combine_args_t;

/** Initializer for ::flashattn_combine_args_t: sets struct_size, everything else 0 / NULL. */
#define FLASHATTN_COMBINE_ARGS_INIT \
  {sizeof(flashattn_combine_args_t), 0, 0, 0, 0, 0, 0, 0, 0, 0, FLASHATTN_DTYPE_FP16, 0, 0, 0}

/**
 * @brief Merge partial attention results over a split of the keys.
 *
 * For each row, with parts i whose lse_i is not -inf: lse = log sum_i exp(lse_i) and
 * O = sum_i exp(lse_i - lse) O_i. Parts with lse_i = -inf are skipped (their O_i is never
 * read); a row whose parts are all -inf gets O = 0 and LSE = -inf. A NaN part gives NaN.
 * Serves split-KV, cascade attention and context parallelism. CPU: synchronous and
 * bitwise independent of the thread count. CUDA: asynchronous on stream, pointers in
 * device memory of `device`, no allocation, no host synchronization.
 * @param backend CPU or CUDA (AUTO resolves as in ::flashattn_plan_create).
 * @param device CUDA device ordinal (>= 0); ignored (but must be >= 0) for the CPU.
 * @param args Host struct.
 * @param stream CUDA stream or NULL; must be NULL for CPU.
 * @return SUCCESS; NULL_POINTER; INVALID_STRUCT_SIZE; INVALID_ENUM; INVALID_VALUE (device);
 *         INVALID_SHAPE; INVALID_STRIDE; INVALID_ARGUMENT (an output overlapping any other
 *         argument, a stream on CPU, or a stream of another device); MISALIGNED_POINTER;
 *         BACKEND_UNAVAILABLE; NO_DEVICE; WRONG_MEMORY_SPACE; CUDA_ERROR; LAUNCH_FAILED.
 */
FLASHATTN_API flashattn_status_t flashattn_combine(flashattn_backend_t backend, int device,
                                                   const flashattn_combine_args_t* args, struct CUstream_st* stream);

/** @} */

/**
 * @addtogroup version
 * @{
 */

/**
 * @brief Number of CUDA devices usable by the library (0 with no driver, no device, or a
 * CPU-only build). Never fails: errors count as 0 devices.
 * @return Device count.
 */
FLASHATTN_API int flashattn_cuda_device_count(void);

/**
 * @brief Whether the library was built with the CUDA backend.
 * @return 1 if built with CUDA, else 0.
 */
FLASHATTN_API int flashattn_has_cuda_backend(void);

/** @} */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHATTN_H */
