// The hot loops of the CPU backend on fp32 tiles: a small GEMM and the softmax row
// operations. Everything O(tile * head_dim) or O(tile^2) per tile goes through here.
//
// Portability vs speed: the library is built for the baseline ISA (no -march), so these
// functions are compiled twice (baseline and AVX2+FMA, see tile_math.cpp) and the best
// build for the running CPU is picked on first use. Results on one machine are
// deterministic; the two builds may differ in the last bit (FMA contraction).
//
// Shapes: every tile is row-major with an explicit leading dimension; the N extent of a
// GEMM is a multiple of kTileN (tiles are padded), which lets the inner loops run
// without tails.
#pragma once
#include <stdint.h>

namespace flashattn {
namespace cpu {

constexpr int64_t kTileN = 16;  // column padding unit (two AVX registers)

// C[M x N] = (accumulate ? C : 0) + A[M x K] * B[K x N]; N % kTileN == 0.
// Each C element is summed over k in increasing order.
void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
          int64_t ldc, bool accumulate);

// gemm accumulating (C += A B) with B of 16-bit elements, bf16 (bf16 true) or fp16,
// converted to fp32 as they are read: the same bits as gemm on B converted first.
void gemm_h(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B, int64_t ldb, float* C,
            int64_t ldc, bool bf16);

// The same with A given transposed: C = (accumulate ? C : 0) + At^T B, At[K x M] row-major
// (A's element (i, k) at At[k * lda + i]); the same sums in the same order as gemm on A.
void gemm_at(int64_t M, int64_t N, int64_t K, const float* At, int64_t lda, const float* B, int64_t ldb, float* C,
             int64_t ldc, bool accumulate);

// C = scale * (A Bp) with B packed in kTileN-column panels: Bp[j / kTileN][k][j % kTileN]
// (the layout pack_panels writes), so that sweeping a panel reads consecutive cache lines.
// Each element is the sum gemm computes on the unpacked B, rounded, times scale, rounded:
// the bits of gemm followed by scale_rows.
void gemm_panels(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* Bp, float* C, int64_t ldc,
                 float scale);

// gemm (a_transposed false) or gemm_at (true) with the loops in the other order: each
// kTileN-column slab of B through all M rows before the next. The same bits; faster where
// A is small and hot and B does not fit L1 beside it (the backward's dQ += dS K).
void gemm_slabs(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                int64_t ldc, bool accumulate, bool a_transposed);

// The vector loops below require n % kTileN == 0 unless stated.

// max over x[0..n), n % kTileN == 0; -inf for an all -inf row.
float row_max(const float* x, int64_t n);

// x[j] = exp(x[j] - m) for j < n (n % kTileN == 0); returns the sum of the new values in
// a fixed order. exp(-inf) = 0. m must be finite.
float exp_sub_sum(float* x, int64_t n, float m);

// x[j] = exp(x[j] - m) (m may be +inf).
void exp_sub(float* x, int64_t n, float m);

// y[r * ld + j] *= a for r < rows, j < n (n % kLanes == 0: n % kTileN == 0 will do).
void scale_rows(float* y, int64_t ld, int64_t rows, int64_t n, float a);

// One key tile of the forward's online softmax on rows [0, rows) of the score tile s
// (row stride lds, n % kTileN == 0 columns, padding -inf), with the running row max m,
// row sum l and output accumulators acc[r * ldacc + c], c < nacc (nacc % kTileN == 0):
//   m' = max(m, rowmax s),  s = exp(s - m'),  alpha = exp(m - m'),
//   l = l * alpha + rowsum s,  acc *= alpha (skipped when alpha = 1),  m = m'.
// A row whose m' is -inf (every score so far masked, or NaN) is exponentiated against 0
// and keeps m = -inf: l stays 0 for masked scores and becomes NaN for a NaN score.
void online_softmax(float* s, int64_t lds, int64_t rows, int64_t n, float* m, float* l, float* acc, int64_t ldacc,
                    int64_t nacc);

// The same on a transposed score tile: s[k * lds + c] is the score of query row c (a
// column, c < n, n % kTileN == 0) against key k < rows; m, l, acc as above, per column.
// Each column's sum over k runs in increasing k. alpha[c] receives the rescale factor
// (scratch of n floats).
void online_softmax_cols(float* s, int64_t lds, int64_t rows, int64_t n, float* m, float* l, float* alpha, float* acc,
                         int64_t ldacc, int64_t nacc);

// sum a[j] * b[j] for any n (16 lane sums in a fixed order, then the tail).
float dot(const float* a, const float* b, int64_t n);

// C[i][j] = dot(A row i, B row j) for i < M, j < N over K elements (A B^T with B
// row-major: the scores of a few query rows, without transposing K).
void dot_rows(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
              int64_t ldc);

// dot_rows with B rows of 16-bit elements, bf16 (bf16 true) or fp16, converted to fp32 as
// they are read: the same bits as dot_rows on B converted first.
void dot_rows_h(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B, int64_t ldb, float* C,
                int64_t ldc, bool bf16);

// The scores of one query row of each of H heads: C[e * ldc + j] = dot(A[e], B row j from
// element boff[e]) over K elements, for e < H, j < N. B's rows hold the key rows of all the
// heads' kv heads (boff ascending: BSHD), read in memory order, row by row, the heads in
// turn. Each score has the bits of dot_rows on its head.
void dot_heads(int64_t H, int64_t N, int64_t K, const float* const* A, const float* B, int64_t ldb, const int64_t* boff,
               float* C, int64_t ldc);

// dot_heads with B rows of 16-bit elements, bf16 (bf16 true) or fp16 (as dot_rows_h).
void dot_heads_h(int64_t H, int64_t N, int64_t K, const float* const* A, const uint16_t* B, int64_t ldb,
                 const int64_t* boff, float* C, int64_t ldc, bool bf16);

// Exact conversions of n (any) elements to fp32.
void half_row_to_float(const uint16_t* src, float* dst, int64_t n);
void bf16_row_to_float(const uint16_t* src, float* dst, int64_t n);

// Backward elementwise step on one row of a tile (any n): with P in p and dZ in dp,
//   dp = P * (dZ * D - Delta),  p = P * D   (D = drop[j], or 1 when drop is null),
// Delta = delta[0] (delta_step 0) or delta[j] (delta_step 1, transposed tiles).
void ds_rows(float* p, float* dp, const float* drop, const float* delta, int64_t delta_step, int64_t n);

// The backward's elementwise step on a score tile (row stride ld), rows [0, rows) by
// columns [0, n) (n % kLanes == 0: n % kTileN == 0 will do), with S in s and dZ in dp:
//   P = exp(S - LSE),  dp = P * (dZ * D - Delta),  s = P * D  (D = drop, or 1 when null),
// LSE and Delta per row (lse[o], delta[o]) or, per_column, per column (lse[x], delta[x]).
void ds_tile(float* s, float* dp, const float* drop, int64_t ld, int64_t rows, int64_t n, const float* lse,
             const float* delta, bool per_column);

// y[j] *= g[j] (any n).
void mul_row(float* y, const float* g, int64_t n);

}  // namespace cpu
}  // namespace flashattn
