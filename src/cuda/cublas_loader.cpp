#include "cuda/cublas_loader.hpp"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "error.hpp"

namespace flashattn {
namespace cublas {
namespace {

struct Loaded {
  Api api{};
  bool ok = false;
  std::string error;  // why loading failed
};

// Sonames tried in order. libcublas.so.13 is the CUDA 13 runtime ABI; the unversioned
// name is a development symlink (e.g. a toolkit without the versioned link on the path);
// the toolkit directory is tried last because it is often not on the loader path.
// FLASHATTN_CUBLAS_PATH, when set, is tried first (a wheel's bundled copy, say).
void* open_cublas(std::string* errors) {
  std::vector<std::string> names;
  if (const char* env = getenv("FLASHATTN_CUBLAS_PATH")) {
    if (env[0] != '\0') names.push_back(env);
  }
  names.push_back("libcublas.so.13");
  names.push_back("libcublas.so");
  names.push_back("/usr/local/cuda/lib64/libcublas.so.13");
  for (const std::string& name : names) {
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h != nullptr) return h;
    const char* e = dlerror();
    if (!errors->empty()) *errors += "; ";
    *errors += e != nullptr ? e : (name + ": unknown dlopen error");
  }
  return nullptr;
}

template <typename F>
bool sym(void* lib, const char* name, F* out, std::string* error) {
  dlerror();
  void* p = dlsym(lib, name);
  if (p == nullptr) {
    const char* e = dlerror();
    *error = std::string("dlsym(") + name + ") failed: " + (e != nullptr ? e : "symbol is NULL");
    return false;
  }
  *out = reinterpret_cast<F>(p);
  return true;
}

const Loaded& loaded() {
  static Loaded* result = [] {
    Loaded* r = new (std::nothrow) Loaded();
    if (r == nullptr) return r;
    try {
      std::string errors;
      void* lib = open_cublas(&errors);
      if (lib == nullptr) {
        r->error = "cannot load cuBLAS (needed by the standard algorithm): " + errors;
        return r;
      }
      // The library stays loaded for the life of the process (handles may outlive any
      // caller-visible object), so it is never dlclose'd.
      Api& a = r->api;
      if (!sym(lib, "cublasCreate_v2", &a.create, &r->error) ||
          !sym(lib, "cublasDestroy_v2", &a.destroy, &r->error) ||
          !sym(lib, "cublasSetStream_v2", &a.set_stream, &r->error) ||
          !sym(lib, "cublasSetWorkspace_v2", &a.set_workspace, &r->error) ||
          !sym(lib, "cublasGemmStridedBatchedEx", &a.gemm_strided_batched, &r->error)) {
        r->error = "cuBLAS was loaded but is unusable: " + r->error;
        return r;
      }
      std::string ignored;
      if (!sym(lib, "cublasGetStatusString", &a.status_string, &ignored)) a.status_string = nullptr;
      r->ok = true;
    } catch (const std::bad_alloc&) {
      r->error = "out of host memory while loading cuBLAS";
    }
    return r;
  }();
  static const Loaded oom = [] {
    Loaded l;
    l.error = "out of host memory while loading cuBLAS";
    return l;
  }();
  return result != nullptr ? *result : oom;
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
  if (!l.ok) return fail(FLASHATTN_STATUS_LIBRARY_UNAVAILABLE, "algorithm=STANDARD: %s", l.error.c_str());
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
  try {
    t_handles.entries.reserve(t_handles.entries.size() + 1);
  } catch (const std::bad_alloc&) {
    return fail(FLASHATTN_STATUS_OUT_OF_MEMORY, "out of host memory creating a cuBLAS handle");
  }
  Handle h = nullptr;
  const Status st = api->create(&h);
  if (st != kSuccess) {
    (void)cudaGetLastError();
    return fail(st == 3 /* CUBLAS_STATUS_ALLOC_FAILED */ ? FLASHATTN_STATUS_CUDA_ERROR
                                                          : FLASHATTN_STATUS_LIBRARY_UNAVAILABLE,
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
