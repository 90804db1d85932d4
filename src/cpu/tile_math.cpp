#include "cpu/tile_math.hpp"

#include <math.h>
#include <string.h>

// The 32-byte vector helpers below are always inlined into their callers, so the
// "ABI changes without AVX" note GCC gives for the baseline clone does not apply.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

// Function multiversioning needs ifunc support (glibc on x86-64). Elsewhere the
// baseline build is the only one.
#if defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__) && \
    (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 11))
#define FA_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define FA_CPU_CLONES
#endif
#define FA_ALWAYS_INLINE inline __attribute__((always_inline))

namespace flashattn {
namespace cpu {
namespace {

// GCC/Clang vector extension: 8 floats, one AVX register in the x86-64-v3 clone, two
// SSE registers in the baseline clone. Explicit vectors because the autovectorizer
// turns the register-blocked loop nest below into shuffles instead of broadcasts.
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));

FA_ALWAYS_INLINE v8f loadu8(const float* p) {
  v8f v;
  memcpy(&v, p, sizeof v);
  return v;
}
FA_ALWAYS_INLINE void storeu8(float* p, v8f v) { memcpy(p, &v, sizeof v); }
FA_ALWAYS_INLINE v8f splat(float x) { return v8f{} + x; }
// m ? a : b for a lane mask m (all ones / all zeros per lane), as bit operations.
FA_ALWAYS_INLINE v8f select(v8i m, v8f a, v8f b) { return (v8f)(((v8i)a & m) | ((v8i)b & ~m)); }

// exp(x) = 2^n * e^r with n = round(x / ln2), r = x - n ln2 (Cody-Waite two-part ln2),
// e^r by a degree-7 Taylor polynomial (|r| <= ln2/2: truncation < 4e-9 relative).
// Branch-free on 8 lanes; inputs below -87.3 (including -inf) give 0, the subnormal
// range being irrelevant for softmax weights; NaN stays NaN.
FA_ALWAYS_INLINE v8f exp8(v8f x) {
  const v8f lo = splat(-87.3f), hi = splat(88.f);
  const v8i under = x < lo;
  v8f xc = select(under, lo, x);
  xc = select(xc > hi, hi, xc);
  const v8f shift = splat(12582912.f);  // 1.5 * 2^23: adding it rounds to an integer
  const v8f t = xc * 1.44269504088896341f + shift;
  const v8f n = t - shift;
  v8f r = xc - n * 0.693145751953125f;
  r = r - n * 1.42860682030941723212e-6f;
  v8f q = splat(1.f / 5040.f);
  q = q * r + 1.f / 720.f;
  q = q * r + 1.f / 120.f;
  q = q * r + 1.f / 24.f;
  q = q * r + 1.f / 6.f;
  q = q * r + 0.5f;
  q = q * r + 1.f;
  q = q * r + 1.f;
  // The low mantissa bits of t hold n; (n + 127) << 23 is the fp32 bit pattern of 2^n.
  const v8u bits = ((v8u)t + 127u) << 23;
  return select(under, v8f{}, q * (v8f)bits);
}

// Scalar version of the same computation (lane 0 of exp8), for per-row factors.
FA_ALWAYS_INLINE float exp1(float x) { return exp8(splat(x))[0]; }

// Exact binary16 -> binary32 on 8 lanes (same cases as half_to_float in convert.hpp).
FA_ALWAYS_INLINE v8f half8_to_float(const uint16_t* src) {
  v8u h;
  for (int l = 0; l < 8; ++l) h[l] = src[l];
  const v8u sign = (h & 0x8000u) << 16;
  const v8u exp = (h >> 10) & 0x1fu;
  const v8u mant = h & 0x3ffu;
  const v8f sub = __builtin_convertvector((v8i)mant, v8f) * 5.9604644775390625e-08f;
  const v8u normal = ((exp + 112u) << 23) | (mant << 13);
  const v8u special = 0x7f800000u | (mant << 13);
  const v8i is_sub = (v8i)(exp == 0u), is_special = (v8i)(exp == 31u);
  v8u body = (v8u)select(is_special, (v8f)special, (v8f)normal);
  body = (v8u)select(is_sub, sub, (v8f)body);
  return (v8f)(sign | body);
}

// MR x 16 register tile of C: 2*MR accumulators + 2 B vectors + 1 broadcast (MR = 6
// uses 15 of the 16 AVX registers). Each C element sums k in increasing order.
template <int MR>
FA_ALWAYS_INLINE void micro_tile(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                                 int64_t ldc, bool accumulate) {
  v8f c0[MR], c1[MR];
  for (int r = 0; r < MR; ++r) {
    if (accumulate) {
      c0[r] = loadu8(C + r * ldc);
      c1[r] = loadu8(C + r * ldc + 8);
    } else {
      c0[r] = v8f{};
      c1[r] = v8f{};
    }
  }
  for (int64_t k = 0; k < K; ++k) {
    const v8f b0 = loadu8(B + k * ldb), b1 = loadu8(B + k * ldb + 8);
    for (int r = 0; r < MR; ++r) {
      const v8f a = v8f{} + A[r * lda + k];
      c0[r] += a * b0;
      c1[r] += a * b1;
    }
  }
  for (int r = 0; r < MR; ++r) {
    storeu8(C + r * ldc, c0[r]);
    storeu8(C + r * ldc + 8, c1[r]);
  }
}

}  // namespace

