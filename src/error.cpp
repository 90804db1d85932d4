#include "error.hpp"

#include <cstdarg>
#include <cstdio>

namespace flashattn {
namespace {
thread_local char g_message[512];
}

flashattn_status_t fail(flashattn_status_t status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(g_message, sizeof g_message, fmt, ap);
  va_end(ap);
  return status;
}

flashattn_status_t fail_allocation(const char* buffer, size_t bytes) {
  return fail(FLASHATTN_STATUS_OUT_OF_MEMORY, "out of host memory allocating %s (%zu bytes)", buffer, bytes);
}

void clear_error() { g_message[0] = '\0'; }

const char* last_error_message() { return g_message; }

}  // namespace flashattn
