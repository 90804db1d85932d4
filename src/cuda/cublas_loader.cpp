#include "cuda/cublas_loader.hpp"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <mutex>
#include <new>
#include <vector>

#include "cuda/cublas_search.hpp"
#include "error.hpp"

namespace flashattn {
namespace cublas {
namespace {

struct Loaded {
  Api api{};
  bool ok = false;
  char error[4096] = "";  // why loading failed (fixed size: loading allocates nothing)
};

// Appends printf-formatted text to a fixed buffer, truncating at its end.
void append(char* buf, size_t size, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
void append(char* buf, size_t size, const char* fmt, ...) {
  const size_t used = strlen(buf);
  if (used + 1 >= size) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + used, size - used, fmt, ap);
  va_end(ap);
}

// The file libflashattn was loaded from (for the nvidia-cublas wheel next to it).
const char* self_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&load), &info) == 0) return nullptr;
  return info.dli_fname;
}

// Tries the files of search_list (cublas_search.hpp) in order; NULL with the reasons in
// r->error when none loads.
void* open_cublas(Loaded* r) {
  static SearchList list;  // 96 KiB: static, so the loader neither allocates nor needs the stack
  const SearchInputs in{secure_getenv("FLASHATTN_CUBLAS_PATH"), self_path(), CUDART_VERSION / 1000};
  if (search_list(in, &list) != FLASHATTN_STATUS_SUCCESS) {
    append(r->error, sizeof r->error, "%s", last_error_message());
    return nullptr;
  }
  append(r->error, sizeof r->error, "cannot load cuBLAS (needed by the standard algorithm); tried");
  for (int i = 0; i < list.count; ++i) {
    void* h = dlopen(list.path[i], RTLD_NOW | RTLD_LOCAL);
    if (h != nullptr) return h;
    const char* e = dlerror();
    append(r->error, sizeof r->error, "%s %s", i == 0 ? ":" : ";", e != nullptr ? e : list.path[i]);
  }
  return nullptr;
}

template <typename F>
bool sym(void* lib, const char* name, F* out, Loaded* r) {
  dlerror();
  void* p = dlsym(lib, name);
  if (p == nullptr) {
    const char* e = dlerror();
    append(r->error, sizeof r->error, "cuBLAS was loaded but is unusable: dlsym(%s) failed: %s", name,
           e != nullptr ? e : "symbol is NULL");
    return false;
  }
  *out = reinterpret_cast<F>(p);
  return true;
}

const Loaded& loaded() {
  static Loaded result;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = open_cublas(&result);
    if (lib == nullptr) return;
    // The library stays loaded for the life of the process (handles may outlive any
    // caller-visible object), so it is never dlclose'd.
    Api& a = result.api;
    if (!sym(lib, "cublasCreate_v2", &a.create, &result) || !sym(lib, "cublasDestroy_v2", &a.destroy, &result) ||
        !sym(lib, "cublasSetStream_v2", &a.set_stream, &result) ||
        !sym(lib, "cublasSetWorkspace_v2", &a.set_workspace, &result) ||
        !sym(lib, "cublasGemmStridedBatchedEx", &a.gemm_strided_batched, &result))
      return;
    a.status_string = reinterpret_cast<const char* (*)(Status)>(dlsym(lib, "cublasGetStatusString"));  // optional
    result.ok = true;
    result.error[0] = '\0';
  });
  return result;
}

// Set when the process exits (an atexit handler registered with the first handle, so it
// runs before the CUDA runtime's and cuBLAS's teardown, which were set up earlier). A
// thread that ends while the process exits (torch's autograd threads do) must not call
// into a runtime that may be gone: its handles go with the process.
std::atomic<bool> g_process_exiting{false};

void mark_process_exiting() { g_process_exiting.store(true); }

void watch_process_exit() {
  static std::once_flag once;
  std::call_once(once, [] { (void)atexit(mark_process_exiting); });
}

// One handle per (thread, device): a cuBLAS handle must not be used by two threads at
// once, and a per-thread handle needs no lock on the run path.
struct ThreadHandles {
  struct Entry {
    int device;
    Handle handle;
  };
  std::vector<Entry> entries;
  ~ThreadHandles() {
    if (entries.empty() || g_process_exiting.load()) return;
    const Loaded& l = loaded();
    if (!l.ok) return;
    for (const Entry& e : entries) {
      int previous = -1;
      if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
      if (cudaSetDevice(e.device) == cudaSuccess) {
        (void)l.api.destroy(e.handle);
      }
      if (previous >= 0) (void)cudaSetDevice(previous);
      (void)cudaGetLastError();
    }
  }
};

thread_local ThreadHandles t_handles;

}  // namespace

flashattn_status_t load(const Api** api) {
  const Loaded& l = loaded();
  if (!l.ok) return fail(FLASHATTN_STATUS_LIBRARY_UNAVAILABLE, "algorithm=STANDARD: %s", l.error);
  *api = &l.api;
  return FLASHATTN_STATUS_SUCCESS;
}

flashattn_status_t thread_handle(int device, Handle* handle) {
  const Api* api = nullptr;
  if (const flashattn_status_t s = load(&api)) return s;
  for (const ThreadHandles::Entry& e : t_handles.entries) {
    if (e.device == device) {
      *handle = e.handle;
      return FLASHATTN_STATUS_SUCCESS;
    }
  }
  const size_t capacity = t_handles.entries.size() + 1;
  try {
    t_handles.entries.reserve(capacity);
  } catch (const std::bad_alloc&) {
    return fail_allocation("the calling thread's table of cuBLAS handles", capacity * sizeof(ThreadHandles::Entry));
  }
  watch_process_exit();
  Handle h = nullptr;
  const Status st = api->create(&h);
  if (st != kSuccess) {
    (void)cudaGetLastError();
    return fail(
        st == 3 /* CUBLAS_STATUS_ALLOC_FAILED */ ? FLASHATTN_STATUS_CUDA_ERROR : FLASHATTN_STATUS_LIBRARY_UNAVAILABLE,
        "cublasCreate on device %d failed: %s", device, status_text(st));
  }
  t_handles.entries.push_back({device, h});
  *handle = h;
  return FLASHATTN_STATUS_SUCCESS;
}

const char* status_text(Status s) {
  const Loaded& l = loaded();
  if (l.ok && l.api.status_string != nullptr) {
    const char* t = l.api.status_string(s);
    if (t != nullptr) return t;
  }
  switch (s) {
    case 0: return "CUBLAS_STATUS_SUCCESS";
    case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
    case 7: return "CUBLAS_STATUS_INVALID_VALUE";
    case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case 11: return "CUBLAS_STATUS_MAPPING_ERROR";
    case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case 16: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
  }
}

}  // namespace cublas
}  // namespace flashattn
