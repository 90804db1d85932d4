// The extern "C" boundary of the inference path: KV-cache configuration and runs, and the
// merge of partial results. Same guarantees as api.cpp (api_guard.hpp).
#include "api_guard.hpp"
#include "backends.hpp"
#include "error.hpp"
#include "plan.hpp"

using flashattn::enum_value;
using flashattn::fail;
using flashattn::guarded;

extern "C" {

FLASHATTN_API flashattn_status_t flashattn_plan_set_kvcache(flashattn_plan_t plan,
                                                            const flashattn_kvcache_config_t* config) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    if (config == nullptr) {
      plan->kvcache = false;
      plan->kv = KvGeometry{};
      return FLASHATTN_STATUS_SUCCESS;
    }
    if (!plan->has_shape)
      return fail(FLASHATTN_STATUS_PLAN_INCOMPLETE,
                  "plan has no shape: call flashattn_plan_set_shape before flashattn_plan_set_kvcache");
    KvGeometry geometry, resolved;
    FA_TRY(flashattn::read_kvcache_config(config, &geometry));
    FA_TRY(flashattn::check_kvcache_geometry(*plan, geometry, &resolved));
    // Kept unresolved: contiguous strides follow later shape changes, checked at each run.
    plan->kv = geometry;
    plan->kvcache = true;
    return FLASHATTN_STATUS_SUCCESS;
  });
}

FLASHATTN_API flashattn_status_t flashattn_fwd_kvcache(flashattn_plan_t plan, const flashattn_kvcache_args_t* args,
                                                       void* workspace, size_t workspace_bytes,
                                                       struct CUstream_st* stream) {
  return guarded([&]() -> flashattn_status_t {
    FA_CHECK_PLAN(plan);
    flashattn::AttnParams p;
    FA_TRY(flashattn::validate_kvcache(*plan, args, workspace, workspace_bytes, stream, &p));
    if (plan->backend == FLASHATTN_BACKEND_CPU)
      return flashattn::cpu_run(p, plan->cpu_threads, workspace, workspace_bytes);
    return flashattn::cuda_run(p, plan->device, workspace, workspace_bytes, stream);
  });
}

FLASHATTN_API flashattn_status_t flashattn_combine(flashattn_backend_t backend, int device,
                                                   const flashattn_combine_args_t* args, struct CUstream_st* stream) {
  return guarded([&]() -> flashattn_status_t {
    flashattn_backend_t resolved = FLASHATTN_BACKEND_CPU;
    FA_TRY(flashattn::resolve_backend(enum_value(backend), device, &resolved));
    flashattn::CombineParams c;
    FA_TRY(flashattn::validate_combine(args, &c));
    if (resolved == FLASHATTN_BACKEND_CPU) {
      if (stream != nullptr)
        return fail(FLASHATTN_STATUS_INVALID_ARGUMENT, "stream=%p must be NULL for the CPU backend",
                    static_cast<void*>(stream));
      return flashattn::cpu_combine(c);
    }
    return flashattn::cuda_combine(c, device, stream);
  });
}

}  // extern "C"
