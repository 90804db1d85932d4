// Tiled FlashAttention forward (Dao et al., Algorithm 1 with the FA2 loop order).
//
// One task = one (sequence b, query head h, block of task_tiles query tiles of kBr rows). The
// task keeps its Q tiles, the running row max m, the running (pre-dropout) row sum l and
// the unnormalized output accumulators in its thread's slot, and streams the key tiles
// of the sequence through them; tiles that the band mask or the block-sparse layout
// remove entirely are skipped. Memory per thread is O(kBr * head_dim), independent of
// seqlen.
//
// Invariants per row r after processing some key tiles:
//   m[r] = max of the kept scores so far (-inf if none),
//   l[r] = sum exp(s - m[r]) over kept scores (before dropout),
//   acc[r] = sum dropout(exp(s - m[r])) * v.
// A row with l = 0 after the last tile is fully masked: O = 0, LSE = -inf. A NaN score
// (NaN in Q, or in a K row the mask keeps) makes l NaN, and O and LSE NaN.
#include <math.h>
#include <string.h>

#include "cpu/amx.hpp"
#include "cpu/cpu_impl.hpp"
#include "cpu/isa.hpp"
#include "cpu/kvcache.hpp"
#include "cpu/scores.hpp"
#include "cpu/tensor_view.hpp"
#include "cpu/thread_pool.hpp"
#include "cpu/tile_math.hpp"

