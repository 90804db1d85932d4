// `flashattn info`: versions, backends, CUDA devices, and what each backend supports.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "args.hpp"
#include "cli.hpp"
#include "commands.hpp"
#include "device.hpp"
#include "problem.hpp"
#include "tensor.hpp"

namespace facli {
namespace {

// Compresses a sorted list: "1-256", "8-256 step 8", "32,64,96-128", or "none".
std::string ranges(const std::vector<int>& v) {
  if (v.empty()) return "none";
  std::string s;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    if (i + 2 < v.size()) {  // a run of >= 3 values with a constant step
      const int step = v[i + 1] - v[i];
      while (j + 1 < v.size() && v[j + 1] - v[j] == step) ++j;
      if (j - i < 2) j = i;
    }
    if (!s.empty()) s += ",";
    if (j == i) {
      s += std::to_string(v[i]);
      i += 1;
      continue;
    }
    const int step = v[i + 1] - v[i];
    s += step == 1 ? strf("%d-%d", v[i], v[j]) : strf("%d-%d step %d", v[i], v[j], step);
    i = j + 1;
  }
  return s;
}

// Which head dims (1..FLASHATTN_MAX_HEAD_DIM, head_dim_v = head_dim) a backend runs for
// a dtype and algorithm, found by running a 1-token forward for each (the library has
// no query for it, and this asks the kernels themselves). Statuses other than the
// "not supported" band are reported as such.
struct Probe {
  std::vector<int> dims;
  std::string other;  // first unexpected status, if any
};

Probe probe(flashattn_backend_t backend, int device, flashattn_dtype_t dt, flashattn_algorithm_t alg) {
  Probe r;
  const bool on_dev = backend == FLASHATTN_BACKEND_CUDA;
  const size_t n = FLASHATTN_MAX_HEAD_DIM * 4;
  SpaceBuffer q(on_dev, n), k(on_dev, n), v(on_dev, n), o(on_dev, n), lse(on_dev, 16);
  q.fill_bytes(0);
  k.fill_bytes(0);
  v.fill_bytes(0);
  SpaceBuffer ws;
  for (int d = 1; d <= FLASHATTN_MAX_HEAD_DIM; ++d) {
    Plan plan(backend, device);
    lib_check(flashattn_plan_set_shape(plan.get(), 1, 1, 1, 1, 1, d, d), "flashattn_plan_set_shape");
    lib_check(flashattn_plan_set_dtype(plan.get(), dt), "flashattn_plan_set_dtype");
    lib_check(flashattn_plan_set_algorithm(plan.get(), alg), "flashattn_plan_set_algorithm");
    size_t bytes = 0;
    flashattn_status_t st = flashattn_plan_get_workspace_size(plan.get(), FLASHATTN_PASS_FORWARD, &bytes);
    if (st == FLASHATTN_STATUS_SUCCESS) {
      if (bytes > ws.bytes()) ws = SpaceBuffer(on_dev, bytes);
      flashattn_fwd_args_t fa = FLASHATTN_FWD_ARGS_INIT;
      fa.q = q.get();
      fa.k = k.get();
      fa.v = v.get();
      fa.o = o.get();
      fa.lse = static_cast<float*>(lse.get());
      st = flashattn_fwd(plan.get(), &fa, ws.get(), ws.bytes(), nullptr);
    }
    if (st == FLASHATTN_STATUS_SUCCESS) {
      r.dims.push_back(d);
    } else if (st != FLASHATTN_STATUS_NOT_SUPPORTED && st != FLASHATTN_STATUS_HEAD_DIM_NOT_SUPPORTED &&
               st != FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED && r.other.empty()) {
      r.other = strf("d=%d: %s: %s", d, flashattn_status_string(st), flashattn_last_error());
    }
  }
  if (on_dev) dev::synchronize();
  return r;
}

void print_support(flashattn_backend_t backend, int device) {
  for (flashattn_algorithm_t alg : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
    for (flashattn_dtype_t dt : {FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP32}) {
      const Probe pr = probe(backend, device, dt, alg);
      std::printf("    %-8s %-4s head_dim %s%s\n", algorithm_name(alg), dtype_name(dt), ranges(pr.dims).c_str(),
                  pr.other.empty() ? "" : ("   [" + pr.other + "]").c_str());
    }
  }
}

// The CPU kernels' instruction sets (FLASHATTN_CPU_ISA in flashattn.h): each name that a
// CPU plan creation accepts is usable here; the library uses the forced one, else the
// best usable (the last in this list). The others are listed with the library's reason
// (for amx: a missing CPU feature, or Linux refusing the tile data permission). A first
// plan under the caller's environment fixes the process's set as the library would; the
// variable is restored afterwards.
void print_cpu_isa() {
  const char* const names[] = {"baseline", "avx2", "avx512", "amx"};
  const char* env = std::getenv("FLASHATTN_CPU_ISA");
  const std::string forced = env ? env : "";
  flashattn_plan_t plan = nullptr;
  const bool forced_ok = flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS;
  const std::string refusal = forced_ok ? "" : flashattn_last_error();
  flashattn_plan_destroy(plan);
  std::string usable, best, refused;
  for (const char* name : names) {
    setenv("FLASHATTN_CPU_ISA", name, 1);
    plan = nullptr;
    if (flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS) {
      usable += (usable.empty() ? "" : ", ") + std::string(name);
      best = name;
    } else {
      refused += strf("\ncpu isa      %s not usable: %s", name, flashattn_last_error());
    }
    flashattn_plan_destroy(plan);
  }
  if (env) {
    setenv("FLASHATTN_CPU_ISA", forced.c_str(), 1);
    if (forced_ok)
      std::printf("cpu kernels  %s (forced by FLASHATTN_CPU_ISA; usable here: %s)\n", forced.c_str(), usable.c_str());
    else
      std::printf("cpu kernels  %s (FLASHATTN_CPU_ISA refused: %s; usable here: %s)\n", best.c_str(), refusal.c_str(),
                  usable.c_str());
  } else {
    unsetenv("FLASHATTN_CPU_ISA");
    std::printf("cpu kernels  %s (usable here: %s; FLASHATTN_CPU_ISA forces one)\n", best.c_str(), usable.c_str());
  }
  if (!refused.empty()) std::printf("%s\n", refused.c_str() + 1);
}

}  // namespace

