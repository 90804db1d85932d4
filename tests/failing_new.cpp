#include "failing_new.hpp"

#include <stdlib.h>

#include <atomic>
#include <new>

#include "flashattn.h"

// The replaced operators allocate with malloc and release with free, as a complete set
// (plain, array, nothrow, sized deletes), so every allocation is made and freed by one
// allocator (the C library's, or a sanitizer's interceptor of it) whatever the C++ runtime
// is linked as. The aligned (std::align_val_t) forms are not replaced; the runtime pairs
// them itself.
namespace {
std::atomic<bool> g_fail{false};
std::atomic<size_t> g_refused{0};

bool refuse() {
  if (!g_fail.load(std::memory_order_relaxed)) return false;
  g_refused.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void* allocate(size_t n) noexcept { return refuse() ? nullptr : malloc(n != 0 ? n : 1); }

void* allocate_or_throw(size_t n) {
  void* p = allocate(n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

namespace fat {
AllocationsFail::AllocationsFail() {
  g_refused = 0;
  g_fail = true;
}
AllocationsFail::~AllocationsFail() { g_fail = false; }
size_t AllocationsFail::refused() const { return g_refused.load(); }

bool injection_reaches_library() {
  static const bool reaches = [] {
    flashattn_plan_t plan = nullptr;
    flashattn_status_t st;
    {
      AllocationsFail fail;
      st = flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0);
    }
    flashattn_plan_destroy(plan);
    return st == FLASHATTN_STATUS_OUT_OF_MEMORY;
  }();
  return reaches;
}
}  // namespace fat

void* operator new(size_t n) { return allocate_or_throw(n); }
void* operator new[](size_t n) { return allocate_or_throw(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void operator delete(void* p) noexcept { free(p); }
void operator delete[](void* p) noexcept { free(p); }
void operator delete(void* p, size_t) noexcept { free(p); }
void operator delete[](void* p, size_t) noexcept { free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { free(p); }
