// The amx set's tile product and packers (src/cpu/amx.hpp), compiled here from the
// library's sources and run where the set is usable (skipped with its refusal elsewhere).
// The product's inputs are small integers, so every partial sum is an integer below 2^24
// and exact in fp32 whatever the order of the additions: the comparison is bitwise, and a
// wrong layout, a wrong pair order or a lost tile shows as a wrong element.
#include <stdint.h>

#include <algorithm>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "cpu/amx.hpp"
#include "cpu/convert.hpp"
#include "cpu/isa.hpp"

#if FA_HAVE_X86_BUILDS
namespace {

using namespace flashattn::cpu;

// Ends the test case as skipped, with the set's refusal, where the amx set is not usable.
#define REQUIRE_AMX()                                                        \
  do {                                                                       \
    const char* const why = isa_refusal(Isa::kAmx);                          \
    if (why != nullptr) FA_SKIP_TEST(std::string("amx not usable: ") + why); \
  } while (0)

uint32_t pair(uint16_t lo, uint16_t hi) { return uint32_t{lo} | uint32_t{hi} << 16; }

// A small integer in [-4, 4] from (i, j, seed), exact in bf16.
float small(int64_t i, int64_t j, int seed) { return static_cast<float>((i * 7 + j * 13 + seed * 5) % 9 - 4); }

}  // namespace

TEST_CASE("amx: the packers lay out rows, transposed pairs and scaled columns, zeros past the data", "[amx]") {
  REQUIRE_AMX();
  const int64_t rows = 37, n = 45, ld = 50, rows_out = 48, words = 32;
  std::vector<float> x(rows * ld);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < ld; ++k) x[r * ld + k] = 0.37f * small(r, k, 1) + 0.011f * static_cast<float>(k);
  // Rounding ties (to even, down and up), a NaN, zeros and the smallest normal number.
  const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0xbf808001u, 0x7fc00001u,
                              0x00000000u, 0x80000000u, 0x00800000u};
  for (int64_t i = 0; i < 7; ++i) x[(3 * i + 1) * ld + 5 * i + 2] = bits_f32(special[i]);
  const auto bf = [&](int64_t r, int64_t k) -> uint16_t {
    return r < rows && k < n ? float_to_bf16(x[r * ld + k]) : 0;
  };
  const int64_t ldo = 48;
  std::vector<uint32_t> qt(words * ldo, 0xdeadbeefu);
  amx_rows_t(x.data(), ld, rows, n, words, qt.data(), ldo);
  for (int64_t t = 0; t < words; ++t)
    for (int64_t j = 0; j < ldo; ++j) REQUIRE(qt[t * ldo + j] == pair(bf(j, 2 * t), bf(j, 2 * t + 1)));

  const int64_t wrows = 44, wwords = 24;  // rows past the data, and words past it (n = 45: a last odd one)
  std::vector<uint32_t> wf(wrows * wwords, 0xdeadbeefu), wl(wrows * wwords, 0xdeadbeefu);
  amx_words_f(x.data(), ld, rows, n, wrows, wwords, wf.data());
  for (int64_t r = 0; r < wrows; ++r)
    for (int64_t t = 0; t < wwords; ++t) REQUIRE(wf[r * wwords + t] == pair(bf(r, 2 * t), bf(r, 2 * t + 1)));
  const auto res = [&](int64_t r, int64_t k) -> uint16_t {  // bf(x - bf(x)): the exact residual, rounded
    return r < rows && k < n ? float_to_bf16(x[r * ld + k] - bf16_to_float(float_to_bf16(x[r * ld + k]))) : 0;
  };
  std::fill(wf.begin(), wf.end(), 0xdeadbeefu);
  amx_words_f(x.data(), ld, rows, n, wrows, wwords, wf.data(), wl.data());
  for (int64_t r = 0; r < wrows; ++r)
    for (int64_t t = 0; t < wwords; ++t) {
      REQUIRE(wf[r * wwords + t] == pair(bf(r, 2 * t), bf(r, 2 * t + 1)));
      REQUIRE(wl[r * wwords + t] == pair(res(r, 2 * t), res(r, 2 * t + 1)));
    }

  const int64_t pairs = 20;
  std::vector<uint32_t> pf(pairs * ldo, 0xdeadbeefu);
  amx_pairs_f(x.data(), ld, rows, n, pairs, pf.data(), ldo);
  for (int64_t t = 0; t < pairs; ++t)
    for (int64_t j = 0; j < ldo; ++j) REQUIRE(pf[t * ldo + j] == pair(bf(2 * t, j), bf(2 * t + 1, j)));

  std::vector<std::vector<uint16_t>> src(rows, std::vector<uint16_t>(n));
  std::vector<const uint16_t*> ptr(rows);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < n; ++k) src[r][k] = bf(r, k);
    ptr[r] = src[r].data();
  }
  const auto el = [&](int64_t r, int64_t k) -> uint16_t { return r < rows && k < n ? src[r][k] : 0; };
  std::vector<uint32_t> a(rows_out * words, 0xdeadbeefu);
  amx_copy_rows(ptr.data(), rows, n, rows_out, words, a.data());
  for (int64_t r = 0; r < rows_out; ++r)
    for (int64_t t = 0; t < words; ++t) REQUIRE(a[r * words + t] == pair(el(r, 2 * t), el(r, 2 * t + 1)));

  const int64_t ldt = 24;  // pairs of rows: 19 of the 37, the last with one row
  std::vector<uint32_t> vt(rows_out * ldt, 0xdeadbeefu);
  amx_pairs_t(ptr.data(), rows, n, rows_out, vt.data(), ldt);
  for (int64_t e = 0; e < rows_out; ++e)
    for (int64_t t = 0; t < ldt; ++t) REQUIRE(vt[e * ldt + t] == pair(el(2 * t, e), el(2 * t + 1, e)));

  const int64_t cols = 32, ldy = 40;
  std::vector<float> y(rows * ldy), alpha(cols, 1.f);
  for (int64_t i = 0; i < rows * ldy; ++i) y[i] = 0.5f * static_cast<float>(i % 11);
  std::vector<float> y0 = y;
  amx_scale_cols(y.data(), ldy, rows, cols, alpha.data());
  REQUIRE(y == y0);
  alpha[17] = 0.25f;
  amx_scale_cols(y.data(), ldy, rows, cols, alpha.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < ldy; ++c) REQUIRE(y[r * ldy + c] == (c < cols ? alpha[c] : 1.f) * y0[r * ldy + c]);
}

