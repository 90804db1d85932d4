// Standard attention: the baseline the flash path is benchmarked against, and a second
// implementation of every option for cross-checking.
//
// For one (sequence, query head) at a time it materializes the full score matrix S and
// the probabilities P = softmax(S) (then dP and dS in the backward) in the shared
// workspace, O(seqlen_q * seqlen_k), exactly as a framework would with three GEMM calls.
// There is no tile skipping: masks are applied element by element to the full matrix.
// The team splits each phase by row blocks or key blocks (static assignment, barriers
// between phases); every output element is computed by one member in a fixed order,
// so results are deterministic and independent of the thread count.
#include <math.h>
#include <string.h>

#include <algorithm>

#include "cpu/cpu_impl.hpp"
#include "cpu/scores.hpp"
#include "cpu/tensor_view.hpp"
#include "cpu/thread_pool.hpp"
#include "cpu/tile_math.hpp"

namespace flashattn {
namespace cpu {
namespace {

constexpr int64_t kRows = 64;  // rows per work item of a row phase
constexpr int64_t kCols = 64;  // key columns per work item of a column phase

struct StdDims {
  int64_t dqk, dv, dqkp, dvp;
  int64_t lds;  // leading dim of S/P/dS: seqlen_k rounded up to the GEMM column unit
  int64_t ldq;  // seqlen_q rounded up (transposed column blocks)
};

StdDims std_dims(const AttnParams& p) {
  StdDims d;
  d.dqk = p.head_dim_qk;
  d.dv = p.head_dim_v;
  d.dqkp = round_up(d.dqk, kTileN);
  d.dvp = round_up(d.dv, kTileN);
  d.lds = round_up(p.seqlen_k, kTileN);
  d.ldq = round_up(p.seqlen_q, kTileN);
  return d;
}

// Extent of the fp32 dBias accumulator: each dim is the bias extent, or 1 if broadcast.
void dbias_extent(const AttnParams& p, int64_t e[4]) {
  const int64_t full[4] = {p.batch, p.heads_q, p.seqlen_q, p.seqlen_k};
  for (int k = 0; k < 4; ++k) e[k] = p.bias_stride[k] != 0 ? full[k] : 1;
}

struct StdShared {
  float* kt;     // [dqk x lds]
  float* v;      // [seqlen_k x dvp]  forward
  float* kr;     // [seqlen_k x dqkp] backward
  float* vt;     // [dv x lds]        backward
  float* qf;     // [seqlen_q x dqkp] backward
  float* dof;    // [seqlen_q x dvp]  backward
  float* s;      // [seqlen_q x lds]  S, then P (forward) / Z (backward)
  float* ds;     // [seqlen_q x lds]  dP, then dS (before the softcap factor)
  float* capg;   // [seqlen_q x lds]  softcap factor (backward with softcap)
  float* lse;    // [seqlen_q]
  float* delta;  // [seqlen_q]
  float* dk;     // [seqlen_k x dqkp] fp32 dK of the kv head, summed over its query heads
  float* dvacc;  // [seqlen_k x dvp]
  float* dbias;  // dbias_extent, fp32 sums (backward with bias tensor)
};

StdShared carve_shared(const AttnParams& p, Carver& cv) {
  const StdDims d = std_dims(p);
  const bool bwd = p.direction == kBackward;
  StdShared s{};
  s.kt = cv.floats(d.dqk, d.lds);
  if (!bwd) {
    s.v = cv.floats(p.seqlen_k, d.dvp);
    s.s = cv.floats(p.seqlen_q, d.lds);
    return s;
  }
  s.kr = cv.floats(p.seqlen_k, d.dqkp);
  s.vt = cv.floats(d.dv, d.lds);
  s.qf = cv.floats(p.seqlen_q, d.dqkp);
  s.dof = cv.floats(p.seqlen_q, d.dvp);
  s.s = cv.floats(p.seqlen_q, d.lds);
  s.ds = cv.floats(p.seqlen_q, d.lds);
  s.capg = p.softcap > 0.f ? cv.floats(p.seqlen_q, d.lds) : nullptr;
  s.lse = cv.floats(p.seqlen_q);
  s.delta = cv.floats(p.seqlen_q);
  s.dk = cv.floats(p.seqlen_k, d.dqkp);
  s.dvacc = cv.floats(p.seqlen_k, d.dvp);
  if (p.bias_kind == kBiasTensor) {
    int64_t e[4];
    dbias_extent(p, e);
    s.dbias = cv.floats(e[0], e[1], e[2], e[3]);
  }
  return s;
}

struct StdSlot {
  float* q;     // [kRows x dqkp]  forward: Q rows; backward: dQ rows
  float* o;     // [kRows x dvp]   forward
  float* drop;  // [kRows x lds]   dropout multipliers of a row block
  float* dsr;   // [kRows x lds]   dS * softcap factor (backward)
  float* colt;  // [kCols x ldq]   a column block of Z or dS, transposed (backward)
  float* tmp;   // [max(dqkp, dvp)]
};

StdSlot carve_slot(const AttnParams& p, Carver& cv) {
  const StdDims d = std_dims(p);
  StdSlot s{};
  s.q = cv.floats(kRows, d.dqkp);
  s.o = cv.floats(kRows, d.dvp);
  s.drop = dropout_active(p.drop_threshold) ? cv.floats(kRows, d.lds) : nullptr;
  if (p.direction == kBackward) {
    s.dsr = cv.floats(kRows, d.lds);
    s.colt = cv.floats(kCols, d.ldq);
  }
  s.tmp = cv.floats(d.dqkp > d.dvp ? d.dqkp : d.dvp);
  return s;
}

// Static round-robin split of n work items over the team.
template <class F>
void for_members(const TeamMember& me, int64_t n, F&& f) {
  for (int64_t x = me.id; x < n; x += me.size) f(x);
}

void forward_head(const AttnParams& p, const HeadCtx& c, const StdShared& sh, const StdSlot& w, const TeamMember& me) {
  const StdDims d = std_dims(p);
  // K^T and V of the kv head, converted once.
  for_members(me, ceil_div(c.len_k, kCols), [&](int64_t t) {
    const int64_t j0 = t * kCols, nj = c.len_k - j0 < kCols ? c.len_k - j0 : kCols;
    load_rows_t(p, p.k, p.k_stride, c.b, c.k0, c.hk, j0, nj, d.dqk, sh.kt + j0, d.lds);
    load_rows(p, p.v, p.v_stride, c.b, c.k0, c.hk, j0, nj, d.dv, sh.v + j0 * d.dvp, d.dvp);
  });
  me.barrier->wait();
  for_members(me, ceil_div(c.len_q, kRows), [&](int64_t t) {
    const int64_t i0 = t * kRows, ni = c.len_q - i0 < kRows ? c.len_q - i0 : kRows;
    float* s = sh.s + i0 * d.lds;
    load_rows(p, p.q, p.q_stride, c.b, c.q0, c.h, i0, ni, d.dqk, w.q, d.dqk);
    gemm(ni, d.lds, d.dqk, w.q, d.dqk, sh.kt, d.lds, s, d.lds, false);  // S
    transform_scores<false>(p, c, s, d.lds, i0, ni, 0, c.len_k, d.lds, true, nullptr);
    if (w.drop) dropout_tile<false>(p, c, w.drop, d.lds, i0, ni, 0, c.len_k);
    for (int64_t r = 0; r < ni; ++r) {
      float* row = s + r * d.lds;
      const float m = row_max(row, d.lds);
      // m = -inf: every score is -inf (masked) or NaN (row_max skips NaN). Exponentiated
      // against 0 instead, masked scores give exact zeros and NaN stays NaN, so l = 0
      // exactly iff the row is fully masked (P = 0, LSE = -inf) and a NaN score makes
      // l, P, O and LSE NaN.
      const float l = exp_sub_sum(row, d.lds, m == -INFINITY ? 0.f : m);
      float lse = -INFINITY;
      if (l != 0.f) {
        scale_rows(row, d.lds, 1, d.lds, 1.f / l);  // P
        lse = m + logf(l);
        if (w.drop) mul_row(row, w.drop + r * d.lds, c.len_k);
      }
      if (p.lse) p.lse[lse_index(p, c, i0 + r)] = lse;
    }
    gemm(ni, d.dvp, c.len_k, s, d.lds, sh.v, d.dvp, w.o, d.dvp, false);  // O = P V
    store_rows(p, p.o, p.o_stride, c.b, c.q0, c.h, i0, ni, d.dv, w.o, d.dvp, 1.f, w.tmp);
  });
  me.barrier->wait();  // S and K/V buffers are reused by the next head
}

// Backward for the query heads of kv head hk of sequence b: recompute S, P row blocks;
// dP = dO V^T; dS = P * (dP * D - Delta); dQ = scale dS' K (dS' = dS * softcap factor);
// then by key blocks dV += Z^T dO, dK += dS'^T Q, summed over the GQA group in fp32.
void backward_kv_head(const AttnParams& p, int64_t b, int64_t hk, const StdShared& sh, const StdSlot& w,
                      const TeamMember& me) {
  const StdDims d = std_dims(p);
  const int64_t group = p.heads_q / p.heads_kv;
  const int64_t len_k = seq_len_k(p, b), len_q = seq_len_q(p, b);
  const int64_t k0 = p.varlen ? p.cu_seqlens_k[b] : 0;
  const int64_t n_kb = ceil_div(len_k, kCols), n_qb = ceil_div(len_q, kRows);
  const bool want_dbias = p.bias_kind == kBiasTensor && p.dbias != nullptr;
  int64_t e[4] = {1, 1, 1, 1};
  if (want_dbias) dbias_extent(p, e);
  const bool db_rows = p.bias_stride[2] != 0, db_cols = p.bias_stride[3] != 0;

  for_members(me, n_kb, [&](int64_t t) {
    const int64_t j0 = t * kCols, nj = len_k - j0 < kCols ? len_k - j0 : kCols;
    load_rows_t(p, p.k, p.k_stride, b, k0, hk, j0, nj, d.dqk, sh.kt + j0, d.lds);
    load_rows(p, p.k, p.k_stride, b, k0, hk, j0, nj, d.dqk, sh.kr + j0 * d.dqkp, d.dqkp);
    load_rows_t(p, p.v, p.v_stride, b, k0, hk, j0, nj, d.dv, sh.vt + j0, d.lds);
    memset(sh.dk + j0 * d.dqkp, 0, sizeof(float) * static_cast<size_t>(nj * d.dqkp));
    memset(sh.dvacc + j0 * d.dvp, 0, sizeof(float) * static_cast<size_t>(nj * d.dvp));
  });
  me.barrier->wait();

  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const HeadCtx c = make_head_ctx(p, b, h);
    float* dbias_head = nullptr;  // this (b, h)'s [e2 x e3] slice of the dBias sums
    if (want_dbias) {
      const int64_t bb = p.bias_stride[0] != 0 ? b : 0, hh = p.bias_stride[1] != 0 ? h : 0;
      dbias_head = sh.dbias + (bb * e[1] + hh) * e[2] * e[3];
    }

    for_members(me, n_qb, [&](int64_t t) {
      const int64_t i0 = t * kRows, ni = len_q - i0 < kRows ? len_q - i0 : kRows;
      float* s = sh.s + i0 * d.lds;
      float* dp = sh.ds + i0 * d.lds;
      float* capg = sh.capg ? sh.capg + i0 * d.lds : nullptr;
      load_rows(p, p.q, p.q_stride, b, c.q0, h, i0, ni, d.dqk, sh.qf + i0 * d.dqkp, d.dqkp);
      load_rows(p, p.dout, p.do_stride, b, c.q0, h, i0, ni, d.dv, sh.dof + i0 * d.dvp, d.dvp);
      for (int64_t r = 0; r < ni; ++r) {
        const float lse = p.lse_in[lse_index(p, c, i0 + r)];
        sh.lse[i0 + r] = lse == -INFINITY ? INFINITY : lse;  // fully masked row: P = 0
        row_to_float(elem_ptr(p.o_in, p.dtype, row_offset(p, p.o_stride, b, c.q0 + i0 + r, h)), p.dtype, w.tmp, d.dv);
        sh.delta[i0 + r] = dot(sh.dof + (i0 + r) * d.dvp, w.tmp, d.dv);
      }
      gemm(ni, d.lds, d.dqk, sh.qf + i0 * d.dqkp, d.dqkp, sh.kt, d.lds, s, d.lds, false);  // S
      transform_scores<false>(p, c, s, d.lds, i0, ni, 0, len_k, d.lds, true, capg);
      gemm(ni, d.lds, d.dv, sh.dof + i0 * d.dvp, d.dvp, sh.vt, d.lds, dp, d.lds, false);  // dZ
      if (w.drop) dropout_tile<false>(p, c, w.drop, d.lds, i0, ni, 0, len_k);
      for (int64_t r = 0; r < ni; ++r) {
        float* srow = s + r * d.lds;
        float* dprow = dp + r * d.lds;
        float* dsr = w.dsr + r * d.lds;
        exp_sub(srow, d.lds, sh.lse[i0 + r]);                                                      // P
        ds_rows(srow, dprow, w.drop ? w.drop + r * d.lds : nullptr, sh.delta + i0 + r, 0, len_k);  // dS, Z
        memcpy(dsr, dprow, sizeof(float) * static_cast<size_t>(len_k));
        if (capg) mul_row(dsr, capg + r * d.lds, len_k);
        for (int64_t x = len_k; x < d.lds; ++x) dprow[x] = srow[x] = dsr[x] = 0.f;
        if (want_dbias && db_rows) {  // this member owns rows i0..i0+ni of the dBias sums
          float* acc = dbias_head + (i0 + r) * e[3];
          if (db_cols) {
            for (int64_t x = 0; x < len_k; ++x) acc[x] += dprow[x];
          } else {
            for (int64_t x = 0; x < len_k; ++x) acc[0] += dprow[x];
          }
        }
      }
      gemm(ni, d.dqkp, len_k, w.dsr, d.lds, sh.kr, d.dqkp, w.q, d.dqkp, false);  // dQ / scale
      store_grad_rows(p, p.dq, p.dq_stride, b, c.q0, h, i0, ni, d.dqk, w.q, d.dqkp, p.scale, w.tmp);
    });
    me.barrier->wait();

    for_members(me, n_kb, [&](int64_t t) {
      const int64_t j0 = t * kCols, nj = len_k - j0 < kCols ? len_k - j0 : kCols;
      for (int64_t i = 0; i < len_q; ++i) {
        const float* zr = sh.s + i * d.lds + j0;
        for (int64_t x = 0; x < nj; ++x) w.colt[x * d.ldq + i] = zr[x];
      }
      gemm(nj, d.dvp, len_q, w.colt, d.ldq, sh.dof, d.dvp, sh.dvacc + j0 * d.dvp, d.dvp, true);  // dV
      for (int64_t i = 0; i < len_q; ++i) {
        const float* dsrow = sh.ds + i * d.lds + j0;
        const float* g = sh.capg ? sh.capg + i * d.lds + j0 : nullptr;
        for (int64_t x = 0; x < nj; ++x) w.colt[x * d.ldq + i] = g ? dsrow[x] * g[x] : dsrow[x];
      }
      gemm(nj, d.dqkp, len_q, w.colt, d.ldq, sh.qf, d.dqkp, sh.dk + j0 * d.dqkp, d.dqkp, true);  // dK / scale
      if (want_dbias && !db_rows) {
        if (db_cols) {  // this member owns columns j0..j0+nj of the row-summed dBias
          for (int64_t i = 0; i < len_q; ++i) {
            const float* dsrow = sh.ds + i * d.lds + j0;
            for (int64_t x = 0; x < nj; ++x) dbias_head[j0 + x] += dsrow[x];
          }
        } else if (t == 0) {  // a single sum per (b, h): one member, row-major order
          for (int64_t i = 0; i < len_q; ++i) {
            for (int64_t x = 0; x < len_k; ++x) dbias_head[0] += sh.ds[i * d.lds + x];
          }
        }
      }
    });
    me.barrier->wait();
  }

