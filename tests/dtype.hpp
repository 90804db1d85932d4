// Host-side fp16 / bf16 / fp32 conversions for the tests (round to nearest even), written
// independently of the library so the tests can check its conversions too.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cstddef>

#include "flashattn.h"

namespace fat {

inline uint32_t f32_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return x;
}
inline float bits_f32(uint32_t x) {
  float f;
  memcpy(&f, &x, 4);
  return f;
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (ax < 0x38800000u) {                                               // below 2^-14: subnormal
    const double v = static_cast<double>(bits_f32(ax)) * 16777216.0;    // units of 2^-24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(nearbyint(v)));
  }
  const uint32_t e = (ax >> 23) - 127 + 15;
  const uint32_t m = ax & 0x7fffffu;
  uint32_t h = (e << 10) | (m >> 13);
  const uint32_t rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h += 1;  // a carry into the exponent is correct
  return static_cast<uint16_t>(sign | h);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {
    const float v = ldexpf(static_cast<float>(m), -24);
    return sign ? -v : v;
  }
  if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
  return bits_f32(sign | ((e - 15 + 127) << 23) | (m << 13));
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

inline float bf16_to_f32(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }

inline size_t dtype_size(flashattn_dtype_t t) { return t == FLASHATTN_DTYPE_FP32 ? 4 : 2; }

inline const char* dtype_name(flashattn_dtype_t t) {
  return t == FLASHATTN_DTYPE_FP16 ? "fp16" : t == FLASHATTN_DTYPE_BF16 ? "bf16" : "fp32";
}

// Unit roundoff of the type (half an ulp at 1).
inline double dtype_eps(flashattn_dtype_t t) {
  return t == FLASHATTN_DTYPE_FP16 ? ldexp(1.0, -11) : t == FLASHATTN_DTYPE_BF16 ? ldexp(1.0, -8) : ldexp(1.0, -24);
}

inline void store_elem(flashattn_dtype_t t, void* dst, double v) {
  const float f = static_cast<float>(v);
  if (t == FLASHATTN_DTYPE_FP32) {
    memcpy(dst, &f, 4);
  } else {
    const uint16_t h = t == FLASHATTN_DTYPE_FP16 ? f32_to_f16(f) : f32_to_bf16(f);
    memcpy(dst, &h, 2);
  }
}

inline double load_elem(flashattn_dtype_t t, const void* src) {
  if (t == FLASHATTN_DTYPE_FP32) {
    float f;
    memcpy(&f, src, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, src, 2);
  return t == FLASHATTN_DTYPE_FP16 ? f16_to_f32(h) : bf16_to_f32(h);
}

// Rounds v to the nearest value of type t (through fp32, as a cast in PyTorch would).
inline double round_to(flashattn_dtype_t t, double v) {
  unsigned char buf[4];
  store_elem(t, buf, v);
  return load_elem(t, buf);
}

}  // namespace fat
