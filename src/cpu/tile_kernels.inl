// Bodies of the tile kernels (tile_math.hpp), included by tile_math.cpp once per
// instruction set inside its own namespace, with FA_TARGET set to that instruction
// set's target attribute (empty for the baseline), FA_LANES to its vector width in
// floats (8: AVX2 or two SSE registers; 16: AVX-512) and FA_MR to the rows of its GEMM
// register tile. Not a standalone header: it relies on <math.h>, <stdint.h> and
// <string.h> being included before the namespace opens.
//
// GCC/Clang vector extension: vf is one register of FA_LANES floats (two SSE registers
// in the baseline build). Explicit vectors because the autovectorizer turns the
// register-blocked loop nest below into shuffles instead of broadcasts. Helpers take and
// return vectors by reference only: passing a 32-byte vector by value is an ABI error in
// Clang (and a warning in GCC) when AVX is not enabled, which is the case in the
// baseline build.
typedef float vf __attribute__((vector_size(FA_LANES * 4)));
typedef int32_t vi __attribute__((vector_size(FA_LANES * 4)));
typedef uint32_t vu __attribute__((vector_size(FA_LANES * 4)));
constexpr int kLanes = FA_LANES;
constexpr int kVecs = static_cast<int>(kTileN) / kLanes;  // vectors per kTileN columns

FA_TARGET FA_ALWAYS_INLINE void loadv(vf& v, const float* p) { memcpy(&v, p, sizeof v); }
FA_TARGET FA_ALWAYS_INLINE void storev(float* p, const vf& v) { memcpy(p, &v, sizeof v); }
// A broadcast of x. x - 0 is x for every x (x + 0 is not, for x = -0), so this compiles
// to one broadcast (from memory: one load), where "V{} + x" keeps an add and a lane loop
// becomes a chain of inserts.
template <class V>
FA_TARGET FA_ALWAYS_INLINE void splat(V& v, float x) {
  v = x - V{};
}
FA_TARGET FA_ALWAYS_INLINE float lane_sum(const vf& v) {
  float total = 0.f;
  for (int l = 0; l < kLanes; ++l) total += v[l];
  return total;
}

// m ? a : b for a lane mask m (all ones / all zeros per lane), as bit operations.
#define FA_SELECT(m, a, b) ((vf)((((vi)(a)) & (m)) | (((vi)(b)) & ~(m))))

// exp(x) = 2^n * e^r with n = round(x / ln2), r = x - n ln2 (Cody-Waite two-part ln2),
// e^r by a degree-7 Taylor polynomial (|r| <= ln2/2: truncation < 4e-9 relative).
// Branch-free on every lane; inputs below -87.3 (including -inf) give 0, the subnormal
// range being irrelevant for softmax weights; inputs above 88 give exp(88); NaN stays NaN.
// Inputs below -87.3 go through the arithmetic unclamped (their lanes may hold anything)
// and are cleared at the end. On Zen 3 the compares, selects, multiplies and FMAs share
// two pipes: a minimum for the upper clamp and a bitwise clear for the lower one instead
// of three compare-and-selects took a 64 x 64 online_softmax_cols from 7.2k to 4.3k TSC
// ticks (with col_max below), with the same bits on every input.
//
// expv_n computes N exponentials step by step over all of them (N independent chains in
// the order the pipes can overlap them), with the same operations on every lane as N
// calls of expv. kClampHigh false leaves out the upper clamp, for callers whose inputs are
// at most 0 (or NaN), where it changes nothing.

// Lanes above 88 set to 88 (NaN stays NaN).
FA_TARGET FA_ALWAYS_INLINE void clamp_high(const vf& x, vf& xc) {
  const vf hi = vf{} + 88.f;
#if defined(FA_ISA_F16C) && FA_LANES == 16
  // MINPS gives its second operand unless the first is less; the zero-masked form, as GCC 12
  // warns that the unmasked one reads an undefined vector.
  xc = (vf)_mm512_maskz_min_ps(0xffff, (__m512)hi, (__m512)x);
#elif defined(FA_ISA_F16C)
  xc = (vf)_mm256_min_ps((__m256)hi, (__m256)x);
#else
  const vi over = x > hi;
  xc = FA_SELECT(over, hi, x);
#endif
}

