// AMX-BF16 tile products and their operand packers (amx.hpp). Compiled with target
// attributes, so the library needs nothing beyond the baseline to load; only a process whose
// set is amx (isa.hpp: the CPU has it and Linux granted the tile data permission) calls
// these functions.
#include "cpu/amx.hpp"

#if FA_HAVE_X86_BUILDS
#include <immintrin.h>
#include <string.h>

#include "cpu/convert.hpp"

#define FA_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))

namespace flashattn {
namespace cpu {
namespace {

// The tile configuration of amx_gemm (ldtilecfg's 64-byte layout, palette 1): tiles 0-3 the
// 2 x 2 C tiles of a 32 x 32 block, 4-5 A's two 16-row tiles, 6-7 B's two 16-column tiles;
// every tile 16 rows of 64 bytes (16 fp32 sums, or 16 words).
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

TileConfig gemm_config() {
  TileConfig c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  return c;
}

}  // namespace

FA_AMX_TARGET void amx_tiles_begin() {
  static const TileConfig config = gemm_config();
  _tile_loadconfig(&config);
}

FA_AMX_TARGET void amx_tiles_end() { _tile_release(); }

FA_AMX_TARGET void amx_gemm(int64_t M, int64_t N, int64_t K2, const uint32_t* A, int64_t lda, const uint32_t* B,
                            int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  const int64_t sa = lda * 4, sb = ldb * 4, sc = ldc * 4;  // row strides in bytes
  // GCC's tile loads do not tell the compiler that they read memory: every store to the
  // operands before this point must be done first.
  __asm__ volatile("" ::: "memory");
  for (int64_t i = 0; i < M; i += 32) {
    const uint32_t* a0 = A + i * lda;
    const uint32_t* a1 = A + (i + 16) * lda;
    int64_t j = 0;
    for (; j + 32 <= N; j += 32) {  // a 32 x 32 block: C tiles 0 1 / 2 3
      float* c0 = C + i * ldc + j;
      float* c1 = c0 + 16 * ldc;
      if (accumulate) {
        _tile_loadd(0, c0, sc);
        _tile_loadd(1, c0 + 16, sc);
        _tile_loadd(2, c1, sc);
        _tile_loadd(3, c1 + 16, sc);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (int64_t t = 0; t < K2; t += kAmxWords) {
        _tile_loadd(4, a0 + t, sa);
        _tile_loadd(5, a1 + t, sa);
        _tile_loadd(6, B + t * ldb + j, sb);
        _tile_loadd(7, B + t * ldb + j + 16, sb);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c0, sc);
      _tile_stored(1, c0 + 16, sc);
      _tile_stored(2, c1, sc);
      _tile_stored(3, c1 + 16, sc);
    }
    if (j < N) {  // the last 16 columns: C tiles 0 / 2
      float* c0 = C + i * ldc + j;
      float* c1 = c0 + 16 * ldc;
      if (accumulate) {
        _tile_loadd(0, c0, sc);
        _tile_loadd(2, c1, sc);
      } else {
        _tile_zero(0);
        _tile_zero(2);
      }
      for (int64_t t = 0; t < K2; t += kAmxWords) {
        _tile_loadd(4, a0 + t, sa);
        _tile_loadd(5, a1 + t, sa);
        _tile_loadd(6, B + t * ldb + j, sb);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 5, 6);
      }
      _tile_stored(0, c0, sc);
      _tile_stored(2, c1, sc);
    }
  }
}

FA_AMX_TARGET void amx_copy_rows(const uint16_t* const* rows, int64_t nrows, int64_t n, int64_t rows_out, int64_t words,
                                 uint32_t* out) {
  for (int64_t r = 0; r < rows_out; ++r) {
    uint16_t* o = reinterpret_cast<uint16_t*>(out + r * words);
    int64_t e = 0;
    if (r < nrows) {
      memcpy(o, rows[r], sizeof(uint16_t) * static_cast<size_t>(n));
      e = n;
    }
    memset(o + e, 0, sizeof(uint16_t) * static_cast<size_t>(2 * words - e));
  }
}

typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

// One round of transpose16: the h-word halves of each 2h-word block exchanged between w[t]
// and w[t + h], for the rows t whose bit h is clear.
#define FA_LO(e) (((e)&H) == 0 ? (e) : 16 + (e)-H)
#define FA_HI(e) (((e)&H) == 0 ? (e) + H : 16 + (e))
#define FA_IDX16(F) F(0), F(1), F(2), F(3), F(4), F(5), F(6), F(7), F(8), F(9), F(10), F(11), F(12), F(13), F(14), F(15)
template <int H>
FA_AMX_TARGET inline void transpose_round(v16u* w) {
  for (int t = 0; t < 16; ++t) {
    if (t & H) continue;
    const v16u a = w[t], b = w[t + H];
    w[t] = __builtin_shufflevector(a, b, FA_IDX16(FA_LO));
    w[t + H] = __builtin_shufflevector(a, b, FA_IDX16(FA_HI));
  }
}
#undef FA_IDX16
#undef FA_HI
#undef FA_LO

// 16 x 16 32-bit words transposed: out[e * ldo + t] = w[t][e].
FA_AMX_TARGET inline void transpose16(v16u* w, uint32_t* out, int64_t ldo) {
  transpose_round<8>(w);
  transpose_round<4>(w);
  transpose_round<2>(w);
  transpose_round<1>(w);
  for (int e = 0; e < 16; ++e) memcpy(out + e * ldo, &w[e], sizeof(v16u));
}

// 16 elements of a bf16 row, widened to words.
FA_AMX_TARGET inline v16u widen16(const uint16_t* p) {
  v16h h;
  memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, v16u);
}

FA_AMX_TARGET void amx_pairs_t(const uint16_t* const* rows, int64_t nrows, int64_t n, int64_t rows_out, uint32_t* out,
                               int64_t ldo) {
  memset(out, 0, sizeof(uint32_t) * static_cast<size_t>(rows_out * ldo));
  for (int64_t t0 = 0; 2 * t0 < nrows; t0 += 16) {
    const int64_t nt = ldo - t0 < 16 ? ldo - t0 : 16;
    int64_t e0 = 0;
    for (; e0 + 16 <= n && nt == 16; e0 += 16) {  // 16 x 16 blocks: rows of pairs, transposed
      v16u w[16];
      for (int t = 0; t < 16; ++t) {
        const int64_t r = 2 * (t0 + t);
        w[t] = r < nrows ? widen16(rows[r] + e0) : v16u{};
        if (r + 1 < nrows) w[t] |= widen16(rows[r + 1] + e0) << 16;
      }
      transpose16(w, out + e0 * ldo + t0, ldo);
    }
    for (int64_t t = t0; t < t0 + nt && 2 * t < nrows; ++t) {  // the rest one word at a time
      const uint16_t* lo = rows[2 * t];
      const uint16_t* hi = 2 * t + 1 < nrows ? rows[2 * t + 1] : nullptr;
      for (int64_t e = e0; e < n; ++e) out[e * ldo + t] = uint32_t{lo[e]} | (hi ? uint32_t{hi[e]} << 16 : 0u);
    }
  }
}

// float_to_bf16 on 16 lanes (the result in the low halves).
FA_AMX_TARGET inline v16u bf16_lanes(const v16u& u) {
  const v16u rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const v16u nan = (v16u)((u & 0x7fffffffu) > 0x7f800000u);
  return (nan & ((u >> 16) | 0x0040u)) | (~nan & rounded);
}

typedef float v16f __attribute__((vector_size(64)));

// 32 elements of an fp32 row, as bits in a (0-15) and b (16-31): elements from n on are 0.
FA_AMX_TARGET inline void load32(const float* x, int64_t n, v16u& a, v16u& b) {
  if (n >= 32) {
    memcpy(&a, x, sizeof a);
    memcpy(&b, x + 16, sizeof b);
    return;
  }
  float f[32] = {};
  if (n > 0) memcpy(f, x, sizeof(float) * static_cast<size_t>(n));
  memcpy(&a, f, sizeof a);
  memcpy(&b, f + 16, sizeof b);
}

// The 16 words (bf(e[2t]), bf(e[2t + 1])) of the 32 fp32 elements e in a, b.
FA_AMX_TARGET inline v16u words16(const v16u& a, const v16u& b) {
  const v16u ra = bf16_lanes(a), rb = bf16_lanes(b);
  return __builtin_shufflevector(ra, rb, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) |
         __builtin_shufflevector(ra, rb, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31) << 16;
}

// e - bf(e) on 16 lanes of fp32 bits (exact: the residual of a rounding to 8 bits).
FA_AMX_TARGET inline v16u residual16(const v16u& e) { return (v16u)((v16f)e - (v16f)(bf16_lanes(e) << 16)); }

// 16 words (bf(x[2t]), bf(x[2t + 1])) of an fp32 row, t < 16: elements from n on are 0.
FA_AMX_TARGET inline v16u row_words16(const float* x, int64_t n) {
  v16u a, b;
  load32(x, n, a, b);
  return words16(a, b);
}

FA_AMX_TARGET void amx_rows_t(const float* x, int64_t ld, int64_t rows, int64_t n, int64_t words, uint32_t* out,
                              int64_t ldo) {
  memset(out, 0, sizeof(uint32_t) * static_cast<size_t>(words * ldo));
  for (int64_t j0 = 0; j0 < rows; j0 += 16) {
    for (int64_t t0 = 0; 2 * t0 < n; t0 += 16) {  // 16 rows x 16 words, transposed
      v16u w[16];
      for (int j = 0; j < 16; ++j) w[j] = j0 + j < rows ? row_words16(x + (j0 + j) * ld + 2 * t0, n - 2 * t0) : v16u{};
      if (t0 + 16 <= words && j0 + 16 <= ldo) {
        transpose16(w, out + t0 * ldo + j0, ldo);
      } else {
        for (int j = 0; j < 16 && j0 + j < ldo; ++j)
          for (int t = 0; t < 16 && t0 + t < words; ++t) out[(t0 + t) * ldo + j0 + j] = w[j][t];
      }
    }
  }
}

FA_AMX_TARGET void amx_words_f(const float* x, int64_t ld, int64_t rows, int64_t n, int64_t rows_out, int64_t words,
                               uint32_t* out, uint32_t* lo) {
  for (int64_t r = 0; r < rows_out; ++r) {
    for (int64_t t0 = 0; t0 < words; t0 += 16) {
      const size_t bytes = sizeof(uint32_t) * static_cast<size_t>(words - t0 < 16 ? words - t0 : 16);
      v16u a{}, b{};
      if (r < rows) load32(x + r * ld + 2 * t0, n - 2 * t0, a, b);
      const v16u w = words16(a, b);
      memcpy(out + r * words + t0, &w, bytes);
      if (lo == nullptr) continue;
      const v16u wl = words16(residual16(a), residual16(b));
      memcpy(lo + r * words + t0, &wl, bytes);
    }
  }
}

// 16 words (bf(lo[j]), bf(hi[j])), j < 16. VCVTNE2PS2BF16 rounds to nearest even as
// float_to_bf16 does, quiets NaNs the same way and flushes subnormal inputs to zero, which
// P never holds: the softmax's exponentials are 0 or at least exp(-87.3) > 2^-126.
FA_AMX_TARGET inline void pair_words16(const float* lo, const float* hi, uint32_t* out) {
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                              6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512 l = _mm512_loadu_ps(lo);
  const __m512 h = hi != nullptr ? _mm512_loadu_ps(hi) : _mm512_setzero_ps();
  const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(h, l);  // l's 16 bf16 below h's
  _mm512_storeu_si512(out, _mm512_permutexvar_epi16(interleave, halves));
}

FA_AMX_TARGET void amx_pairs_f(const float* x, int64_t ld, int64_t rows, int64_t n, int64_t pairs, uint32_t* out,
                               int64_t ldo) {
  for (int64_t t = 0; t < pairs; ++t) {
    uint32_t* o = out + t * ldo;
    int64_t j = 0;
    if (2 * t < rows) {
      const float* lo = x + 2 * t * ld;
      const float* hi = 2 * t + 1 < rows ? lo + ld : nullptr;
      for (; j + 16 <= n; j += 16) pair_words16(lo + j, hi ? hi + j : nullptr, o + j);
      for (; j < n; ++j) o[j] = uint32_t{float_to_bf16(lo[j])} | (hi ? uint32_t{float_to_bf16(hi[j])} << 16 : 0u);
    }
    for (; j < ldo; ++j) o[j] = 0;
  }
}

FA_AMX_TARGET void amx_scale_cols(float* y, int64_t ld, int64_t rows, int64_t n, const float* a) {
  bool ones = true;
  for (int64_t c = 0; c < n; ++c) ones &= a[c] == 1.f;
  if (ones) return;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * ld;
    for (int64_t c = 0; c < n; ++c) row[c] *= a[c];
  }
}

}  // namespace cpu
}  // namespace flashattn
#endif
