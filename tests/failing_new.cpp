#include "failing_new.hpp"

#include <stdlib.h>

#include <atomic>
#include <new>

namespace {
std::atomic<bool> g_fail{false};
std::atomic<size_t> g_refused{0};

void* allocate(size_t n) {
  if (g_fail.load(std::memory_order_relaxed)) {
    g_refused.fetch_add(1, std::memory_order_relaxed);
    throw std::bad_alloc();
  }
  void* p = malloc(n != 0 ? n : 1);
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
}  // namespace fat

void* operator new(size_t n) { return allocate(n); }
void* operator new[](size_t n) { return allocate(n); }
void operator delete(void* p) noexcept { free(p); }
void operator delete[](void* p) noexcept { free(p); }
void operator delete(void* p, size_t) noexcept { free(p); }
void operator delete[](void* p, size_t) noexcept { free(p); }
