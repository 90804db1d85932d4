// Tiled FlashAttention backward by recomputation (no N x N buffer).
//
// With P = exp(S - LSE) recomputed per tile, Z = dropout(P) (multipliers D), and
// Delta_i = rowsum(dO_i * O_i) (= rowsum(Z * dZ), since O_i = sum_j Z_ij V_j):
//   dV = Z^T dO,  dZ = dO V^T,  dS = P * (dZ * D - Delta),
//   dS_raw = dS * (1 - tanh^2) with softcap,  dQ = scale dS_raw K,  dK = scale dS_raw^T Q,
//   dBias = dS (summed over broadcast dims).
//
// Every output element is owned by exactly one task (no atomics, no partial sums across
// tasks), so results are bitwise identical for any thread count. Two schedules, which
// give bitwise identical results (the same sums in the same order), chosen per run:
//   one pass (no bias tensor, and at least one (b, kv head) per thread): tasks (b, kv
//           head) loop over the query heads of the GQA group, the key tiles and the
//           query tiles, and compute dQ, dK and dV of the whole group from each tile
//           pair's dS: 5 tile GEMMs per pair, with dQ, dK and dV accumulated over
//           sequence-long buffers in the task's slot (O(N d) workspace per thread);
//   two passes (otherwise; a task per tile keeps every thread busy, and dBias is owned
//           per query tile):
//     pass 1, tasks (b, kv head, key tile): dK, dV of that tile, looping over the query
//           heads of the GQA group and every query tile (computed on S, with K^T and V^T
//           transposed once per task; dK and dV read dS and Z transposed, gemm_at);
//     pass 2, tasks (b, h, query tile): dQ of that tile, looping over the key tiles
//           (computed on S^T, with Q^T and dO^T transposed once per task); it
//           also produces dBias. When dBias broadcasts over batch, heads or rows, a
//           pass-2 task covers all the (b, h, query tile) that share its dBias elements,
//           in a fixed order, and sums them in an fp32 slot buffer.
//   Pass 2 recomputes S and dP: 7 tile GEMMs per (q, k) tile pair.
//
// bf16 runs on the amx set (amx_products) take the same schedules with every tile pair on
// S^T (the two-pass schedule's pass-2 layout, and the forward's) and its GEMMs on AMX tiles
// (amx.hpp): S^T = K Q^T and dZ^T = V dO^T from the bf16 inputs (exact), dK += dS^T Q and
// dQ += dS K with dS rounded to bf16, dV += Z^T dO with Z as two bf16 parts (its rounding and
// the residual's: 16 bits), sums in fp32. Z is P times the keep mask: the dropout scale
// 1 / (1 - p) multiplies dZ before dS and dV as it is stored (docs/internals/cpu-bf16-amx.md).
#include <math.h>
#include <string.h>

#include <utility>

#include "cpu/amx.hpp"
#include "cpu/cpu_impl.hpp"
#include "cpu/isa.hpp"
#include "cpu/scores.hpp"
#include "cpu/tensor_view.hpp"
#include "cpu/thread_pool.hpp"
#include "cpu/tile_math.hpp"

