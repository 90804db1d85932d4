// Element conversions between the storage dtypes (fp16, bf16, fp32) and fp32.
//
// Written for exactness first: float -> fp16/bf16 rounds to nearest even, keeps
// infinities, turns NaN into a quiet NaN of the same sign, and produces fp16
// subnormals correctly. The loops over rows are branch-light so the compiler can
// vectorize the fp32 and bf16 cases; fp16 decoding uses selects instead of branches.
#pragma once
#include <stdint.h>
#include <string.h>

#include "common/params.h"
#include "cpu/tile_math.hpp"

namespace flashattn {
namespace cpu {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// binary16 -> binary32, exact for every input (subnormals, inf, NaN payloads).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  // Subnormal/zero: mant * 2^-24 is exact in fp32.
  const float sub = static_cast<float>(mant) * 5.9604644775390625e-08f;
  const uint32_t normal = ((exp + 112u) << 23) | (mant << 13);
  const uint32_t special = 0x7f800000u | (mant << 13);
  const uint32_t body = exp == 0 ? f32_bits(sub) : (exp == 31 ? special : normal);
  return bits_f32(sign | body);
}

// binary32 -> binary16, round to nearest even; overflow (>= 65520) gives inf.
inline uint16_t float_to_half(float f) {
  uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  uint32_t out;
  if (u >= 0x47800000u) {  // |f| >= 65536, inf or NaN
    out = u > 0x7f800000u ? (0x7e00u | ((u >> 13) & 0x3ffu)) : 0x7c00u;
  } else if (u < 0x38800000u) {  // |f| < 2^-14: fp16 subnormal or zero
    // Adding 0.5 aligns the fp16 subnormal grid (spacing 2^-24) with the last fp32
    // mantissa bits, so the hardware add performs the round-to-nearest-even for us.
    const float shifted = bits_f32(u) + 0.5f;
    out = f32_bits(shifted) - 0x3f000000u;
  } else {
    const uint32_t odd = (u >> 13) & 1u;
    // Rebias 127 -> 15 and round: adding 0xfff + odd rounds half to even; a carry out
    // of the mantissa correctly bumps the exponent (up to inf at 65520).
    u += 0xc8000fffu + odd;  // == ((15 - 127) << 23) + 0xfff, modulo 2^32
    out = u >> 13;
  }
  return static_cast<uint16_t>(sign | out);
}

inline float bf16_to_float(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }

// binary32 -> bfloat16, round to nearest even; NaN stays a (quiet) NaN. A select, not a
// branch, so the packing loops (amx.cpp) vectorize.
inline uint16_t float_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x0040u : rounded);
}

inline size_t dtype_size(int32_t dtype) { return dtype == kFp32 ? 4 : 2; }

// Reads element idx of a dtype array as fp32.
inline float load_elem(const void* base, int32_t dtype, int64_t idx) {
  if (dtype == kFp32) return static_cast<const float*>(base)[idx];
  const uint16_t v = static_cast<const uint16_t*>(base)[idx];
  return dtype == kFp16 ? half_to_float(v) : bf16_to_float(v);
}

inline void store_elem(void* base, int32_t dtype, int64_t idx, float v) {
  if (dtype == kFp32) {
    static_cast<float*>(base)[idx] = v;
  } else {
    static_cast<uint16_t*>(base)[idx] = dtype == kFp16 ? float_to_half(v) : float_to_bf16(v);
  }
}

// n contiguous elements -> fp32 (vectorized converters in tile_math.cpp: tiles are
// reconverted for every tile pair, so this is on the hot path).
inline void row_to_float(const void* src, int32_t dtype, float* dst, int64_t n) {
  if (dtype == kFp32) {
    memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  } else if (dtype == kBf16) {
    bf16_row_to_float(static_cast<const uint16_t*>(src), dst, n);
  } else {
    half_row_to_float(static_cast<const uint16_t*>(src), dst, n);
  }
}

// n contiguous elements -> fp32, written with stride dst_stride (tile transposes);
// converted in chunks of 256 (the largest head dim) through a stack buffer.
inline void row_to_float_strided(const void* src, int32_t dtype, float* dst, int64_t dst_stride, int64_t n) {
  float tmp[256];
  for (int64_t c0 = 0; c0 < n; c0 += 256) {
    const int64_t m = n - c0 < 256 ? n - c0 : 256;
    const char* chunk = static_cast<const char*>(src) + c0 * static_cast<int64_t>(dtype_size(dtype));
    row_to_float(chunk, dtype, tmp, m);
    for (int64_t c = 0; c < m; ++c) dst[(c0 + c) * dst_stride] = tmp[c];
  }
}

// fp32 -> n contiguous elements of dtype (round to nearest even).
inline void row_from_float(const float* src, int32_t dtype, void* dst, int64_t n) {
  if (dtype == kFp32) {
    memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  } else if (dtype == kBf16) {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int64_t c = 0; c < n; ++c) d[c] = float_to_bf16(src[c]);
  } else {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int64_t c = 0; c < n; ++c) d[c] = float_to_half(src[c]);
  }
}

// Writes n zeros of dtype.
inline void row_zero(int32_t dtype, void* dst, int64_t n) {
  memset(dst, 0, static_cast<size_t>(n) * dtype_size(dtype));
}

}  // namespace cpu
}  // namespace flashattn