  for_members(me, n_kb, [&](int64_t t) {
    const int64_t j0 = t * kCols, nj = len_k - j0 < kCols ? len_k - j0 : kCols;
    store_grad_rows(p, p.dk, p.dk_stride, b, k0, hk, j0, nj, d.dqk, sh.dk + j0 * d.dqkp, d.dqkp, p.scale, w.tmp);
    store_grad_rows(p, p.dv, p.dv_stride, b, k0, hk, j0, nj, d.dv, sh.dvacc + j0 * d.dvp, d.dvp, 1.f, w.tmp);
  });
  me.barrier->wait();
}

// No phase has more work items than the larger of the row and key block counts.
int useful_threads(const AttnParams& p, int threads) {
  const int64_t items = std::max(ceil_div(p.seqlen_q, kRows), ceil_div(p.seqlen_k, kCols));
  return team_size(threads, items, attention_work(p));
}

}  // namespace

CheckedSize standard_shared_bytes(const AttnParams& p) {
  Carver cv{nullptr};
  carve_shared(p, cv);
  return cv.used;
}

CheckedSize standard_slot_bytes(const AttnParams& p) {
  Carver cv{nullptr};
  carve_slot(p, cv);
  return cv.used;
}

void standard_forward(const AttnParams& p, char* workspace, int threads) {
  const size_t shared_bytes = static_cast<size_t>(standard_shared_bytes(p).value());
  const size_t slot_bytes = static_cast<size_t>(standard_slot_bytes(p).value());
  Carver scv{workspace};
  const StdShared sh = carve_shared(p, scv);
  {
    const StdDims d = std_dims(p);  // GEMM padding must be finite; S is always written first
    memset(sh.kt, 0, sizeof(float) * static_cast<size_t>(d.dqk * d.lds));
    memset(sh.v, 0, sizeof(float) * static_cast<size_t>(p.seqlen_k * d.dvp));
  }
  threads = useful_threads(p, threads);
  run_team(threads, [&](const TeamMember& me) {
    char* slot = workspace + shared_bytes + static_cast<size_t>(me.id) * slot_bytes;
    memset(slot, 0, slot_bytes);
    Carver cv{slot};
    const StdSlot w = carve_slot(p, cv);
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t h = 0; h < p.heads_q; ++h) forward_head(p, make_head_ctx(p, b, h), sh, w, me);
    }
  });
  write_uncovered_tokens(p);
}

}  // namespace cpu
}  // namespace flashattn