int cmd_info(int argc, char** argv) {
  Args a("info", {{"--no-probe", OptSpec::kFlag, nullptr, "skip the per-backend head_dim/dtype probe"},
                  {"--help", OptSpec::kFlag, nullptr, "show this help"}});
  a.parse(argc, argv, 2);
  if (a.has("--help")) {
    std::printf(
        "usage: flashattn info [options]\n\n"
        "Prints the library version (runtime and the header this tool was built with), the\n"
        "backends built in, the CUDA devices, and for each usable backend the head dims\n"
        "(head_dim_qk = head_dim_v, 1..%d) each dtype and algorithm runs, found by running a\n"
        "one-token forward pass for each (no mask or options).\n\noptions:\n%s",
        FLASHATTN_MAX_HEAD_DIM, a.options_help().c_str());
    return kExitOk;
  }
  int major = 0, minor = 0, patch = 0;
  const int number = flashattn_get_version(&major, &minor, &patch);
  std::printf("libflashattn %d.%d.%d (runtime, version number %d)\n", major, minor, patch, number);
  std::printf("header       %d.%d.%d (this tool was built against it)%s\n", FLASHATTN_VERSION_MAJOR,
              FLASHATTN_VERSION_MINOR, FLASHATTN_VERSION_PATCH,
              number == FLASHATTN_VERSION_NUMBER ? "" : "  WARNING: differs from the runtime library");
  const bool has_cuda = flashattn_has_cuda_backend() != 0;
  std::printf("backends     cpu%s\n", has_cuda ? ", cuda" : "   (cuda: not built in)");

  if (const char* env = std::getenv("FLASHATTN_CPU_THREADS"))
    std::printf("cpu threads  FLASHATTN_CPU_THREADS=%s\n", env);
  else
    std::printf("cpu threads  %u hardware threads (FLASHATTN_CPU_THREADS overrides)\n",
                std::thread::hardware_concurrency());
  print_cpu_isa();

  // CUDA devices: the library's count, and names/capabilities through the tool's own
  // CUDA runtime (the library has no query for them).
  const int lib_count = flashattn_cuda_device_count();
  std::string why;
  const std::vector<dev::Props> props = dev::query(&why, /*free_memory=*/true);
  if (lib_count == 0) {
    std::printf("cuda devices none%s\n",
                !has_cuda ? " (library built without CUDA)" : (why.empty() ? "" : (" (" + why + ")").c_str()));
  } else {
    std::printf("cuda devices %d\n", lib_count);
    for (size_t i = 0; i < props.size(); ++i) {
      const dev::Props& p = props[i];
      std::printf("  [%zu] %s, compute capability %d.%d, %d SMs, %s total, %s free\n", i, p.name.c_str(), p.cc_major,
                  p.cc_minor, p.sm_count, human_bytes(double(p.total_bytes)).c_str(),
                  human_bytes(double(p.free_bytes)).c_str());
    }
    if (props.empty()) std::printf("  (names unavailable: %s)\n", why.c_str());
  }

  if (a.has("--no-probe")) return kExitOk;
  std::printf("\nsupport (head dims that run a forward pass, per algorithm and dtype):\n");
  std::printf("  cpu:\n");
  print_support(FLASHATTN_BACKEND_CPU, 0);
  if (has_cuda && lib_count > 0) {
    if (!dev::built()) {
      std::printf("  cuda: not probed (this tool was built without the CUDA runtime)\n");
    } else {
      for (int d = 0; d < lib_count; ++d) {
        std::printf("  cuda device %d:\n", d);
        dev::set_device(d);
        print_support(FLASHATTN_BACKEND_CUDA, d);
      }
    }
  }
  return kExitOk;
}

}  // namespace facli
