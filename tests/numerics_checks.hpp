// Checks shared by the numerics tests of the CPU backend (test_numerics.cpp) and of the CUDA
// backend (test_gpu_numerics.cpp): what one non-finite input element does to each row of O
// and LSE (docs/numerics.md, "NaN and infinity in the inputs"), and that it never reaches
// another sequence of the batch. The poison_* scenarios run on the backend of the MemOps
// they are given, so both backends are held to the same statements. Header-only.
#pragma once
#include <math.h>
#include <string.h>

#include <algorithm>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "harness.hpp"

namespace fat {

inline bool all_finite(const std::vector<double>& x) {
  for (double v : x)
    if (!std::isfinite(v)) return false;
  return true;
}

inline double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, fabs(v));
  return m;
}

// What a poisoned input does to one (batch, query row, query head) row of O and its LSE.
enum class RowExp {
  Same,          // bitwise equal to the clean run (O row and LSE)
  NaNRow,        // every element of the O row is NaN, and so is LSE
  ColNonFinite,  // element `dim` of the O row is NaN or +-inf, the others are bitwise the clean run's; LSE too
  ColMaybe,      // as ColNonFinite, or bitwise the clean run's (a masked key's 0 * NaN, see numerics.md)
  Finite,        // every element finite, LSE finite (the key dropped out of the row)
  MaskedRow      // O row exactly 0, LSE = -inf, as for a fully masked row
};

inline const char* exp_name(RowExp e) {
  switch (e) {
    case RowExp::Same: return "same";
    case RowExp::NaNRow: return "NaN row (O and LSE)";
    case RowExp::ColNonFinite: return "column non-finite";
    case RowExp::ColMaybe: return "column non-finite or same";
    case RowExp::Finite: return "finite";
    default: return "masked row";
  }
}

// The fp64 value of input `which` (0 Q, 1 K, 2 V) at [b, pos, head, dim] of a fixed-length
// problem (the reference layout is BSHD).
inline double& input_at(const Config& c, RefInputs& in, int which, int64_t b, int64_t pos, int64_t head, int64_t dim) {
  const int64_t H = which == 0 ? c.hq : c.hkv, D = which == 2 ? c.dv : c.dqk;
  const int64_t S = which == 0 ? c.sq : c.sk;
  std::vector<double>& x = which == 0 ? in.q : which == 1 ? in.k : in.v;
  return x[((b * S + pos) * H + head) * D + dim];
}

