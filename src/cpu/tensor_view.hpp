// Strided tensor access for the CPU backend: where row i of head h of sequence b lives,
// per-sequence lengths in varlen mode, and tile loads/stores with dtype conversion.
//
// Addresses are element offsets: (batch * stride.b) + (token * stride.s) + (head * stride.h),
// where token = i without varlen and token = cu_seqlens[b] + i with varlen (the batch
// stride is then ignored). The dim stride is 1 (validated by the API layer), so every
// row of a head is a contiguous run of head_dim elements.
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/mask.h"
#include "common/params.h"
#include "cpu/convert.hpp"
#include "cpu/tile_math.hpp"

namespace flashattn {
namespace cpu {

// One (sequence, query head) pair: lengths, token offsets and the per-head constants
// every score needs.
struct HeadCtx {
  int64_t b, h, hk;       // sequence, query head, kv head
  int64_t len_q, len_k;   // this sequence's lengths
  int64_t q0, k0;         // first token of the sequence (0 without varlen)
  int64_t shift;          // i' = i + shift (mask alignment)
  float slope;            // ALiBi slope of (b, h) (0 otherwise)
  uint64_t head_counter;  // Philox counter word: offset + b * heads_q + h
};

inline int64_t seq_len_q(const AttnParams& p, int64_t b) {
  return p.varlen ? int64_t{p.cu_seqlens_q[b + 1]} - p.cu_seqlens_q[b] : p.seqlen_q;
}
inline int64_t seq_len_k(const AttnParams& p, int64_t b) {
  if (p.kv_enabled) return int64_t{p.kv_seqused[b]} + p.kv_seqlen_new;
  return p.varlen ? int64_t{p.cu_seqlens_k[b + 1]} - p.cu_seqlens_k[b] : p.seqlen_k;
}

inline HeadCtx make_head_ctx(const AttnParams& p, int64_t b, int64_t h) {
  HeadCtx c;
  c.b = b;
  c.h = h;
  c.hk = h / (p.heads_q / p.heads_kv);
  c.len_q = seq_len_q(p, b);
  c.len_k = seq_len_k(p, b);
  c.q0 = p.varlen ? p.cu_seqlens_q[b] : 0;
  c.k0 = p.varlen ? p.cu_seqlens_k[b] : 0;
  c.shift = align_shift(p, c.len_q, c.len_k);
  c.slope = alibi_slope(p, b, h);
  c.head_counter = p.offset + static_cast<uint64_t>(b) * static_cast<uint64_t>(p.heads_q) + static_cast<uint64_t>(h);
  return c;
}

// Element offset of row `token` (absolute token index within the batch entry) of head h.
inline int64_t row_offset(const AttnParams& p, const Strides4& s, int64_t b, int64_t token, int64_t h) {
  return (p.varlen ? 0 : b * s.b) + token * s.s + h * s.h;
}

// Element offset of key j of sequence b, kv head hk, in a KV cache (p.kv_enabled).
inline int64_t cache_row_offset(const AttnParams& p, const Strides4& s, int64_t b, int64_t hk, int64_t j) {
  if (p.kv_block_table != nullptr) {
    const int64_t page = p.kv_block_table[b * p.kv_max_pages + j / p.kv_page_size];
    return page * s.b + (j % p.kv_page_size) * s.s + hk * s.h;
  }
  const int64_t row = p.kv_batch_idx != nullptr ? p.kv_batch_idx[b] : b;
  return row * s.b + j * s.s + hk * s.h;
}

// Element offset of key j of context c in K or V (strides s), cached or not.
inline int64_t key_row_offset(const AttnParams& p, const Strides4& s, const HeadCtx& c, int64_t j) {
  return p.kv_enabled ? cache_row_offset(p, s, c.b, c.hk, j) : row_offset(p, s, c.b, c.k0 + j, c.hk);
}

// Index of LSE for query row i of context c.
inline int64_t lse_index(const AttnParams& p, const HeadCtx& c, int64_t i) {
  return p.varlen ? c.h * p.total_q + c.q0 + i : (c.b * p.heads_q + c.h) * p.seqlen_q + i;
}

inline const char* elem_ptr(const void* base, int32_t dtype, int64_t offset) {
  return static_cast<const char*>(base) + offset * static_cast<int64_t>(dtype_size(dtype));
}
inline char* elem_ptr(void* base, int32_t dtype, int64_t offset) {
  return static_cast<char*>(base) + offset * static_cast<int64_t>(dtype_size(dtype));
}

// Pointers to the 16-bit rows of keys [j0, j0+n) of context c in K or V (strides s), found
// through key_row_offset (pages too): rows[r] for key j0 + r, read in place by the AMX
// packers (amx.hpp).
inline void key_rows_h(const AttnParams& p, const void* base, const Strides4& s, const HeadCtx& c, int64_t j0,
                       int64_t n, const uint16_t** rows) {
  for (int64_t r = 0; r < n; ++r)
    rows[r] = reinterpret_cast<const uint16_t*>(elem_ptr(base, p.dtype, key_row_offset(p, s, c, j0 + r)));
}

// Rows [i0, i0+n) of head h (sequence token base tok0) -> dst[r*ld + c], c < dim.
inline void load_rows(const AttnParams& p, const void* base, const Strides4& s, int64_t b, int64_t tok0, int64_t h,
                      int64_t i0, int64_t n, int64_t dim, float* dst, int64_t ld) {
  for (int64_t r = 0; r < n; ++r) {
    row_to_float(elem_ptr(base, p.dtype, row_offset(p, s, b, tok0 + i0 + r, h)), p.dtype, dst + r * ld, dim);
  }
}

// Same rows, transposed: dst[c*ld + r].
inline void load_rows_t(const AttnParams& p, const void* base, const Strides4& s, int64_t b, int64_t tok0, int64_t h,
                        int64_t i0, int64_t n, int64_t dim, float* dst, int64_t ld) {
  for (int64_t r = 0; r < n; ++r) {
    row_to_float_strided(elem_ptr(base, p.dtype, row_offset(p, s, b, tok0 + i0 + r, h)), p.dtype, dst + r, ld, dim);
  }
}

// Keys [j0, j0+n) of context c from K or V -> dst[r*ld + c] (transposed: dst[c*ld + r]).
// Each row asks the caches for the row kAhead keys on: key rows of one head are a stride
// apart (heads * head_dim elements in BSHD), which the hardware prefetchers do not follow,
// and the 16-bit conversion loop kept few rows' loads in flight (bf16 d = 128: a key
// tile's K and V 36-45k TSC ticks, 13-17k with the prefetch; fp32 memcpy rows unchanged).
inline void load_key_rows(const AttnParams& p, const void* base, const Strides4& s, const HeadCtx& c, int64_t j0,
                          int64_t n, int64_t dim, float* dst, int64_t ld, bool transposed) {
  constexpr int64_t kAhead = 8;
  const int64_t bytes = dim * static_cast<int64_t>(dtype_size(p.dtype));
  for (int64_t r = 0; r < n; ++r) {
    if (r + kAhead < n) {
      const char* next = elem_ptr(base, p.dtype, key_row_offset(p, s, c, j0 + r + kAhead));
      for (int64_t x = 0; x < bytes; x += 64) __builtin_prefetch(next + x, 0, 3);
    }
    const char* src = elem_ptr(base, p.dtype, key_row_offset(p, s, c, j0 + r));
    if (transposed) {
      row_to_float_strided(src, p.dtype, dst + r, ld, dim);
    } else {
      row_to_float(src, p.dtype, dst + r * ld, dim);
    }
  }
}

// src[r*ld + c] * mul -> rows [i0, i0+n) of head h. tmp holds one row (dim floats).
inline void store_rows(const AttnParams& p, void* base, const Strides4& s, int64_t b, int64_t tok0, int64_t h,
                       int64_t i0, int64_t n, int64_t dim, const float* src, int64_t ld, float mul, float* tmp) {
  for (int64_t r = 0; r < n; ++r) {
    const float* row = src + r * ld;
    for (int64_t c = 0; c < dim; ++c) tmp[c] = row[c] * mul;
    row_from_float(tmp, p.dtype, elem_ptr(base, p.dtype, row_offset(p, s, b, tok0 + i0 + r, h)), dim);
  }
}

// Gradient rows (dQ, dK, dV): as store_rows, or with p.grad_accumulate the fp32 sum of the
// stored value and src * mul, rounded once to the dtype.
inline void store_grad_rows(const AttnParams& p, void* base, const Strides4& s, int64_t b, int64_t tok0, int64_t h,
                            int64_t i0, int64_t n, int64_t dim, const float* src, int64_t ld, float mul, float* tmp) {
  if (!p.grad_accumulate) return store_rows(p, base, s, b, tok0, h, i0, n, dim, src, ld, mul, tmp);
  for (int64_t r = 0; r < n; ++r) {
    const float* row = src + r * ld;
    void* dst = elem_ptr(base, p.dtype, row_offset(p, s, b, tok0 + i0 + r, h));
    row_to_float(dst, p.dtype, tmp, dim);
    for (int64_t c = 0; c < dim; ++c) tmp[c] += row[c] * mul;
    row_from_float(tmp, p.dtype, dst, dim);
  }
}

// Zeros rows [i0, i0+n) of head h.
inline void zero_rows(const AttnParams& p, void* base, const Strides4& s, int64_t b, int64_t tok0, int64_t h,
                      int64_t i0, int64_t n, int64_t dim) {
  for (int64_t r = 0; r < n; ++r)
    row_zero(p.dtype, elem_ptr(base, p.dtype, row_offset(p, s, b, tok0 + i0 + r, h)), dim);
}

// float tile transpose: dst[c*ldd + r] = src[r*lds + c] for r < rows, c < cols.
inline void transpose_tile(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst, int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
  }
}

// Rows [0, n) of a row-major float tile (row stride lds) as gemm_panels' B:
// dst[r / kTileN][c][r % kTileN] for c < dim (panels of dim x kTileN floats; rows past n
// are left as they are).
inline void pack_panels(const float* src, int64_t lds, int64_t n, int64_t dim, float* dst) {
  for (int64_t r = 0; r < n; ++r) {
    float* panel = dst + (r / kTileN) * dim * kTileN + r % kTileN;
    for (int64_t c = 0; c < dim; ++c) panel[c * kTileN] = src[r * lds + c];
  }
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t m) { return ceil_div(a, m) * m; }

}  // namespace cpu
}  // namespace flashattn
