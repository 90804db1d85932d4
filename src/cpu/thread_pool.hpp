// The CPU backend's worker threads: one pool per process, shared by every run and plan.
//
// The pool is created on first use and grows (never shrinks) to the largest team any
// plan asked for; plan creation grows it, so a run never starts a thread or allocates.
// A run borrows the pool's idle workers for the length of one call: when several runs
// from several user threads overlap, each gets the workers that are idle when it starts
// and runs with fewer members otherwise (never waiting for a busy worker, so there is
// no deadlock and no oversubscription). The workers are stopped and joined when the
// library is unloaded (dlclose) or the process exits. In a child made by fork() the
// workers do not exist: teams there run on the calling thread alone.
//
// Every member gets a dense id in [0, size) that selects its private workspace slot.
// Work is distributed by the callers through atomic task counters, and each output
// element is owned by exactly one task whose computation does not depend on which
// thread runs it: results are bitwise identical for any team size.
#pragma once
#include <stdint.h>

#include <atomic>
#include <condition_variable>
#include <mutex>

namespace flashattn {
namespace cpu {

// Threads a plan may use: FLASHATTN_CPU_THREADS if set to a positive number, else
// std::thread::hardware_concurrency(); capped at kMaxThreads. Read once per plan
// (cpu_prepare_plan() in backends.hpp, called at plan creation).
int default_thread_count();
constexpr int kMaxThreads = 256;

// Starts pool workers until teams of `threads` members (the caller plus threads - 1
// workers) can be formed. The only function of the pool that allocates; a thread the
// system refuses to start is left out (teams are then smaller).
void reserve_workers(int threads);

// Work (multiply-adds, or elements moved) one extra member must have to pay for waking
// it: below it a second thread costs more than it saves (measured in
// bench/cpu/tiny_problem.py: b=1, one query, 128 keys).
constexpr double kWorkPerMember = 262144;

// Members worth using for `tasks` independent tasks of `work` in total: at most
// `threads`, at most `tasks`, and one per kWorkPerMember of work; at least 1.
int team_size(int threads, int64_t tasks, double work);

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

using TeamFn = void (*)(const void* ctx, const TeamMember& member);

// Runs fn(ctx, member) on up to `threads` members (the caller is member 0) and returns
// when all are done. The team may be smaller than asked (busy or missing workers): fn
// must only use member.size, never assume `threads`. A member that no worker has
// started when member 0's fn returns is not run at all: fn must hand out its work
// through a TaskCounter, or make every member wait at the barrier before member 0 can
// return (then all have started). fn must not throw. Allocates nothing once
// reserve_workers(threads) has run.
void run_team(int threads, TeamFn fn, const void* ctx);

// The same for any callable, passed by address (no copy, no allocation).
template <class F>
void run_team(int threads, const F& fn) {
  run_team(
      threads, [](const void* ctx, const TeamMember& m) { (*static_cast<const F*>(ctx))(m); }, &fn);
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
