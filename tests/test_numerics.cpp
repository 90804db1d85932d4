// Numerical robustness, fault recovery and size limits of the CPU backend, through the
// public API (docs/numerics.md documents the semantics tested here):
//  [numerics] huge scores with and without softcap, NaN/Inf inputs, fully masked problems,
//             dropout at p = 0 and p -> 1;
//  [faults]   every kind of failed call leaves the plan usable and its results unchanged;
//  [limits]   128k keys for one query (and the transpose), minimally aligned pointers.
// Inputs come from fixed seeds; nothing depends on timing.
#include <math.h>

#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "harness.hpp"

using namespace fat;

namespace {

Config base(const char* name, int64_t sq, int64_t sk, int64_t d, flashattn_dtype_t t, uint64_t seed) {
  Config c;
  c.name = name;
  c.sq = sq;
  c.sk = sk;
  c.dqk = c.dv = d;
  c.hq = 2;
  c.hkv = 1;
  c.dtype = t;
  c.data_seed = seed;
  return c;
}

bool all_finite(const std::vector<double>& x) {
  for (double v : x)
    if (!std::isfinite(v)) return false;
  return true;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, fabs(v));
  return m;
}

// RAII plan on the CPU backend.
struct Plan {
  flashattn_plan_t p = nullptr;
  Plan() { REQUIRE(flashattn_plan_create(&p, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS); }
  ~Plan() { flashattn_plan_destroy(p); }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
};

void require_same_bits(const LibResult& a, const LibResult& b) {
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a.raw_o == b.raw_o);
  CHECK(a.raw_lse == b.raw_lse);
  CHECK(a.raw_dq == b.raw_dq);
  CHECK(a.raw_dk == b.raw_dk);
  CHECK(a.raw_dv == b.raw_dv);
  CHECK(a.raw_dbias == b.raw_dbias);
}

// Contiguous BSHD byte buffers of a non-varlen problem (the reference layout is BSHD), with
// every pointer moved `offset` bytes past a 64-byte aligned start.
struct RawBuffers {
  flashattn_dtype_t t;
  size_t offset;
  std::vector<unsigned char> q, k, v, o, dout, dq, dk, dv;
  std::vector<float> lse;
  void fill(std::vector<unsigned char>& buf, const std::vector<double>* x, size_t n) {
    const size_t es = dtype_size(t);
    buf.assign(n * es + offset + 64, kPoison);
    for (size_t i = 0; x && i < n; ++i) store_elem(t, at(buf) + i * es, (*x)[i]);
  }
  unsigned char* at(std::vector<unsigned char>& buf) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(buf.data());
    return buf.data() + ((64 - a % 64) % 64) + offset;
  }
  std::vector<double> read(std::vector<unsigned char>& buf, size_t n) {
    std::vector<double> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = load_elem(t, at(buf) + i * dtype_size(t));
    return x;
  }
  RawBuffers(const Problem& p, size_t off) : t(p.cfg.dtype), offset(off) {
    fill(q, &p.in.q, p.in.q.size());
    fill(k, &p.in.k, p.in.k.size());
    fill(v, &p.in.v, p.in.v.size());
    fill(dout, &p.in.dout, p.in.dout.size());
    fill(o, nullptr, p.in.dout.size());
    fill(dq, nullptr, p.in.q.size());
    fill(dk, nullptr, p.in.k.size());
    fill(dv, nullptr, p.in.v.size());
    lse.assign(p.spec.total_q() * p.cfg.hq + 16, 0.f);
  }
  flashattn_fwd_args_t fwd_args() {
    flashattn_fwd_args_t a = FLASHATTN_FWD_ARGS_INIT;
    a.q = at(q);
    a.k = at(k);
    a.v = at(v);
    a.o = at(o);
    a.lse = lse.data();
    return a;
  }
  flashattn_bwd_args_t bwd_args() {
    flashattn_bwd_args_t a = FLASHATTN_BWD_ARGS_INIT;
    a.q = at(q);
    a.k = at(k);
    a.v = at(v);
    a.o = at(o);
    a.lse = lse.data();
    a.dout = at(dout);
    a.dq = at(dq);
    a.dk = at(dk);
    a.dv = at(dv);
    return a;
  }
};