// Runs the clean problem and the problem with one poisoned input element (which: 0 Q, 1 K,
// 2 V, at [b, pos, head, dim]) on the backend of `mem` and checks: both runs succeed, the
// clean one matches the reference under `tol`, every row of O / LSE behaves as
// expected(batch, i, h) says, and the gradients of every batch other than b are bitwise
// the clean run's (on CUDA, give c.deterministic so that two clean runs agree bitwise).
template <class Expected>
void check_poison(const Config& c, int which, int64_t b, int64_t pos, int64_t head, int64_t dim, double value,
                  Expected expected, MemOps& mem, const Tolerance& tol = kCpuTolerance) {
  const Problem clean = make_problem(c);
  Problem bad = clean;
  input_at(c, bad.in, which, b, pos, head, dim) = value;
  const LibResult rc = run_library(clean, mem, 0), rb = run_library(bad, mem, 0);
  INFO(describe(c) << " poisoned "
                   << "QKV"[which] << "[b=" << b << ", pos=" << pos << ", head=" << head << ", dim=" << dim
                   << "] = " << value);
  INFO("status fwd/bwd = " << rb.fwd << "/" << rb.bwd << " " << rb.error);
  REQUIRE(rb.ok());
  check_against_reference(clean, rc, tol);
  const size_t es = dtype_size(c.dtype);
  size_t n_affected = 0, n_bad = 0;
  std::string first_bad;
  for (int64_t bb = 0; bb < c.batch; ++bb)
    for (int64_t i = 0; i < c.sq; ++i)
      for (int64_t h = 0; h < c.hq; ++h) {
        const int64_t r = (bb * c.sq + i) * c.hq + h;
        const RowExp want = expected(bb, i, h);
        n_affected += want != RowExp::Same;
        auto same = [&](int64_t e) {
          return memcmp(&rb.raw_o[(r * c.dv + e) * es], &rc.raw_o[(r * c.dv + e) * es], es) == 0;
        };
        const size_t li = (bb * c.hq + h) * c.sq + i;  // raw LSE is [b, h, sq]
        const bool lse_same = memcmp(&rb.raw_lse[li * 4], &rc.raw_lse[li * 4], 4) == 0;
        const double lse = rb.lse[r];
        bool ok = true;
        for (int64_t e = 0; e < c.dv; ++e) {
          const double o = rb.o[r * c.dv + e];
          switch (want) {
            case RowExp::Same: ok = ok && same(e) && lse_same; break;
            case RowExp::NaNRow: ok = ok && std::isnan(o) && std::isnan(lse); break;
            case RowExp::ColNonFinite: ok = ok && lse_same && (e == dim ? !std::isfinite(o) : same(e)); break;
            case RowExp::ColMaybe: ok = ok && lse_same && (e == dim ? (!std::isfinite(o) || same(e)) : same(e)); break;
            case RowExp::Finite: ok = ok && std::isfinite(o) && std::isfinite(lse); break;
            case RowExp::MaskedRow: ok = ok && o == 0.0 && lse == -std::numeric_limits<double>::infinity(); break;
          }
        }
        if (!ok && n_bad++ == 0) {
          std::ostringstream m;
          m << "row (b=" << bb << ", i=" << i << ", h=" << h << ") expected " << exp_name(want) << ", O[0.." << c.dv
            << ") =";
          for (int64_t e = 0; e < c.dv; ++e) m << " " << rb.o[r * c.dv + e];
          m << " LSE " << lse << " (clean " << rc.lse[r] << ")";
          first_bad = m.str();
        }
      }
  INFO("affected rows " << n_affected << ", rows not as expected " << n_bad << "; first: " << first_bad);
  CHECK(n_affected > 0);
  CHECK(n_bad == 0);
  // Gradients: every batch other than b is bitwise unaffected; batch b reports SUCCESS.
  auto same_other_batches = [&](const std::vector<uint8_t>& got, const std::vector<uint8_t>& ref, int64_t per_batch) {
    size_t diff = 0;
    for (int64_t bb = 0; bb < c.batch; ++bb)
      if (bb != b) diff += memcmp(&got[bb * per_batch * es], &ref[bb * per_batch * es], per_batch * es) != 0;
    return diff;
  };
  CHECK(same_other_batches(rb.raw_dq, rc.raw_dq, c.sq * c.hq * c.dqk) == 0);
  CHECK(same_other_batches(rb.raw_dk, rc.raw_dk, c.sk * c.hkv * c.dqk) == 0);
  CHECK(same_other_batches(rb.raw_dv, rc.raw_dv, c.sk * c.hkv * c.dv) == 0);
}

// Expected rows for a non-finite value `val` in Q[b, i0, h0, dim] (docs/numerics.md): the
// row's scores are NaN (val NaN) or +-inf (val infinite, by the sign of val * K[.., dim]);
// any NaN or +inf score makes O and LSE NaN, and a row whose scores are all -inf is a
// fully masked row. Every other row is bitwise unchanged.
inline RowExp q_poison_row(const Problem& p, int64_t b0, int64_t i0, int64_t h0, int64_t dim, double val, int64_t b,
                           int64_t i, int64_t h) {
  if (!(b == b0 && i == i0 && h == h0)) return RowExp::Same;
  if (std::isnan(val)) return RowExp::NaNRow;
  const Config& c = p.cfg;
  const int64_t hk = h0 / (c.hq / c.hkv);
  for (int64_t j = 0; j < c.sk; ++j)  // (no mask in these problems: every key is visible)
    if (!(val * p.in.k[((b0 * c.sk + j) * c.hkv + hk) * c.dqk + dim] < 0)) return RowExp::NaNRow;  // +inf or NaN
  return RowExp::MaskedRow;
}