TEST_CASE("amx: the tile product is A B over pairs of k, and accumulates", "[amx]") {
  REQUIRE_AMX();
  const int64_t M = 64, N = 48, K2 = 32, lda = K2 + 3, ldb = N + 5, ldc = N + 7;
  std::vector<uint32_t> A(M * lda), B(K2 * ldb);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t t = 0; t < K2; ++t)
      A[i * lda + t] = pair(float_to_bf16(small(i, 2 * t, 2)), float_to_bf16(small(i, 2 * t + 1, 2)));
  for (int64_t t = 0; t < K2; ++t)
    for (int64_t j = 0; j < N; ++j)
      B[t * ldb + j] = pair(float_to_bf16(small(2 * t, j, 3)), float_to_bf16(small(2 * t + 1, j, 3)));
  std::vector<float> C(M * ldc, -1.f);
  {
    AmxTiles tiles(true);
    amx_gemm(M, N, K2, A.data(), lda, B.data(), ldb, C.data(), ldc, false);
  }
  const auto dot = [&](int64_t i, int64_t j) {
    int64_t s = 0;
    for (int64_t k = 0; k < 2 * K2; ++k)
      s += static_cast<int64_t>(small(i, k, 2)) * static_cast<int64_t>(small(k, j, 3));
    return static_cast<float>(s);
  };
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) REQUIRE(C[i * ldc + j] == dot(i, j));
  {
    AmxTiles tiles(true);
    amx_gemm(M, N, K2, A.data(), lda, B.data(), ldb, C.data(), ldc, true);
  }
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) REQUIRE(C[i * ldc + j] == 2 * dot(i, j));
}
#else
TEST_CASE("amx: the tile product and packers", "[amx]") { FA_SKIP_TEST("this build has no x86-64 instruction sets"); }
#endif