std::vector<unsigned char> workspace(flashattn_plan_t plan, flashattn_pass_t pass, size_t* bytes) {
  REQUIRE(flashattn_plan_get_workspace_size(plan, pass, bytes) == FLASHATTN_STATUS_SUCCESS);
  return std::vector<unsigned char>(*bytes + 1);
}

// What a poisoned input does to one (batch, query row, query head) row of O and its LSE.
enum class RowExp {
  Same,          // bitwise equal to the clean run (O row and LSE)
  AllNonFinite,  // every element of the O row is NaN or +-inf
  ColNonFinite,  // element `dim` of the O row is NaN or +-inf, the others are bitwise the clean run's; LSE too
  ColMaybe,      // as ColNonFinite, or bitwise the clean run's (a masked key's 0 * NaN, see numerics.md)
  Finite,        // every element finite, LSE finite (the key dropped out of the row)
  MaskedRow      // O row exactly 0, LSE = -inf, as for a fully masked row
};
const char* exp_name(RowExp e) {
  switch (e) {
    case RowExp::Same: return "same";
    case RowExp::AllNonFinite: return "all non-finite";
    case RowExp::ColNonFinite: return "column non-finite";
    case RowExp::ColMaybe: return "column non-finite or same";
    case RowExp::Finite: return "finite";
    default: return "masked row";
  }
}

// Runs the clean problem and the problem with one poisoned input element (which: 0 Q, 1 K,
// 2 V, at [b, pos, head, dim]) and checks: both runs succeed, the clean one matches the
// reference, every row of O / LSE behaves as expected(batch, i, h) says, and the gradients
// of every batch other than b are bitwise the clean run's.
template <class Expected>
void check_poison(const Config& c, int which, int64_t b, int64_t pos, int64_t head, int64_t dim, double value,
                  Expected expected) {
  const Problem clean = make_problem(c);
  Problem bad = clean;
  const int64_t H = which == 0 ? c.hq : c.hkv, D = which == 2 ? c.dv : c.dqk;
  const int64_t S = which == 0 ? c.sq : c.sk;
  std::vector<double>& x = which == 0 ? bad.in.q : which == 1 ? bad.in.k : bad.in.v;
  x[((b * S + pos) * H + head) * D + dim] = value;
  const LibResult rc = run_cpu(clean), rb = run_cpu(bad);
  INFO(describe(c) << " poisoned " << "QKV"[which] << "[b=" << b << ", pos=" << pos << ", head=" << head
                   << ", dim=" << dim << "] = " << value);
  INFO("status fwd/bwd = " << rb.fwd << "/" << rb.bwd << " " << rb.error);
  REQUIRE(rb.ok());
  check_against_reference(clean, rc);
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
            case RowExp::AllNonFinite: ok = ok && !std::isfinite(o); break;
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

}  // namespace

// ---- 1. large magnitudes -----------------------------------------------------------------

TEST_CASE("scores of magnitude 1e4 do not overflow the online softmax and O and LSE match the reference",
          "[numerics]") {
  // Inputs ~ N(0, 50^2), d = 16, scale 1/4: |scale * q.k| ~ 1e4 (max ~4e4, inside fp16's
  // range). exp(1e4) overflows fp32 and fp64, so only a max-subtracted (online) softmax gets
  // a finite result. The scores themselves are computed in fp32, so each carries an error of
  // about |s| * 2^-24 and P = exp(s - LSE) a relative error of that size: the bound below
  // is that score conditioning (2x for O, 8x for LSE = max + log(sum), whose dot products
  // sum terms larger than |s|) plus O's rounding to the dtype, not the same-precision
  // yardstick (which rounds S to bf16/fp16, an error of ~32 at 1e4).
  uint64_t seed = 100;
  for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP16}) {
    Config c = base("scores ~1e4", 37, 70, 16, t, ++seed);
    c.input_scale = 50.0;
    c.backward = false;
    const Problem p = make_problem(c);
    const LibResult r = run_cpu(p);
    REQUIRE(r.ok());
    const RefOutputs ref = reference_fp64(p.spec, p.in, false);
    const double smax = max_abs(ref.lse);
    const double u_s = smax * ldexp(1.0, -24);  // relative error of P from the fp32 scores
    const ErrStats eo = error_stats(r.o, ref.o), el = error_stats(r.lse, ref.lse);
    const double tol_o = (2 * u_s + dtype_eps(t)) * (1.0 + max_abs(ref.o_mag));
    const double tol_l = 8 * u_s + ldexp(1.0, -24) * (1.0 + smax);
    INFO(describe(c) << " max |LSE| " << smax << " | O err " << eo.max_abs << " (tol " << tol_o << ") LSE err "
                     << el.max_abs << " (tol " << tol_l << ")");
    CHECK(smax > 5e3);  // the scores really are huge
    CHECK(all_finite(r.o));
    CHECK(all_finite(r.lse));
    CHECK(eo.nonfinite_mismatch + el.nonfinite_mismatch == 0);
    CHECK(eo.max_abs <= tol_o);
    CHECK(el.max_abs <= tol_l);
  }
}

