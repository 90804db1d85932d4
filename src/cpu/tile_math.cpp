// Instantiates the tile kernels (tile_kernels.inl) for the baseline instruction set and,
// on x86-64 with GCC or Clang, for AVX2+FMA+F16C and for AVX-512F, and dispatches every
// call to the set isa.hpp selected for the process.
//
// Manual dispatch rather than target_clones: Clang 14 silently ignores target_clones
// on functions inside a namespace and names the resolver differently from GCC, so
// only a plain target attribute and a function table work with both compilers.
#include "cpu/tile_math.hpp"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "cpu/isa.hpp"

#define FA_ALWAYS_INLINE inline __attribute__((always_inline))

#if FA_HAVE_X86_BUILDS
#include <immintrin.h>  // F16C and FMA intrinsics, used only inside target functions
#endif

namespace flashattn {
namespace cpu {

namespace isa_base {
#define FA_TARGET
#define FA_LANES 8
#define FA_MR 6
#define FA_ACC_DOUBLE 1
#include "cpu/tile_kernels.inl"
#undef FA_ACC_DOUBLE
#undef FA_MR
#undef FA_LANES
#undef FA_TARGET
}  // namespace isa_base

#if FA_HAVE_X86_BUILDS
namespace isa_avx2 {
#define FA_TARGET __attribute__((target("avx2,fma,f16c")))
#define FA_LANES 8
#define FA_MR 6
#define FA_ISA_F16C 1
#include "cpu/tile_kernels.inl"
#undef FA_ISA_F16C
#undef FA_MR
#undef FA_LANES
#undef FA_TARGET
}  // namespace isa_avx2

namespace isa_avx512 {
#define FA_TARGET __attribute__((target("avx512f,avx2,fma,f16c")))
#define FA_LANES 16
#define FA_MR 16  // a 64-row tile is 4 register tiles
#define FA_ISA_F16C 1
#include "cpu/tile_kernels.inl"
#undef FA_ISA_F16C
#undef FA_MR
#undef FA_LANES
#undef FA_TARGET
}  // namespace isa_avx512
#endif

namespace {

struct KernelTable {
  decltype(&isa_base::gemm) gemm;
  decltype(&isa_base::gemm_h) gemm_h;
  decltype(&isa_base::gemm_at) gemm_at;
  decltype(&isa_base::gemm_panels) gemm_panels;
  decltype(&isa_base::gemm_slabs) gemm_slabs;
  decltype(&isa_base::row_max) row_max;
  decltype(&isa_base::exp_sub_sum) exp_sub_sum;
  decltype(&isa_base::exp_sub) exp_sub;
  decltype(&isa_base::scale_rows) scale_rows;
  decltype(&isa_base::online_softmax) online_softmax;
  decltype(&isa_base::online_softmax_cols) online_softmax_cols;
  decltype(&isa_base::dot) dot;
  decltype(&isa_base::dot_rows) dot_rows;
  decltype(&isa_base::dot_rows_h) dot_rows_h;
  decltype(&isa_base::dot_heads) dot_heads;
  decltype(&isa_base::dot_heads_h) dot_heads_h;
  decltype(&isa_base::half_row_to_float) half_row_to_float;
  decltype(&isa_base::bf16_row_to_float) bf16_row_to_float;
  decltype(&isa_base::ds_rows) ds_rows;
  decltype(&isa_base::ds_tile) ds_tile;
  decltype(&isa_base::mul_row) mul_row;
};

#define FA_TABLE(ns)                                                                                               \
  KernelTable {                                                                                                    \
    ns::gemm, ns::gemm_h, ns::gemm_at, ns::gemm_panels, ns::gemm_slabs, ns::row_max, ns::exp_sub_sum, ns::exp_sub, \
        ns::scale_rows, ns::online_softmax, ns::online_softmax_cols, ns::dot, ns::dot_rows, ns::dot_rows_h,        \
        ns::dot_heads, ns::dot_heads_h, ns::half_row_to_float, ns::bf16_row_to_float, ns::ds_rows, ns::ds_tile,    \
        ns::mul_row                                                                                                \
  }

KernelTable pick_kernels() {
  switch (selected_isa()) {
#if FA_HAVE_X86_BUILDS
    case Isa::kAmx:  // the avx512 kernels; bf16 forward products on AMX tiles (amx.hpp)
    case Isa::kAvx512: return FA_TABLE(isa_avx512);
    case Isa::kAvx2: return FA_TABLE(isa_avx2);
#endif
    default: return FA_TABLE(isa_base);
  }
}

// Function-local static: initialized once, thread-safely, on first use.
const KernelTable& kernels() {
  static const KernelTable table = pick_kernels();
  return table;
}

}  // namespace

void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
          int64_t ldc, bool accumulate) {
  kernels().gemm(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}
void gemm_h(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B, int64_t ldb, float* C,
            int64_t ldc, bool bf16) {
  kernels().gemm_h(M, N, K, A, lda, B, ldb, C, ldc, bf16);
}
void gemm_at(int64_t M, int64_t N, int64_t K, const float* At, int64_t lda, const float* B, int64_t ldb, float* C,
             int64_t ldc, bool accumulate) {
  kernels().gemm_at(M, N, K, At, lda, B, ldb, C, ldc, accumulate);
}
void gemm_panels(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* Bp, float* C, int64_t ldc,
                 float scale) {
  kernels().gemm_panels(M, N, K, A, lda, Bp, C, ldc, scale);
}
void gemm_slabs(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                int64_t ldc, bool accumulate, bool a_transposed) {
  kernels().gemm_slabs(M, N, K, A, lda, B, ldb, C, ldc, accumulate, a_transposed);
}
float row_max(const float* x, int64_t n) { return kernels().row_max(x, n); }
float exp_sub_sum(float* x, int64_t n, float m) { return kernels().exp_sub_sum(x, n, m); }
void exp_sub(float* x, int64_t n, float m) { kernels().exp_sub(x, n, m); }
void scale_rows(float* y, int64_t ld, int64_t rows, int64_t n, float a) { kernels().scale_rows(y, ld, rows, n, a); }
void online_softmax(float* s, int64_t lds, int64_t rows, int64_t n, float* m, float* l, float* acc, int64_t ldacc,
                    int64_t nacc) {
  kernels().online_softmax(s, lds, rows, n, m, l, acc, ldacc, nacc);
}
void online_softmax_cols(float* s, int64_t lds, int64_t rows, int64_t n, float* m, float* l, float* alpha, float* acc,
                         int64_t ldacc, int64_t nacc) {
  kernels().online_softmax_cols(s, lds, rows, n, m, l, alpha, acc, ldacc, nacc);
}
float dot(const float* a, const float* b, int64_t n) { return kernels().dot(a, b, n); }
void dot_rows(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
              int64_t ldc) {
  kernels().dot_rows(M, N, K, A, lda, B, ldb, C, ldc);
}
void dot_rows_h(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B, int64_t ldb, float* C,
                int64_t ldc, bool bf16) {
  kernels().dot_rows_h(M, N, K, A, lda, B, ldb, C, ldc, bf16);
}
void dot_heads(int64_t H, int64_t N, int64_t K, const float* const* A, const float* B, int64_t ldb, const int64_t* boff,
               float* C, int64_t ldc) {
  kernels().dot_heads(H, N, K, A, B, ldb, boff, C, ldc);
}
void dot_heads_h(int64_t H, int64_t N, int64_t K, const float* const* A, const uint16_t* B, int64_t ldb,
                 const int64_t* boff, float* C, int64_t ldc, bool bf16) {
  kernels().dot_heads_h(H, N, K, A, B, ldb, boff, C, ldc, bf16);
}
void half_row_to_float(const uint16_t* src, float* dst, int64_t n) { kernels().half_row_to_float(src, dst, n); }
void bf16_row_to_float(const uint16_t* src, float* dst, int64_t n) { kernels().bf16_row_to_float(src, dst, n); }
void ds_rows(float* p, float* dp, const float* drop, const float* delta, int64_t delta_step, int64_t n) {
  kernels().ds_rows(p, dp, drop, delta, delta_step, n);
}
void ds_tile(float* s, float* dp, const float* drop, int64_t ld, int64_t rows, int64_t n, const float* lse,
             const float* delta, bool per_column) {
  kernels().ds_tile(s, dp, drop, ld, rows, n, lse, delta, per_column);
}
void mul_row(float* y, const float* g, int64_t n) { kernels().mul_row(y, g, n); }

}  // namespace cpu
}  // namespace flashattn
