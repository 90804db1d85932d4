// Bodies of the tile kernels (tile_math.hpp), included by tile_math.cpp once per
// instruction set inside its own namespace, with FA_TARGET set to that instruction
// set's target attribute (empty for the baseline). Not a standalone header: it relies
// on <math.h>, <stdint.h> and <string.h> being included before the namespace opens.
//
// GCC/Clang vector extension: 8 floats, one AVX register in the AVX2 build, two SSE
// registers in the baseline build. Explicit vectors because the autovectorizer
// turns the register-blocked loop nest below into shuffles instead of broadcasts.
// Helpers take and return vectors by reference only: passing a 32-byte vector by
// value is an ABI error in Clang (and a warning in GCC) when AVX is not enabled, which
// is the case in the baseline build.
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));

FA_TARGET FA_ALWAYS_INLINE void load8(v8f& v, const float* p) { memcpy(&v, p, sizeof v); }
FA_TARGET FA_ALWAYS_INLINE void store8(float* p, const v8f& v) { memcpy(p, &v, sizeof v); }

// m ? a : b for a lane mask m (all ones / all zeros per lane), as bit operations.
#ifndef FA_SELECT
#define FA_SELECT(m, a, b) ((v8f)((((v8i)(a)) & (m)) | (((v8i)(b)) & ~(m))))
#endif

// exp(x) = 2^n * e^r with n = round(x / ln2), r = x - n ln2 (Cody-Waite two-part ln2),
// e^r by a degree-7 Taylor polynomial (|r| <= ln2/2: truncation < 4e-9 relative).
// Branch-free on 8 lanes; inputs below -87.3 (including -inf) give 0, the subnormal
// range being irrelevant for softmax weights; NaN stays NaN.
FA_TARGET FA_ALWAYS_INLINE void exp8(const v8f& x, v8f& out) {
  const v8f lo = v8f{} - 87.3f, hi = v8f{} + 88.f;
  const v8i under = x < lo;
  v8f xc = FA_SELECT(under, lo, x);
  const v8i over = xc > hi;
  xc = FA_SELECT(over, hi, xc);
  const v8f shift = v8f{} + 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const v8f t = xc * 1.44269504088896341f + shift;
  const v8f n = t - shift;
  v8f r = xc - n * 0.693145751953125f;
  r = r - n * 1.42860682030941723212e-6f;
  v8f q = v8f{} + 1.f / 5040.f;
  q = q * r + 1.f / 720.f;
  q = q * r + 1.f / 120.f;
  q = q * r + 1.f / 24.f;
  q = q * r + 1.f / 6.f;
  q = q * r + 0.5f;
  q = q * r + 1.f;
  q = q * r + 1.f;
  // The low mantissa bits of t hold n; (n + 127) << 23 is the fp32 bit pattern of 2^n.
  const v8u bits = ((v8u)t + 127u) << 23;
  const v8f e = q * (v8f)bits;
  const v8f zero = v8f{};
  out = FA_SELECT(under, zero, e);
}

// Scalar version of the same computation (lane 0 of exp8), for per-row factors.
FA_TARGET FA_ALWAYS_INLINE float exp1(float x) {
  const v8f xv = {x, x, x, x, x, x, x, x};
  v8f e;
  exp8(xv, e);
  return e[0];
}

// Exact binary16 -> binary32 on 8 lanes (same cases as half_to_float in convert.hpp).
FA_TARGET FA_ALWAYS_INLINE void half8_to_float(const uint16_t* src, v8f& out) {
  v8u h;
  for (int l = 0; l < 8; ++l) h[l] = src[l];
  const v8u sign = (h & 0x8000u) << 16;
  const v8u exp = (h >> 10) & 0x1fu;
  const v8u mant = h & 0x3ffu;
  const v8f sub = __builtin_convertvector((v8i)mant, v8f) * 5.9604644775390625e-08f;
  const v8u normal = ((exp + 112u) << 23) | (mant << 13);
  const v8u special = 0x7f800000u | (mant << 13);
  const v8i is_sub = (v8i)(exp == 0u), is_special = (v8i)(exp == 31u);
  v8f body = FA_SELECT(is_special, (v8f)special, (v8f)normal);
  body = FA_SELECT(is_sub, sub, body);
  out = (v8f)(sign | (v8u)body);
}

// MR x 16 register tile of C: 2*MR accumulators + 2 B vectors + 1 broadcast (MR = 6
// uses 15 of the 16 AVX registers). Each C element sums k in increasing order.
template <int MR>
FA_TARGET FA_ALWAYS_INLINE void micro_tile(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                                           float* C, int64_t ldc, bool accumulate) {
  v8f c0[MR], c1[MR];
  for (int r = 0; r < MR; ++r) {
    if (accumulate) {
      load8(c0[r], C + r * ldc);
      load8(c1[r], C + r * ldc + 8);
    } else {
      c0[r] = v8f{};
      c1[r] = v8f{};
    }
  }
  for (int64_t k = 0; k < K; ++k) {
    v8f b0, b1;
    load8(b0, B + k * ldb);
    load8(b1, B + k * ldb + 8);
    for (int r = 0; r < MR; ++r) {
      const float x = A[r * lda + k];
      const v8f a = {x, x, x, x, x, x, x, x};  // a broadcast load ("0 + x" would keep an add)
      c0[r] += a * b0;
      c1[r] += a * b1;
    }
  }
  for (int r = 0; r < MR; ++r) {
    store8(C + r * ldc, c0[r]);
    store8(C + r * ldc + 8, c1[r]);
  }
}