TEST_CASE("scores of magnitude 1e4 give finite gradients and dV matching the reference", "[numerics]") {
  // dQ and dK at such scores are dominated by the rounding of O in D = rowsum(dO * O)
  // times |scores|, so only finiteness is asserted for them; dV = P^T dO does not see
  // that amplification.
  uint64_t seed = 110;
  for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP16}) {
    Config c = base("scores ~1e4 backward", 29, 45, 16, t, ++seed);
    c.input_scale = 50.0;
    const Problem p = make_problem(c);
    const LibResult r = run_cpu(p);
    REQUIRE(r.ok());
    INFO(describe(c));
    CHECK(all_finite(r.o));
    CHECK(all_finite(r.lse));
    CHECK(all_finite(r.dq));
    CHECK(all_finite(r.dk));
    CHECK(all_finite(r.dv));
    const RefOutputs ref = reference_fp64(p.spec, p.in, true);
    const ErrStats e = error_stats(r.dv, ref.dv);
    // P is recomputed as exp(s - LSE) with s ~ 1e4 in fp32: relative error ~ 1e4 * 2^-24
    // per probability, plus the output rounding of the dtype.
    const double tol = (1e4 * ldexp(1.0, -24) * 8 + 2 * dtype_eps(t)) * (1.0 + max_abs(ref.dv_mag));
    INFO("dV max error " << e.max_abs << " tolerance " << tol);
    CHECK(e.nonfinite_mismatch == 0);
    CHECK(e.max_abs <= tol);
  }
}

// ---- 2. softcap with huge scores ---------------------------------------------------------

TEST_CASE("softcap 30 on scores of magnitude 1e6 gives finite outputs matching the reference and finite gradients",
          "[numerics]") {
  // Inputs ~ N(0, 500^2), d = 16, scale 1/4: raw scores ~ 1e6; after 30 * tanh(s / 30) every
  // score lies in [-30, 30] and tanh's derivative underflows to 0 almost everywhere.
  uint64_t seed = 200;
  for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP16}) {
    Config c = base("softcap 30, scores ~1e6", 33, 41, 16, t, ++seed);
    c.input_scale = 500.0;
    c.softcap = 30.f;
    const Problem p = make_problem(c);
    const LibResult r = run_cpu(p);
    REQUIRE(r.ok());
    INFO(describe(c));
    CHECK(all_finite(r.o));
    CHECK(all_finite(r.lse));
    CHECK(all_finite(r.dq));
    CHECK(all_finite(r.dk));
    CHECK(all_finite(r.dv));
    for (double l : r.lse) CHECK(fabs(l) <= 30.0 + log(41.0) + 1e-3);
    const RefOutputs ref = reference_fp64(p.spec, p.in, true);
    // fp16 scores of 1e6 are inf in the same-precision yardstick, so compare against fp64
    // directly: the capped scores are moderate, so O, LSE and dV are as accurate as usual
    // up to the fp32 rounding of the raw dot products (2^-24 * 1e6 / 30 relative to the cap):
    // twice that plus the dtype's unit roundoff, relative to the condition magnitudes.
    const double u = dtype_eps(t) + 1e6 * ldexp(1.0, -24) / 30.0;
    const ErrStats eo = error_stats(r.o, ref.o), el = error_stats(r.lse, ref.lse), ev = error_stats(r.dv, ref.dv);
    const double tol_o = 2 * u * (1 + max_abs(ref.o_mag)), tol_l = 2 * u * (1 + max_abs(ref.lse)),
                 tol_v = 2 * u * (1 + max_abs(ref.dv_mag));
    INFO("O err " << eo.max_abs << " (tol " << tol_o << ") LSE err " << el.max_abs << " (tol " << tol_l
                  << ") dV err " << ev.max_abs << " (tol " << tol_v << ")");
    CHECK(eo.nonfinite_mismatch + el.nonfinite_mismatch + ev.nonfinite_mismatch == 0);
    CHECK(eo.max_abs <= tol_o);
    CHECK(el.max_abs <= tol_l);
    CHECK(ev.max_abs <= tol_v);
  }
}

