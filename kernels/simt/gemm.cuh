// Register-tiled fp32 products over shared-memory tiles (traits.h for the thread grid and
// the row pitches). Plain fmaf in a fixed order: exact fp32 arithmetic, no tensor cores.
//   gemm_nt: C[SM][SN]   += A[m][k] B[n][k]  (m = ty*SM + i, n = tx + 16*j)
//   gemm_nn: C[SM][4*NG] += A[m][k] B[k][n]  (m = ty*SM + i, n = tx*4 + 64*g + e)
//   gemm_tn: C[SM][4*NG] += A[k][m] B[k][n]  (m = ty*SM + i, n = tx*4 + 64*g + e)
// kdim is a multiple of 4 (the tiles are zero past the real dims).
#pragma once

namespace flashattn {
namespace simt {

__device__ __forceinline__ int thread_x() { return threadIdx.x & 15; }
__device__ __forceinline__ int thread_y() { return threadIdx.x >> 4; }

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }

__device__ __forceinline__ void fma4(float* c, float a, const float4& b) {
  c[0] = fmaf(a, b.x, c[0]);
  c[1] = fmaf(a, b.y, c[1]);
  c[2] = fmaf(a, b.z, c[2]);
  c[3] = fmaf(a, b.w, c[3]);
}

template <int SM, int SN>
__device__ __forceinline__ void gemm_nt(float (&c)[SM][SN], const float* a, int lda, const float* b, int ldb,
                                        int kdim) {
  const float* pa = a + thread_y() * SM * lda;
  const float* pb = b + thread_x() * ldb;
#pragma unroll 1
  for (int k = 0; k < kdim; k += 4) {
    float4 av[SM], bv[SN];
#pragma unroll
    for (int i = 0; i < SM; ++i) av[i] = ld4(pa + i * lda + k);
#pragma unroll
    for (int j = 0; j < SN; ++j) bv[j] = ld4(pb + 16 * j * ldb + k);
#pragma unroll
    for (int i = 0; i < SM; ++i)
#pragma unroll
      for (int j = 0; j < SN; ++j) {
        c[i][j] = fmaf(av[i].x, bv[j].x, c[i][j]);
        c[i][j] = fmaf(av[i].y, bv[j].y, c[i][j]);
        c[i][j] = fmaf(av[i].z, bv[j].z, c[i][j]);
        c[i][j] = fmaf(av[i].w, bv[j].w, c[i][j]);
      }
  }
}

template <int SM, int NG>
__device__ __forceinline__ void gemm_nn(float (&c)[SM][4 * NG], const float* a, int lda, const float* b, int ldb,
                                        int kdim) {
  const float* pa = a + thread_y() * SM * lda;
  const float* pb = b + thread_x() * 4;
#pragma unroll 1
  for (int k = 0; k < kdim; k += 4) {
    float4 av[SM];
#pragma unroll
    for (int i = 0; i < SM; ++i) av[i] = ld4(pa + i * lda + k);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      float4 bv[NG];
#pragma unroll
      for (int g = 0; g < NG; ++g) bv[g] = ld4(pb + (k + kk) * ldb + 64 * g);
#pragma unroll
      for (int i = 0; i < SM; ++i) {
        const float x = kk == 0 ? av[i].x : kk == 1 ? av[i].y : kk == 2 ? av[i].z : av[i].w;
#pragma unroll
        for (int g = 0; g < NG; ++g) fma4(&c[i][4 * g], x, bv[g]);
      }
    }
  }
}

template <int SM, int NG>
__device__ __forceinline__ void gemm_tn(float (&c)[SM][4 * NG], const float* a, int lda, const float* b, int ldb,
                                        int kdim) {
  const float* pa = a + thread_y() * SM;
  const float* pb = b + thread_x() * 4;
#pragma unroll 4
  for (int k = 0; k < kdim; ++k) {
    float av[SM];
#pragma unroll
    for (int i = 0; i < SM; ++i) av[i] = pa[k * lda + i];
    float4 bv[NG];
#pragma unroll
    for (int g = 0; g < NG; ++g) bv[g] = ld4(pb + k * ldb + 64 * g);
#pragma unroll
    for (int i = 0; i < SM; ++i)
#pragma unroll
      for (int g = 0; g < NG; ++g) fma4(&c[i][4 * g], av[i], bv[g]);
  }
}

template <int M, int N>
__device__ __forceinline__ void zero(float (&c)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int j = 0; j < N; ++j) c[i][j] = 0.f;
}

}  // namespace simt
}  // namespace flashattn