// Blocked over K (kKBlock) and N (kNBlock) so that the B panel being swept stays in L2
// when the standard path multiplies whole rows of S (N, K up to seqlen); the sum over
// k stays in increasing order (each micro tile reloads C and continues), so blocking
// does not change results. Flash tiles fit in one block.
FA_TARGET void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                    int64_t ldc, bool accumulate) {
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

FA_TARGET float row_max(const float* x, int64_t n) {
  v8f m0 = v8f{} - INFINITY, m1 = m0;
  for (int64_t j = 0; j < n; j += 16) {
    v8f a, b;
    load8(a, x + j);
    load8(b, x + j + 8);
    const v8i ga = a > m0, gb = b > m1;
    m0 = FA_SELECT(ga, a, m0);
    m1 = FA_SELECT(gb, b, m1);
  }
  float m = m0[0];
  for (int l = 0; l < 8; ++l) {
    m = m0[l] > m ? m0[l] : m;
    m = m1[l] > m ? m1[l] : m;
  }
  return m;
}

FA_TARGET float exp_sub_sum(float* x, int64_t n, float m) {
  // 16 lane sums combined in a fixed order: vectorized and deterministic.
  v8f s0 = v8f{}, s1 = v8f{};
  for (int64_t j = 0; j < n; j += 16) {
    v8f a, b, e0, e1;
    load8(a, x + j);
    load8(b, x + j + 8);
    a = a - m;
    b = b - m;
    exp8(a, e0);
    exp8(b, e1);
    store8(x + j, e0);
    store8(x + j + 8, e1);
    s0 += e0;
    s1 += e1;
  }
  const v8f s = s0 + s1;
  float total = 0.f;
  for (int l = 0; l < 8; ++l) total += s[l];
  return total;
}

FA_TARGET void exp_sub_vec(float* x, const float* m, int64_t n) {
  for (int64_t j = 0; j < n; j += 8) {
    v8f a, b, e;
    load8(a, x + j);
    load8(b, m + j);
    a = a - b;
    exp8(a, e);
    store8(x + j, e);
  }
}

FA_TARGET void exp_sub(float* x, int64_t n, float m) {
  for (int64_t j = 0; j < n; j += 8) {
    v8f a, e;
    load8(a, x + j);
    a = a - m;
    exp8(a, e);
    store8(x + j, e);
  }
}

FA_TARGET void scale_row(float* y, int64_t n, float a) {
  for (int64_t j = 0; j < n; j += 8) {
    v8f v;
    load8(v, y + j);
    v = v * a;
    store8(y + j, v);
  }
}

FA_TARGET float dot(const float* a, const float* b, int64_t n) {
  v8f s0 = v8f{}, s1 = v8f{};
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    v8f a0, a1, b0, b1;
    load8(a0, a + j);
    load8(a1, a + j + 8);
    load8(b0, b + j);
    load8(b1, b + j + 8);
    s0 += a0 * b0;
    s1 += a1 * b1;
  }
  const v8f s = s0 + s1;
  float total = 0.f;
  for (int l = 0; l < 8; ++l) total += s[l];
  for (; j < n; ++j) total += a[j] * b[j];
  return total;
}

FA_TARGET void half_row_to_float(const uint16_t* src, float* dst, int64_t n) {
  int64_t j = 0;
#if defined(FA_ISA_F16C)
  // F16C converts 8 halves per instruction, exactly (subnormals, inf, NaN included).
  for (; j + 8 <= n; j += 8) {
    _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j))));
  }
#else
  for (; j + 8 <= n; j += 8) {
    v8f v;
    half8_to_float(src + j, v);
    store8(dst + j, v);
  }
#endif
  if (j < n) {
    uint16_t tail[8] = {};
    for (int64_t l = j; l < n; ++l) tail[l - j] = src[l];
    v8f v;
    half8_to_float(tail, v);
    for (int64_t l = j; l < n; ++l) dst[l] = v[l - j];
  }
}

FA_TARGET void bf16_row_to_float(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t u = static_cast<uint32_t>(src[j]) << 16;
    memcpy(dst + j, &u, sizeof u);
  }
}

FA_TARGET void ds_rows(float* p, float* dp, const float* drop, const float* delta, int64_t delta_step, int64_t n) {
  // delta_step 0: one Delta for the row (normal tile); 1: Delta per element (S^T tile).
  for (int64_t j = 0; j < n; ++j) {
    const float d = drop ? drop[j] : 1.f;
    const float pr = p[j];
    dp[j] = pr * (dp[j] * d - delta[j * delta_step]);
    p[j] = pr * d;
  }
}

FA_TARGET void mul_row(float* y, const float* g, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] *= g[j];
}

FA_TARGET float exp_scalar(float x) { return exp1(x); }