template <int N, bool kClampHigh>
FA_TARGET FA_ALWAYS_INLINE void expv_n(const vf* x, vf* out) {
  const vf lo = vf{} - 87.3f;
  const vf shift = vf{} + 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  vi under[N];
  vf xc[N], t[N], r[N], q[N];
  for (int i = 0; i < N; ++i) {
    under[i] = x[i] < lo;
    xc[i] = x[i];
    if (kClampHigh) clamp_high(x[i], xc[i]);
  }
  for (int i = 0; i < N; ++i) t[i] = xc[i] * 1.44269504088896341f + shift;
  for (int i = 0; i < N; ++i) {
    const vf n = t[i] - shift;
    r[i] = xc[i] - n * 0.693145751953125f;
    r[i] = r[i] - n * 1.42860682030941723212e-6f;
  }
  for (int i = 0; i < N; ++i) q[i] = (vf{} + 1.f / 5040.f) * r[i] + 1.f / 720.f;
  for (int i = 0; i < N; ++i) q[i] = q[i] * r[i] + 1.f / 120.f;
  for (int i = 0; i < N; ++i) q[i] = q[i] * r[i] + 1.f / 24.f;
  for (int i = 0; i < N; ++i) q[i] = q[i] * r[i] + 1.f / 6.f;
  for (int i = 0; i < N; ++i) q[i] = q[i] * r[i] + 0.5f;
  for (int i = 0; i < N; ++i) q[i] = q[i] * r[i] + 1.f;
  for (int i = 0; i < N; ++i) q[i] = q[i] * r[i] + 1.f;
  for (int i = 0; i < N; ++i) {
    // The low mantissa bits of t hold n; (n + 127) << 23 is the fp32 bit pattern of 2^n.
    const vu bits = ((vu)t[i] + 127u) << 23;
    const vf e = q[i] * (vf)bits;
    out[i] = (vf)((vi)e & ~under[i]);
  }
}

template <bool kClampHigh = true>
FA_TARGET FA_ALWAYS_INLINE void expv(const vf& x, vf& out) {
  expv_n<1, kClampHigh>(&x, &out);
}

// a > m ? a : m on every lane: m keeps its value where a is NaN (the maximum skips NaN
// scores). One instruction where the build has it (MAXPS gives its second operand unless
// the first is greater) instead of a compare and a select.
FA_TARGET FA_ALWAYS_INLINE void max_skip_nan(vf& m, const vf& a) {
#if defined(FA_ISA_F16C) && FA_LANES == 16
  m = (vf)_mm512_maskz_max_ps(0xffff, (__m512)a, (__m512)m);  // zero-masked: as in expv
#elif defined(FA_ISA_F16C)
  m = (vf)_mm256_max_ps((__m256)a, (__m256)m);
#else
  const vi g = a > m;
  m = FA_SELECT(g, a, m);
#endif
}

// Scalar version of the same computation (lane 0 of expv), for per-row factors.
FA_TARGET FA_ALWAYS_INLINE float exp1(float x) {
  vf xv, e;
  splat(xv, x);
  expv(xv, e);
  return e[0];
}

// Exact binary16 -> binary32 on every lane (same cases as half_to_float in convert.hpp).
FA_TARGET FA_ALWAYS_INLINE void halfv_to_float(const uint16_t* src, vf& out) {
  vu h;
  for (int l = 0; l < kLanes; ++l) h[l] = src[l];
  const vu sign = (h & 0x8000u) << 16;
  const vu exp = (h >> 10) & 0x1fu;
  const vu mant = h & 0x3ffu;
  const vf sub = __builtin_convertvector((vi)mant, vf) * 5.9604644775390625e-08f;
  const vu normal = ((exp + 112u) << 23) | (mant << 13);
  const vu special = 0x7f800000u | (mant << 13);
  const vi is_sub = (vi)(exp == 0u), is_special = (vi)(exp == 31u);
  vf body = FA_SELECT(is_special, (vf)special, (vf)normal);
  body = FA_SELECT(is_sub, sub, body);
  out = (vf)(sign | (vu)body);
}

// A B operand's elements: fp32, or 16-bit rows (bf16, fp16) converted to fp32 as they are
// loaded. The conversions are exact, so a kernel gives the same bits on 16-bit rows as on
// the same rows converted to fp32 first.
enum Src { kSrcF32, kSrcBf16, kSrcF16 };
template <int kSrc>
using src_t = typename std::conditional<kSrc == kSrcF32, float, uint16_t>::type;