// Blocked over K (kKBlock) and N (kNBlock) so that the B panel being swept stays in L2
// when the standard path multiplies whole rows of S (N, K up to seqlen); the sum over
// k stays in increasing order (each micro tile reloads C and continues), so blocking
// does not change results. Flash tiles fit in one block.
FA_CPU_CLONES void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                        int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  constexpr int64_t kKBlock = 256, kNBlock = 256;
  if (K == 0) {
    if (!accumulate) {
      for (int64_t i = 0; i < M; ++i) memset(C + i * ldc, 0, sizeof(float) * static_cast<size_t>(N));
    }
    return;
  }
  for (int64_t kb = 0; kb < K; kb += kKBlock) {
    const int64_t kc = K - kb < kKBlock ? K - kb : kKBlock;
    const bool acc = accumulate || kb > 0;
    for (int64_t jb = 0; jb < N; jb += kNBlock) {
      const int64_t je = N - jb < kNBlock ? N : jb + kNBlock;
      int64_t i = 0;
      for (; i + 6 <= M; i += 6) {
        for (int64_t j = jb; j < je; j += 16) {
          micro_tile<6>(kc, A + i * lda + kb, lda, B + kb * ldb + j, ldb, C + i * ldc + j, ldc, acc);
        }
      }
      for (; i + 2 <= M; i += 2) {
        for (int64_t j = jb; j < je; j += 16) {
          micro_tile<2>(kc, A + i * lda + kb, lda, B + kb * ldb + j, ldb, C + i * ldc + j, ldc, acc);
        }
      }
      for (; i < M; ++i) {
        for (int64_t j = jb; j < je; j += 16) {
          micro_tile<1>(kc, A + i * lda + kb, lda, B + kb * ldb + j, ldb, C + i * ldc + j, ldc, acc);
        }
      }
    }
  }
}

FA_CPU_CLONES float row_max(const float* x, int64_t n) {
  v8f m0 = splat(-INFINITY), m1 = m0;
  for (int64_t j = 0; j < n; j += 16) {
    const v8f a = loadu8(x + j), b = loadu8(x + j + 8);
    m0 = select(a > m0, a, m0);
    m1 = select(b > m1, b, m1);
  }
  m0 = select(m1 > m0, m1, m0);
  float m = m0[0];
  for (int l = 1; l < 8; ++l) m = m0[l] > m ? m0[l] : m;
  return m;
}

FA_CPU_CLONES float exp_sub_sum(float* x, int64_t n, float m) {
  // 16 lane sums combined in a fixed order: vectorized and deterministic.
  v8f s0 = v8f{}, s1 = v8f{};
  const v8f mv = splat(m);
  for (int64_t j = 0; j < n; j += 16) {
    const v8f e0 = exp8(loadu8(x + j) - mv), e1 = exp8(loadu8(x + j + 8) - mv);
    storeu8(x + j, e0);
    storeu8(x + j + 8, e1);
    s0 += e0;
    s1 += e1;
  }
  const v8f s = s0 + s1;
  float total = 0.f;
  for (int l = 0; l < 8; ++l) total += s[l];
  return total;
}

FA_CPU_CLONES void exp_sub_vec(float* x, const float* m, int64_t n) {
  for (int64_t j = 0; j < n; j += 8) storeu8(x + j, exp8(loadu8(x + j) - loadu8(m + j)));
}

FA_CPU_CLONES void exp_sub(float* x, int64_t n, float m) {
  const v8f mv = splat(m);
  for (int64_t j = 0; j < n; j += 8) storeu8(x + j, exp8(loadu8(x + j) - mv));
}

FA_CPU_CLONES void scale_row(float* y, int64_t n, float a) {
  const v8f av = splat(a);
  for (int64_t j = 0; j < n; j += 8) storeu8(y + j, loadu8(y + j) * av);
}

FA_CPU_CLONES float dot(const float* a, const float* b, int64_t n) {
  v8f s0 = v8f{}, s1 = v8f{};
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    s0 += loadu8(a + j) * loadu8(b + j);
    s1 += loadu8(a + j + 8) * loadu8(b + j + 8);
  }
  const v8f s = s0 + s1;
  float total = 0.f;
  for (int l = 0; l < 8; ++l) total += s[l];
  for (; j < n; ++j) total += a[j] * b[j];
  return total;
}

FA_CPU_CLONES void half_row_to_float(const uint16_t* src, float* dst, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) storeu8(dst + j, half8_to_float(src + j));
  if (j < n) {
    uint16_t tail[8] = {};
    for (int64_t l = j; l < n; ++l) tail[l - j] = src[l];
    const v8f v = half8_to_float(tail);
    for (int64_t l = j; l < n; ++l) dst[l] = v[l - j];
  }
}

FA_CPU_CLONES void bf16_row_to_float(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t u = static_cast<uint32_t>(src[j]) << 16;
    memcpy(dst + j, &u, sizeof u);
  }
}

FA_CPU_CLONES void ds_rows(float* p, float* dp, const float* drop, const float* delta, int64_t delta_step,
                           int64_t n) {
  // delta_step 0: one Delta for the row (normal tile); 1: Delta per element (S^T tile).
  for (int64_t j = 0; j < n; ++j) {
    const float d = drop ? drop[j] : 1.f;
    const float pr = p[j];
    dp[j] = pr * (dp[j] * d - delta[j * delta_step]);
    p[j] = pr * d;
  }
}

FA_CPU_CLONES void mul_row(float* y, const float* g, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] *= g[j];
}

float exp_scalar(float x) { return exp1(x); }

}  // namespace cpu
}  // namespace flashattn
