#include "cpu/tile_math.hpp"

#include <math.h>
#include <string.h>

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

// exp(x) = 2^n * e^r with n = round(x / ln2), r = x - n ln2 (Cody-Waite two-part ln2),
// e^r by a degree-7 Taylor polynomial (|r| <= ln2/2: truncation < 4e-9 relative).
// Branch-free so loops over it vectorize; inputs below -87.3 (including -inf) give 0,
// the subnormal range being irrelevant for softmax weights.
FA_ALWAYS_INLINE float exp_poly(float x) {
  const float xc = x < -87.3f ? -87.3f : (x > 88.f ? 88.f : x);
  const float kShift = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = xc * 1.44269504088896341f + kShift;
  const float n = t - kShift;
  float r = xc - n * 0.693145751953125f;
  r = r - n * 1.42860682030941723212e-6f;
  float q = 1.f / 5040.f;
  q = q * r + 1.f / 720.f;
  q = q * r + 1.f / 120.f;
  q = q * r + 1.f / 24.f;
  q = q * r + 1.f / 6.f;
  q = q * r + 0.5f;
  q = q * r + 1.f;
  q = q * r + 1.f;
  uint32_t tb;
  memcpy(&tb, &t, sizeof tb);
  // The low mantissa bits of t hold n (two's complement within the 2^22 window).
  const uint32_t bits = (tb + 127u) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  const float e = q * scale;
  return x < -87.3f ? 0.f : e;
}

// 4 x 16 register tile: 8 AVX accumulators + 2 B vectors + 1 broadcast.
template <int MR>
FA_ALWAYS_INLINE void micro_tile(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                                 int64_t ldc, bool accumulate) {
  float c[MR][16];
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < 16; ++j) c[r][j] = accumulate ? C[r * ldc + j] : 0.f;
  }
  for (int64_t k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    for (int r = 0; r < MR; ++r) {
      const float a = A[r * lda + k];
      for (int j = 0; j < 16; ++j) c[r][j] += a * b[j];
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < 16; ++j) C[r * ldc + j] = c[r][j];
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
      for (; i + 4 <= M; i += 4) {
        for (int64_t j = jb; j < je; j += 16) {
          micro_tile<4>(kc, A + i * lda + kb, lda, B + kb * ldb + j, ldb, C + i * ldc + j, ldc, acc);
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
  float lane[16];
  for (int l = 0; l < 16; ++l) lane[l] = -INFINITY;
  for (int64_t j = 0; j < n; j += 16) {
    for (int l = 0; l < 16; ++l) lane[l] = x[j + l] > lane[l] ? x[j + l] : lane[l];
  }
  float m = lane[0];
  for (int l = 1; l < 16; ++l) m = lane[l] > m ? lane[l] : m;
  return m;
}

FA_CPU_CLONES float exp_sub_sum(float* x, int64_t n, float m) {
  // Per-lane partial sums, combined in a fixed order: vectorizable and deterministic.
  float lane[16] = {};
  for (int64_t j = 0; j < n; j += 16) {
    for (int l = 0; l < 16; ++l) {
      const float e = exp_poly(x[j + l] - m);
      x[j + l] = e;
      lane[l] += e;
    }
  }
  float s = 0.f;
  for (int l = 0; l < 16; ++l) s += lane[l];
  return s;
}

FA_CPU_CLONES void exp_sub_vec(float* x, const float* m, int64_t n) {
  for (int64_t j = 0; j < n; ++j) x[j] = exp_poly(x[j] - m[j]);
}

FA_CPU_CLONES void exp_sub(float* x, int64_t n, float m) {
  for (int64_t j = 0; j < n; ++j) x[j] = exp_poly(x[j] - m);
}

FA_CPU_CLONES void scale_row(float* y, int64_t n, float a) {
  for (int64_t j = 0; j < n; ++j) y[j] *= a;
}

float exp_scalar(float x) { return exp_poly(x); }

}  // namespace cpu
}  // namespace flashattn