template <int kSrc>
FA_TARGET FA_ALWAYS_INLINE void load_src(vf& v, const src_t<kSrc>* p) {
  if constexpr (kSrc == kSrcF32) {
    loadv(v, p);
  } else if constexpr (kSrc == kSrcBf16) {  // zero-extend and shift: bf16 is the top half of fp32
#if defined(FA_ISA_F16C) && FA_LANES == 16
    // One widening load (GCC 12 splits the generic conversion below into two halves); the
    // zero-masked form, as GCC 12 warns that the unmasked one reads an undefined vector.
    const vu u = (vu)_mm512_maskz_cvtepu16_epi32(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    v = (vf)(u << 16);
#elif defined(FA_ISA_F16C)
    const vu u = (vu)_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    v = (vf)(u << 16);
#else
    typedef uint16_t vh __attribute__((vector_size(FA_LANES * 2)));
    vh h;
    memcpy(&h, p, sizeof h);
    const vu u = __builtin_convertvector(h, vu) << 16;
    memcpy(&v, &u, sizeof v);
#endif
  } else {
#if defined(FA_ISA_F16C) && FA_LANES == 16
    // The zero-masked form: GCC 12 warns that the unmasked one reads an undefined vector.
    v = (vf)_mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(FA_ISA_F16C)
    v = (vf)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
    halfv_to_float(p, v);
#endif
  }
}

template <int kSrc>
FA_TARGET FA_ALWAYS_INLINE float src_scalar(const src_t<kSrc>* p) {
  if constexpr (kSrc == kSrcF32) {
    return *p;
  } else {
    vf v;
    src_t<kSrc> lane[kLanes] = {*p};
    load_src<kSrc>(v, lane);
    return v[0];
  }
}

// The GEMM's accumulators: fp32, or (FA_ACC_DOUBLE, the baseline build, which has no
// FMA) fp64 lanes, where each product is exact and each sum is rounded once, like a
// fused multiply-add: without it the baseline build misses the accuracy the tests
// demand (dK under dropout p -> 1, tests/test_numerics.cpp).
#if defined(FA_ACC_DOUBLE)
typedef double vacc __attribute__((vector_size(FA_LANES * 8)));
#else
typedef vf vacc;
#endif
FA_TARGET FA_ALWAYS_INLINE void load_acc(vacc& v, const float* p) {
  vf f;
  loadv(f, p);
  v = __builtin_convertvector(f, vacc);
}
template <int kSrc>
FA_TARGET FA_ALWAYS_INLINE void load_src_acc(vacc& v, const src_t<kSrc>* p) {
  vf f;
  load_src<kSrc>(f, p);
  v = __builtin_convertvector(f, vacc);
}
FA_TARGET FA_ALWAYS_INLINE void store_acc(float* p, const vacc& v) {
  const vf f = __builtin_convertvector(v, vf);
  storev(p, f);
}

// c += a * b in one rounding. Explicit where the build has FMA: the forward and the
// backward compute the same scores in different GEMM functions (gemm_panels, gemm), and
// contraction of "c += a * b" is each compilation's choice (GCC 13 fused it in some of
// those functions and not in others at 16 lanes, so P = exp(S - LSE) lost its exact 1).
// The baseline build accumulates in fp64, where the product of two floats is exact and
// fusing changes nothing.
FA_TARGET FA_ALWAYS_INLINE void fma_acc(vacc& c, const vacc& a, const vacc& b) {
#if defined(FA_ACC_DOUBLE)
  c += a * b;
#elif FA_LANES == 16
  c = (vacc)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#else
  c = (vacc)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#endif
}

// The same for the fp32 dot products (dot_body): the forward reads K in its dtype in place
// (dot_rows_h) and the backward reads converted rows (dot_rows), two compiled copies of one
// loop whose contraction would otherwise be each copy's choice. The baseline build has no
// FMA instruction, so there nothing is fused either way.
FA_TARGET FA_ALWAYS_INLINE void fma_vf(vf& c, const vf& a, const vf& b) {
#if defined(FA_ACC_DOUBLE)
  c += a * b;
#elif FA_LANES == 16
  c = (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#else
  c = (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#endif
}
FA_TARGET FA_ALWAYS_INLINE float fma_f32(float c, float a, float b) {
#if defined(FA_ACC_DOUBLE)
  return c + a * b;
#else
  return __builtin_fmaf(a, b, c);
#endif
}

// B rows ahead of the one being read that the few-row kernels (dot_rows, the GEMM's
// rows below 4) ask the caches for. Their B rows are keys of one head, a stride apart in
// the inputs (heads * head_dim elements in BSHD), which the hardware prefetchers do not
// follow: each row's loads waited for memory. Asking 8 rows ahead took a bf16 decode of
// 16 heads at d = 64 from 7.9 to 5.4 ms, fp32 from 4.6 to 3.8 ms (1 thread, EPYC). 16-bit
// rows ask twice as many rows ahead, the same bytes as fp32's: a bf16 decode of 4 heads,
// 32k keys at d = 64 went 1.11-1.19x faster than with 8 rows, fp32 at 16 rows did not
// change (docs/internals/cpu-decode.md).
template <int kSrc>
constexpr int64_t kRowsAhead = kSrc == kSrcF32 ? 8 : 16;

// Asks the caches for the cache lines of the n elements `rows` rows of ld elements past
// p. The rows may lie past the caller's last: those of a tile are followed by the next
// tile's, read next (the first rows of each tile waited for memory when only the tile's
// own rows were asked for), and prefetches never fault, so the address is computed as an
// integer rather than as a pointer past B.
template <class T>
FA_TARGET FA_ALWAYS_INLINE void prefetch_row(const T* p, int64_t rows, int64_t ld, int64_t n) {
  const uintptr_t c = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(rows * ld) * sizeof(T);
  const int64_t bytes = n * static_cast<int64_t>(sizeof(T));
  for (int64_t x = 0; x < bytes; x += 64) __builtin_prefetch(reinterpret_cast<const char*>(c + x), 0, 3);
  __builtin_prefetch(reinterpret_cast<const char*>(c + bytes - 1), 0, 3);
}

// MR x kTileN register tile of C: MR * kVecs accumulators, kVecs B vectors and one
// broadcast (AVX2: 6 x 2 + 2 + 1 = 15 of 16 registers; AVX-512: 16 x 1 + 1 + 1 = 18 of
// 32). Each C element sums k in increasing order. kAT: A is stored transposed, element
// (r, k) at A[k * lda + r] (broadcasts read any layout at the same cost). NV: vectors per
// row (wider tiles for few rows, wide_tiles); kSrc: B's elements (load_src); kAhead: ask
// for B's row kRowsAhead ahead at each k; kScale: C is stored times scale.
template <int MR, bool kAT, int NV = kVecs, int kSrc = kSrcF32, bool kAhead = false, bool kScale = false>
FA_TARGET FA_ALWAYS_INLINE void micro_tile(int64_t K, const float* A, int64_t lda, const src_t<kSrc>* B, int64_t ldb,
                                           float* C, int64_t ldc, bool accumulate, float scale = 1.f) {
  vacc c[MR][NV];
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) {
      if (accumulate) {
        load_acc(c[r][v], C + r * ldc + v * kLanes);
      } else {
        c[r][v] = vacc{};
      }
    }
  }
  for (int64_t k = 0; k < K; ++k) {
    if (kAhead) prefetch_row(B, k + kRowsAhead<kSrc>, ldb, NV * kLanes);
    vacc b[NV];
    for (int v = 0; v < NV; ++v) load_src_acc<kSrc>(b[v], B + k * ldb + v * kLanes);
    for (int r = 0; r < MR; ++r) {
      vacc a;
      splat(a, kAT ? A[k * lda + r] : A[r * lda + k]);
      for (int v = 0; v < NV; ++v) fma_acc(c[r][v], a, b[v]);
    }
  }
  if (!kScale) {
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) store_acc(C + r * ldc + v * kLanes, c[r][v]);
    return;
  }
  // The sum rounded to fp32, then times scale in fp32: the bits of a separate scale pass.
  // The broadcast comes after the k loop: hoisted above it (as GCC otherwise does), it
  // takes a register from the loop, and a B vector was reloaded from the stack instead.
  float sc = scale;
  __asm__ volatile("" : "+m"(sc));
  vf sv;
  splat(sv, sc);
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) {
      vf f = __builtin_convertvector(c[r][v], vf);
      f = f * sv;
      storev(C + r * ldc + v * kLanes, f);
    }
  }
}

