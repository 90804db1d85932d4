// Tiled FlashAttention forward (Dao et al., Algorithm 1 with the FA2 loop order).
//
// One task = one (sequence b, query head h, block of kSub query tiles of kBr rows). The
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

#include "cpu/cpu_impl.hpp"
#include "cpu/kvcache.hpp"
#include "cpu/scores.hpp"
#include "cpu/tensor_view.hpp"
#include "cpu/thread_pool.hpp"
#include "cpu/tile_math.hpp"

namespace flashattn {
namespace cpu {
namespace {

// A task covers kSub consecutive query tiles (kFwdBlockRows rows) that share each
// converted K/V tile: the conversion (and the K panel packing) is paid once per
// kFwdBlockRows query rows while the mask/sparsity skipping stays at kBr x kBc
// granularity. 4 (256 rows) halves the share of the packing against 2 (profiled: from
// ~20% of a d=64 forward to ~10%). Blocks of at most kDotRows rows compute their scores as
// dot products (cpu_impl.hpp).
constexpr int kSub = static_cast<int>(kFwdBlockRows / kBr);

struct RowState {
  float* q;    // [kBr x dqk] row-major (dot blocks), or kBr / kTileN panels of [dqk x kTileN]
  float* acc;  // [kBr x dvp]
  float* m;    // [kBr]
  float* l;    // [kBr]
};

struct FwdSlot {
  RowState sub[kSub];
  float* qrows;  // [kBr x dqk]   Q rows staged for the panels
  float* k;      // [kBc x dqk]   K tile, row-major
  float* v;      // [kBc x dvp]
  float* s;      // [kBc x kBr]   scores S^T, then probabilities (dot blocks: S, [kBr x kBc])
  float* drop;   // [kBc x kBr]   dropout multipliers, laid out as s (dropout only)
  float* alpha;  // [kBr]         rescale factors
  float* tmp;    // [dvp]         output row staging
};

FwdSlot carve_fwd(const AttnParams& p, Carver& cv) {
  const int64_t dqk = p.head_dim_qk, dvp = round_up(p.head_dim_v, kTileN);
  FwdSlot s;
  for (RowState& r : s.sub) {
    r.q = cv.floats(kBr, dqk);
    r.acc = cv.floats(kBr, dvp);
    r.m = cv.floats(kBr);
    r.l = cv.floats(kBr);
  }
  s.qrows = cv.floats(kBr, dqk);
  s.k = cv.floats(kBc, dqk);
  s.v = cv.floats(kBc, dvp);
  s.s = cv.floats(kBr, kBc);
  s.drop = p.p_drop > 0.f ? cv.floats(kBr, kBc) : nullptr;
  s.alpha = cv.floats(kBr);
  s.tmp = cv.floats(dvp);
  return s;
}

// The K and V rows of one key tile as the score and P V loops read them (row strides ldk,
// ldv): the slot's converted tiles, or for dot blocks of fp32 inputs whose rows are evenly
// strided the inputs in place (decode reads each key once instead of copying it first).
struct KeyTile {
  const float* k;
  int64_t ldk;
  const float* v;
  int64_t ldv;
};

// Loads what the key tile [j0, j0 + nj) of c needs into w's K and V tiles, or points at the
// inputs: K in place for fp32 dot blocks without pages (the dot products read dqk elements
// of each row), V too when head_dim_v is a multiple of the GEMM's column unit (it reads
// whole kTileN-column vectors).
KeyTile load_key_tile(const AttnParams& p, const HeadCtx& c, int64_t j0, int64_t nj, bool dots, const FwdSlot& w) {
  const int64_t dqk = p.head_dim_qk, dv = p.head_dim_v, dvp = round_up(dv, kTileN);
  const bool in_place = dots && p.dtype == kFp32 && p.kv_block_table == nullptr;
  KeyTile t{w.k, dqk, w.v, dvp};
  if (in_place) {
    t.k = reinterpret_cast<const float*>(elem_ptr(p.k, p.dtype, key_row_offset(p, p.k_stride, c, j0)));
    t.ldk = p.k_stride.s;
  } else {
    load_key_rows(p, p.k, p.k_stride, c, j0, nj, dqk, w.k, dqk, false);
  }
  if (in_place && dv == dvp) {
    t.v = reinterpret_cast<const float*>(elem_ptr(p.v, p.dtype, key_row_offset(p, p.v_stride, c, j0)));
    t.ldv = p.v_stride.s;
  } else {
    load_key_rows(p, p.v, p.v_stride, c, j0, nj, dv, w.v, dvp, false);
  }
  return t;
}

// One kBr x kBc tile of the online softmax: scores, then
// m' = max(m, rowmax S), P = exp(S - m'), l = l * exp(m - m') + rowsum P,
// acc = acc * exp(m - m') + dropout(P) V.
// GEMM blocks work on S^T = K Q^T (K row-major as A, Q in panels as B): each query row is
// a column, so the softmax runs down columns in vector lanes, with no reduction across
// lanes, and K needs no transposing. Dot blocks (few rows) work on S = Q K^T by dot
// products, row by row. Both give every score the same sum in the same order.
void update_rows(const AttnParams& p, const HeadCtx& c, int64_t i0, int64_t ni, int64_t j0, int64_t nj, TileKind kind,
                 bool dots, const KeyTile& kt, const RowState& st, const FwdSlot& w) {
  const int64_t dqk = p.head_dim_qk, dvp = round_up(p.head_dim_v, kTileN);
  const bool partial = kind == kTilePartial;
  if (dots) {
    dot_rows(ni, nj, dqk, st.q, dqk, kt.k, kt.ldk, w.s, kBc);  // padding columns: transform_scores
    transform_scores<false>(p, c, w.s, kBc, i0, ni, j0, nj, kBc, partial, nullptr);
    if (w.drop) dropout_tile<false>(p, c, w.drop, kBc, i0, ni, j0, nj);
    online_softmax(w.s, kBc, ni, kBc, st.m, st.l, st.acc, dvp, dvp);
    if (w.drop)
      for (int64_t r = 0; r < ni; ++r) mul_row(w.s + r * kBc, w.drop + r * kBc, kBc);
    gemm(ni, dvp, nj, w.s, kBc, kt.v, kt.ldv, st.acc, dvp, true);
    return;
  }
  const int64_t nc = round_up(ni, kTileN);  // query columns computed (padding: -inf scores)
  gemm_panels(nj, nc, dqk, w.k, dqk, st.q, w.s, kBr, false);
  transform_scores<true>(p, c, w.s, kBr, i0, ni, j0, nj, nc, partial, nullptr);
  if (w.drop) dropout_tile<true>(p, c, w.drop, kBr, i0, ni, j0, nj);
  online_softmax_cols(w.s, kBr, nj, nc, st.m, st.l, w.alpha, st.acc, dvp, dvp);
  if (w.drop)
    for (int64_t x = 0; x < nj; ++x) mul_row(w.s + x * kBr, w.drop + x * kBr, ni);
  gemm_at(ni, dvp, nj, w.s, kBr, w.v, dvp, st.acc, dvp, true);  // acc += P V, P read from S^T
}

// Query rows [i0, i0 + kSub * kBr) of context c (clipped to the sequence) against keys
// [j_begin, j_end) (j_begin a multiple of kBc). Writes O and LSE, or with parts (split
// s of a split-KV run) the normalized partial O and LSE of those keys.
void forward_block(const AttnParams& p, const HeadCtx& c, int64_t i0, int64_t j_begin, int64_t j_end, const FwdSlot& w,
                   const SplitParts* parts, int64_t s) {
  const int64_t dqk = p.head_dim_qk, dv = p.head_dim_v, dvp = round_up(dv, kTileN);
  int64_t rows[kSub];
  int64_t block_rows = 0;
  for (int sb = 0; sb < kSub; ++sb) {
    const int64_t start = i0 + sb * kBr;
    rows[sb] = start >= c.len_q ? 0 : (c.len_q - start < kBr ? c.len_q - start : kBr);
    block_rows += rows[sb];
  }
  const bool dots = block_rows <= kDotRows;
  for (int sb = 0; sb < kSub; ++sb) {
    if (rows[sb] == 0) continue;
    const int64_t start = i0 + sb * kBr;
    const RowState& st = w.sub[sb];
    float* q = dots ? st.q : w.qrows;
    load_rows(p, p.q, p.q_stride, c.b, c.q0, c.h, start, rows[sb], dqk, q, dqk);
    if (p.rotary != 0)
      for (int64_t r = 0; r < rows[sb]; ++r) rotate_row(p, q + r * dqk, query_rotary_position(p, c.b, start + r));
    if (!dots) pack_panels(q, dqk, rows[sb], dqk, st.q);
    // Every row of the tile, the padding rows' too: the column softmax reads them all.
    for (int64_t r = 0; r < kBr; ++r) {
      st.m[r] = -INFINITY;
      st.l[r] = 0.f;
    }
    memset(st.acc, 0, sizeof(float) * static_cast<size_t>(kBr * dvp));
  }

  for (int64_t j0 = j_begin; j0 < j_end; j0 += kBc) {
    const int64_t nj = j_end - j0 < kBc ? j_end - j0 : kBc;
    TileKind kind[kSub];
    bool any = false;
    for (int sb = 0; sb < kSub; ++sb) {
      kind[sb] = rows[sb] ? classify_tile(p, c, i0 + sb * kBr, rows[sb], j0, nj) : kTileSkip;
      any |= kind[sb] != kTileSkip;
    }
    if (!any) continue;
    const KeyTile kt = load_key_tile(p, c, j0, nj, dots, w);
    for (int sb = 0; sb < kSub; ++sb) {
      if (kind[sb] != kTileSkip) update_rows(p, c, i0 + sb * kBr, rows[sb], j0, nj, kind[sb], dots, kt, w.sub[sb], w);
    }
  }

  for (int sb = 0; sb < kSub; ++sb) {
    const RowState& st = w.sub[sb];
    for (int64_t r = 0; r < rows[sb]; ++r) {
      const int64_t i = i0 + sb * kBr + r;
      // l = 0 exactly iff every probability was 0 (the row's maximum alone gives
      // exp(0) = 1): a fully masked row. A NaN l (a NaN or +inf score) is not empty and
      // makes O and LSE NaN.
      const bool empty = st.l[r] == 0.f;
      const float inv = empty ? 0.f : 1.f / st.l[r];
      const float lse = empty ? -INFINITY : st.m[r] + logf(st.l[r]);
      if (parts != nullptr) {
        const int64_t row = split_row(p, s, c.b, c.h, i);
        parts->lse[row] = lse;
        float* o = parts->o + row * dv;
        for (int64_t d = 0; d < dv; ++d) o[d] = st.acc[r * dvp + d] * inv;
        continue;
      }
      store_rows(p, p.o, p.o_stride, c.b, c.q0, c.h, i, 1, dv, st.acc + r * dvp, dvp, inv, w.tmp);
      if (p.lse) p.lse[lse_index(p, c, i)] = lse;
    }
  }
}

}  // namespace

CheckedSize flash_fwd_slot_bytes(const AttnParams& p) {
  Carver cv{nullptr};
  carve_fwd(p, cv);
  return cv.used;
}

void flash_forward(const AttnParams& p, char* workspace, int threads) {
  // Split-KV (KV-cache runs only): each (sequence, head, query block) task is split into
  // kv_num_splits key ranges of whole kBc tiles whose partial results are merged after;
  // the split count comes from the plan, never from the thread count.
  const int64_t n_splits = p.kv_enabled ? p.kv_num_splits : 1;
  const size_t shared = p.kv_enabled ? static_cast<size_t>(kv_shared_bytes(p).value()) : 0;
  const SplitParts parts = n_splits > 1 ? split_parts(p, workspace) : SplitParts{nullptr, nullptr};
  const int64_t rows_per_task = kFwdBlockRows;
  const int64_t n_qt = ceil_div(p.seqlen_q, rows_per_task);
  const int64_t n_tasks = p.batch * p.heads_q * n_qt * n_splits;
  // Both sizes are parts of the checked workspace size the API layer validated.
  const size_t slot_bytes = static_cast<size_t>(flash_fwd_slot_bytes(p).value());
  const int team = team_size(threads, n_tasks, attention_work(p));
  TaskCounter tasks(n_tasks);
  run_team(team, [&](const TeamMember& me) {
    Carver cv{workspace + shared + static_cast<size_t>(me.id) * slot_bytes};
    const FwdSlot w = carve_fwd(p, cv);
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
      const HeadCtx c = make_head_ctx(p, bh / p.heads_q, bh % p.heads_q);
      if (qt * rows_per_task >= c.len_q) continue;  // varlen: past this sequence's end
      if (n_splits == 1) {
        forward_block(p, c, qt * rows_per_task, 0, c.len_k, w, nullptr, 0);
        continue;
      }
      const int64_t chunk = round_up(ceil_div(c.len_k, n_splits), kBc);
      const int64_t j_begin = s * chunk < c.len_k ? s * chunk : c.len_k;
      const int64_t j_end = j_begin + chunk < c.len_k ? j_begin + chunk : c.len_k;
      forward_block(p, c, qt * rows_per_task, j_begin, j_end, w, &parts, s);
    }
  });
  if (n_splits > 1) combine_split_parts(p, parts, threads);
  write_uncovered_tokens(p);
}

}  // namespace cpu
}  // namespace flashattn
