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

namespace flashattn {
namespace cpu {

// Threads a call may use: FLASHATTN_CPU_THREADS if set to a positive number, else
// std::thread::hardware_concurrency(); capped at kMaxThreads.
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
  int id;         // 0 .. size-1, indexes the workspace slot
  int size;       // number of members actually running
  Barrier* barrier;
};

// Runs fn on up to `threads` members (the caller is member 0) and returns when all are
// done. If the system refuses to start a thread, the team simply runs with fewer
// members; fn must therefore only use member.size, never assume `threads`. fn must not
// throw.
void run_team(int threads, const std::function<void(const TeamMember&)>& fn);

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