// Rows [i, M) (fewer than 4) of a row-major B product: register tiles 8 / MR vectors wide
// (columns [jb, je)), so that each row keeps 8 / MR independent accumulator chains (the
// FMA latency bound one 1 x kTileN tile per row hit: one chain per vector), then half as
// wide (AVX-512 at d = 64: 4 vectors), then kTileN-column tiles for what is left. Same
// sums in the same order as micro_tile.
template <int MR, bool kAT, int kSrc = kSrcF32>
FA_TARGET FA_ALWAYS_INLINE void wide_tiles(int64_t kc, const float* A, int64_t lda, const src_t<kSrc>* B, int64_t ldb,
                                           float* C, int64_t ldc, int64_t jb, int64_t je, bool acc) {
  constexpr int kNV = 8 / MR, kHalf = kNV / 2 > kVecs ? kNV / 2 : kVecs;
  int64_t j = jb;
  for (; j + kNV * kLanes <= je; j += kNV * kLanes)
    micro_tile<MR, kAT, kNV, kSrc, true>(kc, A, lda, B + j, ldb, C + j, ldc, acc);
  for (; j + kHalf * kLanes <= je; j += kHalf * kLanes)
    micro_tile<MR, kAT, kHalf, kSrc, true>(kc, A, lda, B + j, ldb, C + j, ldc, acc);
  for (; j < je; j += kTileN) micro_tile<MR, kAT, kVecs, kSrc, true>(kc, A, lda, B + j, ldb, C + j, ldc, acc);
}