// ---- 3. NaN and Inf inputs ---------------------------------------------------------------

TEST_CASE("NaN in a Q row makes it a masked row (O = 0 and LSE = -inf) and Inf makes it NaN and nothing else changes",
          "[numerics]") {
  // Measured CPU behavior (numerics.md): a NaN query makes every score of its row NaN, no
  // score exceeds the running maximum, and the row is treated as fully masked. An infinite
  // query element makes the row's scores +-inf: O is NaN (LSE is -inf).
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_BF16}) {
    Config c = base("poisoned Q", 9, 13, 16, t, 300);
    c.batch = 3;
    c.hq = 4;
    c.hkv = 2;
    for (double val : {nan, inf, -inf})
      check_poison(c, 0, 1, 4, 3, 5, val, [&](int64_t b, int64_t i, int64_t h) {
        if (!(b == 1 && i == 4 && h == 3)) return RowExp::Same;
        return std::isnan(val) ? RowExp::MaskedRow : RowExp::AllNonFinite;
      });
  }
}

TEST_CASE("NaN or Inf in K reaches only the rows of its batch and GQA group whose score it makes NaN or +inf",
          "[numerics]") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_FP16}) {
    Config c = base("poisoned K", 9, 13, 16, t, 310);
    c.batch = 3;
    c.hq = 4;
    c.hkv = 2;  // query heads 2, 3 use kv head 1
    const Problem p = make_problem(c);
    for (double val : {nan, inf, -inf})
      check_poison(c, 1, 2, 6, 1, 0, val, [&](int64_t b, int64_t i, int64_t h) {
        if (!(b == 2 && h / 2 == 1)) return RowExp::Same;
        if (std::isnan(val)) return RowExp::AllNonFinite;
        // score = scale * (q[.., 0] * val + finite): +inf poisons the row (inf - inf in the
        // softmax), -inf only removes the key from the row.
        const double q0 = p.in.q[((b * c.sq + i) * c.hq + h) * c.dqk + 0];
        return q0 * val > 0 ? RowExp::AllNonFinite : RowExp::Finite;
      });
  }
}

TEST_CASE("NaN or Inf in V poisons exactly its column of the rows of its batch and GQA group", "[numerics]") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_FP16}) {
    Config c = base("poisoned V", 9, 13, 16, t, 315);
    c.batch = 3;
    c.hq = 4;
    c.hkv = 2;
    for (double val : {nan, inf, -inf})
      check_poison(c, 2, 2, 6, 1, 3, val, [](int64_t b, int64_t, int64_t h) {
        return b == 2 && h / 2 == 1 ? RowExp::ColNonFinite : RowExp::Same;
      });
  }
}

TEST_CASE("NaN in K or V under a causal mask poisons the rows that see the key and no other batch or head",
          "[numerics]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Config c = base("poisoned K/V, causal", 40, 40, 16, FLASHATTN_DTYPE_FP32, 320);
  c.batch = 2;
  c.hq = 2;
  c.hkv = 2;
  c.band = true;
  c.wr = 0;  // causal, top-left: row i sees keys 0..i
  // K: a masked score is replaced by -inf before it can spread, so rows i < 9 are exact.
  check_poison(c, 1, 0, 9, 1, 2, nan, [](int64_t b, int64_t i, int64_t h) {
    return b == 0 && h == 1 && i >= 9 ? RowExp::AllNonFinite : RowExp::Same;
  });
  // V: rows that see key 9 get NaN in column 2; rows it is masked from may get it too
  // (0 * NaN in a computed tile), but nothing outside (batch 0, head 1, column 2) changes.
  check_poison(c, 2, 0, 9, 1, 2, nan, [](int64_t b, int64_t i, int64_t h) {
    if (!(b == 0 && h == 1)) return RowExp::Same;
    return i >= 9 ? RowExp::ColNonFinite : RowExp::ColMaybe;
  });
}

// ---- 4. fully masked problems ------------------------------------------------------------

