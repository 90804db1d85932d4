// Replacements of the global operator new for one test program (tests/failing_new.cpp):
// while armed, every allocation of the process fails with std::bad_alloc, including those
// libflashattn makes (its undefined operator new binds to the program's definition). No
// library seam or build knob is involved. Arm only around the one call under test.
#pragma once
#include <stddef.h>

#include "catch_compat.hpp"

namespace fat {

// While an AllocationsFail is alive, operator new throws (and nothrow new returns NULL).
class AllocationsFail {
 public:
  AllocationsFail();
  ~AllocationsFail();
  AllocationsFail(const AllocationsFail&) = delete;
  AllocationsFail& operator=(const AllocationsFail&) = delete;
  // Allocations refused so far by this guard.
  size_t refused() const;
};

// Whether failing this program's operator new fails the library's allocations too: the
// library binds to the program's operator new unless it carries its own C++ runtime (a
// static libstdc++, hidden by its version script). Probed once, with a plan creation.
bool injection_reaches_library();

}  // namespace fat

// Skips the current test case where the library's allocations cannot be failed from here
// (its results would prove nothing).
#define FA_REQUIRE_INJECTION()                                                                                \
  do {                                                                                                        \
    if (!fat::injection_reaches_library())                                                                    \
      FA_SKIP_TEST("the library does not allocate through this program's operator new (static C++ runtime)"); \
  } while (0)
