/* Compiled (syntax only) as strict C99 and as C++17 by ctest: every public type, macro and
   function of flashattn.h used the way a consumer would, so a header change that breaks
   either language or warns under -Wall -Wextra -pedantic fails the test. */
#include "flashattn.h"

int flashattn_header_usage(void);

int flashattn_header_usage(void) {
  flashattn_plan_t plan = NULL;
  flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO;
  flashattn_fwd_args_t fa = FLASHATTN_FWD_ARGS_INIT;
  flashattn_bwd_args_t ba = FLASHATTN_BWD_ARGS_INIT;
  const int64_t strides[4] = {0, 0, 0, 1};
  size_t bytes = 0;
  int major = 0, minor = 0, patch = 0;
  int v = flashattn_get_version(&major, &minor, &patch);
  flashattn_status_t st = flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0);
  (void)flashattn_status_string(st);
  (void)flashattn_last_error();
  (void)flashattn_plan_get_backend(plan, &backend);
  (void)flashattn_plan_set_shape(plan, 1, 1, 1, 1, 1, 8, 8);
  (void)flashattn_plan_set_dtype(plan, FLASHATTN_DTYPE_BF16);
  (void)flashattn_plan_set_strides(plan, FLASHATTN_TENSOR_DV, strides);
  (void)flashattn_plan_set_softmax_scale(plan, 0.5f);
  (void)flashattn_plan_set_algorithm(plan, FLASHATTN_ALGORITHM_STANDARD);
  (void)flashattn_plan_set_varlen(plan, 0, 0, 0);
  (void)flashattn_plan_set_deterministic(plan, 1);
  (void)flashattn_plan_set_grad_accumulate(plan, 1);
  (void)flashattn_plan_set_band_mask(plan, FLASHATTN_ALIGN_BOTTOM_RIGHT, FLASHATTN_WINDOW_UNBOUNDED, 0);
  (void)flashattn_plan_set_softcap(plan, 30.0f);
  (void)flashattn_plan_set_bias(plan, FLASHATTN_BIAS_ALIBI_SYMMETRIC, NULL);
  (void)flashattn_plan_set_alibi_batch_stride(plan, 0);
  (void)flashattn_plan_set_dropout(plan, 0.1f, (uint64_t)1, (uint64_t)2);
  (void)flashattn_plan_set_block_sparse(plan, NULL, 1, 1, 1, 128, 64);
  (void)flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_BACKWARD, &bytes);
  (void)flashattn_fwd(plan, &fa, NULL, bytes, (struct CUstream_st*)0);
  (void)flashattn_bwd(plan, &ba, NULL, bytes, (struct CUstream_st*)0);
  flashattn_plan_destroy(plan);
  return v + flashattn_cuda_device_count() + flashattn_has_cuda_backend() + FLASHATTN_MAX_HEAD_DIM +
         (FLASHATTN_VERSION_NUMBER > 0) + (int)sizeof(flashattn_tensor_t) + (int)FLASHATTN_PASS_FORWARD +
         (int)FLASHATTN_BIAS_TENSOR + (int)FLASHATTN_ALIGN_TOP_LEFT + (int)FLASHATTN_BIAS_NONE +
         (int)FLASHATTN_BIAS_ALIBI + (int)FLASHATTN_DTYPE_FP16 + (int)FLASHATTN_DTYPE_FP32;
}