namespace flashattn {
namespace cpu {
namespace {

// A block covers kSub consecutive query tiles (kFwdBlockRows rows) that share each
// converted K/V tile (a task takes one or two blocks: task_tiles): the conversion (and
// the K panel packing) is paid once per block while the mask/sparsity skipping stays at
// kBr x kBc granularity. 4 (256 rows) halves the share of the packing against 2
// (profiled: from ~20% of a d=64 forward to ~10%). Blocks of at most kDotRows rows compute
// their scores as dot products (cpu_impl.hpp).
constexpr int kSub = static_cast<int>(kFwdBlockRows / kBr);

// Query tiles of one task: two blocks (2 kSub tiles) where head dims of at most 64 leave
// room in L2 for 8 tiles' Q panels and accumulators (256 KiB), halving the K/V tile loads
// per query row; a block for the rest (and for split, KV-cache, decode and AMX runs).
constexpr int kMaxSub = 2 * kSub;
int task_tiles(const AttnParams& p) {
  const bool small = p.head_dim_qk <= 64 && p.head_dim_v <= 64;
  return small && !p.kv_enabled && !decode_schedule(p) && !amx_products(p) ? kMaxSub : kSub;
}

struct RowState {
  float* q;      // [kBr x dqk] row-major (dot blocks), or kBr / kTileN panels of [dqk x kTileN]
  float* acc;    // [kBr x dvp], or in AMX GEMM blocks O^T: [amx_v_rows x kBr]
  float* m;      // [kBr]
  float* l;      // [kBr]
  uint32_t* qt;  // amx_products runs only: [qwords x kBr] Q^T, pairs of head dims (B of S^T = K Q^T)
};

struct FwdSlot {
  RowState sub[kMaxSub];  // task_tiles(p) of them carved
  float* qrows;           // [kBr x dqk]   Q rows staged for the panels
  float* k;               // [kBc x dqk]   K tile, row-major
  float* v;               // [kBc x dvp]
  float* s;               // [kBc x kBr]   scores S^T, then probabilities (dot blocks: S, [kBr x kBc])
  float* drop;            // [kBc x kBr]   dropout multipliers, laid out as s (dropout only)
  float* alpha;           // [kBr]         rescale factors
  float* tmp;             // [dvp]         output row staging
  // amx_products runs only: the tile operands (amx.hpp) of the GEMM blocks
  uint32_t* ka;  // [kBc x qwords]            K rows, pairs of head dims (A of S^T = K Q^T)
  uint32_t* vt;  // [amx_v_rows x kBc / 2]    V^T, pairs of keys (A of O^T += V^T P^T)
  uint32_t* pt;  // [kBc / 2 x kBr]           P^T rounded to bf16, pairs of keys (B of O^T)
  float* orow;   // [dvp]                     an output row gathered from O^T
};

// Words per row of the AMX K rows (and pair rows of Q^T): head_dim_qk in bf16 pairs,
// padded with zero pairs to whole tile rows.
int64_t amx_q_words(const AttnParams& p) {
#if FA_HAVE_X86_BUILDS
  return amx_words(p.head_dim_qk);
#else
  (void)p;
  return 0;
#endif
}

// Rows of the AMX O^T accumulators and V^T words: head_dim_v padded to whole 32-row tile
// pairs (amx_gemm's M unit).
int64_t amx_v_rows(const AttnParams& p) { return round_up(round_up(p.head_dim_v, kTileN), 32); }

FwdSlot carve_fwd(const AttnParams& p, Carver& cv) {
  const int64_t dqk = p.head_dim_qk, dvp = round_up(p.head_dim_v, kTileN);
  FwdSlot s;
  const bool amx = amx_products(p);
  const int64_t qwords = amx_q_words(p);
  for (int sb = 0; sb < task_tiles(p); ++sb) {
    RowState& r = s.sub[sb];
    r.q = cv.floats(kBr, dqk);
    r.acc = cv.floats(kBr, amx ? amx_v_rows(p) : dvp);
    r.m = cv.floats(kBr);
    r.l = cv.floats(kBr);
    r.qt = amx ? cv.words(qwords, kBr) : nullptr;
  }
  s.qrows = cv.floats(kBr, dqk);
  s.k = cv.floats(kBc, dqk);
  s.v = cv.floats(kBc, dvp);
  s.s = cv.floats(kBr, kBc);
  s.drop = dropout_active(p.drop_threshold) ? cv.floats(kBr, kBc) : nullptr;
  s.alpha = cv.floats(kBr);
  s.tmp = cv.floats(dvp);
  s.ka = amx ? cv.words(kBc, qwords) : nullptr;
  s.vt = amx ? cv.words(amx_v_rows(p), kBc / 2) : nullptr;
  s.pt = amx ? cv.words(kBc / 2, kBr) : nullptr;
  s.orow = amx ? cv.floats(dvp) : nullptr;
  return s;
}

// The K and V rows of one key tile as the score and P V loops read them (row strides ldk,
// ldv): the slot's converted fp32 tiles, or for dot blocks whose rows are evenly strided
// (no pages) the inputs in place, fp32 or 16-bit (kh, vh: converted as they are read), so
// decode reads each key once instead of converting it into the slot first. In place, a
// 16-bit tile read 2-3x faster than one converted into the slot (bf16, 1 thread, EPYC:
// the conversion's stores and reloads waited on the strided source rows).
struct KeyTile {
  const float* k;
  const uint16_t* kh;  // K in place as 16-bit rows (k unused), or null
  int64_t ldk;
  const float* v;
  const uint16_t* vh;  // V in place as 16-bit rows (v unused), or null
  int64_t ldv;
};

// Loads what the key tile [j0, j0 + nj) of c needs into w's K and V tiles, or points at the
// inputs: K in place for dot blocks without pages (the dot products read dqk elements of
// each row), V too when head_dim_v is a multiple of the GEMM's column unit (it reads whole
// kTileN-column vectors).
KeyTile load_key_tile(const AttnParams& p, const HeadCtx& c, int64_t j0, int64_t nj, bool dots, const FwdSlot& w) {
  const int64_t dqk = p.head_dim_qk, dv = p.head_dim_v, dvp = round_up(dv, kTileN);
  const bool in_place = dots && p.kv_block_table == nullptr;
  KeyTile t{w.k, nullptr, dqk, w.v, nullptr, dvp};
  // Points f (fp32) or h (16-bit) at the tile's rows of src where they are.
  const auto point_at = [&](const void* src, const Strides4& st, const float*& f, const uint16_t*& h, int64_t& ld) {
    const char* rows = elem_ptr(src, p.dtype, key_row_offset(p, st, c, j0));
    f = p.dtype == kFp32 ? reinterpret_cast<const float*>(rows) : nullptr;
    h = p.dtype == kFp32 ? nullptr : reinterpret_cast<const uint16_t*>(rows);
    ld = st.s;
  };
  if (in_place) point_at(p.k, p.k_stride, t.k, t.kh, t.ldk);
  else load_key_rows(p, p.k, p.k_stride, c, j0, nj, dqk, w.k, dqk, false);
  if (in_place && dv == dvp) point_at(p.v, p.v_stride, t.v, t.vh, t.ldv);
  else load_key_rows(p, p.v, p.v_stride, c, j0, nj, dv, w.v, dvp, false);
  return t;
}

#if FA_HAVE_X86_BUILDS
// Packs the key tile [j0, j0 + nj) of c (bf16) for the AMX products: K's rows (pairs of
// head dims) and V^T's pairs of keys, read from the inputs in place (rows through
// key_row_offset, so pages too); keys past nj and head dims past the inputs' are zeros.
void pack_key_tile_amx(const AttnParams& p, const HeadCtx& c, int64_t j0, int64_t nj, const FwdSlot& w) {
  const uint16_t* rows[kBc] = {};
  key_rows_h(p, p.k, p.k_stride, c, j0, nj, rows);
  amx_copy_rows(rows, nj, p.head_dim_qk, kBc, amx_q_words(p), w.ka);
  key_rows_h(p, p.v, p.v_stride, c, j0, nj, rows);
  amx_pairs_t(rows, nj, p.head_dim_v, amx_v_rows(p), w.vt, kBc / 2);
}
#endif

// The online softmax and P V of rows [i0, i0 + ni) of a dot block whose scores s (row
// stride kBc) against key tile [j0, j0 + nj) are computed (update_rows).
void update_dot_rows(const AttnParams& p, const HeadCtx& c, int64_t i0, int64_t ni, int64_t j0, int64_t nj,
                     bool partial, const KeyTile& kt, const RowState& st, const FwdSlot& w, float* s) {
  const int64_t dvp = round_up(p.head_dim_v, kTileN);
  transform_scores<false>(p, c, s, kBc, i0, ni, j0, nj, kBc, partial, nullptr);
  if (w.drop) dropout_tile<false>(p, c, w.drop, kBc, i0, ni, j0, nj);
  online_softmax(s, kBc, ni, kBc, st.m, st.l, st.acc, dvp, dvp);
  if (w.drop)
    for (int64_t r = 0; r < ni; ++r) mul_row(s + r * kBc, w.drop + r * kBc, kBc);
  if (kt.vh != nullptr) {
    gemm_h(ni, dvp, nj, s, kBc, kt.vh, kt.ldv, st.acc, dvp, p.dtype == kBf16);
  } else {
    gemm(ni, dvp, nj, s, kBc, kt.v, kt.ldv, st.acc, dvp, true);
  }
}

// One kBr x kBc tile of the online softmax: scores, then
// m' = max(m, rowmax S), P = exp(S - m'), l = l * exp(m - m') + rowsum P,
// acc = acc * exp(m - m') + dropout(P) V.
// GEMM blocks work on S^T = K Q^T (K row-major as A, Q in panels as B): each query row is
// a column, so the softmax runs down columns in vector lanes, with no reduction across
// lanes, and K needs no transposing. Dot blocks (few rows) work on S = Q K^T by dot
// products, row by row. Both give every score the same sum in the same order. AMX runs
// (amx_products) work on S^T = K Q^T and the column softmax as GEMM blocks do, with the
// two products on tiles: S^T from K's rows and Q^T, then O^T += V^T P^T from V^T (packed
// once per key tile) and P^T rounded to bf16, into transposed accumulators.
void update_rows(const AttnParams& p, const HeadCtx& c, int64_t i0, int64_t ni, int64_t j0, int64_t nj, TileKind kind,
                 bool dots, const KeyTile& kt, const RowState& st, const FwdSlot& w) {
  const int64_t dqk = p.head_dim_qk, dvp = round_up(p.head_dim_v, kTileN);
  const bool partial = kind == kTilePartial;
#if FA_HAVE_X86_BUILDS
  if (!dots && w.ka != nullptr) {
    const int64_t nc = round_up(ni, kTileN);  // query columns computed (padding: -inf scores)
    amx_gemm(round_up(nj, 32), nc, amx_q_words(p), w.ka, amx_q_words(p), st.qt, kBr, w.s, kBr, false);
    transform_scores<true>(p, c, w.s, kBr, i0, ni, j0, nj, nc, partial, nullptr);
    if (w.drop) dropout_tile<true>(p, c, w.drop, kBr, i0, ni, j0, nj);
    online_softmax_cols(w.s, kBr, nj, nc, st.m, st.l, w.alpha, st.acc, kBr, 0);
    amx_scale_cols(st.acc, kBr, amx_v_rows(p), nc, w.alpha);  // O^T's columns are the rows
    // Dropout zeroes P where dropped and leaves 1 / (1 - p_drop) to finish_rows: P itself
    // is rounded to bf16 below, and a P of 1 (one visible key) stays exact that way.
    if (w.drop)
      for (int64_t x = 0; x < nj; ++x)
        for (int64_t r = 0; r < ni; ++r)
          if (w.drop[x * kBr + r] == 0.f) w.s[x * kBr + r] = 0.f;
    amx_pairs_f(w.s, kBr, nj, nc, kBc / 2, w.pt, kBr);
    amx_gemm(amx_v_rows(p), nc, kBc / 2, w.vt, kBc / 2, w.pt, kBr, st.acc, kBr, true);
    return;
  }
#endif
  if (dots) {
    if (kt.kh != nullptr) {  // padding columns: transform_scores
      dot_rows_h(ni, nj, dqk, st.q, dqk, kt.kh, kt.ldk, w.s, kBc, p.dtype == kBf16);
    } else {
      dot_rows(ni, nj, dqk, st.q, dqk, kt.k, kt.ldk, w.s, kBc);
    }
    update_dot_rows(p, c, i0, ni, j0, nj, partial, kt, st, w, w.s);
    return;
  }
  const int64_t nc = round_up(ni, kTileN);  // query columns computed (padding: -inf scores)
  const bool scaled = p.softcap <= 0.f;     // the score scale is applied as the GEMM stores S^T
  gemm_panels(nj, nc, dqk, w.k, dqk, st.q, w.s, kBr, scaled ? p.scale : 1.f);
  transform_scores<true>(p, c, w.s, kBr, i0, ni, j0, nj, nc, partial, nullptr, scaled);
  if (w.drop) dropout_tile<true>(p, c, w.drop, kBr, i0, ni, j0, nj);
  online_softmax_cols(w.s, kBr, nj, nc, st.m, st.l, w.alpha, st.acc, dvp, dvp);
  if (w.drop)
    for (int64_t x = 0; x < nj; ++x) mul_row(w.s + x * kBr, w.drop + x * kBr, ni);
  gemm_at(ni, dvp, nj, w.s, kBr, w.v, dvp, st.acc, dvp, true);  // acc += P V, P read from S^T
}

// Writes O and LSE of rows [i0, i0 + ni) of context c from their state st, or with parts
// (split s of a split run) the normalized partial O and LSE of the keys it covered. O is
// acc * (keep / l): keep is 1, or 1 / (1 - p_drop) where update_rows left it out of P.
// transposed: acc holds O^T (AMX GEMM blocks).
void finish_rows(const AttnParams& p, const HeadCtx& c, int64_t i0, int64_t ni, const RowState& st, const FwdSlot& w,
                 const SplitParts* parts, int64_t s, float keep, bool transposed) {
  const int64_t dv = p.head_dim_v, dvp = round_up(dv, kTileN);
  for (int64_t r = 0; r < ni; ++r) {
    const float* acc = st.acc + r * dvp;
    if (transposed) {
      for (int64_t d = 0; d < dv; ++d) w.orow[d] = st.acc[d * kBr + r];
      acc = w.orow;
    }
    const int64_t i = i0 + r;
    // l = 0 exactly iff every probability was 0 (the row's maximum alone gives
    // exp(0) = 1): a fully masked row. A NaN l (a NaN or +inf score) is not empty and
    // makes O and LSE NaN.
    const bool empty = st.l[r] == 0.f;
    const float inv = empty ? 0.f : keep / st.l[r];
    const float lse = empty ? -INFINITY : st.m[r] + logf(st.l[r]);
    if (parts != nullptr) {
      const int64_t row = split_row(p, s, c.b, c.h, i);
      parts->lse[row] = lse;
      float* o = parts->o + row * dv;
      for (int64_t d = 0; d < dv; ++d) o[d] = acc[d] * inv;
      continue;
    }
    store_rows(p, p.o, p.o_stride, c.b, c.q0, c.h, i, 1, dv, acc, dvp, inv, w.tmp);
    if (p.lse) p.lse[lse_index(p, c, i)] = lse;
  }
}

// Loads query rows [i0, i0 + ni) of context c (rotated for a KV-cache run with rotary
// embedding) into q (row stride dqk) and clears their state (rows [0, n_clear) of st).
void start_rows(const AttnParams& p, const HeadCtx& c, int64_t i0, int64_t ni, float* q, const RowState& st,
                int64_t n_clear) {
  const int64_t dqk = p.head_dim_qk, dvp = round_up(p.head_dim_v, kTileN);
  load_rows(p, p.q, p.q_stride, c.b, c.q0, c.h, i0, ni, dqk, q, dqk);
  if (p.rotary != 0)
    for (int64_t r = 0; r < ni; ++r) rotate_row(p, q + r * dqk, query_rotary_position(p, c.b, i0 + r));
  for (int64_t r = 0; r < n_clear; ++r) {
    st.m[r] = -INFINITY;
    st.l[r] = 0.f;
  }
  memset(st.acc, 0, sizeof(float) * static_cast<size_t>(n_clear * dvp));
}

// Query rows [i0, i0 + n_sub * kBr) of context c (clipped to the sequence) against keys
// [j_begin, j_end) (j_begin a multiple of kBc). Writes O and LSE, or with parts (split
// s of a split-KV run) the normalized partial O and LSE of those keys. Rows of a block of
// at most kDotRows rows are dot blocks (cpu_impl.hpp): the caller hands over such a block
// alone (forward_task).
void forward_block(const AttnParams& p, const HeadCtx& c, int64_t i0, int n_sub, int64_t j_begin, int64_t j_end,
                   const FwdSlot& w, const SplitParts* parts, int64_t s) {
  const int64_t dqk = p.head_dim_qk;
  int64_t rows[kMaxSub];
  int64_t block_rows = 0;
  for (int sb = 0; sb < n_sub; ++sb) {
    const int64_t start = i0 + sb * kBr;
    rows[sb] = start >= c.len_q ? 0 : (c.len_q - start < kBr ? c.len_q - start : kBr);
    block_rows += rows[sb];
  }
  const bool dots = block_rows <= kDotRows;
  for (int sb = 0; sb < n_sub; ++sb) {
    if (rows[sb] == 0) continue;
    const int64_t start = i0 + sb * kBr;
    const RowState& st = w.sub[sb];
    float* q = dots ? st.q : w.qrows;
    // Every row of the tile, the padding rows' too: the column softmax reads them all.
    start_rows(p, c, start, rows[sb], q, st, kBr);
#if FA_HAVE_X86_BUILDS
    if (!dots && st.qt != nullptr) {
      amx_rows_t(q, dqk, rows[sb], dqk, amx_q_words(p), st.qt, kBr);
      memset(st.acc, 0, sizeof(float) * static_cast<size_t>(amx_v_rows(p) * kBr));
      continue;
    }
#endif
    if (!dots) pack_panels(q, dqk, rows[sb], dqk, st.q);
  }

  for (int64_t j0 = j_begin; j0 < j_end; j0 += kBc) {
    const int64_t nj = j_end - j0 < kBc ? j_end - j0 : kBc;
    TileKind kind[kMaxSub];
    bool any = false;
    for (int sb = 0; sb < n_sub; ++sb) {
      kind[sb] = rows[sb] ? classify_tile(p, c, i0 + sb * kBr, rows[sb], j0, nj) : kTileSkip;
      any |= kind[sb] != kTileSkip;
    }
    if (!any) continue;
#if FA_HAVE_X86_BUILDS
    if (!dots && w.ka != nullptr) {
      pack_key_tile_amx(p, c, j0, nj, w);
      for (int sb = 0; sb < n_sub; ++sb)
        if (kind[sb] != kTileSkip)
          update_rows(p, c, i0 + sb * kBr, rows[sb], j0, nj, kind[sb], false, KeyTile{}, w.sub[sb], w);
      continue;
    }
#endif
    const KeyTile kt = load_key_tile(p, c, j0, nj, dots, w);
    for (int sb = 0; sb < n_sub; ++sb) {
      if (kind[sb] != kTileSkip) update_rows(p, c, i0 + sb * kBr, rows[sb], j0, nj, kind[sb], dots, kt, w.sub[sb], w);
    }
  }

  const bool amx = !dots && w.ka != nullptr;
  const float keep = amx && w.drop != nullptr ? p.rp_keep : 1.f;
  for (int sb = 0; sb < n_sub; ++sb) finish_rows(p, c, i0 + sb * kBr, rows[sb], w.sub[sb], w, parts, s, keep, amx);
}

// Query rows [i0, i0 + task_tiles(p) * kBr) of context c: one forward_block, or with two
// blocks of which the second is a dot block (at most kDotRows rows, the sequence's last:
// cpu_impl.hpp's first_dot_row) one per block, so that every row takes the path the
// backward expects.
void forward_task(const AttnParams& p, const HeadCtx& c, int64_t i0, int64_t j_begin, int64_t j_end, const FwdSlot& w,
                  const SplitParts* parts, int64_t s) {
  const int n_sub = task_tiles(p);
  const int64_t second = i0 + kFwdBlockRows;  // the second block's first row (n_sub == kMaxSub)
  if (n_sub == kMaxSub && second < c.len_q && c.len_q - second <= kDotRows) {
    forward_block(p, c, i0, kSub, j_begin, j_end, w, parts, s);
    forward_block(p, c, second, kSub, j_begin, j_end, w, parts, s);
    return;
  }
  forward_block(p, c, i0, n_sub, j_begin, j_end, w, parts, s);
}

// The keys [*j_begin, *j_end) of split s of n_splits over len_k keys: whole kBc tiles, the
// last splits possibly empty.
void split_range(int64_t len_k, int64_t n_splits, int64_t s, int64_t* j_begin, int64_t* j_end) {
  const int64_t chunk = round_up(ceil_div(len_k, n_splits), kBc);
  *j_begin = s * chunk < len_k ? s * chunk : len_k;
  *j_end = *j_begin + chunk < len_k ? *j_begin + chunk : len_k;
}

// Keys a decode task's kv heads take turns over (decode_task): 4 tiles. With key rows of
// all heads 4 KiB or more apart (BSHD, 16 heads of d = 64 in fp32), each key of a head
// is on a page of its own; a window's 256 pages stay in the TLB while the task's other
// kv heads read the same pages, where one head's pass over all keys missed the TLB on
// every key (measured: 2x the time of the same bytes read contiguously).
constexpr int64_t kDecodeWindow = 4 * kBc;

// Whether a decode task's scores read the key rows of all its kv heads at once, in memory
// order (decode_rows_in_order): one query row per head, more than one kv head, keys in
// place (no pages), and the kv heads' slices of a key row within that row (BSHD).
bool row_order_scores(const AttnParams& p, const HeadCtx* ctx, int64_t nh, int64_t rows) {
  const int64_t nkv = ctx[nh - 1].hk - ctx[0].hk + 1;
  return rows == 1 && nkv > 1 && p.kv_block_table == nullptr && p.k_stride.h > 0 &&
         (nkv - 1) * p.k_stride.h + p.head_dim_qk <= p.k_stride.s;
}

// Keys [j_begin, j_end) of the decode task of query heads ctx[0, nh) (one row each): per
// key tile, the scores of all heads by dot_heads, reading each key row's kv head slices in
// memory order, then each head's online softmax and P V. Same bits as the tiles of
// decode_task's loop. Reading the keys of 4 heads of d = 64 row by row instead of one
// head at a time (rows 1 KiB apart) took fp32 decodes of 8k-32k keys 1.1-1.3x faster (1
// thread, EPYC; docs/internals/cpu-decode.md).
void decode_rows_in_order(const AttnParams& p, const HeadCtx* ctx, const RowState* st, int64_t nh, int64_t j_begin,
                          int64_t j_end, const FwdSlot& w) {
  const float* q[kBr];
  int64_t boff[kBr];
  for (int64_t e = 0; e < nh; ++e) {
    q[e] = st[e].q;
    boff[e] = key_row_offset(p, p.k_stride, ctx[e], 0) - key_row_offset(p, p.k_stride, ctx[0], 0);
  }
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kBc) {
    const int64_t nj = j_end - j0 < kBc ? j_end - j0 : kBc;
    TileKind kind[kBr];
    bool any = false;
    for (int64_t e = 0; e < nh; ++e) {
      kind[e] = classify_tile(p, ctx[e], 0, 1, j0, nj);
      any |= kind[e] != kTileSkip;
    }
    if (!any) continue;
    const KeyTile kt = load_key_tile(p, ctx[0], j0, nj, true, w);
    if (kt.kh != nullptr) {
      dot_heads_h(nh, nj, p.head_dim_qk, q, kt.kh, kt.ldk, boff, w.s, kBc, p.dtype == kBf16);
    } else {
      dot_heads(nh, nj, p.head_dim_qk, q, kt.k, kt.ldk, boff, w.s, kBc);
    }
    // The heads' kv heads ascend: each kv head's tile (V converted where it must be) is
    // loaded once, when its first head comes.
    KeyTile ke = kt;
    int64_t ke_head = ctx[0].hk;
    for (int64_t e = 0; e < nh; ++e) {
      if (kind[e] == kTileSkip) continue;
      if (ctx[e].hk != ke_head) {
        ke = load_key_tile(p, ctx[e], j0, nj, true, w);
        ke_head = ctx[e].hk;
      }
      update_dot_rows(p, ctx[e], 0, 1, j0, nj, kind[e] == kTilePartial, ke, st[e], w, w.s + e * kBc);
    }
  }
}

// Query heads [h0, h0 + nh) of sequence b (every row of each: a decode schedule has at
// most kDotRows per head, and nh * rows <= kBr) against split s of the keys. Each kv head
// of the range loads each K and V tile once for all of its query heads in the range (GQA
// packing), and the kv heads take turns over windows of kDecodeWindow keys.
void decode_task(const AttnParams& p, int64_t b, int64_t h0, int64_t nh, int64_t n_splits, int64_t s, const FwdSlot& w,
                 const SplitParts* parts) {
  const int64_t dqk = p.head_dim_qk, dvp = round_up(p.head_dim_v, kTileN);
  const int64_t group = p.heads_q / p.heads_kv;
  HeadCtx ctx[kBr];
  RowState st[kBr];
  const RowState& all = w.sub[0];
  int64_t rows = 0;
  for (int64_t e = 0; e < nh; ++e) {
    ctx[e] = make_head_ctx(p, b, h0 + e);
    rows = ctx[e].len_q;
    st[e] = RowState{all.q + e * rows * dqk, all.acc + e * rows * dvp, all.m + e * rows, all.l + e * rows, nullptr};
    start_rows(p, ctx[e], 0, rows, st[e].q, st[e], rows);
  }
  if (rows == 0) return;  // varlen: an empty sequence
  int64_t j_begin, j_end;
  split_range(ctx[0].len_k, n_splits, s, &j_begin, &j_end);
  if (row_order_scores(p, ctx, nh, rows)) {
    decode_rows_in_order(p, ctx, st, nh, j_begin, j_end, w);
    for (int64_t e = 0; e < nh; ++e) finish_rows(p, ctx[e], 0, rows, st[e], w, parts, s, 1.f, false);
    return;
  }
  for (int64_t w0 = j_begin; w0 < j_end; w0 += kDecodeWindow) {
    const int64_t w1 = j_end - w0 < kDecodeWindow ? j_end : w0 + kDecodeWindow;
    for (int64_t e0 = 0; e0 < nh;) {
      // The query heads [e0, e1) of the range share kv head ctx[e0].hk.
      const int64_t e1 = (ctx[e0].hk + 1) * group - h0 < nh ? (ctx[e0].hk + 1) * group - h0 : nh;
      for (int64_t j0 = w0; j0 < w1; j0 += kBc) {
        const int64_t nj = w1 - j0 < kBc ? w1 - j0 : kBc;
        TileKind kind[kBr];
        bool any = false;
        for (int64_t e = e0; e < e1; ++e) {
          kind[e] = classify_tile(p, ctx[e], 0, rows, j0, nj);
          any |= kind[e] != kTileSkip;
        }
        if (!any) continue;
        const KeyTile kt = load_key_tile(p, ctx[e0], j0, nj, true, w);
        for (int64_t e = e0; e < e1; ++e)
          if (kind[e] != kTileSkip) update_rows(p, ctx[e], 0, rows, j0, nj, kind[e], true, kt, st[e], w);
      }
      e0 = e1;
    }
  }
  for (int64_t e = 0; e < nh; ++e) finish_rows(p, ctx[e], 0, rows, st[e], w, parts, s, 1.f, false);
}

// Query heads per decode task: whole GQA groups of kv heads while their rows fit one
// kBr-row state, else kBr / rows heads of one group.
int64_t decode_heads_per_task(const AttnParams& p) {
  const int64_t group = p.heads_q / p.heads_kv, rows = p.seqlen_q > 0 ? p.seqlen_q : 1;
  if (group * rows > kBr) return kBr / rows;
  const int64_t kv = kBr / (group * rows) < p.heads_kv ? kBr / (group * rows) : p.heads_kv;
  return kv * group;
}

}  // namespace

// A decode's rows (at most kDotRows) are dot blocks, which take no tile: its runs neither
// carve the tile operands nor configure the tiles.
bool amx_products(const AttnParams& p) {
  return p.dtype == kBf16 && p.rotary == 0 && selected_isa() == Isa::kAmx && !decode_schedule(p);
}

bool decode_schedule(const AttnParams& p) { return p.direction == kForward && p.seqlen_q <= kDotRows; }

int64_t key_splits_for(int64_t tasks, int64_t seqlen_k) {
  const int64_t by_tasks = tasks >= 64 ? 1 : ceil_div(64, tasks);
  const int64_t by_keys = seqlen_k / 256 > 1 ? seqlen_k / 256 : 1;
  return by_tasks < by_keys ? by_tasks : by_keys;
}

int64_t decode_splits(const AttnParams& p) {
  return key_splits_for(p.batch * ceil_div(p.heads_q, decode_heads_per_task(p)), p.seqlen_k);
}

int64_t forward_splits(const AttnParams& p) {
  if (p.kv_enabled) return p.kv_num_splits;
  return decode_schedule(p) ? decode_splits(p) : 1;
}

CheckedSize flash_fwd_shared_bytes(const AttnParams& p) {
  if (p.kv_enabled) return kv_shared_bytes(p);
  return forward_splits(p) > 1 ? split_parts_bytes(p) : CheckedSize(0);
}

CheckedSize flash_fwd_slot_bytes(const AttnParams& p) {
  Carver cv{nullptr};
  carve_fwd(p, cv);
  return cv.used;
}

void flash_forward(const AttnParams& p, char* workspace, int threads) {
  // Split runs (KV-cache runs, and decode schedules of long keys): each task is split into
  // forward_splits(p) key ranges of whole kBc tiles whose partial results are merged after;
  // the split count comes from the shape (or the plan), never from the thread count.
  const int64_t n_splits = forward_splits(p);
  // Both sizes are parts of the checked workspace size the API layer validated.
  const size_t shared = static_cast<size_t>(flash_fwd_shared_bytes(p).value());
  const SplitParts parts = n_splits > 1 ? split_parts(p, workspace) : SplitParts{nullptr, nullptr};
  const SplitParts* out = n_splits > 1 ? &parts : nullptr;
  const bool decode = decode_schedule(p);
  // Decode: a task per (sequence, range of query heads, split); else per (sequence, query
  // head, block of query rows, split). A decode's rows are one block (at most kDotRows).
  const int64_t heads_per_task = decode ? decode_heads_per_task(p) : 1;
  const int64_t n_ht = ceil_div(p.heads_q, heads_per_task);
  const int64_t task_rows = task_tiles(p) * kBr;
  const int64_t n_qt = ceil_div(p.seqlen_q, task_rows);
  const int64_t n_tasks = p.batch * n_ht * n_qt * n_splits;
  const size_t slot_bytes = static_cast<size_t>(flash_fwd_slot_bytes(p).value());
  const int team = team_size(threads, n_tasks, attention_work(p));
  TaskCounter tasks(n_tasks);
  run_team(team, [&](const TeamMember& me) {
    Carver cv{workspace + shared + static_cast<size_t>(me.id) * slot_bytes};
    const FwdSlot w = carve_fwd(p, cv);
#if FA_HAVE_X86_BUILDS
    const AmxTiles tiles(w.ka != nullptr);  // this member's tile configuration, for the run
#endif
    // The P V GEMM reads V's columns past head_dim_v, which the loads leave as they are:
    // zero them once per run, so they stay finite. The scores of the Q panels' rows past a
    // partial tile are overwritten (-inf) before use; everything else in the slot is
    // written before it is read (the tests run on a NaN-poisoned workspace). Zeroing the
    // whole slot cost up to 0.6 MB per thread per run.
    const int64_t dvp = round_up(p.head_dim_v, kTileN);
    memset(w.v, 0, sizeof(float) * static_cast<size_t>(kBc * dvp));
    for (int64_t t = tasks.next(); t >= 0; t = tasks.next()) {
      // Last query block first: under a causal mask (top-left) it is the longest, and
      // handing out long tasks first shortens the tail of the dynamic schedule.
      const int64_t s = t % n_splits, u = t / n_splits;
      const int64_t qt = n_qt - 1 - u % n_qt, bh = u / n_qt;
      const int64_t b = bh / n_ht, h0 = bh % n_ht * heads_per_task;
      if (decode) {
        const int64_t nh = p.heads_q - h0 < heads_per_task ? p.heads_q - h0 : heads_per_task;
        decode_task(p, b, h0, nh, n_splits, s, w, out);
        continue;
      }
      const HeadCtx c = make_head_ctx(p, b, h0);
      if (qt * task_rows >= c.len_q) continue;  // varlen: past this sequence's end
      int64_t j_begin, j_end;
      split_range(c.len_k, n_splits, s, &j_begin, &j_end);
      forward_task(p, c, qt * task_rows, j_begin, j_end, w, out, s);
    }
  });
  if (n_splits > 1) combine_split_parts(p, parts, threads);
  write_uncovered_tokens(p);
}

}  // namespace cpu
}  // namespace flashattn