// Blocked over K (kKBlock) and N (kNBlock) so that the B panel being swept stays in L2
// when the standard path multiplies whole rows of S (N, K up to seqlen); the sum over
// k stays in increasing order (each micro tile reloads C and continues), so blocking
// does not change results. Flash tiles fit in one block. kPanels: B is packed in
// kTileN-column panels ([N / kTileN][K][kTileN], ldb unused), else row-major. kAT: A is
// stored transposed (micro_tile). Panel products store C times scale (after the last K
// block).
template <bool kPanels, bool kAT, int kSrc = kSrcF32>
FA_TARGET FA_ALWAYS_INLINE void gemm_blocked(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                                             const src_t<kSrc>* B, int64_t ldb, float* C, int64_t ldc, bool accumulate,
                                             float scale = 1.f) {
  constexpr int64_t kKBlock = 256, kNBlock = 256;
  if (K == 0) {
    if (!accumulate) {
      for (int64_t i = 0; i < M; ++i) memset(C + i * ldc, 0, sizeof(float) * static_cast<size_t>(N));
    }
    return;
  }
  const int64_t ldp = kPanels ? kTileN : ldb;
  for (int64_t kb = 0; kb < K; kb += kKBlock) {
    const int64_t kc = K - kb < kKBlock ? K - kb : kKBlock;
    const bool acc = accumulate || kb > 0;
    const float sc = kb + kc < K ? 1.f : scale;
    for (int64_t jb = 0; jb < N; jb += kNBlock) {
      const int64_t je = N - jb < kNBlock ? N : jb + kNBlock;
      auto panel = [&](int64_t j) { return kPanels ? B + (j / kTileN) * K * kTileN + kb * kTileN : B + kb * ldb + j; };
      auto rows = [&](int64_t i) { return kAT ? A + kb * lda + i : A + i * lda + kb; };
      int64_t i = 0;
      for (; i + FA_MR <= M; i += FA_MR) {
        for (int64_t j = jb; j < je; j += kTileN) {
          micro_tile<FA_MR, kAT, kVecs, kSrc, false, kPanels>(kc, rows(i), lda, panel(j), ldp, C + i * ldc + j, ldc,
                                                              acc, sc);
        }
      }
      for (; i + 4 <= M; i += 4) {  // a 64-row tile: 10 tiles of 6 rows, then one of 4
        for (int64_t j = jb; j < je; j += kTileN) {
          micro_tile<4, kAT, kVecs, kSrc, false, kPanels>(kc, rows(i), lda, panel(j), ldp, C + i * ldc + j, ldc, acc,
                                                          sc);
        }
      }
      if constexpr (kPanels) {
        for (; i + 2 <= M; i += 2) {
          for (int64_t j = jb; j < je; j += kTileN) {
            micro_tile<2, kAT, kVecs, kSrcF32, false, true>(kc, rows(i), lda, panel(j), ldp, C + i * ldc + j, ldc, acc,
                                                            sc);
          }
        }
        for (; i < M; ++i) {
          for (int64_t j = jb; j < je; j += kTileN) {
            micro_tile<1, kAT, kVecs, kSrcF32, false, true>(kc, rows(i), lda, panel(j), ldp, C + i * ldc + j, ldc, acc,
                                                            sc);
          }
        }
      } else {
        const src_t<kSrc>* Bk = B + kb * ldb;
        for (; i + 2 <= M; i += 2) wide_tiles<2, kAT, kSrc>(kc, rows(i), lda, Bk, ldb, C + i * ldc, ldc, jb, je, acc);
        for (; i < M; ++i) wide_tiles<1, kAT, kSrc>(kc, rows(i), lda, Bk, ldb, C + i * ldc, ldc, jb, je, acc);
      }
    }
  }
}