TEST_CASE("every row masked gives O = 0 and LSE = -inf and dQ and dK and dV exactly 0", "[numerics]") {
  // test_attention.cpp covers single masked rows of each mask kind; here no row sees any
  // key, so dK and dV receive no contribution and must be exactly zero as well.
  uint64_t seed = 400;
  for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_FP16}) {
    std::vector<Config> cs;
    Config c = base("block-sparse layout of zeros", 24, 20, 16, t, ++seed);
    c.sparse = true;
    c.block_q = 24;  // one row block, made all zero
    c.block_k = 8;
    c.zero_row_block = 0;
    cs.push_back(c);
    c = base("block-sparse zeros, bottom-right causal", 30, 12, 16, t, ++seed);
    c.sparse = true;
    c.block_q = 32;  // one row block, made all zero, on top of a band mask
    c.block_k = 5;
    c.zero_row_block = 0;
    c.band = true;
    c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
    c.wr = 0;
    cs.push_back(c);
    for (const Config& x : cs) {
      const Problem p = make_problem(x);
      const LibResult r = run_cpu(p);
      INFO(describe(x));
      REQUIRE(r.ok());
      check_against_reference(p, r);
      for (double v : r.o) CHECK(v == 0.0);
      for (double v : r.lse) CHECK(v == -std::numeric_limits<double>::infinity());
      size_t nonzero = 0;
      for (double v : r.dq) nonzero += v != 0.0;
      for (double v : r.dk) nonzero += v != 0.0;
      for (double v : r.dv) nonzero += v != 0.0;
      CHECK(nonzero == 0);
    }
  }
}

// ---- 5. dropout extremes -----------------------------------------------------------------

TEST_CASE("dropout p = 0 with a seed is bitwise identical to no dropout", "[numerics]") {
  for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_BF16}) {
    Config c = base("dropout p = 0", 23, 31, 32, t, 500);
    c.batch = 2;
    const Problem p = make_problem(c);
    const LibResult plain = run_cpu(p);
    Plan plan;
    REQUIRE(configure_plan(plan.p, p) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_dropout(plan.p, 0.f, 0xdeadbeefull, 12345) == FLASHATTN_STATUS_SUCCESS);
    HostMem mem;
    const LibResult zero = run_on_plan(plan.p, p, mem);
    require_same_bits(plain, zero);
  }
}

TEST_CASE("dropout with p close to 1 (0.999 and the largest float below 1) is finite and matches the reference",
          "[numerics]") {
  HostMem mem;
  for (float pd : {0.999f, nextafterf(1.f, 0.f)})
    for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_BF16}) {
      Config c = base("dropout p -> 1", 64, 64, 64, t, 510);
      c.batch = 4;
      c.hq = c.hkv = 16;
      c.p_drop = pd;
      c.seed = 0x0123456789abcdefull;
      c.offset = 77;
      INFO(describe(c) << " p = " << pd);
      // recover_dropout_masks runs with V = I (and dO = I) and checks the run against the
      // reference, which applies the documented keep rule; the masks are the library's.
      const Masks m = recover_dropout_masks(c, mem);
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
      const double expect = n * (1.0 - static_cast<double>(pd));
      INFO("kept " << kept << " (bwd " << kept_bwd << ") of " << n << ", expected " << expect);
      CHECK(mismatch == 0);
      CHECK(kept == kept_bwd);
      // Binomial: within 5 standard deviations (+1 for p so close to 1 that ~0 are kept).
      CHECK(fabs(static_cast<double>(kept) - expect) <= 5.0 * sqrt(expect) + 1.0);
      // And on random data: finite and matching the reference.
      Config r = c;
      r.name = "dropout p -> 1, random data";
      r.batch = 2;
      r.hq = 2;
      r.hkv = 1;
      r.sq = 40;
      r.sk = 70;
      const Problem pr = make_problem(r);
      const LibResult lr = run_cpu(pr);
      REQUIRE(lr.ok());
      CHECK(all_finite(lr.o));
      CHECK(all_finite(lr.dq));
      CHECK(all_finite(lr.dk));
      CHECK(all_finite(lr.dv));
      check_against_reference(pr, lr);
    }
}

// ---- 6. faults ---------------------------------------------------------------------------

