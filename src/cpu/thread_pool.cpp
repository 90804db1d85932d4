#include "cpu/thread_pool.hpp"

#include <pthread.h>
#include <stdlib.h>

#include <new>
#include <thread>
#include <vector>

namespace flashattn {
namespace cpu {

int default_thread_count() {
  long n = 0;
  if (const char* env = secure_getenv("FLASHATTN_CPU_THREADS")) {
    char* end = nullptr;
    n = strtol(env, &end, 10);
    if (end == env || *end != '\0') n = 0;
  }
  if (n <= 0) n = static_cast<long>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  return n > kMaxThreads ? kMaxThreads : static_cast<int>(n);
}

int team_size(int threads, int64_t tasks, double work) {
  double n = work / kWorkPerMember;  // a double: attention work can exceed 2^63
  if (n > static_cast<double>(tasks)) n = static_cast<double>(tasks);
  if (n > threads) n = threads;
  return n < 1 ? 1 : static_cast<int>(n);
}

void Barrier::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t gen = generation_;
  if (++waiting_ == count_) {
    waiting_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen; });
}

namespace {

// Set in a child made by fork(): the parent's workers do not exist there, and the pool's
// mutex may have been held by one of them, so the child never touches the pool.
std::atomic<bool> g_forked_child{false};

// One run_team call, on the caller's stack. Its members 1..size-1 are claimed by
// workers from the pool's list of jobs with unclaimed members.
struct Job {
  TeamFn fn;
  const void* ctx;
  int size;
  Barrier* barrier;
  int unclaimed;  // members not yet taken by a worker
  int running;    // workers that took a member and have not finished it
  std::condition_variable done;
  Job* next;
};

class Pool {
 public:
  Pool() {
    pthread_atfork(nullptr, nullptr, [] { g_forked_child.store(true, std::memory_order_relaxed); });
  }

  void grow(int workers) {
    std::lock_guard<std::mutex> lock(mu_);
    while (!stop_ && static_cast<int>(threads_.size()) < workers) {
      try {
        threads_.emplace_back([this] { work(); });
      } catch (...) {
        return;  // resource limit: teams run with the workers started so far
      }
      ++idle_;
    }
  }

  // Takes up to `wanted` idle workers for a job; they join it once it is posted.
  int reserve(int wanted) {
    std::lock_guard<std::mutex> lock(mu_);
    const int n = wanted < idle_ ? wanted : idle_;
    idle_ -= n;
    return n;
  }

  void post(Job& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job.next = pending_;
      pending_ = &job;
    }
    wake_.notify_all();
  }

  // Called by member 0 when its fn returned. Members no worker has taken yet are not
  // started at all (their workers go back to idle), so a late worker (a loaded machine)
  // never makes a run slower than running alone; then waits for the started ones.
  void wait(Job& job) {
    std::unique_lock<std::mutex> lock(mu_);
    if (job.unclaimed > 0) {
      Job** link = &pending_;
      while (*link != &job) link = &(*link)->next;
      *link = job.next;
      idle_ += job.unclaimed;
      job.running -= job.unclaimed;
      job.unclaimed = 0;
    }
    job.done.wait(lock, [&] { return job.running == 0; });
  }

  // Stops and joins the workers (library unload or process exit). The pool stays
  // usable afterwards: teams then run on the caller alone.
  void shutdown() {
    if (g_forked_child.load(std::memory_order_relaxed)) {
      for (std::thread& t : threads_) t.detach();  // they exist only in the parent
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      idle_ = 0;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
    std::vector<std::thread>().swap(threads_);  // the pool outlives dlclose's unmapping: free now
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || pending_ != nullptr; });
      if (pending_ == nullptr) return;  // stopped, and no job is waiting for members
      Job& job = *pending_;
      const int id = job.size - job.unclaimed;
      if (--job.unclaimed == 0) pending_ = job.next;
      lock.unlock();
      job.fn(job.ctx, TeamMember{id, job.size, job.barrier});
      lock.lock();
      ++idle_;
      if (--job.running == 0) job.done.notify_one();  // under the lock: job outlives it
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;
  std::vector<std::thread> threads_;
  int idle_ = 0;            // started workers neither reserved nor running a member
  Job* pending_ = nullptr;  // jobs with unclaimed members
  bool stop_ = false;
};

// Constructed in place on first use and never destroyed, so that a team started after
// shutdown (say from another static destructor) still finds a valid, stopped pool; the
// guard's destructor, run at dlclose or exit, stops and joins the workers.
Pool& the_pool() {
  alignas(Pool) static unsigned char storage[sizeof(Pool)];
  static Pool* const pool = new (storage) Pool();
  static const struct Guard {
    ~Guard() { pool->shutdown(); }
  } guard;
  return *pool;
}

void run_alone(TeamFn fn, const void* ctx) {
  Barrier barrier(1);
  fn(ctx, TeamMember{0, 1, &barrier});
}

}  // namespace

void reserve_workers(int threads) {
  if (threads > 1 && !g_forked_child.load(std::memory_order_relaxed)) the_pool().grow(threads - 1);
}

void run_team(int threads, TeamFn fn, const void* ctx) {
  if (threads <= 1 || g_forked_child.load(std::memory_order_relaxed)) return run_alone(fn, ctx);
  Pool& pool = the_pool();
  pool.grow(threads - 1);  // nothing to start after reserve_workers(threads)
  const int helpers = pool.reserve(threads - 1);
  if (helpers == 0) return run_alone(fn, ctx);
  Barrier barrier(helpers + 1);
  Job job{fn, ctx, helpers + 1, &barrier, helpers, helpers, {}, nullptr};
  pool.post(job);
  fn(ctx, TeamMember{0, helpers + 1, &barrier});
  pool.wait(job);
}

}  // namespace cpu
}  // namespace flashattn