// ---- scenarios -------------------------------------------------------------------------
// `proto` carries what the backend under test needs (dtype, algorithm, head dim, pad16,
// deterministic); each scenario sets the shape, name and data seed itself, and the head dim
// where its numbers depend on it (d > 0).

inline Config scenario(const Config& proto, const char* name, int64_t batch, int64_t sq, int64_t sk, int64_t hq,
                       int64_t hkv, uint64_t seed, int64_t d = 0) {
  Config c = proto;
  c.name = name;
  if (d > 0) c.dqk = c.dv = d;
  c.batch = batch;
  c.sq = sq;
  c.sk = sk;
  c.hq = hq;
  c.hkv = hkv;
  c.data_seed = seed;
  return c;
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// NaN, +inf and -inf in Q[1, 4, 3, 5]: that row's O and LSE are NaN (or, for an infinite
// element whose scores are all -inf, a masked row); every other row is bitwise unchanged.
inline void poison_q(const Config& proto, MemOps& mem, const Tolerance& tol) {
  const Config c = scenario(proto, "poisoned Q", 3, 9, 13, 4, 2, 300);
  const Problem p = make_problem(c);
  for (double val : {kNaN, kInf, -kInf})
    check_poison(
        c, 0, 1, 4, 3, 5, val,
        [&](int64_t b, int64_t i, int64_t h) { return q_poison_row(p, 1, 4, 3, 5, val, b, i, h); }, mem, tol);
}

// Bottom-right causal with seqlen_q > seqlen_k: rows 0..49 see no key. A NaN in a row that
// sees keys makes it NaN although most of its scores are masked; a NaN in a row that sees
// none changes nothing in the forward (its scores are all replaced by -inf).
inline void poison_q_masked(const Config& proto, MemOps& mem, const Tolerance& tol) {
  Config c = scenario(proto, "poisoned Q, bottom-right causal", 2, 150, 100, 2, 1, 305);
  c.band = true;
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wl = -1;
  c.wr = 0;  // row i sees keys 0..i-50
  check_poison(
      c, 0, 0, 60, 1, 3, kNaN,
      [](int64_t b, int64_t i, int64_t h) { return b == 0 && i == 60 && h == 1 ? RowExp::NaNRow : RowExp::Same; }, mem,
      tol);
  // Forward only: in the backward, the masked row's zero dS times its NaN Q may reach dK
  // (0 * NaN, as for a NaN V element under a mask).
  c.backward = false;
  const Problem p = make_problem(c);
  Problem bad = p;
  input_at(c, bad.in, 0, 1, 20, 0, 3) = kNaN;  // row 20 sees no key
  const LibResult rc = run_library(p, mem, 0), rb = run_library(bad, mem, 0);
  INFO(describe(c) << " NaN in Q of fully masked row 20: " << rb.error);
  REQUIRE(rb.ok());
  check_against_reference(p, rc, tol);  // row 20 (a fully masked row) is exactly O = 0, LSE = -inf
  CHECK(rb.raw_o == rc.raw_o);
  CHECK(rb.raw_lse == rc.raw_lse);
}

// NaN, +inf, -inf in K[2, 6, 1, 0]: rows of batch 2 and the query heads of kv head 1 whose
// score becomes NaN or +inf are NaN rows; where it becomes -inf the key drops out.
inline void poison_k(const Config& proto, MemOps& mem, const Tolerance& tol) {
  const Config c = scenario(proto, "poisoned K", 3, 9, 13, 4, 2, 310);  // query heads 2, 3 use kv head 1
  const Problem p = make_problem(c);
  for (double val : {kNaN, kInf, -kInf})
    check_poison(
        c, 1, 2, 6, 1, 0, val,
        [&](int64_t b, int64_t i, int64_t h) {
          if (!(b == 2 && h / 2 == 1)) return RowExp::Same;
          if (std::isnan(val)) return RowExp::NaNRow;
          // score = scale * (q[.., 0] * val + finite): +inf poisons the row (inf - inf in the
          // softmax), -inf only removes the key from the row.
          const double q0 = p.in.q[((b * c.sq + i) * c.hq + h) * c.dqk + 0];
          return q0 * val < 0 ? RowExp::Finite : RowExp::NaNRow;  // q0 = 0 would give 0 * inf = NaN
        },
        mem, tol);
}

// NaN, +inf, -inf in V[2, 6, 1, 3]: column 3 of the rows of batch 2 and kv head 1's query
// heads is non-finite, every other element and LSE bitwise unchanged.
inline void poison_v(const Config& proto, MemOps& mem, const Tolerance& tol) {
  const Config c = scenario(proto, "poisoned V", 3, 9, 13, 4, 2, 315);
  for (double val : {kNaN, kInf, -kInf})
    check_poison(
        c, 2, 2, 6, 1, 3, val,
        [](int64_t b, int64_t, int64_t h) { return b == 2 && h / 2 == 1 ? RowExp::ColNonFinite : RowExp::Same; }, mem,
        tol);
}

// NaN in K or V at key 9 under a top-left causal mask (row i sees keys 0..i).
inline void poison_kv_causal(const Config& proto, MemOps& mem, const Tolerance& tol) {
  Config c = scenario(proto, "poisoned K/V, causal", 2, 40, 40, 2, 2, 320);
  c.band = true;
  c.align = FLASHATTN_ALIGN_TOP_LEFT;
  c.wl = -1;
  c.wr = 0;
  // K: a masked score is replaced by -inf before it can spread, so rows i < 9 are exact.
  check_poison(
      c, 1, 0, 9, 1, 2, kNaN,
      [](int64_t b, int64_t i, int64_t h) { return b == 0 && h == 1 && i >= 9 ? RowExp::NaNRow : RowExp::Same; }, mem,
      tol);
  // V: rows that see key 9 get NaN in column 2; rows it is masked from may get it too
  // (0 * NaN in a computed tile), but nothing outside (batch 0, head 1, column 2) changes.
  check_poison(
      c, 2, 0, 9, 1, 2, kNaN,
      [](int64_t b, int64_t i, int64_t h) {
        if (!(b == 0 && h == 1)) return RowExp::Same;
        return i >= 9 ? RowExp::ColNonFinite : RowExp::ColMaybe;
      },
      mem, tol);
}

// The run succeeded and every output and gradient is finite.
inline void require_finite_run(const LibResult& r) {
  REQUIRE(r.ok());
  CHECK(all_finite(r.o));
  CHECK(all_finite(r.lse));
  CHECK(all_finite(r.dq));
  CHECK(all_finite(r.dk));
  CHECK(all_finite(r.dv));
}

// RAII plan.
struct Plan {
  flashattn_plan_t p = nullptr;
  explicit Plan(flashattn_backend_t backend = FLASHATTN_BACKEND_CPU) {
    REQUIRE(flashattn_plan_create(&p, backend, 0) == FLASHATTN_STATUS_SUCCESS);
  }
  ~Plan() { flashattn_plan_destroy(p); }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
};

// Error bounds of the scenarios below whose reference is the fp64 one alone (the
// same-precision yardstick is useless there: it rounds scores of 1e4 or 1e6 to the dtype).
// u_s = max|LSE| * 2^-24 is the relative error of a probability computed from fp32 scores of
// that magnitude; eps is the dtype's unit roundoff. A real defect (a missing max
// subtraction, a wrong scale or cap) is off by O(1) relative, far above every bound.
struct NumericsBounds {
  double o_us, o_eps;      // large scores, O:   (o_us * u_s + o_eps * eps) * (1 + max O magnitude)
  double lse_us, lse_ulp;  // large scores, LSE: lse_us * u_s + lse_ulp * 2^-24 * (1 + max |LSE|)
  double dv_us, dv_eps;    // large scores, dV:  (dv_us * u_s + dv_eps * eps) * (1 + max dV magnitude)
  double cap_u;            // softcap: O, LSE, dV within cap_u * u * (1 + magnitude), u = eps + 1e6 * 2^-24 / 30
};

// Scores of magnitude 1e4: inputs ~ N(0, 50^2), d = 16, scale 1/4, so |scale * q.k| ~ 1e4
// (max ~4e4, inside fp16's range). exp(1e4) overflows fp32 and fp64, so only a max-subtracted
// (online) softmax gets a finite result. O and LSE are finite and match the fp64 reference.
inline void large_scores_fwd(const Config& proto, MemOps& mem, const NumericsBounds& bd, uint64_t seed) {
  Config c = scenario(proto, "scores ~1e4", 1, 37, 70, 2, 1, seed, 16);
  c.input_scale = 50.0;
  c.backward = false;
  const Problem p = make_problem(c);
  const LibResult r = run_library(p, mem, 0);
  INFO(describe(c) << " " << r.error);
  REQUIRE(r.ok());
  const RefOutputs ref = reference_fp64(p.spec, p.in, false);
  const double smax = max_abs(ref.lse), eps = dtype_eps(c.dtype);
  const double u_s = smax * ldexp(1.0, -24);
  const ErrStats eo = error_stats(r.o, ref.o), el = error_stats(r.lse, ref.lse);
  const double tol_o = (bd.o_us * u_s + bd.o_eps * eps) * (1.0 + max_abs(ref.o_mag));
  const double tol_l = bd.lse_us * u_s + bd.lse_ulp * ldexp(1.0, -24) * (1.0 + smax);
  INFO("max |LSE| " << smax << " | O err " << eo.max_abs << " (tol " << tol_o << ") LSE err " << el.max_abs << " (tol "
                    << tol_l << ")");
  CHECK(smax > 5e3);  // the scores really are huge
  CHECK(all_finite(r.o));
  CHECK(all_finite(r.lse));
  CHECK(eo.nonfinite_mismatch + el.nonfinite_mismatch == 0);
  CHECK(eo.max_abs <= tol_o);
  CHECK(el.max_abs <= tol_l);
}

// The backward at scores of 1e4 is finite and dV matches the reference. dQ and dK are
// dominated by the rounding of O in D = rowsum(dO * O) times |scores|, so only finiteness is
// asserted for them; dV = P^T dO does not see that amplification (P is recomputed as
// exp(s - LSE) from fp32 s and LSE: relative error ~ u_s, plus the dtype's roundings).
inline void large_scores_bwd(const Config& proto, MemOps& mem, const NumericsBounds& bd, uint64_t seed) {
  Config c = scenario(proto, "scores ~1e4 backward", 1, 29, 45, 2, 1, seed, 16);
  c.input_scale = 50.0;
  const Problem p = make_problem(c);
  const LibResult r = run_library(p, mem, 0);
  INFO(describe(c) << " " << r.error);
  require_finite_run(r);
  const RefOutputs ref = reference_fp64(p.spec, p.in, true);
  const double u_s = max_abs(ref.lse) * ldexp(1.0, -24);
  const ErrStats e = error_stats(r.dv, ref.dv);
  const double tol = (bd.dv_us * u_s + bd.dv_eps * dtype_eps(c.dtype)) * (1.0 + max_abs(ref.dv_mag));
  INFO("max |LSE| " << max_abs(ref.lse) << " dV max error " << e.max_abs << " tolerance " << tol);
  CHECK(e.nonfinite_mismatch == 0);
  CHECK(e.max_abs <= tol);
}

// Softcap 30 on raw scores of magnitude 1e6 (inputs ~ N(0, 500^2), d = 16, scale 1/4): every
// score after 30 * tanh(s / 30) lies in [-30, 30] and tanh's derivative underflows to 0 almost
// everywhere. Outputs and gradients are finite, |LSE| <= 30 + log(seqlen_k), and O, LSE, dV
// match the fp64 reference up to the fp32 rounding of the raw dot products (2^-24 * 1e6 / 30
// relative to the cap) plus the dtype's unit roundoff.
inline void softcap_huge_scores(const Config& proto, MemOps& mem, const NumericsBounds& bd, uint64_t seed) {
  Config c = scenario(proto, "softcap 30, scores ~1e6", 1, 33, 41, 2, 1, seed, 16);
  c.input_scale = 500.0;
  c.softcap = 30.f;
  const Problem p = make_problem(c);
  const LibResult r = run_library(p, mem, 0);
  INFO(describe(c) << " " << r.error);
  require_finite_run(r);
  for (double l : r.lse) CHECK(fabs(l) <= 30.0 + log(41.0) + 1e-3);
  const RefOutputs ref = reference_fp64(p.spec, p.in, true);
  const double u = dtype_eps(c.dtype) + 1e6 * ldexp(1.0, -24) / 30.0;
  const ErrStats eo = error_stats(r.o, ref.o), el = error_stats(r.lse, ref.lse), ev = error_stats(r.dv, ref.dv);
  const double tol_o = bd.cap_u * u * (1 + max_abs(ref.o_mag)), tol_l = bd.cap_u * u * (1 + max_abs(ref.lse)),
               tol_v = bd.cap_u * u * (1 + max_abs(ref.dv_mag));
  INFO("O err " << eo.max_abs << " (tol " << tol_o << ") LSE err " << el.max_abs << " (tol " << tol_l << ") dV err "
                << ev.max_abs << " (tol " << tol_v << ")");
  CHECK(eo.nonfinite_mismatch + el.nonfinite_mismatch + ev.nonfinite_mismatch == 0);
  CHECK(eo.max_abs <= tol_o);
  CHECK(el.max_abs <= tol_l);
  CHECK(ev.max_abs <= tol_v);
}

// Problems in which no query row sees any key: O = 0, LSE = -inf and dQ, dK, dV all exactly 0
// (dK and dV receive no contribution at all). A block-sparse layout of zeros, the same on
// top of a bottom-right causal band, and varlen sequences none of whose queries has a key.
inline void all_rows_masked(const Config& proto, MemOps& mem, const Tolerance& tol, uint64_t seed) {
  std::vector<Config> cs;
  Config c = scenario(proto, "block-sparse layout of zeros", 1, 24, 20, 2, 1, ++seed);
  c.sparse = true;
  c.block_q = 24;  // one row block, made all zero
  c.block_k = 8;
  c.zero_row_block = 0;
  cs.push_back(c);
  c = scenario(proto, "block-sparse zeros, bottom-right causal", 1, 30, 12, 2, 1, ++seed);
  c.sparse = true;
  c.block_q = 32;  // one row block, made all zero, on top of a band mask
  c.block_k = 5;
  c.zero_row_block = 0;
  c.band = true;
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wl = -1;
  c.wr = 0;
  cs.push_back(c);
  c = scenario(proto, "varlen, no sequence with both queries and keys", 1, 1, 1, 2, 1, ++seed);
  c.seqlens_q = {5, 0, 9};
  c.seqlens_k = {0, 3, 0};
  cs.push_back(c);
  for (const Config& x : cs) {
    const Problem p = make_problem(x);
    const LibResult r = run_library(p, mem, 0);
    INFO(describe(x) << " " << r.error);
    REQUIRE(r.ok());
    check_against_reference(p, r, tol);
    for (double v : r.o) CHECK(v == 0.0);
    for (double v : r.lse) CHECK(v == -std::numeric_limits<double>::infinity());
    size_t nonzero = 0;
    for (double v : r.dq) nonzero += v != 0.0;
    for (double v : r.dk) nonzero += v != 0.0;
    for (double v : r.dv) nonzero += v != 0.0;
    CHECK(nonzero == 0);
  }
}

// A plan given dropout p = 0 (with a seed and offset) gives bitwise the outputs and
// gradients of a plan without dropout.
inline void dropout_zero_is_off(const Config& proto, MemOps& mem, uint64_t seed) {
  const Config c = scenario(proto, "dropout p = 0", 2, 23, 31, 2, 1, seed, 32);
  const Problem p = make_problem(c);
  const LibResult plain = run_library(p, mem, 0);
  INFO(describe(c) << " " << plain.error);
  Plan plan(mem.backend());
  REQUIRE(configure_plan(plan.p, p) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_dropout(plan.p, 0.f, 0xdeadbeefull, 12345) == FLASHATTN_STATUS_SUCCESS);
  const LibResult zero = run_on_plan(plan.p, p, mem);
  require_same_bits(plain, zero);
}

// Dropout with p close to 1: the kept elements, recovered from the library's outputs with
// V = I and dO = I, are exactly those of the documented keep rule in the forward and the
// backward, a fraction 1 - t / 65536 of them (t = min(round(p * 65536), 65535): at least
// one in 65536); on random data outputs and gradients are finite and match the reference.
inline void dropout_near_one(const Config& proto, MemOps& mem, const Tolerance& tol, float pd) {
  Config c = scenario(proto, "dropout p -> 1", 4, 64, 64, 16, 16, 510, 64);
  c.p_drop = pd;
  c.seed = 0x0123456789abcdefull;
  c.offset = 77;
  INFO(describe(c) << " p = " << pd);
  // With V = I, and with so few kept elements on random data, an element of O or dV is one
  // or two kept terms, so its error is that of one P = exp(s - LSE), up to (|s| + |LSE|)
  // unit roundoffs, which the fp32 yardstick (rounding on its own) does not track: measured
  // over 24 masks, up to 8.2 unit roundoffs of C. In fp16/bf16 the same single terms carry
  // the rounding of P (scaled) to the dtype before P V and dP^T dO, one unit roundoff of the
  // element that the same-precision yardstick may or may not incur at the same element
  // (GPU, bf16, p = 0.999: dV 0.83 against the yardstick's 0.53 at |dV| 146, 1.5 units).
  // A wrong mask or scale is off by O(1).
  Tolerance single_term = tol;
  single_term.floor_u_fp32 = std::max(tol.floor_u_fp32, 16.0);
  single_term.floor_u_lowp = std::max(tol.floor_u_lowp, 1.0);
  // recover_dropout_masks checks the run against the reference, which applies the
  // documented keep rule; the masks are the library's.
  const Masks m = recover_dropout_masks(c, mem, single_term);
  INFO(m.error);
  REQUIRE(m.ok);
  size_t kept = 0, kept_bwd = 0, mismatch = 0;
  const Problem p = make_problem(c);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < c.sq; ++i)
        for (int64_t j = 0; j < c.sk; ++j) {
          const size_t idx = ((b * c.sq + i) * c.hq + h) * c.sk + j;
          kept += m.fwd[idx];
          kept_bwd += m.bwd[idx];
          mismatch += m.fwd[idx] != (ref_dropout_keep(p.spec, b, h, i, j) ? 1 : 0);
        }
  const double n = static_cast<double>(c.batch * c.hq * c.sq * c.sk);
  const double expect = n * (1.0 - fmin(floor(static_cast<double>(pd) * 65536.0 + 0.5), 65535.0) / 65536.0);
  INFO("kept " << kept << " (bwd " << kept_bwd << ") of " << n << ", expected " << expect);
  CHECK(mismatch == 0);
  CHECK(kept == kept_bwd);
  // Binomial: within 5 standard deviations (+1 for p so close to 1 that ~0 are kept).
  CHECK(fabs(static_cast<double>(kept) - expect) <= 5.0 * sqrt(expect) + 1.0);
  // And on random data: finite and matching the reference.
  Config r = scenario(c, "dropout p -> 1, random data", 2, 40, 70, 2, 1, 510, 64);
  const Problem pr = make_problem(r);
  const LibResult lr = run_library(pr, mem, 0);
  INFO(lr.error);
  require_finite_run(lr);
  check_against_reference(pr, lr, single_term);
}

}  // namespace fat
