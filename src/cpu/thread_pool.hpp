// A team of worker threads for one backend call.
//
// Threads are started per call (no global state survives a call, so nothing has to be
// torn down at library unload and concurrent calls from several user threads never
// share workers). Every worker gets a dense id in [0, size) that selects its private
// workspace slot. Work is distributed by the callers through atomic task counters, and
// each output element is owned by exactly one task whose computation does not depend on
// which thread runs it: results are bitwise identical for any thread count.
#pragma once
#include <stdint.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <new>

#include "error.hpp"

namespace flashattn {
namespace cpu {

// Threads a plan may use: FLASHATTN_CPU_THREADS if set to a positive number, else
// std::thread::hardware_concurrency(); capped at kMaxThreads. Read once per plan
// (cpu_thread_count() in backends.hpp, called at plan creation).
int default_thread_count();
constexpr int kMaxThreads = 256;

// Reusable barrier for the members of one team.
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void wait();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int count_;
  int waiting_ = 0;
  uint64_t generation_ = 0;
};

// Context handed to every team member.
struct TeamMember {
  int id;    // 0 .. size-1, indexes the workspace slot
  int size;  // number of members actually running
  Barrier* barrier;
};

// Runs fn on up to `threads` members (the caller is member 0) and returns when all are
// done. If the system refuses to start a thread (or to allocate the vector of thread
// handles, or a thread's state), the team simply runs with fewer members; fn must
// therefore only use member.size, never assume `threads`. fn must not throw.
void run_team(int threads, const std::function<void(const TeamMember&)>& fn);

// The same for any callable: the std::function holding it is allocated on the heap
// (sizeof(F) bytes for the algorithms' closures); a failure to allocate it throws
// AllocationFailure naming it (error.hpp), before any member starts.
template <class F>
void run_team(int threads, const F& fn) {
  std::function<void(const TeamMember&)> task;
  try {
    task = fn;
  } catch (const std::bad_alloc&) {
    throw AllocationFailure{"the task closure of the CPU worker team", sizeof(F)};
  }
  run_team(threads, task);
}

// Hands out task indices 0..n-1 to the members of a team, each exactly once.
class TaskCounter {
 public:
  explicit TaskCounter(int64_t n) : n_(n) {}
  // Next task index, or -1 when all are taken.
  int64_t next() {
    const int64_t t = next_.fetch_add(1, std::memory_order_relaxed);
    return t < n_ ? t : -1;
  }

 private:
  std::atomic<int64_t> next_{0};
  int64_t n_;
};

}  // namespace cpu
}  // namespace flashattn
