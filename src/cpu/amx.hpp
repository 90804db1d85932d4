// AMX-BF16 tile products of the amx instruction set (isa.hpp): the bf16 forward's K Q^T and
// V^T P^T (flash_fwd.cpp), the bf16 backward's K Q^T, V dO^T, Z^T dO, dS^T Q and dS K
// (flash_bwd.cpp), and the packers that lay their operands out for the tiles.
//
// Operands are 32-bit words, each holding one pair of bf16 elements along the product's
// inner index k (element 2t in the low half, 2t + 1 in the high half):
//   A, rows of words:  A[i * lda + t] = (a(i, 2t), a(i, 2t + 1))  (a stored bf16 row),
//   B, rows of pairs:  B[t * ldb + j] = (b(2t, j), b(2t + 1, j)).
// tdpbf16ps (Intel SDM) sums one tile row's 16 words per C element in two fp32 lane sums
// from 0 (the pairs' low products, and their high ones), then adds low + high to C: round to
// nearest even, bf16 inputs and fp32 results below 2^-126 taken as 0, MXCSR unused. amx_gemm
// steps k in whole tile rows from t = 0, so each C element is one fixed sequence of fp32
// operations whatever the blocking, the thread or the thread count.
//
// A thread multiplies between amx_tiles_begin and amx_tiles_end (AmxTiles), which load and
// release the tile configuration: loaded per run and per team member, so that another
// library's tile use on the same thread between runs (oneDNN's, in a process that also
// runs PyTorch) cannot leave a different configuration behind.
#pragma once
#include <stdint.h>

#include "cpu/isa.hpp"

#if FA_HAVE_X86_BUILDS
namespace flashattn {
namespace cpu {

constexpr int64_t kAmxWords = 16;  // words per tile row: the k step of one tdpbf16ps (32 bf16)

// Words of an operand row holding n elements of k: n in bf16 pairs, padded with zero pairs
// to whole tile rows (a multiple of kAmxWords, amx_gemm's K2 unit).
inline int64_t amx_words(int64_t n) { return (n + 2 * kAmxWords - 1) / (2 * kAmxWords) * kAmxWords; }

void amx_tiles_begin();
void amx_tiles_end();

// The calling thread's tiles, configured for amx_gemm while it lives (when on).
class AmxTiles {
 public:
  explicit AmxTiles(bool on) : on_(on) {
    if (on_) amx_tiles_begin();
  }
  ~AmxTiles() {
    if (on_) amx_tiles_end();
  }
  AmxTiles(const AmxTiles&) = delete;
  AmxTiles& operator=(const AmxTiles&) = delete;

 private:
  bool on_;
};

// C[M x N] = (accumulate ? C : 0) + A B over K2 words (2 K2 elements of k); M % 32 == 0,
// N % 16 == 0, K2 % kAmxWords == 0. Row strides lda, ldb in words, ldc in floats.
void amx_gemm(int64_t M, int64_t N, int64_t K2, const uint32_t* A, int64_t lda, const uint32_t* B, int64_t ldb,
              float* C, int64_t ldc, bool accumulate);

// The packers below read rows given as pointers (row j at rows[j], n elements), or fp32
// rows x(r, k) = x[r * ld + k], and write zeros wherever a row or element is past the data.
// bf(f) is f rounded to bf16 (nearest even, float_to_bf16).

// A operand copied from bf16 rows: out[r * words + t] = word t of row r (an odd n's last
// word with a zero high half) for r < nrows, else 0; r < rows_out, t < words.
void amx_copy_rows(const uint16_t* const* rows, int64_t nrows, int64_t n, int64_t rows_out, int64_t words,
                   uint32_t* out);

// A operand rounded from fp32 rows: out[r * words + t] = (bf(x(r, 2t)), bf(x(r, 2t + 1))) for
// r < rows and k < n, else 0; r < rows_out, t < words. Its bf16 rows (word t of row r holds
// elements 2t, 2t + 1) are also rows for amx_pairs_t. With lo, the residuals too, laid out
// the same: lo's elements bf(x - bf(x)), so that bf(x) + lo carries 16 significant bits of x
// (two products, out's and lo's, give the fp32 operand's product to about 2^-17).
void amx_words_f(const float* x, int64_t ld, int64_t rows, int64_t n, int64_t rows_out, int64_t words, uint32_t* out,
                 uint32_t* lo = nullptr);

// A operand transposed from pairs of bf16 rows: out[e * ldo + t] = (row 2t [e], row 2t + 1 [e])
// for e < n, else 0; e < rows_out, t < ldo.
void amx_pairs_t(const uint16_t* const* rows, int64_t nrows, int64_t n, int64_t rows_out, uint32_t* out, int64_t ldo);

// B operand transposed from fp32 rows: out[t * ldo + j] = (bf(x(j, 2t)), bf(x(j, 2t + 1)))
// for j < rows and k < n; t < words, j < ldo.
void amx_rows_t(const float* x, int64_t ld, int64_t rows, int64_t n, int64_t words, uint32_t* out, int64_t ldo);

// B operand from pairs of fp32 rows: out[t * ldo + j] = (bf(x(2t, j)), bf(x(2t + 1, j))) for
// rows below `rows` and j < n; t < pairs, j < ldo. Subnormal x count as 0 (probabilities
// P are 0 or normal: softmax weights below exp(-87.3) are 0).
void amx_pairs_f(const float* x, int64_t ld, int64_t rows, int64_t n, int64_t pairs, uint32_t* out, int64_t ldo);

// y[r * ld + c] *= a[c] for r < rows, c < n, unless every a[c] is 1 (the rescale of
// transposed accumulators by the online softmax's factors).
void amx_scale_cols(float* y, int64_t ld, int64_t rows, int64_t n, const float* a);

}  // namespace cpu
}  // namespace flashattn
#endif
