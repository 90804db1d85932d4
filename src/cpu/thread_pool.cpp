#include "cpu/thread_pool.hpp"

#include <stdlib.h>

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

void run_team(int threads, const std::function<void(const TeamMember&)>& fn) {
  if (threads <= 1) {
    Barrier barrier(1);
    fn(TeamMember{0, 1, &barrier});
    return;
  }
  // Workers wait at a start gate until the final team size is known, so a failed
  // thread start never leaves a barrier waiting for a member that does not exist.
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool open = false;
  int size = 1;
  Barrier* barrier_ptr = nullptr;

  std::vector<std::thread> workers;
  try {
    workers.reserve(static_cast<size_t>(threads - 1));
  } catch (...) {
    threads = 1;
  }
  for (int t = 1; t < threads; ++t) {
    try {
      workers.emplace_back([&, t] {
        {
          std::unique_lock<std::mutex> lock(gate_mu);
          gate_cv.wait(lock, [&] { return open; });
        }
        fn(TeamMember{t, size, barrier_ptr});
      });
    } catch (...) {
      break;  // resource limit: run with the members started so far
    }
  }
  Barrier barrier(static_cast<int>(workers.size()) + 1);
  {
    std::lock_guard<std::mutex> lock(gate_mu);
    size = static_cast<int>(workers.size()) + 1;
    barrier_ptr = &barrier;
    open = true;
  }
  gate_cv.notify_all();
  fn(TeamMember{0, size, &barrier});
  for (auto& w : workers) w.join();
}

}  // namespace cpu
}  // namespace flashattn
