// What every extern "C" entry point (api.cpp, api_kvcache.cpp) wraps its body in: the
// thread's error message cleared, every C++ exception caught and mapped to a status
// (std::bad_alloc -> OUT_OF_MEMORY, anything else -> INTERNAL_ERROR; allocations that
// can fail are caught where they are made and name their buffer), and enum parameters read
// as the ints a C caller may pass.
#pragma once
#include <cstring>
#include <exception>
#include <new>

#include "error.hpp"
#include "flashattn.h"

namespace flashattn {

// Runs body() with the boundary's guarantees.
template <class F>
flashattn_status_t guarded(F&& body) {
  clear_error();
  try {
    return body();
  } catch (const std::bad_alloc&) {
    // Every allocation of the library names its buffer; reaching this is a library bug.
    return fail(FLASHATTN_STATUS_OUT_OF_MEMORY,
                "out of host memory in an allocation that names no buffer (please report)");
  } catch (const std::exception& e) {
    return fail(FLASHATTN_STATUS_INTERNAL_ERROR, "unexpected exception: %s", e.what());
  } catch (...) {
    return fail(FLASHATTN_STATUS_INTERNAL_ERROR, "unexpected unknown exception");
  }
}

// The int value of an enum parameter. C callers may pass any int; reading the bytes
// instead of the enum lvalue keeps out-of-range values well-defined in C++.
template <class E>
int enum_value(const E& e) {
  static_assert(sizeof(E) == sizeof(int), "enums of the C ABI are int-sized");
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

}  // namespace flashattn

#define FA_CHECK_PLAN(plan) \
  if ((plan) == nullptr) return flashattn::fail(FLASHATTN_STATUS_NULL_POINTER, "plan is NULL")
