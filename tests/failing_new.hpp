// Replacements of the global operator new for one test program (tests/failing_new.cpp):
// while armed, every allocation of the process fails with std::bad_alloc, including those
// libflashattn makes (its undefined operator new binds to the program's definition). No
// library seam or build knob is involved. Arm only around the one call under test.
#pragma once
#include <stddef.h>

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

}  // namespace fat
