// The CPU backend's worker pool shuts down cleanly: the library is loaded, run with a
// team of 4 and unloaded (dlclose joins the workers) three times, then loaded and run
// once more and left loaded, so that process exit shuts the pool down. A hang fails
// through the test's timeout; under ThreadSanitizer (preset `tsan`) so does a race.
#include <dlfcn.h>
#include <flashattn.h>
#include <stdlib.h>

#include <cstdio>
#include <vector>

namespace {

using PlanCreate = decltype(&flashattn_plan_create);
using PlanSetShape = decltype(&flashattn_plan_set_shape);
using PlanSetDtype = decltype(&flashattn_plan_set_dtype);
using Workspace = decltype(&flashattn_plan_get_workspace_size);
using Fwd = decltype(&flashattn_fwd);
using PlanDestroy = decltype(&flashattn_plan_destroy);

template <class F>
F symbol(void* lib, const char* name) {
  void* s = dlsym(lib, name);
  if (s == nullptr) std::fprintf(stderr, "dlsym(%s): %s\n", name, dlerror());
  return reinterpret_cast<F>(s);
}

// Loads the library, runs one forward with 4 threads, and returns the handle (null on
// failure).
void* load_and_run(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "dlopen(%s): %s\n", path, dlerror());
    return nullptr;
  }
  auto create = symbol<PlanCreate>(lib, "flashattn_plan_create");
  auto set_shape = symbol<PlanSetShape>(lib, "flashattn_plan_set_shape");
  auto set_dtype = symbol<PlanSetDtype>(lib, "flashattn_plan_set_dtype");
  auto workspace = symbol<Workspace>(lib, "flashattn_plan_get_workspace_size");
  auto fwd = symbol<Fwd>(lib, "flashattn_fwd");
  auto destroy = symbol<PlanDestroy>(lib, "flashattn_plan_destroy");
  if (!create || !set_shape || !set_dtype || !workspace || !fwd || !destroy) return nullptr;
  const int64_t B = 2, S = 256, H = 4, D = 32;
  std::vector<float> q(B * S * H * D, 0.25f), o(q.size()), lse(B * H * S);
  flashattn_plan_t plan = nullptr;
  size_t ws_bytes = 0;
  bool ok = create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS &&
            set_shape(plan, B, S, S, H, H, D, D) == FLASHATTN_STATUS_SUCCESS &&
            set_dtype(plan, FLASHATTN_DTYPE_FP32) == FLASHATTN_STATUS_SUCCESS &&
            workspace(plan, FLASHATTN_PASS_FORWARD, &ws_bytes) == FLASHATTN_STATUS_SUCCESS;
  if (ok) {
    std::vector<unsigned char> ws(ws_bytes);
    flashattn_fwd_args_t a = FLASHATTN_FWD_ARGS_INIT;
    a.q = a.k = a.v = q.data();
    a.o = o.data();
    a.lse = lse.data();
    ok = fwd(plan, &a, ws.data(), ws.size(), nullptr) == FLASHATTN_STATUS_SUCCESS && o[0] == 0.25f;
  }
  destroy(plan);
  if (!ok) std::fprintf(stderr, "run through %s failed\n", path);
  return ok ? lib : nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: test_unload PATH_OF_LIBFLASHATTN\n");
    return 2;
  }
  setenv("FLASHATTN_CPU_THREADS", "4", 1);
  for (int i = 0; i < 3; ++i) {
    void* lib = load_and_run(argv[1]);
    if (lib == nullptr || dlclose(lib) != 0) return 1;
  }
  if (load_and_run(argv[1]) == nullptr) return 1;
  std::printf("unload: 3 dlclose and an exit with a running pool, no hang\n");
  return 0;
}
