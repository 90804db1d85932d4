// dev:: in a CPU-only build: no device, and any attempt to use one is a clear error.
#include "cli.hpp"
#include "device.hpp"

namespace facli {
namespace dev {

static const char* kWhy = "this flashattn tool was built without CUDA (FLASHATTN_ENABLE_CUDA=OFF)";

bool built() { return false; }
std::vector<Props> query(std::string* why, bool) {
  if (why) *why = kWhy;
  return {};
}
[[noreturn]] static void unavailable() { throw RuntimeError(kWhy); }
void set_device(int) { unavailable(); }
void* malloc(size_t) { unavailable(); }
void free(void*) noexcept {}
void upload(void*, const void*, size_t) { unavailable(); }
void download(void*, const void*, size_t) { unavailable(); }
void fill_bytes(void*, int, size_t) { unavailable(); }
void synchronize() { unavailable(); }
Timer::Timer() { unavailable(); }
Timer::~Timer() = default;
void Timer::start() { unavailable(); }
double Timer::stop() { unavailable(); }

}  // namespace dev
}  // namespace facli