namespace flashattn {
namespace cpu {
namespace {

// The query side's B operands of the AMX products (amx.hpp) for ld query rows (a multiple
// of kBr): a query tile's (two passes) or a head's whole sequence (one pass).
struct QueryPack {
  uint32_t* qt;   // [amx_words(dqk) x ld]  Q^T, pairs of head dims (B of S^T = K Q^T)
  uint32_t* dot;  // [amx_words(dv) x ld]   dO^T, pairs of head dims (B of dZ^T = V dO^T)
  uint32_t* qp;   // [ld / 2 x dqkp]        Q, pairs of queries (B of dK += dS^T Q)
  uint32_t* dop;  // [ld / 2 x dvp]         dO, pairs of queries (B of dV += Z^T dO)
  int64_t ld;
};

struct BwdSlot {
  // pass 1 (key tile fixed)
  float* kt;      // [dqk x kBc]   K^T
  float* vt;      // [dv x kBc]    V^T
  float* dk_acc;  // [kBc x dqkp]
  float* dv_acc;  // [kBc x dvp]
  // pass 2 (query tile fixed)
  float* qt;      // [dqk x kBr]   Q^T
  float* dot;     // [dv x kBr]    dO^T
  float* v;       // [kBc x dv]    V tile, row-major
  float* dq_acc;  // [kBr x dqkp]
  float* dbias;   // [dbias_rows x dbias_ld] (bias tensor only)
  // one pass (no bias tensor): one head's dQ, one kv head's dK and dV, every row, and
  // the head's query side (load_query_side), loaded once per head; nq, nk: seqlen_q,
  // seqlen_k, on amx_products runs rounded up to whole tiles (kBr, kBc)
  float* dq_seq;     // [nq x dqkp]
  float* dk_seq;     // [nk x dqkp]
  float* dv_seq;     // [nk x dvp]
  float* q_seq;      // [seqlen_q x dqkp]
  float* do_seq;     // [seqlen_q x dvp]
  float* lse_seq;    // [nq]
  float* delta_seq;  // [nq]
  // both
  float* kr;     // [kBc x dqkp]  K tile, row-major
  float* q;      // [kBr x dqkp]  Q tile, row-major
  float* dout;   // [kBr x dvp]
  float* s;      // [64 x 64]  S (pass 1) or S^T (pass 2)
  float* dp;     // [64 x 64]
  float* drop;   // [64 x 64]  dropout only
  float* capg;   // [64 x 64]  softcap only
  float* lse;    // [kBr]  +inf for rows without any kept key
  float* delta;  // [kBr]
  float* tmp;    // [max(dqkp, dvp)]
  // amx_products runs only (null otherwise; they carve no kt, vt, qt, dot, v): the tile
  // operands of a tile pair on S^T (amx.hpp)
  uint32_t* ka;     // [kBc x amx_words(dqk)]  K rows, pairs of head dims (A of S^T = K Q^T)
  uint32_t* va;     // [kBc x amx_words(dv)]   V rows, pairs of head dims (A of dZ^T = V dO^T)
  uint32_t* kp;     // [kBc / 2 x dqkp]        K, pairs of keys (B of dQ += dS K)
  uint32_t* za;     // [kBc x kBr / 2]         Z^T rounded, pairs of queries (A of dV += Z^T dO)
  uint32_t* zl;     // [kBc x kBr / 2]         Z^T's rounding residuals, laid out as za (the same)
  uint32_t* dsa;    // [kBc x kBr / 2]         dS^T rounded, pairs of queries (A of dK += dS^T Q)
  uint32_t* dsq;    // [kBr x kBc / 2]         dS, pairs of keys (A of dQ += dS K)
  QueryPack qtile;  // ld kBr (two passes)
  QueryPack qseq;   // ld round_up(seqlen_q, kBr) (one pass)
  // The bytes of the buffers above but the one-pass ones, which come last in the slot.
  size_t tile_bytes;
};

int64_t dbias_ld(const AttnParams& p) { return p.bias_stride[3] != 0 ? round_up(p.seqlen_k, kTileN) : 1; }
int64_t dbias_rows(const AttnParams& p) { return p.bias_stride[2] != 0 ? kBr : 1; }

// The AMX products' query operands for ld rows (none on builds without the amx set).
QueryPack carve_query_pack(const AttnParams& p, Carver& cv, int64_t ld) {
  QueryPack q{nullptr, nullptr, nullptr, nullptr, ld};
#if FA_HAVE_X86_BUILDS
  const int64_t dqkp = round_up(p.head_dim_qk, kTileN), dvp = round_up(p.head_dim_v, kTileN);
  q.qt = cv.words(amx_words(p.head_dim_qk), ld);
  q.dot = cv.words(amx_words(p.head_dim_v), ld);
  q.qp = cv.words(ld / 2, dqkp);
  q.dop = cv.words(ld / 2, dvp);
#else
  (void)p;
  (void)cv;
#endif
  return q;
}

// The AMX products' tile-pair operands (amx_products runs; none on builds without the set).
void carve_tile_operands(const AttnParams& p, Carver& cv, BwdSlot& s) {
#if FA_HAVE_X86_BUILDS
  const int64_t dqkp = round_up(p.head_dim_qk, kTileN);
  s.ka = cv.words(kBc, amx_words(p.head_dim_qk));
  s.va = cv.words(kBc, amx_words(p.head_dim_v));
  s.kp = cv.words(kBc / 2, dqkp);
  s.za = cv.words(kBc, kBr / 2);
  s.zl = cv.words(kBc, kBr / 2);
  s.dsa = cv.words(kBc, kBr / 2);
  s.dsq = cv.words(kBr, kBc / 2);
  s.qtile = carve_query_pack(p, cv, kBr);
#else
  (void)p;
  (void)cv;
  (void)s;
#endif
}

BwdSlot carve_bwd(const AttnParams& p, Carver& cv) {
  const int64_t dqk = p.head_dim_qk, dv = p.head_dim_v;
  const int64_t dqkp = round_up(dqk, kTileN), dvp = round_up(dv, kTileN);
  const bool amx = amx_products(p);
  BwdSlot s{};
  s.v = amx ? nullptr : cv.floats(kBc, dv);
  s.qt = amx ? nullptr : cv.floats(dqk, kBr);
  s.dot = amx ? nullptr : cv.floats(dv, kBr);
  s.dk_acc = cv.floats(kBc, dqkp);
  s.dv_acc = cv.floats(kBc, dvp);
  s.kt = amx ? nullptr : cv.floats(dqk, kBc);
  s.vt = amx ? nullptr : cv.floats(dv, kBc);
  s.dq_acc = cv.floats(kBr, dqkp);
  s.dbias = p.bias_kind == kBiasTensor ? cv.floats(dbias_rows(p), dbias_ld(p)) : nullptr;
  s.q = cv.floats(kBr, dqkp);
  s.kr = cv.floats(kBc, dqkp);
  s.dout = cv.floats(kBr, dvp);
  s.s = cv.floats(kBr, kBc);
  s.dp = cv.floats(kBr, kBc);
  s.drop = dropout_active(p.drop_threshold) ? cv.floats(kBr, kBc) : nullptr;
  s.capg = p.softcap > 0.f ? cv.floats(kBr, kBc) : nullptr;
  s.lse = cv.floats(kBr);
  s.delta = cv.floats(kBr);
  s.tmp = cv.floats(dqkp > dvp ? dqkp : dvp);
  if (amx) carve_tile_operands(p, cv, s);
  s.tile_bytes = static_cast<size_t>(cv.used.value());
  const bool one_pass = p.bias_kind != kBiasTensor;
  // AMX products write whole 32-row blocks of dQ, dK and dV, and the S^T tiles read the
  // LSE and Delta of whole query tiles: the sequences are padded to whole tiles.
  const int64_t nq = amx ? round_up(p.seqlen_q, kBr) : p.seqlen_q, nk = amx ? round_up(p.seqlen_k, kBc) : p.seqlen_k;
  s.dq_seq = one_pass ? cv.floats(nq, dqkp) : nullptr;
  s.dk_seq = one_pass ? cv.floats(nk, dqkp) : nullptr;
  s.dv_seq = one_pass ? cv.floats(nk, dvp) : nullptr;
  s.q_seq = one_pass ? cv.floats(p.seqlen_q, dqkp) : nullptr;
  s.do_seq = one_pass ? cv.floats(p.seqlen_q, dvp) : nullptr;
  s.lse_seq = one_pass ? cv.floats(nq) : nullptr;
  s.delta_seq = one_pass ? cv.floats(nq) : nullptr;
  if (one_pass && amx) s.qseq = carve_query_pack(p, cv, nq);
  return s;
}

// Whether the slot holds the AMX products' operands (amx_products runs).
bool amx_slot(const BwdSlot& w) { return w.ka != nullptr; }

// The scale dV's sums are stored with: 1, or 1 / (1 - p_drop) where the AMX products left
// it out of Z.
float dv_scale(const AttnParams& p, const BwdSlot& w) { return amx_slot(w) && w.drop != nullptr ? p.rp_keep : 1.f; }

// The query side of a query tile as the tile pairs read it: Q and dO rows (row strides
// dqkp, dvp), and per row the LSE and Delta.
struct QuerySide {
  float* q;
  float* dout;
  float* lse;
  float* delta;
};

// Loads Q, dO of query rows [i0, i0+ni) of context c into qs, the LSE (a -inf LSE marks a
// fully masked row: stored as +inf so exp(s - lse) = 0 for every s, including s = -inf),
// and Delta = rowsum(dO * O) in fp32 (fixed summation order, identical in both schedules).
void load_query_side(const AttnParams& p, const HeadCtx& c, int64_t i0, int64_t ni, const QuerySide& qs, float* tmp) {
  const int64_t dqk = p.head_dim_qk, dv = p.head_dim_v;
  const int64_t dqkp = round_up(dqk, kTileN), dvp = round_up(dv, kTileN);
  load_rows(p, p.q, p.q_stride, c.b, c.q0, c.h, i0, ni, dqk, qs.q, dqkp);
  load_rows(p, p.dout, p.do_stride, c.b, c.q0, c.h, i0, ni, dv, qs.dout, dvp);
  for (int64_t r = 0; r < ni; ++r) {
    const float lse = p.lse_in[lse_index(p, c, i0 + r)];
    qs.lse[r] = lse == -INFINITY ? INFINITY : lse;
    row_to_float(elem_ptr(p.o_in, p.dtype, row_offset(p, p.o_stride, c.b, c.q0 + i0 + r, c.h)), p.dtype, tmp, dv);
    qs.delta[r] = dot(qs.dout + r * dvp, tmp, dv);
  }
}

// LSE and Delta of rows [from, to) of qs past the data: +inf and 0, so that P = 0 there.
void pad_query_rows(const QuerySide& qs, int64_t from, int64_t to) {
  for (int64_t r = from; r < to; ++r) {
    qs.lse[r] = INFINITY;
    qs.delta[r] = 0.f;
  }
}

// The two-pass schedule's query tile: loaded into the slot's tile buffers, the LSE and
// Delta of rows past ni padded (+inf, 0) for the transposed tiles' per-column reads.
QuerySide load_query_tile(const AttnParams& p, const HeadCtx& c, int64_t i0, int64_t ni, const BwdSlot& w) {
  const QuerySide qs{w.q, w.dout, w.lse, w.delta};
  load_query_side(p, c, i0, ni, qs, w.tmp);
  pad_query_rows(qs, ni, kBr);
  return qs;
}

// The first row, within query tile [i0, i0 + ni) of c, whose forward scores were dot
// products (ni if none): the backward recomputes those rows' scores the same way.
int64_t dot_rows_from(const HeadCtx& c, int64_t i0, int64_t ni) {
  const int64_t d = first_dot_row(c.len_q) - i0;
  return d < 0 ? 0 : (d > ni ? ni : d);
}

// From the raw scores q.k in w.s and dZ in w.dp (layouts as tile_ds): the scores
// (transform_scores), P = exp(S - LSE), Z = dropout(P) in w.s and dS = P * (dZ * D - Delta)
// in w.dp. unscaled_z (AMX products): Z = P * keep mask, without 1 / (1 - p_drop), which
// multiplies dZ first (the same dS) and dV as it is stored (dv_scale).
template <bool kT>
void scores_to_ds(const AttnParams& p, const HeadCtx& c, int64_t i0, int64_t ni, int64_t j0, int64_t nj, TileKind kind,
                  const QuerySide& qs, const BwdSlot& w, bool unscaled_z) {
  const int64_t ld = kT ? kBr : kBc;  // row stride of the score tiles
  const int64_t rows = kT ? nj : ni, cols = round_up(kT ? ni : nj, kTileN);
  transform_scores<kT>(p, c, w.s, ld, i0, ni, j0, nj, ld, kind == kTilePartial, w.capg);
  if (w.drop) {
    dropout_tile<kT>(p, c, w.drop, ld, i0, ni, j0, nj, unscaled_z);
    if (unscaled_z) scale_rows(w.dp, ld, rows, cols, p.rp_keep);
  }
  // Only the valid entries are read after (the GEMMs that take dS and Z sum over ni or nj).
  ds_tile(w.s, w.dp, w.drop, ld, rows, cols, qs.lse, qs.delta, kT);
}

// One (query tile [i0, i0+ni), key tile [j0, j0+nj)) pair of context c: recomputes S,
// P and dZ, and leaves Z = dropout(P) in w.s and dS = P * (dZ * D - Delta) in w.dp, as
// [ni x kBc] tiles (pass 1: S = Q K^T, dZ = dO V^T from K^T and V^T in w.kt, w.vt) or
// transposed, [nj x kBr] (kT, pass 2: S^T = K Q^T, dZ^T = V dO^T from Q^T and dO^T in
// w.qt, w.dot, and the row-major V tile in w.v). Q, dO, LSE and Delta are qs's; k_rows
// (row stride ldk) is the row-major K tile, for the rows whose forward scores were dot
// products, which are recomputed the same way (cpu_impl.hpp).
template <bool kT>
void tile_ds(const AttnParams& p, const HeadCtx& c, int64_t i0, int64_t ni, int64_t j0, int64_t nj, TileKind kind,
             const float* k_rows, int64_t ldk, const QuerySide& qs, const BwdSlot& w) {
  const int64_t dqk = p.head_dim_qk, dv = p.head_dim_v;
  const int64_t dqkp = round_up(dqk, kTileN), dvp = round_up(dv, kTileN);
  const int64_t d0 = dot_rows_from(c, i0, ni);
  if (kT) {
    gemm(nj, kBr, dqk, k_rows, ldk, w.qt, kBr, w.s, kBr, false);
    if (d0 < ni) dot_rows(nj, ni - d0, dqk, k_rows, ldk, qs.q + d0 * dqkp, dqkp, w.s + d0, kBr);
    gemm(nj, kBr, dv, w.v, dv, w.dot, kBr, w.dp, kBr, false);
  } else {
    gemm(ni, kBc, dqk, qs.q, dqkp, w.kt, kBc, w.s, kBc, false);
    if (d0 < ni) dot_rows(ni - d0, nj, dqk, qs.q + d0 * dqkp, dqkp, k_rows, ldk, w.s + d0 * kBc, kBc);
    gemm(ni, kBc, dv, qs.dout, dvp, w.vt, kBc, w.dp, kBc, false);
  }
  scores_to_ds<kT>(p, c, i0, ni, j0, nj, kind, qs, w, false);
}

// dS_raw = dS * (1 - tanh^2) on the tile tile_ds left in w.dp (softcap only).
template <bool kT>
void soften_ds(int64_t ni, int64_t nj, const BwdSlot& w) {
  if (!w.capg) return;
  const int64_t ld = kT ? kBr : kBc;
  for (int64_t o = 0; o < (kT ? nj : ni); ++o) mul_row(w.dp + o * ld, w.capg + o * ld, kT ? ni : nj);
}

// Loads key tile [j0, j0+nj) of kv head hk of sequence b: K row-major (w.kr), K^T and V^T.
void load_key_side(const AttnParams& p, int64_t b, int64_t hk, int64_t j0, int64_t nj, const BwdSlot& w) {
  const int64_t dqk = p.head_dim_qk, dv = p.head_dim_v;
  const int64_t k0 = p.varlen ? p.cu_seqlens_k[b] : 0;
  load_rows(p, p.k, p.k_stride, b, k0, hk, j0, nj, dqk, w.kr, round_up(dqk, kTileN));
  load_rows_t(p, p.k, p.k_stride, b, k0, hk, j0, nj, dqk, w.kt, kBc);
  load_rows_t(p, p.v, p.v_stride, b, k0, hk, j0, nj, dv, w.vt, kBc);
}

// One (query tile, key tile) pair on S, with the key side loaded (load_key_side) and the
// query side in qs: leaves dS_raw in w.dp and adds dV += Z^T dO and dK += dS_raw^T Q to
// the key tile's rows of dv_acc and dk_acc (Z and dS read transposed; the K dimension is
// the ni valid query rows).
void pair_dkdv(const AttnParams& p, const HeadCtx& c, int64_t i0, int64_t ni, int64_t j0, int64_t nj, TileKind kind,
               const QuerySide& qs, const BwdSlot& w, float* dk_acc, float* dv_acc) {
  const int64_t dqkp = round_up(p.head_dim_qk, kTileN), dvp = round_up(p.head_dim_v, kTileN);
  tile_ds<false>(p, c, i0, ni, j0, nj, kind, w.kr, dqkp, qs, w);
  soften_ds<false>(ni, nj, w);
  gemm_at(nj, dvp, ni, w.s, kBc, qs.dout, dvp, dv_acc, dvp, true);
  gemm_at(nj, dqkp, ni, w.dp, kBc, qs.q, dqkp, dk_acc, dqkp, true);
}

#if FA_HAVE_X86_BUILDS
// ---- AMX products (amx_products runs): tile pairs on S^T ----

// Packs rows [0, n) of the query side qs (fp32, exact bf16 values) into pk's operands;
// rows past n and head dims past the data are zeros.
void pack_query_side(const AttnParams& p, const QuerySide& qs, int64_t n, const QueryPack& pk) {
  const int64_t dqk = p.head_dim_qk, dv = p.head_dim_v;
  const int64_t dqkp = round_up(dqk, kTileN), dvp = round_up(dv, kTileN);
  amx_rows_t(qs.q, dqkp, n, dqk, amx_words(dqk), pk.qt, pk.ld);
  amx_rows_t(qs.dout, dvp, n, dv, amx_words(dv), pk.dot, pk.ld);
  amx_pairs_f(qs.q, dqkp, n, dqkp, pk.ld / 2, pk.qp, dqkp);
  amx_pairs_f(qs.dout, dvp, n, dvp, pk.ld / 2, pk.dop, dvp);
}

// Loads key tile [j0, j0+nj) of c's kv head: K row-major in fp32 (w.kr: the dot rows'
// scores, and K's pairs of keys), K and V rows read in place as the A operands (w.ka,
// w.va), K's pairs of keys (w.kp); keys past nj are zeros.
void load_key_side_amx(const AttnParams& p, const HeadCtx& c, int64_t j0, int64_t nj, const BwdSlot& w) {
  const int64_t dqk = p.head_dim_qk, dv = p.head_dim_v, dqkp = round_up(dqk, kTileN);
  load_rows(p, p.k, p.k_stride, c.b, c.k0, c.hk, j0, nj, dqk, w.kr, dqkp);
  const uint16_t* rows[kBc] = {};
  key_rows_h(p, p.k, p.k_stride, c, j0, nj, rows);
  amx_copy_rows(rows, nj, dqk, kBc, amx_words(dqk), w.ka);
  key_rows_h(p, p.v, p.v_stride, c, j0, nj, rows);
  amx_copy_rows(rows, nj, dv, kBc, amx_words(dv), w.va);
  amx_pairs_f(w.kr, dqkp, nj, dqkp, kBc / 2, w.kp, dqkp);
}

// tile_ds<true> with the products on tiles: S^T = K Q^T and dZ^T = V dO^T from w.ka, w.va
// and pk (at the tile's first query), the dot rows' scores as tile_ds computes them, and
// Z without the dropout scale (scores_to_ds).
void tile_ds_amx(const AttnParams& p, const HeadCtx& c, int64_t i0, int64_t ni, int64_t j0, int64_t nj, TileKind kind,
                 const QuerySide& qs, const QueryPack& pk, const BwdSlot& w) {
  const int64_t dqk = p.head_dim_qk, dqkp = round_up(dqk, kTileN);
  const int64_t qw = amx_words(dqk), vw = amx_words(p.head_dim_v);
  const int64_t mk = round_up(nj, 32), nc = round_up(ni, kTileN);  // key rows, query columns computed
  amx_gemm(mk, nc, qw, w.ka, qw, pk.qt, pk.ld, w.s, kBr, false);
  const int64_t d0 = dot_rows_from(c, i0, ni);
  if (d0 < ni) dot_rows(nj, ni - d0, dqk, w.kr, dqkp, qs.q + d0 * dqkp, dqkp, w.s + d0, kBr);
  amx_gemm(mk, nc, vw, w.va, vw, pk.dot, pk.ld, w.dp, kBr, false);
  scores_to_ds<true>(p, c, i0, ni, j0, nj, kind, qs, w, true);
}

// Rounds dS_raw^T (w.dp) and with z Z^T (w.s) of a tile pair on S^T to bf16 rows: the A
// operands w.dsa, and w.za with Z's residuals in w.zl, pairs of queries, queries past ni and
// keys past nj zeros.
void round_pair_amx(int64_t ni, int64_t nj, bool z, const BwdSlot& w) {
  if (z) amx_words_f(w.s, kBr, nj, ni, round_up(nj, 32), kBr / 2, w.za, w.zl);
  amx_words_f(w.dp, kBr, nj, ni, round_up(nj, 32), kBr / 2, w.dsa);
}

// dV += Z^T dO (Z as its rounding plus the residual's: two products) and dK += dS_raw^T Q
// over the tile pair's queries (whole 32-row blocks of the key tile's accumulator rows: the
// rows past nj add zeros).
void add_dkdv_amx(const AttnParams& p, int64_t ni, int64_t nj, const QueryPack& pk, const BwdSlot& w, float* dk_acc,
                  float* dv_acc) {
  const int64_t dqkp = round_up(p.head_dim_qk, kTileN), dvp = round_up(p.head_dim_v, kTileN);
  const int64_t mk = round_up(nj, 32), k2 = round_up(ni, 32) / 2;
  amx_gemm(mk, dvp, k2, w.za, kBr / 2, pk.dop, dvp, dv_acc, dvp, true);
  amx_gemm(mk, dvp, k2, w.zl, kBr / 2, pk.dop, dvp, dv_acc, dvp, true);
  amx_gemm(mk, dqkp, k2, w.dsa, kBr / 2, pk.qp, dqkp, dk_acc, dqkp, true);
}

// dQ += dS_raw K over the tile pair's keys, dS's pairs of keys transposed from the bf16
// rows of dS^T (w.dsa) into w.dsq (whole 32-row blocks of dq_acc: the rows past ni add
// zeros).
void add_dq_amx(const AttnParams& p, int64_t ni, int64_t nj, const BwdSlot& w, float* dq_acc) {
  const int64_t dqkp = round_up(p.head_dim_qk, kTileN);
  const uint16_t* rows[kBc] = {};
  for (int64_t x = 0; x < nj; ++x) rows[x] = reinterpret_cast<const uint16_t*>(w.dsa + x * (kBr / 2));
  amx_pairs_t(rows, nj, ni, round_up(ni, 32), w.dsq, kBc / 2);
  amx_gemm(round_up(ni, 32), dqkp, round_up(nj, 32) / 2, w.dsq, kBc / 2, w.kp, dqkp, dq_acc, dqkp, true);
}

// pair_dkdv and, with dq_acc, the one pass's dQ += dS_raw K, on tiles: the same sums over
// the same tiles in both schedules (pk at the tile's first query).
void pair_grads_amx(const AttnParams& p, const HeadCtx& c, int64_t i0, int64_t ni, int64_t j0, int64_t nj,
                    TileKind kind, const QuerySide& qs, const QueryPack& pk, const BwdSlot& w, float* dk_acc,
                    float* dv_acc, float* dq_acc) {
  tile_ds_amx(p, c, i0, ni, j0, nj, kind, qs, pk, w);
  soften_ds<true>(ni, nj, w);
  round_pair_amx(ni, nj, true, w);
  add_dkdv_amx(p, ni, nj, pk, w, dk_acc, dv_acc);
  if (dq_acc != nullptr) add_dq_amx(p, ni, nj, w, dq_acc);
}
#endif

// ---- both paths: the schedules' steps, on tiles where the run has the AMX operands ----

// pk's operands from query rows [i0, ...): Q^T and dO^T from column i0, the pairs of
// queries from pair row i0 / 2 (i0 a multiple of kBr); pk itself where it is not carved.
QueryPack query_pack_at(const AttnParams& p, const QueryPack& pk, int64_t i0) {
  if (pk.qt == nullptr) return pk;
  const int64_t dqkp = round_up(p.head_dim_qk, kTileN), dvp = round_up(p.head_dim_v, kTileN);
  return QueryPack{pk.qt + i0, pk.dot + i0, pk.qp + i0 / 2 * dqkp, pk.dop + i0 / 2 * dvp, pk.ld};
}

// Key tile [j0, j0+nj) of c's kv head, as the path's tile pairs read it.
void load_keys(const AttnParams& p, const HeadCtx& c, int64_t j0, int64_t nj, const BwdSlot& w) {
#if FA_HAVE_X86_BUILDS
  if (amx_slot(w)) return load_key_side_amx(p, c, j0, nj, w);
#endif
  load_key_side(p, c.b, c.hk, j0, nj, w);
}

// After the query side qs (rows [0, n) of its buffers) is loaded: the AMX path packs it
// into pk (the fp32 path reads qs as it is).
void pack_queries(const AttnParams& p, const QuerySide& qs, int64_t n, const QueryPack& pk, const BwdSlot& w) {
#if FA_HAVE_X86_BUILDS
  if (amx_slot(w)) pack_query_side(p, qs, n, pk);
#else
  (void)p;
  (void)qs;
  (void)n;
  (void)pk;
  (void)w;
#endif
}

// One tile pair of the one pass (dq_acc: the tile's dQ rows) or of pass 1 (dq_acc null):
// dV, dK and dQ from the same dS.
void pair_grads(const AttnParams& p, const HeadCtx& c, int64_t i0, int64_t ni, int64_t j0, int64_t nj, TileKind kind,
                const QuerySide& qs, const QueryPack& pk, const BwdSlot& w, float* dk_acc, float* dv_acc,
                float* dq_acc) {
#if FA_HAVE_X86_BUILDS
  if (amx_slot(w)) return pair_grads_amx(p, c, i0, ni, j0, nj, kind, qs, pk, w, dk_acc, dv_acc, dq_acc);
#else
  (void)pk;
#endif
  const int64_t dqkp = round_up(p.head_dim_qk, kTileN);
  pair_dkdv(p, c, i0, ni, j0, nj, kind, qs, w, dk_acc, dv_acc);
  if (dq_acc != nullptr) gemm_slabs(ni, dqkp, nj, w.dp, kBc, w.kr, dqkp, dq_acc, dqkp, true, false);  // dQ += dS_raw K
}

// Rows of the dQ, dK, dV accumulators a run clears for n rows of data: whole tiles where
// the AMX products write whole 32-row blocks.
int64_t acc_rows(int64_t n, int64_t tile, const BwdSlot& w) { return amx_slot(w) ? round_up(n, tile) : n; }

// ---- one pass: dQ, dK, dV of kv head hk of sequence b and its GQA group ----
// The sums are pass 1's and pass 2's, in their order: dK and dV of a key tile over (query
// head, query tile), dQ of a query tile over key tiles, from the same dS. Each head's query
// side is loaded once, not once per key tile: reloading Q, dO and O (in tiles, from
// strided rows) for every tile pair took 15% of a long backward's time.
void group_grads(const AttnParams& p, int64_t b, int64_t hk, const BwdSlot& w) {
  const int64_t dqk = p.head_dim_qk, dv = p.head_dim_v;
  const int64_t dqkp = round_up(dqk, kTileN), dvp = round_up(dv, kTileN);
  const int64_t group = p.heads_q / p.heads_kv;
  const int64_t len_k = seq_len_k(p, b), len_q = seq_len_q(p, b);
  const int64_t k0 = p.varlen ? p.cu_seqlens_k[b] : 0;
  const int64_t rows_q = acc_rows(len_q, kBr, w), rows_k = acc_rows(len_k, kBc, w);
  memset(w.dk_seq, 0, sizeof(float) * static_cast<size_t>(rows_k * dqkp));
  memset(w.dv_seq, 0, sizeof(float) * static_cast<size_t>(rows_k * dvp));

  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const HeadCtx c = make_head_ctx(p, b, h);
    memset(w.dq_seq, 0, sizeof(float) * static_cast<size_t>(rows_q * dqkp));
    const QuerySide seq{w.q_seq, w.do_seq, w.lse_seq, w.delta_seq};
    load_query_side(p, c, 0, len_q, seq, w.tmp);
    pad_query_rows(seq, len_q, rows_q);
    pack_queries(p, seq, len_q, w.qseq, w);
    for (int64_t j0 = 0; j0 < len_k; j0 += kBc) {
      const int64_t nj = len_k - j0 < kBc ? len_k - j0 : kBc;
      load_keys(p, c, j0, nj, w);
      for (int64_t i0 = 0; i0 < len_q; i0 += kBr) {
        const int64_t ni = len_q - i0 < kBr ? len_q - i0 : kBr;
        const TileKind kind = classify_tile(p, c, i0, ni, j0, nj);
        if (kind == kTileSkip) continue;
        const QuerySide qs{w.q_seq + i0 * dqkp, w.do_seq + i0 * dvp, w.lse_seq + i0, w.delta_seq + i0};
        pair_grads(p, c, i0, ni, j0, nj, kind, qs, query_pack_at(p, w.qseq, i0), w, w.dk_seq + j0 * dqkp,
                   w.dv_seq + j0 * dvp, w.dq_seq + i0 * dqkp);
      }
    }
    store_grad_rows(p, p.dq, p.dq_stride, b, c.q0, h, 0, len_q, dqk, w.dq_seq, dqkp, p.scale, w.tmp);
  }
  store_grad_rows(p, p.dk, p.dk_stride, b, k0, hk, 0, len_k, dqk, w.dk_seq, dqkp, p.scale, w.tmp);
  store_grad_rows(p, p.dv, p.dv_stride, b, k0, hk, 0, len_k, dv, w.dv_seq, dvp, dv_scale(p, w), w.tmp);
}

// ---- pass 1: dK, dV of key tile [j0, j0+nj) of kv head hk, sequence b ----
void dkdv_tile(const AttnParams& p, int64_t b, int64_t hk, int64_t j0, const BwdSlot& w) {
  const int64_t dqk = p.head_dim_qk, dv = p.head_dim_v;
  const int64_t dqkp = round_up(dqk, kTileN), dvp = round_up(dv, kTileN);
  const int64_t group = p.heads_q / p.heads_kv;
  const int64_t len_k = seq_len_k(p, b), len_q = seq_len_q(p, b);
  const int64_t k0 = p.varlen ? p.cu_seqlens_k[b] : 0;
  const int64_t nj = len_k - j0 < kBc ? len_k - j0 : kBc;

  load_keys(p, make_head_ctx(p, b, hk * group), j0, nj, w);
  memset(w.dk_acc, 0, sizeof(float) * static_cast<size_t>(acc_rows(nj, kBc, w) * dqkp));
  memset(w.dv_acc, 0, sizeof(float) * static_cast<size_t>(acc_rows(nj, kBc, w) * dvp));

  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const HeadCtx c = make_head_ctx(p, b, h);
    for (int64_t i0 = 0; i0 < len_q; i0 += kBr) {
      const int64_t ni = len_q - i0 < kBr ? len_q - i0 : kBr;
      const TileKind kind = classify_tile(p, c, i0, ni, j0, nj);
      if (kind == kTileSkip) continue;
      const QuerySide qs = load_query_tile(p, c, i0, ni, w);
      pack_queries(p, qs, ni, w.qtile, w);
      pair_grads(p, c, i0, ni, j0, nj, kind, qs, w.qtile, w, w.dk_acc, w.dv_acc, nullptr);
    }
  }
  store_grad_rows(p, p.dk, p.dk_stride, b, k0, hk, j0, nj, dqk, w.dk_acc, dqkp, p.scale, w.tmp);
  store_grad_rows(p, p.dv, p.dv_stride, b, k0, hk, j0, nj, dv, w.dv_acc, dvp, dv_scale(p, w), w.tmp);
}

// ---- pass 2: dQ of query tile [i0, i0+ni) of (b, h); dS into the dBias accumulator ----

// The query tile qs as pass 2's pairs read it: Q^T and dO^T (the AMX path: its operands).
void prepare_query_tile_t(const AttnParams& p, const QuerySide& qs, int64_t ni, const BwdSlot& w) {
  if (amx_slot(w)) return pack_queries(p, qs, ni, w.qtile, w);
  transpose_tile(qs.q, round_up(p.head_dim_qk, kTileN), ni, p.head_dim_qk, w.qt, kBr);
  transpose_tile(qs.dout, round_up(p.head_dim_v, kTileN), ni, p.head_dim_v, w.dot, kBr);
}

// Pass 2's tile pair up to dS^T (tile_ds<true>), with the key tile loaded.
void pair_ds_t(const AttnParams& p, const HeadCtx& c, int64_t i0, int64_t ni, int64_t j0, int64_t nj, TileKind kind,
               const QuerySide& qs, const BwdSlot& w) {
#if FA_HAVE_X86_BUILDS
  if (amx_slot(w)) {
    load_key_side_amx(p, c, j0, nj, w);
    return tile_ds_amx(p, c, i0, ni, j0, nj, kind, qs, w.qtile, w);
  }
#endif
  const int64_t dqkp = round_up(p.head_dim_qk, kTileN);
  load_rows(p, p.k, p.k_stride, c.b, c.k0, c.hk, j0, nj, p.head_dim_qk, w.kr, dqkp);
  load_rows(p, p.v, p.v_stride, c.b, c.k0, c.hk, j0, nj, p.head_dim_v, w.v, p.head_dim_v);
  tile_ds<true>(p, c, i0, ni, j0, nj, kind, w.kr, dqkp, qs, w);
}

// dQ += dS_raw K of pass 2's tile pair (dS_raw^T in w.dp).
void add_dq_t(const AttnParams& p, int64_t ni, int64_t nj, const BwdSlot& w) {
  const int64_t dqkp = round_up(p.head_dim_qk, kTileN);
#if FA_HAVE_X86_BUILDS
  if (amx_slot(w)) {
    round_pair_amx(ni, nj, false, w);
    return add_dq_amx(p, ni, nj, w, w.dq_acc);
  }
#endif
  gemm_slabs(ni, dqkp, nj, w.dp, kBr, w.kr, dqkp, w.dq_acc, dqkp, true, true);  // dQ += dS K
}

void dq_tile(const AttnParams& p, const HeadCtx& c, int64_t i0, const BwdSlot& w) {
  const int64_t dqk = p.head_dim_qk;
  const int64_t dqkp = round_up(dqk, kTileN);
  const int64_t ni = c.len_q - i0 < kBr ? c.len_q - i0 : kBr;
  const bool want_dbias = p.dbias != nullptr && w.dbias != nullptr;
  const int64_t db_ld = dbias_ld(p);
  const bool db_rows = p.bias_stride[2] != 0, db_cols = p.bias_stride[3] != 0;

  const QuerySide qs = load_query_tile(p, c, i0, ni, w);
  prepare_query_tile_t(p, qs, ni, w);
  memset(w.dq_acc, 0, sizeof(float) * static_cast<size_t>(acc_rows(ni, kBr, w) * dqkp));

  for (int64_t j0 = 0; j0 < c.len_k; j0 += kBc) {
    const int64_t nj = c.len_k - j0 < kBc ? c.len_k - j0 : kBc;
    const TileKind kind = classify_tile(p, c, i0, ni, j0, nj);
    if (kind == kTileSkip) continue;
    pair_ds_t(p, c, i0, ni, j0, nj, kind, qs, w);
    if (want_dbias) {
      for (int64_t r = 0; r < ni; ++r) {
        float* acc = w.dbias + (db_rows ? r : 0) * db_ld;
        if (db_cols) {
          for (int64_t x = 0; x < nj; ++x) acc[j0 + x] += w.dp[x * kBr + r];
        } else {
          for (int64_t x = 0; x < nj; ++x) acc[0] += w.dp[x * kBr + r];
        }
      }
    }
    soften_ds<true>(ni, nj, w);
    add_dq_t(p, ni, nj, w);
  }
  store_grad_rows(p, p.dq, p.dq_stride, c.b, c.q0, c.h, i0, ni, dqk, w.dq_acc, dqkp, p.scale, w.tmp);
}

// How pass-2 tasks are grouped: the dims (batch, head, query tile) along which dBias
// has a nonzero stride index tasks; the others are looped inside a task.
struct DqGrouping {
  int64_t nb, nh, nqt;     // extents indexing tasks
  int64_t inb, inh, inqt;  // extents looped inside a task
};

DqGrouping dq_grouping(const AttnParams& p) {
  const int64_t n_qt = ceil_div(p.seqlen_q, kBr);
  DqGrouping g{p.batch, p.heads_q, n_qt, 1, 1, 1};
  if (p.bias_kind == kBiasTensor && p.dbias != nullptr) {
    if (p.bias_stride[0] == 0) std::swap(g.nb, g.inb);
    if (p.bias_stride[1] == 0) std::swap(g.nh, g.inh);
    if (p.bias_stride[2] == 0) std::swap(g.nqt, g.inqt);
  }
  return g;
}

// Writes the dBias elements owned by a pass-2 task: rows [i0, i0+kBr) (or the single
// broadcast row) by every column, within the logical extent [seqlen_q, seqlen_k].
void store_dbias(const AttnParams& p, int64_t b, int64_t h, int64_t i0, const BwdSlot& w) {
  const int64_t* bs = p.bias_stride;
  const int64_t rows = bs[2] != 0 ? (p.seqlen_q - i0 < kBr ? p.seqlen_q - i0 : kBr) : 1;
  const int64_t cols = bs[3] != 0 ? p.seqlen_k : 1;
  const int64_t ld = dbias_ld(p);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = b * bs[0] + h * bs[1] + (i0 + r) * bs[2];
    const float* acc = w.dbias + r * ld;
    for (int64_t x = 0; x < cols; ++x) store_elem(p.dbias, p.dtype, base + x * bs[3], acc[x]);
  }
}

}  // namespace

