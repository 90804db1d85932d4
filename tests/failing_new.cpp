#include "failing_new.hpp"

#include <dlfcn.h>

#include <atomic>
#include <new>

// The replacements below fail while armed and otherwise forward to the definitions they
// replace (the C++ runtime's, or a sanitizer's), found with dlsym(RTLD_NEXT): every
// allocation is still made and freed by one allocator, so operator delete stays theirs.
namespace {
std::atomic<bool> g_fail{false};
std::atomic<size_t> g_refused{0};

bool refuse() {
  if (!g_fail.load(std::memory_order_relaxed)) return false;
  g_refused.fetch_add(1, std::memory_order_relaxed);
  return true;
}

template <class Fn>
Fn next(const char* mangled) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, mangled));
}

using New = void* (*)(size_t);
using NewNothrow = void* (*)(size_t, const std::nothrow_t&) noexcept;
}  // namespace

namespace fat {
AllocationsFail::AllocationsFail() {
  g_refused = 0;
  g_fail = true;
}
AllocationsFail::~AllocationsFail() { g_fail = false; }
size_t AllocationsFail::refused() const { return g_refused.load(); }
}  // namespace fat

void* operator new(size_t n) {
  static const New real = next<New>("_Znwm");
  if (refuse()) throw std::bad_alloc();
  return real(n);
}
void* operator new[](size_t n) {
  static const New real = next<New>("_Znam");
  if (refuse()) throw std::bad_alloc();
  return real(n);
}
void* operator new(size_t n, const std::nothrow_t& t) noexcept {
  static const NewNothrow real = next<NewNothrow>("_ZnwmRKSt9nothrow_t");
  return refuse() ? nullptr : real(n, t);
}
void* operator new[](size_t n, const std::nothrow_t& t) noexcept {
  static const NewNothrow real = next<NewNothrow>("_ZnamRKSt9nothrow_t");
  return refuse() ? nullptr : real(n, t);
}
