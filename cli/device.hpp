// The CUDA runtime as the CLI needs it (device buffers, copies, events, device
// properties). device_cuda.cpp implements it with the CUDA runtime when the build has
// FLASHATTN_ENABLE_CUDA=ON; device_none.cpp otherwise. Failures throw RuntimeError.
// With no driver the tool still starts: nothing here runs before a CUDA command needs it.
#pragma once
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

namespace facli {
namespace dev {

// Whether the tool was built with the CUDA runtime.
bool built();

struct Props {
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  size_t total_bytes = 0, free_bytes = 0;
};
// Properties of every visible device; an empty list with *why set when there is none
// (no driver, no device, CPU-only build). free_bytes is filled only with
// free_memory (that creates a context on every device).
std::vector<Props> query(std::string* why, bool free_memory = false);

void set_device(int device);
void* malloc(size_t bytes);  // never returns null (bytes 0 gives a 1-byte buffer)
void free(void* p) noexcept;
void upload(void* dst, const void* src, size_t bytes);
void download(void* dst, const void* src, size_t bytes);
void fill_bytes(void* dst, int value, size_t bytes);
void synchronize();

// A pair of events on the default (legacy) stream, where the CLI runs the library.
class Timer {
 public:
  Timer();
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  void start();
  // Records the stop event, waits for it, returns the milliseconds between the two.
  double stop();

 private:
  void* start_ = nullptr;
  void* stop_ = nullptr;
};

// Device buffer owner.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t bytes) : ptr_(dev::malloc(bytes)), bytes_(bytes) {}
  ~Buffer() { dev::free(ptr_); }
  Buffer(Buffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      dev::free(ptr_);
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace dev

// Memory in the space a backend reads: host memory for the CPU backend, device memory
// for the CUDA backend.
class SpaceBuffer {
 public:
  SpaceBuffer() = default;
  SpaceBuffer(bool on_device, size_t bytes) : device_(on_device), bytes_(bytes) {
    if (device_) d_ = dev::Buffer(bytes);
    else h_.resize(bytes ? bytes : 1);
  }
  void* get() { return device_ ? d_.get() : static_cast<void*>(h_.data()); }
  size_t bytes() const { return bytes_; }
  void upload(const void* src, size_t n) {
    if (n == 0) return;  // an empty tensor may have no storage at all
    if (device_) dev::upload(d_.get(), src, n);
    else std::memcpy(h_.data(), src, n);
  }
  void download(void* dst, size_t n) const {
    if (n == 0) return;
    if (device_) dev::download(dst, d_.get(), n);
    else std::memcpy(dst, h_.data(), n);
  }
  void fill_bytes(int value) {
    if (device_) dev::fill_bytes(d_.get(), value, bytes_);
    else std::memset(h_.data(), value, bytes_);
  }

 private:
  bool device_ = false;
  size_t bytes_ = 0;
  dev::Buffer d_;
  std::vector<unsigned char> h_;
};

}  // namespace facli