TEST_CASE("after every kind of failed fwd/bwd call the same plan runs and gives a fresh plan's bits", "[faults]") {
  for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_FP16}) {
    Config c = base("faults", 21, 34, 16, t, 600);
    c.batch = 2;
    c.band = true;
    c.wr = 0;
    c.p_drop = 0.2f;
    c.seed = 99;
    const Problem p = make_problem(c);
    HostMem mem;
    const LibResult fresh = run_cpu(p);
    check_against_reference(p, fresh);
    Plan plan;
    REQUIRE(configure_plan(plan.p, p) == FLASHATTN_STATUS_SUCCESS);
    require_same_bits(fresh, run_on_plan(plan.p, p, mem));

    RawBuffers raw(p, 0);
    size_t wf = 0, wb = 0;
    std::vector<unsigned char> wsf = workspace(plan.p, FLASHATTN_PASS_FORWARD, &wf);
    std::vector<unsigned char> wsb = workspace(plan.p, FLASHATTN_PASS_BACKWARD, &wb);
    struct Fault {
      const char* what;
      flashattn_status_t want;
      flashattn_status_t got;
    };
    std::vector<Fault> faults;
    auto fwd = [&](const char* what, flashattn_status_t want, flashattn_fwd_args_t a, void* ws, size_t n,
                   CUstream_st* s = nullptr) { faults.push_back({what, want, flashattn_fwd(plan.p, &a, ws, n, s)}); };
    auto bwd = [&](const char* what, flashattn_status_t want, flashattn_bwd_args_t a, void* ws, size_t n,
                   CUstream_st* s = nullptr) { faults.push_back({what, want, flashattn_bwd(plan.p, &a, ws, n, s)}); };
    flashattn_fwd_args_t fa = raw.fwd_args();
    flashattn_bwd_args_t ba = raw.bwd_args();
    {
      flashattn_fwd_args_t a = fa;
      a.q = nullptr;
      fwd("fwd q = NULL", FLASHATTN_STATUS_NULL_POINTER, a, wsf.data(), wf);
      a = fa;
      a.o = nullptr;
      fwd("fwd o = NULL", FLASHATTN_STATUS_NULL_POINTER, a, wsf.data(), wf);
      a = fa;
      a.struct_size = 8;
      fwd("fwd struct_size = 8", FLASHATTN_STATUS_INVALID_STRUCT_SIZE, a, wsf.data(), wf);
      a = fa;
      a.o = static_cast<unsigned char*>(a.o) + 1;
      fwd("fwd o misaligned by 1 byte", FLASHATTN_STATUS_MISALIGNED_POINTER, a, wsf.data(), wf);
      fwd("fwd stream on CPU", FLASHATTN_STATUS_INVALID_ARGUMENT, fa, wsf.data(), wf,
          reinterpret_cast<CUstream_st*>(wsf.data()));
      a = fa;
      a.bias = raw.at(raw.q);
      fwd("fwd bias without bias kind", FLASHATTN_STATUS_INVALID_ARGUMENT, a, wsf.data(), wf);
      REQUIRE(wf > 0);  // the CPU backend always needs scratch, so both faults below apply
      {
        fwd("fwd workspace NULL", FLASHATTN_STATUS_WORKSPACE_TOO_SMALL, fa, nullptr, wf);
        fwd("fwd workspace of 1 byte", FLASHATTN_STATUS_WORKSPACE_TOO_SMALL, fa, wsf.data(), 1);
      }
      flashattn_bwd_args_t b = ba;
      b.lse = nullptr;
      bwd("bwd lse = NULL", FLASHATTN_STATUS_NULL_POINTER, b, wsb.data(), wb);
      b = ba;
      b.dv = static_cast<unsigned char*>(b.dv) + 1;
      bwd("bwd dv misaligned", FLASHATTN_STATUS_MISALIGNED_POINTER, b, wsb.data(), wb);
      REQUIRE(wb > 0);
      bwd("bwd workspace NULL", FLASHATTN_STATUS_WORKSPACE_TOO_SMALL, ba, nullptr, wb);
      b = ba;
      b.struct_size = 0;
      bwd("bwd struct_size = 0", FLASHATTN_STATUS_INVALID_STRUCT_SIZE, b, wsb.data(), wb);
    }
    for (const Fault& f : faults) {
      INFO(dtype_name(t) << " " << f.what << ": got " << flashattn_status_string(f.got) << " want "
                         << flashattn_status_string(f.want));
      CHECK(f.got != FLASHATTN_STATUS_SUCCESS);
      // The exact status of each fault is specified in errors.md; aliasing outputs and
      // cu_seqlens on a fixed-length plan may be reported by a more specific code.
      if (f.want != FLASHATTN_STATUS_INVALID_ARGUMENT) CHECK(f.got == f.want);
    }
    // Nothing was written by the failed calls...
    for (unsigned char x : raw.o) CHECK(x == kPoison);
    // ...and the same plan still gives the fresh plan's results, bit for bit.
    require_same_bits(fresh, run_on_plan(plan.p, p, mem));
  }
}

