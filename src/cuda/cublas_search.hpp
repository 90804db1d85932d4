// Which files the cuBLAS loader (cublas_loader.cpp) tries, in order: a pure function of
// the environment variable, the loaded libflashattn's own path and the CUDA major version
// the library was built with, so the choice is unit-tested without CUDA
// (tests/test_cublas_search.cpp). Needs no CUDA header and allocates nothing.
#pragma once
#include <stddef.h>

#include "flashattn.h"

namespace flashattn {
namespace cublas {

// What the search depends on, gathered by the loader from the process.
struct SearchInputs {
  const char* env_path;   // secure_getenv("FLASHATTN_CUBLAS_PATH"); NULL when unset
  const char* self_path;  // file of the loaded libflashattn (dladdr), or NULL
  int cuda_major;         // major CUDA version libflashattn was built with (CUDART_VERSION / 1000)
};

constexpr int kMaxCandidates = 24;  // 6 per major: the build's, 13, 12, and libcublas.so
constexpr size_t kMaxPath = 4096;   // PATH_MAX on Linux

// Files to dlopen, first hit wins. Each is an absolute path or a bare soname that the
// system loader looks up (LD_LIBRARY_PATH, ld.so.cache); never a relative path.
struct SearchList {
  int count = 0;
  char path[kMaxCandidates][kMaxPath];
};

// The search order (docs/concepts.md, "Environment variables"):
//  1. FLASHATTN_CUBLAS_PATH, when set and not empty, alone: it must be an absolute path
//     (LIBRARY_UNAVAILABLE naming the variable and its value otherwise).
//  2. For the major version M the library was built with, then for the other majors
//     whose cuBLAS has the same ABI for the calls used (13 and 12, newest first):
//     a. nvidia/cublas/lib/libcublas.so.M (the nvidia-cublas-cuM Python wheel) under the
//        directory of the loaded libflashattn and under its two parent directories (a
//        wheel's site-packages/<package>/ and site-packages/<package>/lib/), when that
//        path is absolute;
//     b. the soname libcublas.so.M;
//     c. the toolkit's copy: /usr/local/cuda-M/lib64/libcublas.so.M, then
//        /usr/local/cuda/lib64/libcublas.so.M.
//  3. libcublas.so (a toolkit's development link, whatever its version).
// Fails with LIBRARY_UNAVAILABLE when a path does not fit kMaxPath bytes.
flashattn_status_t search_list(const SearchInputs& in, SearchList* list);

}  // namespace cublas
}  // namespace flashattn
