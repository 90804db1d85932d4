#include "cuda/cublas_search.hpp"

#include <stdio.h>
#include <string.h>

#include "error.hpp"

namespace flashattn {
namespace cublas {
namespace {

constexpr int kAbiMajors[] = {13, 12};  // cuBLAS majors whose calls used here share one ABI

// Appends snprintf(fmt, dir, major, major) to the list: every format takes a string,
// then the major version once or twice.
flashattn_status_t add(SearchList* list, const char* fmt, const char* dir, int major) {
  if (list->count == kMaxCandidates)
    return fail(FLASHATTN_STATUS_INTERNAL_ERROR, "cuBLAS search: more than %d candidate paths", kMaxCandidates);
  const int n = snprintf(list->path[list->count], kMaxPath, fmt, dir, major, major);
  if (n < 0 || static_cast<size_t>(n) >= kMaxPath)
    return fail(FLASHATTN_STATUS_LIBRARY_UNAVAILABLE,
                "cuBLAS search: the path under '%.64s...' is longer than %zu bytes", dir, kMaxPath - 1);
  ++list->count;
  return FLASHATTN_STATUS_SUCCESS;
}

// The candidates of one major version. self_dir (NULL if unknown) is the directory of
// libflashattn without its trailing slash ("" for the root directory).
flashattn_status_t add_major(SearchList* list, const char* self_dir, int major) {
  if (self_dir != nullptr) {
    FA_TRY(add(list, "%s/nvidia/cublas/lib/libcublas.so.%d", self_dir, major));
    FA_TRY(add(list, "%s/../nvidia/cublas/lib/libcublas.so.%d", self_dir, major));
    FA_TRY(add(list, "%s/../../nvidia/cublas/lib/libcublas.so.%d", self_dir, major));
  }
  FA_TRY(add(list, "%slibcublas.so.%d", "", major));
  FA_TRY(add(list, "%s/usr/local/cuda-%d/lib64/libcublas.so.%d", "", major));
  return add(list, "%s/usr/local/cuda/lib64/libcublas.so.%d", "", major);
}

}  // namespace

flashattn_status_t search_list(const SearchInputs& in, SearchList* list) {
  list->count = 0;
  if (in.env_path != nullptr && in.env_path[0] != '\0') {
    if (in.env_path[0] != '/')
      return fail(FLASHATTN_STATUS_LIBRARY_UNAVAILABLE,
                  "FLASHATTN_CUBLAS_PATH=%s is not an absolute path (cuBLAS is loaded only from an absolute path "
                  "given there, never relative to the current directory)",
                  in.env_path);
    return add(list, "%s", in.env_path, 0);
  }
  // Only an absolute library path names directories independent of the current one.
  char self_dir[kMaxPath];
  const char* dir = nullptr;
  if (in.self_path != nullptr && in.self_path[0] == '/') {
    const size_t len = static_cast<size_t>(strrchr(in.self_path, '/') - in.self_path);
    if (len >= sizeof self_dir)
      return fail(FLASHATTN_STATUS_LIBRARY_UNAVAILABLE,
                  "cuBLAS search: the directory of libflashattn is longer than %zu bytes", sizeof self_dir - 1);
    memcpy(self_dir, in.self_path, len);
    self_dir[len] = '\0';
    dir = self_dir;
  }
  FA_TRY(add_major(list, dir, in.cuda_major));
  for (int major : kAbiMajors)
    if (major != in.cuda_major) FA_TRY(add_major(list, dir, major));
  return add(list, "%slibcublas.so", "", 0);
}

}  // namespace cublas
}  // namespace flashattn