TEST_CASE("after rejected cu_seqlens the same varlen plan runs and gives a fresh plan's bits", "[faults]") {
  Config c = base("varlen faults", 1, 1, 16, FLASHATTN_DTYPE_BF16, 610);
  c.seqlens_q = {5, 0, 9};
  c.seqlens_k = {7, 3, 11};
  c.band = true;
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wr = 0;
  const Problem p = make_problem(c);
  REQUIRE(p.varlen);
  HostMem mem;
  const LibResult fresh = run_cpu(p);
  check_against_reference(p, fresh);
  Plan plan;
  REQUIRE(configure_plan(plan.p, p) == FLASHATTN_STATUS_SUCCESS);
  require_same_bits(fresh, run_on_plan(plan.p, p, mem));

  const int64_t tq = p.spec.total_q(), tk = p.spec.total_k();
  const size_t es = 2;
  std::vector<unsigned char> q(tq * c.hq * c.dqk * es), k(tk * c.hkv * c.dqk * es), v(tk * c.hkv * c.dv * es),
      o(tq * c.hq * c.dv * es, kPoison), dout(o.size()), dq(q.size(), kPoison), dk(k.size(), kPoison),
      dv(v.size(), kPoison);
  std::vector<float> lse(tq * c.hq, 0.f);
  size_t wf = 0, wb = 0;
  std::vector<unsigned char> wsf = workspace(plan.p, FLASHATTN_PASS_FORWARD, &wf);
  std::vector<unsigned char> wsb = workspace(plan.p, FLASHATTN_PASS_BACKWARD, &wb);
  const std::vector<int32_t> good_q(p.cu_q), good_k(p.cu_k);
  struct Bad {
    const char* what;
    std::vector<int32_t> cq, ck;
  };
  std::vector<Bad> bads = {
      {"q not monotonic", {0, 5, 4, 14}, good_k},
      {"k not monotonic", good_q, {0, 7, 6, 21}},
      {"q does not start at 0", {1, 5, 5, 14}, good_k},
      {"q total exceeds total_q", {0, 5, 5, 15}, good_k},
      {"k total exceeds total_k", good_q, {0, 7, 10, 22}},
      {"q length exceeds max seqlen_q", {0, 1, 1, 14}, good_k},
      {"negative offset", {0, -1, 5, 14}, good_k},
  };
  REQUIRE(good_q == std::vector<int32_t>({0, 5, 5, 14}));
  REQUIRE(good_k == std::vector<int32_t>({0, 7, 10, 21}));
  for (const Bad& bd : bads) {
    INFO(bd.what);
    flashattn_fwd_args_t a = FLASHATTN_FWD_ARGS_INIT;
    a.q = q.data();
    a.k = k.data();
    a.v = v.data();
    a.o = o.data();
    a.lse = lse.data();
    a.cu_seqlens_q = bd.cq.data();
    a.cu_seqlens_k = bd.ck.data();
    const flashattn_status_t sf = flashattn_fwd(plan.p, &a, wsf.data(), wf, nullptr);
    CHECK(sf == FLASHATTN_STATUS_INVALID_SEQLENS);
    flashattn_bwd_args_t b = FLASHATTN_BWD_ARGS_INIT;
    b.q = q.data();
    b.k = k.data();
    b.v = v.data();
    b.o = o.data();
    b.lse = lse.data();
    b.dout = dout.data();
    b.dq = dq.data();
    b.dk = dk.data();
    b.dv = dv.data();
    b.cu_seqlens_q = bd.cq.data();
    b.cu_seqlens_k = bd.ck.data();
    const flashattn_status_t sb = flashattn_bwd(plan.p, &b, wsb.data(), wb, nullptr);
    CHECK(sb == FLASHATTN_STATUS_INVALID_SEQLENS);
    // A missing cu_seqlens array too.
    a.cu_seqlens_k = nullptr;
    CHECK(flashattn_fwd(plan.p, &a, wsf.data(), wf, nullptr) == FLASHATTN_STATUS_NULL_POINTER);
  }
  size_t touched = 0;
  for (unsigned char x : o) touched += x != kPoison;
  for (unsigned char x : dq) touched += x != kPoison;
  for (unsigned char x : dk) touched += x != kPoison;
  for (unsigned char x : dv) touched += x != kPoison;
  CHECK(touched == 0);
  require_same_bits(fresh, run_on_plan(plan.p, p, mem));
}

