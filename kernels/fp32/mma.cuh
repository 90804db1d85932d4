// 3xTF32 tensor-core products of the fp32 kernels (docs/internals/kernels-fp32.md): each
// fp32 operand x is split into big = tf32(x) and small = tf32(x - big) (both rounded to
// nearest; x - big is exact), and a*b is taken as big_a*big_b + big_a*small_b +
// small_a*big_b by mma.sync.m16n8k8 tf32 (sm_80+). The tensor cores round their fp32 sums
// toward zero, an error that grows with every accumulation into the same registers; so
// each k-step of 8 runs into fresh zeros and is added to the accumulator by an fp32 add
// (round to nearest). What remains is the split's residue, about 2^-22 relative per
// product (fp32 rounds to 2^-24), at tensor-core speed.
//
// Fragments of one m16n8k8 (g = lane / 4, t = lane % 4), with the k index of each k-step
// relabelled so that k index t is column 2t and k index t + 4 column 2t + 1 of the step
// (a sum over k does not depend on its order; A and B use the same relabelling):
//   A [16 x 8]: a0 (g, 2t), a1 (g + 8, 2t), a2 (g, 2t + 1), a3 (g + 8, 2t + 1)
//   B [8 x 8]:  b0 (k = 2t, n = g), b1 (k = 2t + 1, n = g)
//   C [16 x 8]: c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1)
// An operand stored with k contiguous thus loads each pair in one 8-byte access. A warp's
// accumulator tile of 16 rows and NT * 8 columns is float c[NT][4] in C order; element e
// of c[n] is at row g + 8 * (e / 2), column 8n + 2t + e % 2 of the tile.
#pragma once
#include <stdint.h>

namespace flashattn {
namespace fp32 {

__device__ __forceinline__ int lane_g() { return (threadIdx.x & 31) >> 2; }
__device__ __forceinline__ int lane_t() { return threadIdx.x & 3; }
__device__ __forceinline__ int warp_id() { return threadIdx.x >> 5; }

// Row and column within a warp tile of accumulator element e of c[n].
__device__ __forceinline__ int frag_row(int e) { return lane_g() + 8 * (e >> 1); }
__device__ __forceinline__ int frag_col(int n, int e) { return 8 * n + 2 * lane_t() + (e & 1); }

// x rounded to the nearest TF32 value, ties away from zero, for a finite x: half a TF32
// unit (bit 12) added to the bits, the 13 bits below TF32's mantissa cleared. This is
// cvt.rna.tf32.f32 for every finite x without the checks for non-finite ones that the
// compiler wraps around that instruction.
__device__ __forceinline__ uint32_t to_tf32(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }

// x = big + small (+ a residue below 2^-22 |x|). A non-finite x (x - big is then NaN), or a
// finite one within half a TF32 unit of FLT_MAX, whose big term rounds to infinity (x - big
// is then infinite), goes whole into the small term with a zero big one: of the three
// products only small_x * big_y sees it, which gives what the exact product gives (+-inf
// times a nonzero y, NaN times anything, a finite x to TF32 precision), where
// inf * small_y = inf * 0 would make a NaN. One comparison either way (|rest| < inf).
struct Split {
  uint32_t big, small;
};
__device__ __forceinline__ Split split(float x) {
  const uint32_t big = to_tf32(x);
  const float rest = x - __uint_as_float(big);
  return fabsf(rest) < INFINITY ? Split{big, to_tf32(rest)} : Split{0u, __float_as_uint(x)};
}
// The split of a probability (in [0, 1], times dropout's keep factor, or NaN): no guard.
// A NaN may come out as any value; the forward's NaN rows are NaN through their softmax
// sum l instead.
__device__ __forceinline__ Split split_probability(float x) {
  const uint32_t big = to_tf32(x);
  return Split{big, to_tf32(x - __uint_as_float(big))};
}

__device__ __forceinline__ void mma_tf32(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// d += a b in 3xTF32 on the tensor cores (their rounding): the two small cross products
// first, then big * big. For a d that holds no more than a few k-steps of the product,
// which the caller then adds to its accumulator in fp32.
__device__ __forceinline__ void mma3_into(float (&d)[4], const Split (&a)[4], const Split (&b)[2]) {
  mma_tf32(d, a[0].small, a[1].small, a[2].small, a[3].small, b[0].big, b[1].big);
  mma_tf32(d, a[0].big, a[1].big, a[2].big, a[3].big, b[0].small, b[1].small);
  mma_tf32(d, a[0].big, a[1].big, a[2].big, a[3].big, b[0].big, b[1].big);
}
// c += a b in 3xTF32: one k-step into zeros, then one fp32 addition per element.
__device__ __forceinline__ void mma3(float (&c)[4], const Split (&a)[4], const Split (&b)[2]) {
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  mma3_into(d, a, b);
#pragma unroll
  for (int e = 0; e < 4; ++e) c[e] += d[e];
}

// The A fragment of rows [m0, m0 + 16) and k-step [k0, k0 + 8) of the matrix A[m][k],
// stored in shared memory at a[m * lda + k] (kTrans: at a[k * lda + m]).
template <bool kTrans>
__device__ __forceinline__ void load_a(Split (&f)[4], const float* a, int lda, int m0, int k0) {
  const int m = m0 + lane_g(), k = k0 + 2 * lane_t();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float2 x;
    if (kTrans) {
      x = make_float2(a[k * lda + m + 8 * h], a[(k + 1) * lda + m + 8 * h]);
    } else {
      x = *reinterpret_cast<const float2*>(a + (m + 8 * h) * lda + k);
    }
    f[h] = split(x.x);
    f[h + 2] = split(x.y);
  }
}

// The B fragment of k-step [k0, k0 + 8) and columns [n0, n0 + 8) of the matrix B[k][n],
// stored at b[n * ldb + k] (kKMajor) or at b[k * ldb + n].
template <bool kKMajor>
__device__ __forceinline__ void load_b(Split (&f)[2], const float* b, int ldb, int k0, int n0) {
  const int n = n0 + lane_g(), k = k0 + 2 * lane_t();
  const float2 x =
      kKMajor ? *reinterpret_cast<const float2*>(b + n * ldb + k) : make_float2(b[k * ldb + n], b[(k + 1) * ldb + n]);
  f[0] = split(x.x);
  f[1] = split(x.y);
}

// c[NT][4] += A[m0 .. m0+16][0 .. kdim) B[0 .. kdim)[n0 .. n0 + 8 NT) for one warp, both
// operands in shared memory (load_a, load_b for their layouts); kdim a multiple of 8.
// Leading dimensions are even (8-byte aligned pairs).
template <bool kATrans, bool kBKMajor, int NT>
__device__ __forceinline__ void warp_gemm(float (&c)[NT][4], const float* a, int lda, const float* b, int ldb, int m0,
                                          int n0, int kdim) {
#pragma unroll 1
  for (int k0 = 0; k0 < kdim; k0 += 8) {
    Split af[4];
    load_a<kATrans>(af, a, lda, m0, k0);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      Split bf[2];
      load_b<kBKMajor>(bf, b, ldb, k0, n0 + 8 * n);
      mma3(c[n], af, bf);
    }
  }
}

template <int M, int N>
__device__ __forceinline__ void zero(float (&c)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int j = 0; j < N; ++j) c[i][j] = 0.f;
}

}  // namespace fp32
}  // namespace flashattn
