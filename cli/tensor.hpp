// Host tensors in the library's dtypes: fp16/bf16 conversion (round to nearest even),
// BSHD/BHSD strides, reproducible random fill, and reading back as fp64 for comparison.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "flashattn.h"

namespace facli {

uint16_t float_to_half(float f);
float half_to_float(uint16_t h);
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t b);

size_t dtype_size(flashattn_dtype_t dt);
const char* dtype_name(flashattn_dtype_t dt);

// Physical orders of the 4-d tensors (logical order is always batch, seq, head, dim).
enum class Layout { kBSHD, kBHSD };
const char* layout_name(Layout l);
// Element strides (batch, seq, head, dim) of a contiguous tensor with dims (b, s, h, d).
void layout_strides(Layout l, int64_t b, int64_t s, int64_t h, int64_t d, int64_t out[4]);

// A dense tensor with logical dims (batch, seq, head, dim) stored in `dtype` in `layout`.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(flashattn_dtype_t dtype, Layout layout, int64_t b, int64_t s, int64_t h, int64_t d);

  flashattn_dtype_t dtype() const { return dtype_; }
  const int64_t* dims() const { return dims_; }
  const int64_t* strides() const { return strides_; }
  int64_t numel() const { return dims_[0] * dims_[1] * dims_[2] * dims_[3]; }
  size_t bytes() const { return data_.size(); }
  void* data() { return data_.data(); }
  const void* data() const { return data_.data(); }

  int64_t offset(int64_t b, int64_t s, int64_t h, int64_t d) const {
    return b * strides_[0] + s * strides_[1] + h * strides_[2] + d * strides_[3];
  }
  float get(int64_t b, int64_t s, int64_t h, int64_t d) const;
  void set(int64_t b, int64_t s, int64_t h, int64_t d, float v);

  // N(0, 1) values rounded to the dtype; a pure function of (seed, stream, logical index),
  // so BSHD and BHSD tensors with the same seed hold the same logical values.
  void fill_random(uint64_t seed, uint64_t stream);
  // Every byte 0xFF: NaN in fp16, bf16 and fp32, so an element the library never wrote
  // shows up as a mismatch.
  void poison();
  // Logical BSHD-contiguous fp64 copy.
  std::vector<double> to_double() const;

 private:
  flashattn_dtype_t dtype_ = FLASHATTN_DTYPE_FP32;
  int64_t dims_[4] = {0, 0, 0, 0};
  int64_t strides_[4] = {0, 0, 0, 1};
  std::vector<unsigned char> data_;
};

// Fills `count` elements of raw dtype storage with N(0, 1) values (bench inputs; no layout).
void fill_random_raw(void* dst, flashattn_dtype_t dtype, size_t count, uint64_t seed, uint64_t stream);

// The standard normal value number `index` of stream (seed, stream): counter-based.
float random_normal(uint64_t seed, uint64_t stream, uint64_t index);
// A uniform value in [0, 1) from the same counter-based generator.
double random_uniform(uint64_t seed, uint64_t stream, uint64_t index);

}  // namespace facli