CheckedSize flash_bwd_slot_bytes(const AttnParams& p) {
  Carver cv{nullptr};
  carve_bwd(p, cv);
  return cv.used;
}

void flash_backward(const AttnParams& p, char* workspace, int threads) {
  const size_t slot_bytes = static_cast<size_t>(flash_bwd_slot_bytes(p).value());
  const int64_t n_kt = ceil_div(p.seqlen_k, kBc);
  const int64_t n_tasks1 = p.batch * p.heads_kv * n_kt;
  const DqGrouping g = dq_grouping(p);
  const int64_t n_tasks2 = g.nb * g.nh * g.nqt;
  const int64_t max_tasks = n_tasks1 > n_tasks2 ? n_tasks1 : n_tasks2;
  threads = team_size(threads, max_tasks, 2 * attention_work(p));
  const int64_t n_groups = p.batch * p.heads_kv;
  const bool one_pass = p.bias_kind != kBiasTensor && n_groups >= threads;
  TaskCounter groups(one_pass ? n_groups : 0), tasks1(one_pass ? 0 : n_tasks1), tasks2(one_pass ? 0 : n_tasks2);

  run_team(threads, [&](const TeamMember& me) {
    char* slot = workspace + static_cast<size_t>(me.id) * slot_bytes;
    Carver cv{slot};
    const BwdSlot w = carve_bwd(p, cv);
#if FA_HAVE_X86_BUILDS
    const AmxTiles tiles(amx_slot(w));  // this member's tile configuration, for the run
#endif
    // GEMM padding columns must be finite; a two-pass run never touches the one-pass
    // buffers (sequence-long: 5 N d floats), so only the tiles are cleared for it.
    memset(slot, 0, one_pass ? slot_bytes : w.tile_bytes);

    for (int64_t t = groups.next(); t >= 0; t = groups.next()) group_grads(p, t / p.heads_kv, t % p.heads_kv, w);
    for (int64_t t = tasks1.next(); t >= 0; t = tasks1.next()) {
      const int64_t kt = t % n_kt, bhk = t / n_kt;
      const int64_t b = bhk / p.heads_kv, hk = bhk % p.heads_kv;
      if (kt * kBc >= seq_len_k(p, b)) continue;
      dkdv_tile(p, b, hk, kt * kBc, w);
    }
    // No barrier needed: the passes write disjoint outputs and read only inputs.
    for (int64_t t = tasks2.next(); t >= 0; t = tasks2.next()) {
      // Last query tile first: the longest under a top-left causal mask (see flash_fwd.cpp).
      const int64_t tq = g.nqt - 1 - t % g.nqt, th = (t / g.nqt) % g.nh, tb = t / (g.nqt * g.nh);
      if (w.dbias && p.dbias) memset(w.dbias, 0, sizeof(float) * static_cast<size_t>(dbias_rows(p) * dbias_ld(p)));
      for (int64_t ib = 0; ib < g.inb; ++ib) {
        const int64_t b = g.inb > 1 ? ib : tb;
        for (int64_t ih = 0; ih < g.inh; ++ih) {
          const int64_t h = g.inh > 1 ? ih : th;
          const HeadCtx c = make_head_ctx(p, b, h);
          for (int64_t iq = 0; iq < g.inqt; ++iq) {
            const int64_t qt = g.inqt > 1 ? iq : tq;
            if (qt * kBr >= c.len_q) continue;
            dq_tile(p, c, qt * kBr, w);
          }
        }
      }
      if (w.dbias && p.dbias) store_dbias(p, tb, th, tq * kBr, w);
    }
  });
  write_uncovered_tokens(p);
}

}  // namespace cpu
}  // namespace flashattn
