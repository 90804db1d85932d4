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

FA_AMX_TARGET void amx_rows(const float* x, int64_t ld, int64_t rows, int64_t n, int64_t rows_out, int64_t words,
                            uint32_t* out) {
  for (int64_t r = 0; r < rows_out; ++r) {
    uint32_t* o = out + r * words;
    int64_t t = 0;
    if (r < rows) {
      const float* row = x + r * ld;
      for (; t < n / 2; ++t) o[t] = uint32_t{float_to_bf16(row[2 * t])} | uint32_t{float_to_bf16(row[2 * t + 1])} << 16;
      if (n % 2 != 0) o[t++] = float_to_bf16(row[n - 1]);
    }
    for (; t < words; ++t) o[t] = 0;
  }
}

FA_AMX_TARGET void amx_words_t(const uint16_t* const* rows, int64_t nrows, int64_t n, int64_t words, uint32_t* out,
                               int64_t ldo) {
  const int64_t whole = n / 2;
  for (int64_t t = 0; t < words; ++t) {
    uint32_t* o = out + t * ldo;
    int64_t j = 0;
    if (t < whole) {
      for (; j < nrows; ++j) memcpy(o + j, rows[j] + 2 * t, sizeof(uint32_t));
    } else if (t == whole && n % 2 != 0) {
      for (; j < nrows; ++j) o[j] = rows[j][n - 1];
    }
    for (; j < ldo; ++j) o[j] = 0;
  }
}

FA_AMX_TARGET void amx_pairs(const uint16_t* const* rows, int64_t nrows, int64_t n, int64_t pairs, uint32_t* out,
                             int64_t ldo) {
  for (int64_t t = 0; t < pairs; ++t) {
    uint32_t* o = out + t * ldo;
    int64_t e = 0;
    if (2 * t + 1 < nrows) {
      const uint16_t* lo = rows[2 * t];
      const uint16_t* hi = rows[2 * t + 1];
      for (; e < n; ++e) o[e] = static_cast<uint32_t>(lo[e]) | static_cast<uint32_t>(hi[e]) << 16;
    } else if (2 * t < nrows) {
      const uint16_t* lo = rows[2 * t];
      for (; e < n; ++e) o[e] = lo[e];
    }
    for (; e < ldo; ++e) o[e] = 0;
  }
}

}  // namespace cpu
}  // namespace flashattn
#endif