// ---- 7. limits ---------------------------------------------------------------------------

TEST_CASE("one query against 131072 keys matches the reference", "[limits]") {
  Config c = base("sq = 1, sk = 128k", 1, 131072, 8, FLASHATTN_DTYPE_FP32, 700);
  c.hq = c.hkv = 1;
  run_and_check_cpu(c);
  c.band = true;  // bottom-right causal: the single query sees every key
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wr = 0;
  c.wl = 100000;
  run_and_check_cpu(c);
}

TEST_CASE("131072 queries against one key match the reference", "[limits]") {
  Config c = base("sq = 128k, sk = 1", 131072, 1, 8, FLASHATTN_DTYPE_FP32, 710);
  c.hq = c.hkv = 1;
  run_and_check_cpu(c);
  c.band = true;  // bottom-right causal: only the last query sees the key
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wr = 0;
  run_and_check_cpu(c);
}

TEST_CASE("pointers aligned only to the element size give the same bits as 64-byte aligned ones", "[limits]") {
  for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP32}) {
    Config c = base("minimum alignment", 19, 27, 24, t, 720);
    c.batch = 2;
    const Problem p = make_problem(c);
    Plan plan;
    REQUIRE(configure_plan(plan.p, p) == FLASHATTN_STATUS_SUCCESS);
    size_t wf = 0, wb = 0;
    std::vector<unsigned char> wsf = workspace(plan.p, FLASHATTN_PASS_FORWARD, &wf);
    std::vector<unsigned char> wsb = workspace(plan.p, FLASHATTN_PASS_BACKWARD, &wb);
    RawBuffers aligned(p, 0), minimal(p, dtype_size(t));
    for (RawBuffers* r : {&aligned, &minimal}) {
      INFO(dtype_name(t) << " offset " << r->offset);
      flashattn_fwd_args_t a = r->fwd_args();
      REQUIRE(flashattn_fwd(plan.p, &a, wsf.data(), wf, nullptr) == FLASHATTN_STATUS_SUCCESS);
      flashattn_bwd_args_t b = r->bwd_args();
      REQUIRE(flashattn_bwd(plan.p, &b, wsb.data(), wb, nullptr) == FLASHATTN_STATUS_SUCCESS);
    }
    const size_t no = p.in.dout.size(), nq = p.in.q.size(), nk = p.in.k.size(), nv = p.in.v.size();
    CHECK(aligned.read(aligned.o, no) == minimal.read(minimal.o, no));
    CHECK(aligned.read(aligned.dq, nq) == minimal.read(minimal.dq, nq));
    CHECK(aligned.read(aligned.dk, nk) == minimal.read(minimal.dk, nk));
    CHECK(aligned.read(aligned.dv, nv) == minimal.read(minimal.dv, nv));
    CHECK(std::memcmp(aligned.lse.data(), minimal.lse.data(), p.spec.total_q() * c.hq * 4) == 0);
    // And the results are right: compare O with the reference.
    const RefOutputs ref = reference_fp64(p.spec, p.in, false);
    const ErrStats e = error_stats(minimal.read(minimal.o, no), ref.o);
    INFO("O max error " << e.max_abs);
    CHECK(e.nonfinite_mismatch == 0);
    CHECK(e.max_abs <= 4 * dtype_eps(t) * (1 + max_abs(ref.o_mag)));
    // One byte less than the element size is rejected, without writing.
    if (dtype_size(t) > 1) {
      RawBuffers odd(p, 1);
      flashattn_fwd_args_t a = odd.fwd_args();
      CHECK(flashattn_fwd(plan.p, &a, wsf.data(), wf, nullptr) == FLASHATTN_STATUS_MISALIGNED_POINTER);
      for (unsigned char x : odd.o) CHECK(x == kPoison);
    }
  }
}
