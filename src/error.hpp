// Thread-local error state behind flashattn_last_error(), and the helper every layer
// uses to fail with a status and a message naming the argument and its value.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"

namespace flashattn {

// Records a printf-style message for this thread and returns status, so callers can
// write `return fail(FLASHATTN_STATUS_INVALID_SHAPE, "batch=%lld must be >= 1", b);`.
flashattn_status_t fail(flashattn_status_t status, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

// v as the long long that fail()'s %lld takes.
inline long long ll(int64_t v) { return static_cast<long long>(v); }

// Returns from the calling function with the status of expr unless it succeeded.
#define FA_TRY(expr)                                               \
  do {                                                             \
    const flashattn_status_t fa_status_ = (expr);                  \
    if (fa_status_ != FLASHATTN_STATUS_SUCCESS) return fa_status_; \
  } while (0)

// A host allocation of `bytes` bytes for `buffer` (e.g. "the plan state") failed:
// OUT_OF_MEMORY with a message naming both.
flashattn_status_t fail_allocation(const char* buffer, size_t bytes);

// Clears the message (called at the start of every API entry point that returns a status).
void clear_error();

// The current thread's message (flashattn_last_error).
const char* last_error_message();

}  // namespace flashattn