// gemm_blocked's products in the other loop order: each kTileN-column slab of B through
// every row block, so that the slab (K x kTileN) is read from L2 once and then from L1,
// where the row-block order reads all of B once per row block. Same micro tiles, same
// sums: the same bits as gemm_blocked. For the backward's dQ += dS K, whose A (dS) is hot
// and whose B (the K tile, 32 KiB at d = 128) does not fit L1 beside it: 64 x 128 x 64 in
// a loop of the one-pass schedule's GEMMs, 10th percentile 41k -> 30k TSC ticks with the
// other core busy, 30k -> 28k on a quiet machine. Not for dV and dK: their B (dO and Q
// rows, streamed from L3) went 27k -> 31k in this order.
template <bool kAT>
FA_TARGET FA_ALWAYS_INLINE void gemm_slab_order(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                                                const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  constexpr int64_t kKBlock = 256;
  if (K == 0) {
    gemm_blocked<false, kAT>(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    return;
  }
  for (int64_t kb = 0; kb < K; kb += kKBlock) {
    const int64_t kc = K - kb < kKBlock ? K - kb : kKBlock;
    const bool acc = accumulate || kb > 0;
    auto rows = [&](int64_t i) { return kAT ? A + kb * lda + i : A + i * lda + kb; };
    for (int64_t j = 0; j < N; j += kTileN) {
      const float* Bj = B + kb * ldb + j;
      int64_t i = 0;
      for (; i + FA_MR <= M; i += FA_MR) micro_tile<FA_MR, kAT>(kc, rows(i), lda, Bj, ldb, C + i * ldc + j, ldc, acc);
      for (; i + 4 <= M; i += 4) micro_tile<4, kAT>(kc, rows(i), lda, Bj, ldb, C + i * ldc + j, ldc, acc);
      for (; i + 2 <= M; i += 2) micro_tile<2, kAT>(kc, rows(i), lda, Bj, ldb, C + i * ldc + j, ldc, acc);
      for (; i < M; ++i) micro_tile<1, kAT>(kc, rows(i), lda, Bj, ldb, C + i * ldc + j, ldc, acc);
    }
  }
}

FA_TARGET void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                    int64_t ldc, bool accumulate) {
  gemm_blocked<false, false>(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

FA_TARGET void gemm_h(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B, int64_t ldb,
                      float* C, int64_t ldc, bool bf16) {
  if (bf16) {
    gemm_blocked<false, false, kSrcBf16>(M, N, K, A, lda, B, ldb, C, ldc, true);
  } else {
    gemm_blocked<false, false, kSrcF16>(M, N, K, A, lda, B, ldb, C, ldc, true);
  }
}

FA_TARGET void gemm_at(int64_t M, int64_t N, int64_t K, const float* At, int64_t lda, const float* B, int64_t ldb,
                       float* C, int64_t ldc, bool accumulate) {
  gemm_blocked<false, true>(M, N, K, At, lda, B, ldb, C, ldc, accumulate);
}

FA_TARGET void gemm_slabs(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                          float* C, int64_t ldc, bool accumulate, bool a_transposed) {
  if (a_transposed) {
    gemm_slab_order<true>(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
  } else {
    gemm_slab_order<false>(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
  }
}

FA_TARGET void gemm_panels(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* Bp, float* C,
                           int64_t ldc, float scale) {
  gemm_blocked<true, false>(M, N, K, A, lda, Bp, 0, C, ldc, false, scale);
}

FA_TARGET float row_max(const float* x, int64_t n) {
  vf m;
  splat(m, -INFINITY);
  for (int64_t j = 0; j < n; j += kLanes) {
    vf a;
    loadv(a, x + j);
    max_skip_nan(m, a);
  }
  float out = m[0];
  for (int l = 1; l < kLanes; ++l) out = m[l] > out ? m[l] : out;
  return out;
}

FA_TARGET float exp_sub_sum(float* x, int64_t n, float m) {
  // kTileN lane sums combined in a fixed order: vectorized and deterministic.
  vf s[kVecs] = {};
  for (int64_t j = 0; j < n; j += kTileN) {
    for (int v = 0; v < kVecs; ++v) {
      vf a, e;
      loadv(a, x + j + v * kLanes);
      a = a - m;
      expv(a, e);
      storev(x + j + v * kLanes, e);
      s[v] += e;
    }
  }
  for (int v = 1; v < kVecs; ++v) s[0] += s[v];
  return lane_sum(s[0]);
}

FA_TARGET void exp_sub(float* x, int64_t n, float m) {
  for (int64_t j = 0; j < n; j += kLanes) {
    vf a, e;
    loadv(a, x + j);
    a = a - m;
    expv(a, e);
    storev(x + j, e);
  }
}

FA_TARGET FA_ALWAYS_INLINE void scale_row_body(float* y, int64_t n, float a) {
  for (int64_t j = 0; j < n; j += kLanes) {
    vf v;
    loadv(v, y + j);
    v = v * a;
    storev(y + j, v);
  }
}

FA_TARGET void scale_rows(float* y, int64_t ld, int64_t rows, int64_t n, float a) {
  for (int64_t r = 0; r < rows; ++r) scale_row_body(y + r * ld, n, a);
}

FA_TARGET void online_softmax(float* s, int64_t lds, int64_t rows, int64_t n, float* m, float* l, float* acc,
                              int64_t ldacc, int64_t nacc) {
  // kLanes rows at a time, in phases (row maxima, then the rescale factors of all of
  // them in one vector exp, then the exponentials): short independent steps per row
  // overlap in the out-of-order window where one long chain per row did not.
  for (int64_t r0 = 0; r0 < rows; r0 += kLanes) {
    const int nr = static_cast<int>(rows - r0 < kLanes ? rows - r0 : kLanes);
    vf m_old = vf{}, m_new = vf{}, alpha;
    for (int i = 0; i < nr; ++i) {
      const float m_tile = row_max(s + (r0 + i) * lds, n);
      m_old[i] = m[r0 + i];
      m_new[i] = m_tile > m_old[i] ? m_tile : m_old[i];
    }
    // alpha rescales what was accumulated under the previous max (0 when m was -inf).
    const vf diff = m_old - m_new;
    expv(diff, alpha);
    for (int i = 0; i < nr; ++i) {
      const int64_t r = r0 + i;
      float* row = s + r * lds;
      if (m_new[i] == -INFINITY) {
        // Every score of the row so far is -inf (masked) or NaN (row_max skips NaN). Taken
        // against a reference of 0 instead of -inf, masked scores give exact zeros and a
        // NaN stays NaN: l stays exactly 0 for a fully masked row and becomes NaN (for
        // good: NaN times any alpha is NaN) for a row with a NaN score, which then ends
        // with O and LSE NaN. Only rows that have kept nothing yet come here (acc is 0).
        l[r] += exp_sub_sum(row, n, 0.f);
        continue;
      }
      const float sum = exp_sub_sum(row, n, m_new[i]);
      l[r] = l[r] * alpha[i] + sum;
      if (alpha[i] != 1.f) scale_row_body(acc + r * ldacc, nacc, alpha[i]);
      m[r] = m_new[i];
    }
  }
}

// Merges the maxima of rows [0, rows) of NV vectors of columns of s into mx: NV
// independent chains per row (one pass per kTileN columns had two, each a compare and a
// select per row, bound by their latency). Not inlined: inside online_softmax_cols, whose
// exponential constants GCC keeps in registers, three of the eight chains of the AVX2
// build were kept on the stack (a store and a reload per row).
template <int NV>
FA_TARGET __attribute__((noinline)) void col_max(const float* s, int64_t lds, int64_t rows, vf* mx) {
  vf c[NV];
  for (int v = 0; v < NV; ++v) c[v] = mx[v];
  for (int64_t r = 0; r < rows; ++r) {
    for (int v = 0; v < NV; ++v) {
      vf a;
      loadv(a, s + r * lds + v * kLanes);
      max_skip_nan(c[v], a);
    }
  }
  for (int v = 0; v < NV; ++v) mx[v] = c[v];
}

// The columns [c0, c0 + kTileN) of online_softmax_cols once their maxima mx are known.
FA_TARGET FA_ALWAYS_INLINE void softmax_cols_exp(float* s, int64_t lds, int64_t rows, int64_t c0, const vf* mx,
                                                 float* m, float* l, float* alpha) {
  vf ref[kVecs], sum[kVecs];
  for (int v = 0; v < kVecs; ++v) {
    // A column whose maximum is still -inf (every score so far masked, or NaN) is
    // exponentiated against 0 instead, with alpha 1: masked scores give exact zeros and
    // l stays 0, a NaN score makes l NaN for good (the row ends with O and LSE NaN).
    const vi none = mx[v] == (vf{} - INFINITY);
    ref[v] = FA_SELECT(none, vf{}, mx[v]);
    vf old, a;
    loadv(old, m + c0 + v * kLanes);
    const vf diff = old - mx[v];
    expv(diff, a);  // rescales what was accumulated under the previous max (0 from -inf)
    a = FA_SELECT(none, vf{} + 1.f, a);
    storev(alpha + c0 + v * kLanes, a);
    storev(m + c0 + v * kLanes, mx[v]);
    sum[v] = vf{};
  }
  // kStep rows (4 vectors) at a time, their exponentials interleaved step by step (expv_n):
  // one vector at a time, each exponential's chain of ~13 dependent operations filled the
  // scheduler and left the two FMA pipes idle. The sums add the rows in order, as before.
  constexpr int kStep = 4 / kVecs > 1 ? 4 / kVecs : 1;
  int64_t r = 0;
  for (; r + kStep <= rows; r += kStep) {
    vf a[kStep * kVecs], e[kStep * kVecs];
    for (int k = 0; k < kStep; ++k) {
      for (int v = 0; v < kVecs; ++v) {
        loadv(a[k * kVecs + v], s + (r + k) * lds + c0 + v * kLanes);
        a[k * kVecs + v] = a[k * kVecs + v] - ref[v];
      }
    }
    expv_n<kStep * kVecs, false>(a, e);  // x <= 0 or NaN: no upper clamp needed
    for (int k = 0; k < kStep; ++k) {
      for (int v = 0; v < kVecs; ++v) {
        storev(s + (r + k) * lds + c0 + v * kLanes, e[k * kVecs + v]);
        sum[v] += e[k * kVecs + v];
      }
    }
  }
  for (; r < rows; ++r) {
    for (int v = 0; v < kVecs; ++v) {
      vf a, e;
      loadv(a, s + r * lds + c0 + v * kLanes);
      a = a - ref[v];
      expv<false>(a, e);
      storev(s + r * lds + c0 + v * kLanes, e);
      sum[v] += e;
    }
  }
  for (int v = 0; v < kVecs; ++v) {
    vf lv, a;
    loadv(lv, l + c0 + v * kLanes);
    loadv(a, alpha + c0 + v * kLanes);
    lv = lv * a + sum[v];
    storev(l + c0 + v * kLanes, lv);
  }
}

FA_TARGET void online_softmax_cols(float* s, int64_t lds, int64_t rows, int64_t n, float* m, float* l, float* alpha,
                                   float* acc, int64_t ldacc, int64_t nacc) {
  constexpr int64_t kMaxCols = 4 * kTileN;  // columns whose maxima one sweep of the rows takes
  for (int64_t b0 = 0; b0 < n; b0 += kMaxCols) {
    const int64_t nb = n - b0 < kMaxCols ? n - b0 : kMaxCols;
    vf mx[kMaxCols / kLanes];
    for (int v = 0; v < nb / kLanes; ++v) loadv(mx[v], m + b0 + v * kLanes);
    switch (nb / kTileN) {
      case 1: col_max<kVecs>(s + b0, lds, rows, mx); break;
      case 2: col_max<2 * kVecs>(s + b0, lds, rows, mx); break;
      case 3: col_max<3 * kVecs>(s + b0, lds, rows, mx); break;
      default: col_max<4 * kVecs>(s + b0, lds, rows, mx); break;
    }
    for (int64_t c0 = b0; c0 < b0 + nb; c0 += kTileN)
      softmax_cols_exp(s, lds, rows, c0, mx + (c0 - b0) / kLanes, m, l, alpha);
  }
  for (int64_t c = 0; c < n; ++c)
    if (alpha[c] != 1.f) scale_row_body(acc + c * ldacc, nacc, alpha[c]);
}

template <int kSrc = kSrcF32>
FA_TARGET FA_ALWAYS_INLINE float dot_body(const float* a, const src_t<kSrc>* b, int64_t n) {
  vf s[kVecs] = {};
  int64_t j = 0;
  for (; j + kTileN <= n; j += kTileN) {
    for (int v = 0; v < kVecs; ++v) {
      vf av, bv;
      loadv(av, a + j + v * kLanes);
      load_src<kSrc>(bv, b + j + v * kLanes);
      fma_vf(s[v], av, bv);
    }
  }
  for (int v = 1; v < kVecs; ++v) s[0] += s[v];
  float total = lane_sum(s[0]);
  for (; j < n; ++j) total = fma_f32(total, a[j], src_scalar<kSrc>(b + j));
  return total;
}

FA_TARGET float dot(const float* a, const float* b, int64_t n) { return dot_body(a, b, n); }

template <int kSrc>
FA_TARGET FA_ALWAYS_INLINE void dot_rows_src(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                                             const src_t<kSrc>* B, int64_t ldb, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      if (i == 0) prefetch_row(B, j + kRowsAhead<kSrc>, ldb, K);
      C[i * ldc + j] = dot_body<kSrc>(A + i * lda, B + j * ldb, K);
    }
  }
}

FA_TARGET void dot_rows(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                        float* C, int64_t ldc) {
  dot_rows_src<kSrcF32>(M, N, K, A, lda, B, ldb, C, ldc);
}

// The rows ahead are asked for whole, from the first head's slice to the end of the last.
template <int kSrc>
FA_TARGET FA_ALWAYS_INLINE void dot_heads_src(int64_t H, int64_t N, int64_t K, const float* const* A,
                                              const src_t<kSrc>* B, int64_t ldb, const int64_t* boff, float* C,
                                              int64_t ldc) {
  const int64_t span = boff[H - 1] + K - boff[0];
  for (int64_t j = 0; j < N; ++j) {
    prefetch_row(B + boff[0], j + kRowsAhead<kSrc>, ldb, span);
    for (int64_t e = 0; e < H; ++e) C[e * ldc + j] = dot_body<kSrc>(A[e], B + j * ldb + boff[e], K);
  }
}

FA_TARGET void dot_heads(int64_t H, int64_t N, int64_t K, const float* const* A, const float* B, int64_t ldb,
                         const int64_t* boff, float* C, int64_t ldc) {
  dot_heads_src<kSrcF32>(H, N, K, A, B, ldb, boff, C, ldc);
}

FA_TARGET void dot_heads_h(int64_t H, int64_t N, int64_t K, const float* const* A, const uint16_t* B, int64_t ldb,
                           const int64_t* boff, float* C, int64_t ldc, bool bf16) {
  if (bf16) {
    dot_heads_src<kSrcBf16>(H, N, K, A, B, ldb, boff, C, ldc);
  } else {
    dot_heads_src<kSrcF16>(H, N, K, A, B, ldb, boff, C, ldc);
  }
}

FA_TARGET void dot_rows_h(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B, int64_t ldb,
                          float* C, int64_t ldc, bool bf16) {
  if (bf16) {
    dot_rows_src<kSrcBf16>(M, N, K, A, lda, B, ldb, C, ldc);
  } else {
    dot_rows_src<kSrcF16>(M, N, K, A, lda, B, ldb, C, ldc);
  }
}

// n (any) 16-bit elements to fp32 through load_src, the tail through a zero-padded vector.
template <int kSrc>
FA_TARGET FA_ALWAYS_INLINE void src_row_to_float(const uint16_t* src, float* dst, int64_t n) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    vf v;
    load_src<kSrc>(v, src + j);
    storev(dst + j, v);
  }
  if (j < n) {
    uint16_t tail[kLanes] = {};
    for (int64_t l = j; l < n; ++l) tail[l - j] = src[l];
    vf v;
    load_src<kSrc>(v, tail);
    for (int64_t l = j; l < n; ++l) dst[l] = v[l - j];
  }
}

