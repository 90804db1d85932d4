// The CPU backend's check for CUDA device memory (src/cpu/host_memory.cpp), run against a
// stand-in driver (fake_cuda_driver.c, built as libcuda.so.1) so that it needs no GPU:
// before the process has loaded a driver nothing is probed; once it has, memory the driver
// calls device memory is refused with WRONG_MEMORY_SPACE naming the argument and nothing
// is written, while managed memory and memory of a host-page-table GPU are accepted. The
// GPU counterpart with real cudaMalloc'd memory is in test_gpu_limits.cpp. Not linked
// with CUDA: the fake library's soname is the real driver's.
#include <dlfcn.h>

#include <algorithm>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "catch_compat.hpp"
#include "harness.hpp"

using namespace fat;

namespace {

using SetRange = void (*)(const void*, size_t, int, int);

// Loads the fake driver once for the process (the library then finds it loaded).
SetRange fake_driver() {
  static void* h = dlopen(FA_FAKE_CUDA_PATH, RTLD_NOW | RTLD_GLOBAL);
  INFO("dlopen(" << FA_FAKE_CUDA_PATH << "): " << (h ? "ok" : dlerror()));
  REQUIRE(h != nullptr);
  auto set = reinterpret_cast<SetRange>(dlsym(h, "fake_cuda_set_range"));
  REQUIRE(set != nullptr);
  return set;
}

Config small(uint64_t seed) {
  Config c;
  c.name = "host memory probe";
  c.sq = 19;
  c.sk = 23;
  c.dqk = c.dv = 16;
  c.dtype = FLASHATTN_DTYPE_FP32;
  c.data_seed = seed;
  return c;
}

}  // namespace

TEST_CASE("CPU runs probe no memory before a CUDA driver is loaded", "[api][faults]") {
  // This must be the first case of the program (Catch runs them in declaration order;
  // ctest runs each case in its own process): no libcuda.so is loaded yet.
  REQUIRE(dlopen(FA_FAKE_CUDA_PATH, RTLD_NOW | RTLD_NOLOAD) == nullptr);
  const Problem p = make_problem(small(7401));
  const LibResult r = run_cpu(p);
  REQUIRE(r.ok());
  check_against_reference(p, r);
}

TEST_CASE("CPU runs refuse what the loaded CUDA driver calls device memory, by argument name", "[api][faults]") {
  const SetRange set = fake_driver();
  const Problem p = make_problem(small(7402));
  const LibResult fresh = run_cpu(p);
  REQUIRE(fresh.ok());
  flashattn_plan_t raw = nullptr;
  REQUIRE(flashattn_plan_create(&raw, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  const std::unique_ptr<std::remove_pointer_t<flashattn_plan_t>, decltype(&flashattn_plan_destroy)> plan(
      raw, &flashattn_plan_destroy);
  REQUIRE(configure_plan(plan.get(), p) == FLASHATTN_STATUS_SUCCESS);
  size_t wf = 0, wb = 0;
  REQUIRE(flashattn_plan_get_workspace_size(plan.get(), FLASHATTN_PASS_FORWARD, &wf) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_get_workspace_size(plan.get(), FLASHATTN_PASS_BACKWARD, &wb) == FLASHATTN_STATUS_SUCCESS);
  constexpr size_t kBytes = 1 << 16;  // far more than this problem's tensors
  constexpr unsigned char kPoison = 0xA5;
  std::vector<std::vector<unsigned char>> buf(10, std::vector<unsigned char>(kBytes, 0));
  std::vector<unsigned char> ws(std::max(wf, wb) + 64);
  const char* names[10] = {"args.q",    "args.k",  "args.v",  "args.o",  "args.lse",
                           "args.dout", "args.dq", "args.dk", "args.dv", "workspace"};
  for (int which = 0; which < 10; ++which) {
    for (int i : {3, 4, 6, 7, 8}) std::fill(buf[i].begin(), buf[i].end(), kPoison);
    void* ptr[10];
    for (int i = 0; i < 9; ++i) ptr[i] = buf[i].data();
    ptr[9] = ws.data();
    set(ptr[which], which == 9 ? ws.size() : kBytes, 0, 0);
    flashattn_status_t st;
    if (which <= 4 || which == 9) {
      const flashattn_fwd_args_t a = fwd_args(ptr[0], ptr[1], ptr[2], ptr[3], ptr[4]);
      st = flashattn_fwd(plan.get(), &a, ptr[9], ws.size(), nullptr);
    } else {
      const flashattn_bwd_args_t a = bwd_args(ptr[0], ptr[1], ptr[2], ptr[3], ptr[4], ptr[5], ptr[6], ptr[7], ptr[8]);
      st = flashattn_bwd(plan.get(), &a, ptr[9], ws.size(), nullptr);
    }
    const std::string msg = flashattn_last_error();
    INFO("fake device memory as " << names[which] << ": " << flashattn_status_string(st) << ": " << msg);
    CHECK(st == FLASHATTN_STATUS_WRONG_MEMORY_SPACE);
    CHECK(msg.find(names[which]) != std::string::npos);
    for (int i : {3, 4, 6, 7, 8})
      CHECK(std::all_of(buf[i].begin(), buf[i].end(), [](unsigned char b) { return b == kPoison; }));
  }
  // Managed memory, and device memory of a GPU that reads the host page tables, are
  // host-accessible: the whole run goes through, with a fresh plan's bits.
  HostMem mem;
  for (int kind = 0; kind < 2; ++kind) {
    set(buf[0].data(), kBytes, kind == 0, kind == 1);  // the range covers no buffer of run_on_plan
    require_same_bits(fresh, run_on_plan(plan.get(), p, mem));
  }
  set(nullptr, 0, 0, 0);
  require_same_bits(fresh, run_on_plan(plan.get(), p, mem));
}