namespace flashattn {
namespace cpu {

void standard_backward(const AttnParams& p, char* workspace, int threads) {
  const size_t shared_bytes = static_cast<size_t>(standard_shared_bytes(p).value());
  const size_t slot_bytes = static_cast<size_t>(standard_slot_bytes(p).value());
  Carver scv{workspace};
  const StdShared sh = carve_shared(p, scv);
  const StdDims d = std_dims(p);
  // Only the O(seqlen * head_dim) buffers are cleared: the GEMMs read their padding
  // columns. S, dS and the softcap factors are fully written before they are read.
  memset(sh.kt, 0, sizeof(float) * static_cast<size_t>(d.dqk * d.lds));
  memset(sh.vt, 0, sizeof(float) * static_cast<size_t>(d.dv * d.lds));
  memset(sh.qf, 0, sizeof(float) * static_cast<size_t>(p.seqlen_q * d.dqkp));
  memset(sh.dof, 0, sizeof(float) * static_cast<size_t>(p.seqlen_q * d.dvp));
  memset(sh.kr, 0, sizeof(float) * static_cast<size_t>(p.seqlen_k * d.dqkp));
  int64_t e[4] = {0, 0, 0, 0};
  const bool want_dbias = p.bias_kind == kBiasTensor && p.dbias != nullptr;
  if (want_dbias) {
    dbias_extent(p, e);
    memset(sh.dbias, 0, sizeof(float) * static_cast<size_t>(e[0] * e[1] * e[2] * e[3]));
  }
  threads = useful_threads(p, threads);
  run_team(threads, [&](const TeamMember& me) {
    char* slot = workspace + shared_bytes + static_cast<size_t>(me.id) * slot_bytes;
    memset(slot, 0, slot_bytes);
    Carver cv{slot};
    const StdSlot w = carve_slot(p, cv);
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t hk = 0; hk < p.heads_kv; ++hk) backward_kv_head(p, b, hk, sh, w, me);
    }
    if (want_dbias) {      // every dBias element, including those no sequence reaches (zero)
      me.barrier->wait();  // a static split: every member must have started (run_team)
      const int64_t* bs = p.bias_stride;
      for_members(me, e[0] * e[1] * e[2], [&](int64_t t) {
        const int64_t ii = t % e[2], hh = (t / e[2]) % e[1], bb = t / (e[2] * e[1]);
        const float* acc = sh.dbias + t * e[3];
        const int64_t base = bb * bs[0] + hh * bs[1] + ii * bs[2];
        for (int64_t jj = 0; jj < e[3]; ++jj) store_elem(p.dbias, p.dtype, base + jj * bs[3], acc[jj]);
      });
    }
  });
  write_uncovered_tokens(p);
}

}  // namespace cpu
}  // namespace flashattn
