#include "tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

namespace facli {

// ---- dtype conversion ----

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (ax < 0x38800000u) {
    // Below the smallest normal half (2^-14): the result is a multiple of 2^-24. Scaling
    // by 2^24 is exact, and nearbyint rounds to nearest even; 0x400 is the smallest normal.
    float a;
    std::memcpy(&a, &ax, 4);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 16777216.0f)));
  }
  const uint32_t exp = (ax >> 23) - 127 + 15;
  uint32_t h = (exp << 10) | ((ax & 0x7fffffu) >> 13);
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is correct
  return static_cast<uint16_t>(sign | h);
}

float half_to_float(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  float out;
  if (exp == 0) {
    out = std::ldexp(static_cast<float>(mant), -24);
    if (sign) out = -out;
    return out;
  }
  uint32_t x;
  if (exp == 31) x = sign | 0x7f800000u | (mant << 13);
  else x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  std::memcpy(&out, &x, 4);
  return out;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

float bf16_to_float(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float out;
  std::memcpy(&out, &x, 4);
  return out;
}

size_t dtype_size(flashattn_dtype_t dt) { return dt == FLASHATTN_DTYPE_FP32 ? 4 : 2; }

const char* dtype_name(flashattn_dtype_t dt) {
  switch (dt) {
    case FLASHATTN_DTYPE_FP16: return "fp16";
    case FLASHATTN_DTYPE_BF16: return "bf16";
    case FLASHATTN_DTYPE_FP32: return "fp32";
    default: break;
  }
  return "?";
}

const char* layout_name(Layout l) { return l == Layout::kBSHD ? "bshd" : "bhsd"; }

void layout_strides(Layout l, int64_t /*b*/, int64_t s, int64_t h, int64_t d, int64_t out[4]) {
  if (l == Layout::kBSHD) {
    out[0] = s * h * d;
    out[1] = h * d;
    out[2] = d;
  } else {
    out[0] = h * s * d;
    out[1] = d;
    out[2] = s * d;
  }
  out[3] = 1;
}

// ---- random numbers: splitmix64 of a counter, so any element can be drawn independently ----

static inline uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static inline uint64_t draw(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix64(mix64(seed ^ mix64(stream + 0x51ED27A1ull)) ^ index);
}

double random_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return static_cast<double>(draw(seed, stream, index) >> 11) * (1.0 / 9007199254740992.0);
}

float random_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  // Box-Muller on the two 32-bit halves of one draw; u1 in (0, 1] keeps the log finite.
  const uint64_t r = draw(seed, stream, index);
  const double u1 = (static_cast<double>(r >> 32) + 1.0) * (1.0 / 4294967296.0);
  const double u2 = static_cast<double>(r & 0xffffffffu) * (1.0 / 4294967296.0);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

static void store(void* base, flashattn_dtype_t dt, int64_t off, float v) {
  switch (dt) {
    case FLASHATTN_DTYPE_FP16: static_cast<uint16_t*>(base)[off] = float_to_half(v); break;
    case FLASHATTN_DTYPE_BF16: static_cast<uint16_t*>(base)[off] = float_to_bf16(v); break;
    case FLASHATTN_DTYPE_FP32: static_cast<float*>(base)[off] = v; break;
    default: break;  // the tool only makes the three dtypes
  }
}

static float load(const void* base, flashattn_dtype_t dt, int64_t off) {
  switch (dt) {
    case FLASHATTN_DTYPE_FP16: return half_to_float(static_cast<const uint16_t*>(base)[off]);
    case FLASHATTN_DTYPE_BF16: return bf16_to_float(static_cast<const uint16_t*>(base)[off]);
    case FLASHATTN_DTYPE_FP32: return static_cast<const float*>(base)[off];
    default: break;
  }
  return 0.f;
}

// Runs fn(begin, end) over [0, n) on up to hardware_concurrency threads (large n only).
template <class Fn>
static void parallel_range(size_t n, Fn fn) {
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t nt = n < (size_t(1) << 20) ? 1 : std::min<size_t>(hw, 16);
  if (nt == 1) {
    fn(size_t(0), n);
    return;
  }
  std::vector<std::thread> pool;
  const size_t chunk = (n + nt - 1) / nt;
  for (size_t t = 0; t < nt; ++t) {
    const size_t b = t * chunk, e = std::min(n, b + chunk);
    if (b < e) pool.emplace_back(fn, b, e);
  }
  for (auto& th : pool) th.join();
}

void fill_random_raw(void* dst, flashattn_dtype_t dtype, size_t count, uint64_t seed, uint64_t stream) {
  parallel_range(count, [=](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) store(dst, dtype, static_cast<int64_t>(i), random_normal(seed, stream, i));
  });
}

// ---- HostTensor ----

HostTensor::HostTensor(flashattn_dtype_t dtype, Layout layout, int64_t b, int64_t s, int64_t h, int64_t d)
    : dtype_(dtype) {
  dims_[0] = b;
  dims_[1] = s;
  dims_[2] = h;
  dims_[3] = d;
  layout_strides(layout, b, s, h, d, strides_);
  data_.resize(static_cast<size_t>(numel()) * dtype_size(dtype));
}

float HostTensor::get(int64_t b, int64_t s, int64_t h, int64_t d) const {
  return load(data_.data(), dtype_, offset(b, s, h, d));
}

void HostTensor::set(int64_t b, int64_t s, int64_t h, int64_t d, float v) {
  store(data_.data(), dtype_, offset(b, s, h, d), v);
}

void HostTensor::fill_random(uint64_t seed, uint64_t stream) {
  const int64_t S = dims_[1], H = dims_[2], D = dims_[3];
  parallel_range(static_cast<size_t>(numel()), [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; ++n) {
      const int64_t i = static_cast<int64_t>(n);
      const int64_t d = i % D, h = (i / D) % H, s = (i / (D * H)) % S, b = i / (D * H * S);
      store(data_.data(), dtype_, offset(b, s, h, d), random_normal(seed, stream, n));
    }
  });
}

void HostTensor::poison() { std::memset(data_.data(), 0xFF, data_.size()); }

std::vector<double> HostTensor::to_double() const {
  std::vector<double> out(static_cast<size_t>(numel()));
  size_t n = 0;
  for (int64_t b = 0; b < dims_[0]; ++b)
    for (int64_t s = 0; s < dims_[1]; ++s)
      for (int64_t h = 0; h < dims_[2]; ++h)
        for (int64_t d = 0; d < dims_[3]; ++d) out[n++] = get(b, s, h, d);
  return out;
}

}  // namespace facli
