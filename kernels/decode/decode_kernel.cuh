// Split-KV decode attention of a KV-cache run (flashattn_fwd_kvcache): a few query tokens
// per sequence against a contiguous or paged cache, after the append (append_kernel.cuh).
//
// GQA packing: one CTA takes the query heads that share a KV head times the query tokens
// (row r = token i * group + head g, kRows rows per CTA), so each K/V tile is read once
// per KV head. Split-KV: the CTA's keys (the sequence's n keys, narrowed to the band of
// its rows) are cut into `splits` ranges of whole tiles; split s writes fp32 O and LSE to
// the workspace parts (then combine merges them), or, with one split, O in the dtype and
// LSE directly. Tiles of kTileK keys are gathered row by row through the block table
// (any page size, NHD or HND through strides) with 16-byte cp.async into a two-stage
// shared-memory pipeline; `vec` is false when a dim, pointer or stride (of a dim of extent
// above 1) is not a multiple of 16 bytes, and rows are then loaded element by element. Dot products on CUDA cores in
// fp32. Device values out of range (kernels/decode/cache.cuh) give NaN rows.
#pragma once
#include <math.h>

#include "common/mask.h"
#include "decode/cache.cuh"

namespace flashattn {
namespace decode {

constexpr int kTileK = 64;
constexpr int kRows = 16;
constexpr int kThreads = 256;
constexpr int kStages = 2;

// Shared memory of a CTA for padded head dim D and element type T.
template <typename T, int D>
struct Smem {
  static constexpr int kStride = D + 8;  // elements per K/V row: 16 bytes of padding against bank conflicts
  float q[kRows][D];
  float p[kRows][kTileK];
  float m[kRows], l[kRows], alpha[kRows];
  int bad;
  alignas(16) T k[kStages][kTileK][kStride];
  alignas(16) T v[kStages][kTileK][kStride];
};

// Outputs of one split: fp32 parts [splits, batch, heads_q, seqlen_q, (head_dim_v)].
struct Parts {
  float* o;
  float* lse;
};

// tanh(x) within about 1e-6 absolute. The library is built with --use_fast_math, under
// which tanhf is tanh.approx.f32 (relative error 2^-11, an fp16 rounding of every
// softcapped score); softmax is shift-invariant, so the score's absolute error is what
// reaches O.
__device__ __forceinline__ float tanh_fp32(float x) { return 1.f - 2.f / (__expf(2.f * x) + 1.f); }

// One 8-element chunk of a cache row into shared memory: 16-byte cp.async when vec, else
// element by element with zeros past dim; zeros when off < 0 (no row).
template <typename T>
__device__ __forceinline__ void load_chunk(const T* base, int64_t off, int d0, int64_t dim, bool vec, T* out) {
  if (off < 0) {
    *reinterpret_cast<uint4*>(out) = make_uint4(0, 0, 0, 0);
  } else if (vec) {
    fa2::cp_async_16(fa2::smem_u32(out), base + off + d0, true);
  } else {
    for (int e = 0; e < 8; ++e) out[e] = d0 + e < dim ? base[off + d0 + e] : from_float<T>(0.f);
  }
}

// Gathers the K and V rows of keys [t0, t0 + kTileK) into stage st; rows at or past k1
// are zero. A page entry outside the pool sets *bad (its rows zero). Each key's page is
// looked up once for both caches.
template <typename T, int D>
__device__ __forceinline__ void load_tile(const AttnParams& p, const Sequence& s, int64_t b, int64_t hk, int64_t t0,
                                          int64_t k1, bool vec, Smem<T, D>& sm, int st) {
  const int ck = static_cast<int>((p.head_dim_qk + 7) / 8), cv = static_cast<int>((p.head_dim_v + 7) / 8);
  const int chunks = ck > cv ? ck : cv;
  const T* kb = static_cast<const T*>(p.k);
  const T* vb = static_cast<const T*>(p.v);
  for (int c = threadIdx.x; c < kTileK * chunks; c += kThreads) {
    const int jj = c / chunks, d0 = (c - jj * chunks) * 8;
    const int64_t j = t0 + jj;
    const KeyOffsets off = j < k1 ? key_offsets(p, s, b, hk, j) : KeyOffsets{-1, -1};
    if (j < k1 && off.k < 0) sm.bad = 1;
    if (d0 < p.head_dim_qk) load_chunk(kb, off.k, d0, p.head_dim_qk, vec, &sm.k[st][jj][d0]);
    if (d0 < p.head_dim_v) load_chunk(vb, off.v, d0, p.head_dim_v, vec, &sm.v[st][jj][d0]);
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 1)
    decode_kernel(const AttnParams p, const Parts parts, int splits, int row_chunks, bool vec) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem<T, D>& sm = *reinterpret_cast<Smem<T, D>*>(smem_raw);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  int64_t task = blockIdx.x;
  const int split = static_cast<int>(task % splits);
  task /= splits;
  const int chunk = static_cast<int>(task % row_chunks);
  task /= row_chunks;
  const int64_t hk = task % p.heads_kv, b = task / p.heads_kv;
  const int64_t group = p.heads_q / p.heads_kv, sq = p.seqlen_q;
  const int64_t r0 = static_cast<int64_t>(chunk) * kRows;
  const int nr = static_cast<int>(group * sq - r0 < kRows ? group * sq - r0 : kRows);
  const Sequence s = sequence(p, b);
  const int64_t shift = s.n - sq;  // bottom-right: query row i is row i + shift of the keys

  // Keys of this split: the rows' band within [0, n), cut into `splits` whole-tile ranges.
  const int64_t i_first = r0 / group, i_last = (r0 + nr - 1) / group;
  int64_t lo = 0, hi = s.ok ? s.n : 0;
  if (p.has_band && p.window_right >= 0 && p.window_right < hi) {
    const int64_t h = i_last + shift + p.window_right + 1;
    hi = h < hi ? (h > 0 ? h : 0) : hi;
  }
  if (p.has_band && p.window_left >= 0 && p.window_left < s.n) {
    const int64_t l = i_first + shift - p.window_left;
    lo = l > lo ? l : lo;
  }
  const int64_t len = hi > lo ? hi - lo : 0;
  const int64_t per = ((len + splits - 1) / splits + kTileK - 1) / kTileK * kTileK;
  const int64_t k0 = lo + split * per, k1 = k0 + per < hi ? k0 + per : hi;

  if (tid == 0) sm.bad = s.ok ? 0 : 1;
  if (tid < kRows) {
    sm.m[tid] = -INFINITY;
    sm.l[tid] = 0.f;
  }
  // Query rows in fp32, rotated (rounded to T) at the used length (+ i under a band mask).
  for (int64_t e = tid; e < static_cast<int64_t>(kRows) * D; e += kThreads) {
    const int r = static_cast<int>(e / D), d = static_cast<int>(e % D);
    float x = 0.f;
    if (r < nr && d < p.head_dim_qk) {
      const int64_t i = (r0 + r) / group, h = hk * group + (r0 + r) % group;
      x = to_float(static_cast<const T*>(p.q)[b * p.q_stride.b + i * p.q_stride.s + h * p.q_stride.h + d]);
    }
    sm.q[r][d] = x;
  }
  __syncthreads();
  if (p.rotary != 0 && s.ok) {
    const int64_t half = p.rotary_dim / 2;
    for (int64_t e = tid; e < nr * half; e += kThreads) {
      const int r = static_cast<int>(e / half);
      const int64_t k = e % half, i = (r0 + r) / group;
      int64_t da, db;
      rotary_dims(p, k, &da, &db);
      rotate_pair<T>(p, s.used + (p.has_band ? i : 0), k, &sm.q[r][da], &sm.q[r][db]);
    }
  }

  constexpr int kAcc = kRows * D / 2 / kThreads;  // (row, dim pair) accumulators per thread
  float2 acc[kAcc];
#pragma unroll
  for (int a = 0; a < kAcc; ++a) acc[a] = make_float2(0.f, 0.f);

  if (k0 < k1) {
    load_tile<T, D>(p, s, b, hk, k0, k1, vec, sm, 0);
    fa2::cp_async_commit();
  }
  const int qk_chunks = static_cast<int>((p.head_dim_qk + 7) / 8);
  // Scores: thread -> key jj of the tile and rows rg, rg + 4, ...; their aligned query
  // positions and ALiBi slopes are fixed for the CTA (64-bit divisions, once).
  const int jj = tid % kTileK, rg = tid / kTileK;
  constexpr int kRowSteps = kRows / (kThreads / kTileK);
  int64_t row_ip[kRowSteps];
  float row_slope[kRowSteps];
#pragma unroll
  for (int m = 0; m < kRowSteps; ++m) {
    const int64_t rr = r0 + rg + m * (kThreads / kTileK);
    row_ip[m] = rr / group + shift;
    row_slope[m] = alibi_slope(p, b, hk * group + rr % group);  // 0 without ALiBi
  }
  int stage = 0;
  for (int64_t t0 = k0; t0 < k1; t0 += kTileK, stage ^= 1) {
    if (t0 + kTileK < k1) load_tile<T, D>(p, s, b, hk, t0 + kTileK, k1, vec, sm, stage ^ 1);
    fa2::cp_async_commit();
    fa2::cp_async_wait<1>();
    __syncthreads();

    // Scores of key jj for rows rg, rg + 4, ...
    {
      float dot[kRowSteps];
#pragma unroll
      for (int m = 0; m < kRowSteps; ++m) dot[m] = 0.f;
      for (int c = 0; c < qk_chunks; ++c) {
        const uint4 raw = *reinterpret_cast<const uint4*>(&sm.k[stage][jj][c * 8]);
        const T* kv = reinterpret_cast<const T*>(&raw);
        float kf[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) kf[e] = to_float(kv[e]);
#pragma unroll
        for (int m = 0; m < kRowSteps; ++m) {
          const int r = rg + m * (kThreads / kTileK);
          if (r < nr) {
            const float4 qa = *reinterpret_cast<const float4*>(&sm.q[r][c * 8]);
            const float4 qb = *reinterpret_cast<const float4*>(&sm.q[r][c * 8 + 4]);
            dot[m] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] + qb.y * kf[5] +
                      qb.z * kf[6] + qb.w * kf[7];
          }
        }
      }
      const int64_t j = t0 + jj;
#pragma unroll
      for (int m = 0; m < kRowSteps; ++m) {
        const int r = rg + m * (kThreads / kTileK);
        if (r >= nr) continue;
        float x = dot[m] * p.scale;
        if (p.softcap > 0.f) x = p.softcap * tanh_fp32(x / p.softcap);
        x += alibi_bias(p, row_slope[m], row_ip[m], j);
        const bool keep = j < k1 && band_keep(p, row_ip[m], j);
        sm.p[r][jj] = keep ? x : -INFINITY;
      }
    }
    __syncthreads();

    // Online softmax: warp w takes rows w and w + 8, lanes keys lane and lane + 32.
    for (int r = warp; r < nr; r += kThreads / 32) {
      const float x0 = sm.p[r][lane], x1 = sm.p[r][lane + 32];
      float mx = fmaxf(x0, x1);
#pragma unroll
      for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_old = sm.m[r], m_new = fmaxf(m_old, mx);
      const float p0 = m_new == -INFINITY ? 0.f : __expf(x0 - m_new);
      const float p1 = m_new == -INFINITY ? 0.f : __expf(x1 - m_new);
      float sum = p0 + p1;
#pragma unroll
      for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      sm.p[r][lane] = p0;
      sm.p[r][lane + 32] = p1;
      __syncwarp();
      if (lane == 0) {
        const float alpha = m_old == -INFINITY ? 0.f : __expf(m_old - m_new);
        sm.alpha[r] = alpha;
        sm.l[r] = sm.l[r] * alpha + sum;
        sm.m[r] = m_new;
      }
    }
    __syncthreads();

    // O += P V: thread -> (row, dim pair) accumulators, over all kTileK keys of the tile:
    // past k1 P is exactly 0 (masked) and the V rows are zeros (load_tile), so those terms
    // add exact zeros, and the fixed trip count unrolls with four P values per load.
#pragma unroll
    for (int a = 0; a < kAcc; ++a) {
      const int e = tid + a * kThreads, r = e / (D / 2), dp = e % (D / 2);
      if (r >= nr || 2 * dp >= p.head_dim_v) continue;
      const float alpha = sm.alpha[r];
      float2 o = make_float2(acc[a].x * alpha, acc[a].y * alpha);
#pragma unroll
      for (int j4 = 0; j4 < kTileK; j4 += 4) {
        const float4 p4 = *reinterpret_cast<const float4*>(&sm.p[r][j4]);
        const float pj[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          // One 4-byte shared load for the pair (2 * dp is even, rows are 16-byte aligned).
          const uint32_t raw = *reinterpret_cast<const uint32_t*>(&sm.v[stage][j4 + u][2 * dp]);
          const T* v2 = reinterpret_cast<const T*>(&raw);
          o.x += pj[u] * to_float(v2[0]);
          o.y += pj[u] * to_float(v2[1]);
        }
      }
      acc[a] = o;
    }
    __syncthreads();
  }

