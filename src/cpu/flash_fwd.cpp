// Tiled FlashAttention forward (Dao et al., Algorithm 1 with the FA2 loop order).
//
// One task = one (sequence b, query head h, query tile of kBr rows). The task keeps its
// Q tile, the running row max m, the running (pre-dropout) row sum l and the
// unnormalized output accumulator in its thread's slot, and streams the key tiles of
// the sequence through it; tiles that the band mask or the block-sparse layout remove
// entirely are skipped. Memory per thread is O(kBr * head_dim), independent of seqlen.
//
// Invariants per row r after processing some key tiles:
//   m[r] = max of the kept scores so far (-inf if none),
//   l[r] = sum exp(s - m[r]) over kept scores (before dropout),
//   acc[r] = sum dropout(exp(s - m[r])) * v.
// A row with m = -inf after the last tile is fully masked: O = 0, LSE = -inf.
#include <math.h>
#include <string.h>

#include "cpu/cpu_impl.hpp"
#include "cpu/scores.hpp"
#include "cpu/tensor_view.hpp"
#include "cpu/thread_pool.hpp"
#include "cpu/tile_math.hpp"

namespace flashattn {
namespace cpu {
namespace {

struct FwdSlot {
  float* q;     // [kBr x dqk]
  float* kt;    // [dqk x kBc]   K tile transposed: S = Q * Kt
  float* v;     // [kBc x dvp]
  float* s;     // [kBr x kBc]   scores, then probabilities
  float* drop;  // [kBr x kBc]   dropout multipliers (dropout only)
  float* acc;   // [kBr x dvp]
  float* m;     // [kBr]
  float* l;     // [kBr]
  float* tmp;   // [dvp]         output row staging
};

FwdSlot carve_fwd(const AttnParams& p, Carver& cv) {
  const int64_t dqk = p.head_dim_qk, dvp = round_up(p.head_dim_v, kTileN);
  FwdSlot s;
  s.q = cv.floats(kBr * dqk);
  s.kt = cv.floats(dqk * kBc);
  s.v = cv.floats(kBc * dvp);
  s.s = cv.floats(kBr * kBc);
  s.drop = p.p_drop > 0.f ? cv.floats(kBr * kBc) : nullptr;
  s.acc = cv.floats(kBr * dvp);
  s.m = cv.floats(kBr);
  s.l = cv.floats(kBr);
  s.tmp = cv.floats(dvp);
  return s;
}

void forward_tile(const AttnParams& p, const HeadCtx& c, int64_t i0, const FwdSlot& w) {
  const int64_t dqk = p.head_dim_qk, dv = p.head_dim_v, dvp = round_up(dv, kTileN);
  const int64_t ni = c.len_q - i0 < kBr ? c.len_q - i0 : kBr;

  load_rows(p, p.q, p.q_stride, c.b, c.q0, c.h, i0, ni, dqk, w.q, dqk);
  for (int64_t r = 0; r < ni; ++r) {
    w.m[r] = -INFINITY;
    w.l[r] = 0.f;
  }
  memset(w.acc, 0, sizeof(float) * static_cast<size_t>(ni * dvp));

  for (int64_t j0 = 0; j0 < c.len_k; j0 += kBc) {
    const int64_t nj = c.len_k - j0 < kBc ? c.len_k - j0 : kBc;
    const TileKind kind = classify_tile(p, c, i0, ni, j0, nj);
    if (kind == kTileSkip) continue;

    load_rows_t(p, p.k, p.k_stride, c.b, c.k0, c.hk, j0, nj, dqk, w.kt, kBc);
    load_rows(p, p.v, p.v_stride, c.b, c.k0, c.hk, j0, nj, dv, w.v, dvp);
    gemm(ni, kBc, dqk, w.q, dqk, w.kt, kBc, w.s, kBc, false);
    transform_scores<false>(p, c, w.s, kBc, i0, ni, j0, nj, kBc, kind == kTilePartial, nullptr);
    if (w.drop) dropout_tile<false>(p, c, w.drop, kBc, i0, ni, j0, nj);

    for (int64_t r = 0; r < ni; ++r) {
      float* row = w.s + r * kBc;
      const float m_tile = row_max(row, kBc);
      const float m_new = m_tile > w.m[r] ? m_tile : w.m[r];
      if (m_new == -INFINITY) {  // nothing kept in this row yet: avoid -inf - -inf
        memset(row, 0, sizeof(float) * kBc);
        continue;
      }
      // alpha rescales what was accumulated under the previous max (0 when m was -inf).
      const float alpha = exp_scalar(w.m[r] - m_new);
      const float sum = exp_sub_sum(row, kBc, m_new);
      w.l[r] = w.l[r] * alpha + sum;
      if (alpha != 1.f) scale_row(w.acc + r * dvp, dvp, alpha);
      w.m[r] = m_new;
      if (w.drop) mul_row(row, w.drop + r * kBc, kBc);
    }
    gemm(ni, dvp, nj, w.s, kBc, w.v, dvp, w.acc, dvp, true);
  }

  for (int64_t r = 0; r < ni; ++r) {
    const bool empty = !(w.l[r] > 0.f);
    const float inv = empty ? 0.f : 1.f / w.l[r];
    store_rows(p, p.o, p.o_stride, c.b, c.q0, c.h, i0 + r, 1, dv, w.acc + r * dvp, dvp, inv, w.tmp);
    if (p.lse) p.lse[lse_index(p, c, i0 + r)] = empty ? -INFINITY : w.m[r] + logf(w.l[r]);
  }
}

}  // namespace

size_t flash_fwd_slot_bytes(const AttnParams& p) {
  Carver cv{nullptr};
  carve_fwd(p, cv);
  return cv.used;
}

void flash_forward(const AttnParams& p, char* workspace, int threads) {
  const int64_t n_qt = ceil_div(p.seqlen_q, kBr);
  const int64_t n_tasks = p.batch * p.heads_q * n_qt;
  const size_t slot_bytes = flash_fwd_slot_bytes(p);
  if (threads > n_tasks) threads = static_cast<int>(n_tasks > 0 ? n_tasks : 1);
  TaskCounter tasks(n_tasks);
  run_team(threads, [&](const TeamMember& me) {
    Carver cv{workspace + static_cast<size_t>(me.id) * slot_bytes};
    const FwdSlot w = carve_fwd(p, cv);
    // Padding columns of V/acc are read by the GEMMs; keep them finite.
    memset(workspace + static_cast<size_t>(me.id) * slot_bytes, 0, slot_bytes);
    for (int64_t t = tasks.next(); t >= 0; t = tasks.next()) {
      const int64_t qt = t % n_qt, bh = t / n_qt;
      const HeadCtx c = make_head_ctx(p, bh / p.heads_q, bh % p.heads_q);
      if (qt * kBr >= c.len_q) continue;  // varlen: past this sequence's end
      forward_tile(p, c, qt * kBr, w);
    }
  });
  write_uncovered_tokens(p);
}

}  // namespace cpu
}  // namespace flashattn