FA_TARGET void half_row_to_float(const uint16_t* src, float* dst, int64_t n) { src_row_to_float<kSrcF16>(src, dst, n); }

FA_TARGET void bf16_row_to_float(const uint16_t* src, float* dst, int64_t n) {
  src_row_to_float<kSrcBf16>(src, dst, n);
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

FA_TARGET void ds_tile(float* s, float* dp, const float* drop, int64_t ld, int64_t rows, int64_t n, const float* lse,
                       const float* delta, bool per_column) {
  for (int64_t o = 0; o < rows; ++o) {
    vf m = vf{}, dl = vf{};
    if (!per_column) {
      splat(m, lse[o]);
      splat(dl, delta[o]);
    }
    for (int64_t x = 0; x < n; x += kLanes) {
      if (per_column) {
        loadv(m, lse + x);
        loadv(dl, delta + x);
      }
      vf a, e, g;
      loadv(a, s + o * ld + x);
      a = a - m;
      expv(a, e);  // P
      loadv(g, dp + o * ld + x);
      if (drop) {
        vf d;
        loadv(d, drop + o * ld + x);
        g = e * (g * d - dl);
        e = e * d;
      } else {
        g = e * (g - dl);
      }
      storev(s + o * ld + x, e);
      storev(dp + o * ld + x, g);
    }
  }
}

FA_TARGET void mul_row(float* y, const float* g, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] *= g[j];
}