  // Epilogue: O = acc / l, LSE = m + log l. As on the CPU, a row is empty (O = 0, LSE =
  // -inf) iff l == 0 exactly; a NaN l (a NaN or +inf score) stays NaN, and bad device
  // values give NaN.
  const bool bad = sm.bad != 0;
#pragma unroll
  for (int a = 0; a < kAcc; ++a) {
    const int e = tid + a * kThreads, r = e / (D / 2), dp = e % (D / 2);
    if (r >= nr) continue;
    const int64_t i = (r0 + r) / group, h = hk * group + (r0 + r) % group;
    const float l = sm.l[r];
    const float inv = bad ? NAN : (l == 0.f ? 0.f : 1.f / l);
    const float ox = acc[a].x * inv, oy = acc[a].y * inv;
    const int64_t row = (b * p.heads_q + h) * sq + i;
    for (int c = 0; c < 2; ++c) {
      const int64_t d = 2 * dp + c;
      if (d >= p.head_dim_v) break;
      const float val = c == 0 ? ox : oy;
      if (splits == 1)
        static_cast<T*>(p.o)[b * p.o_stride.b + i * p.o_stride.s + h * p.o_stride.h + d] = from_float<T>(val);
      else parts.o[((static_cast<int64_t>(split) * p.batch * p.heads_q * sq) + row) * p.head_dim_v + d] = val;
    }
    if (dp == 0) {
      const float lse = bad ? NAN : (l == 0.f ? -INFINITY : sm.m[r] + logf(l));
      if (splits > 1) parts.lse[static_cast<int64_t>(split) * p.batch * p.heads_q * sq + row] = lse;
      else if (p.lse != nullptr) p.lse[row] = lse;
    }
  }
}

}  // namespace decode
}  // namespace flashattn
