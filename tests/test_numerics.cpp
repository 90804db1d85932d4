// Numerical robustness, fault recovery and size limits of the CPU backend, through the
// public API (docs/numerics.md documents the semantics tested here):
//  [numerics] huge scores with and without softcap, NaN/Inf inputs, fully masked problems,
//             dropout at p = 0 and p -> 1;
//  [faults]   every kind of failed call leaves the plan usable and its results unchanged;
//  [limits]   128k keys for one query (and the transpose), minimally aligned pointers.
// Inputs come from fixed seeds; nothing depends on timing.
#include <math.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "harness.hpp"
#include "numerics_checks.hpp"

using namespace fat;

namespace {

// The scenarios of numerics_checks.hpp run with both algorithms, whose softmax code differs.
const flashattn_algorithm_t kAlgorithms[2] = {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD};

Config proto(flashattn_dtype_t t, flashattn_algorithm_t alg) {
  Config c = base_config("", 1, 1, 16, t, 0);
  c.algorithm = alg;
  return c;
}

// Runs f(proto, n) for both algorithms and each dtype of `types` (n = 1, 2, ... per
// algorithm: an offset for data seeds).
template <class F>
void each_variant(std::initializer_list<flashattn_dtype_t> types, F f) {
  for (flashattn_algorithm_t alg : kAlgorithms) {
    uint64_t n = 0;
    for (flashattn_dtype_t t : types) f(proto(t, alg), ++n);
  }
}
const std::initializer_list<flashattn_dtype_t> kAllTypes = {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_BF16,
                                                            FLASHATTN_DTYPE_FP16};

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
  flashattn_fwd_args_t fwd_args() { return fat::fwd_args(at(q), at(k), at(v), at(o), lse.data()); }
  flashattn_bwd_args_t bwd_args() {
    return fat::bwd_args(at(q), at(k), at(v), at(o), lse.data(), at(dout), at(dq), at(dk), at(dv));
  }
};

std::vector<unsigned char> workspace(flashattn_plan_t plan, flashattn_pass_t pass, size_t* bytes) {
  REQUIRE(flashattn_plan_get_workspace_size(plan, pass, bytes) == FLASHATTN_STATUS_SUCCESS);
  return std::vector<unsigned char>(*bytes + 1);
}

}  // namespace

// ---- 1. large magnitudes, 2. softcap with huge scores -------------------------------------
// Scenarios in numerics_checks.hpp. The CPU backend computes the scores in fp32 and rounds
// only O to its dtype: O is within 2 u_s (score conditioning) plus O's rounding, LSE =
// max + log(sum), whose dot products sum terms larger than |s|, within 8 u_s; dV within
// 2 u_s plus two roundings; softcapped outputs within 2 u.
constexpr NumericsBounds kCpuBounds{2, 1, 8, 1, 2, 2, 2};

TEST_CASE("scores of magnitude 1e4 do not overflow the online softmax and O and LSE match the reference",
          "[numerics]") {
  HostMem mem;
  each_variant(kAllTypes, [&](const Config& c, uint64_t n) { large_scores_fwd(c, mem, kCpuBounds, 100 + n); });
}

TEST_CASE("scores of magnitude 1e4 give finite gradients and dV matching the reference", "[numerics]") {
  HostMem mem;
  each_variant(kAllTypes, [&](const Config& c, uint64_t n) { large_scores_bwd(c, mem, kCpuBounds, 110 + n); });
}

TEST_CASE("softcap 30 on scores of magnitude 1e6 gives finite outputs matching the reference and finite gradients",
          "[numerics]") {
  HostMem mem;
  each_variant(kAllTypes, [&](const Config& c, uint64_t n) { softcap_huge_scores(c, mem, kCpuBounds, 200 + n); });
}

// ---- 3. NaN and Inf inputs ---------------------------------------------------------------

TEST_CASE("NaN or Inf in a Q row makes that row's O and LSE NaN and nothing else changes", "[numerics]") {
  // numerics.md: a NaN query makes every score of its row NaN; the running maximum skips
  // NaN, but the row sum becomes NaN, so O and LSE are NaN (not the O = 0 / LSE = -inf of a
  // fully masked row). An infinite query element makes the row's scores +-inf: +inf - +inf
  // in the softmax gives NaN as well.
  HostMem mem;
  each_variant({FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_BF16}, [&](const Config& c, uint64_t) {
    poison_q(c, mem, kCpuTolerance);
    poison_q_masked(c, mem, kCpuTolerance);
  });
}

TEST_CASE("NaN or Inf in K reaches only the rows of its batch and GQA group whose score it makes NaN or +inf",
          "[numerics]") {
  HostMem mem;
  each_variant({FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_FP16},
               [&](const Config& c, uint64_t) { poison_k(c, mem, kCpuTolerance); });
}

TEST_CASE("NaN or Inf in V poisons exactly its column of the rows of its batch and GQA group", "[numerics]") {
  HostMem mem;
  each_variant({FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_FP16},
               [&](const Config& c, uint64_t) { poison_v(c, mem, kCpuTolerance); });
}

TEST_CASE("NaN in K or V under a causal mask poisons the rows that see the key and no other batch or head",
          "[numerics]") {
  HostMem mem;
  each_variant({FLASHATTN_DTYPE_FP32}, [&](const Config& c, uint64_t) { poison_kv_causal(c, mem, kCpuTolerance); });
}

// ---- 4. fully masked problems ------------------------------------------------------------
// test_attention.cpp covers single masked rows of each mask kind; here no row sees any key.

TEST_CASE("every row masked gives O = 0 and LSE = -inf and dQ and dK and dV exactly 0", "[numerics]") {
  HostMem mem;
  each_variant({FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_FP16},
               [&](const Config& c, uint64_t n) { all_rows_masked(c, mem, kCpuTolerance, 400 + 3 * n); });
}

// ---- 5. dropout extremes -----------------------------------------------------------------

// With one key every probability is exp(S - LSE) = exp(0) = 1 exactly, provided the
// backward recomputes the very S that the forward's LSE came from; dV then depends on dO
// alone. So dV must be bitwise the same for any Q as for Q = 0 (where S = 0 whatever the
// summation order). Query counts cover the forward's dot-product blocks (at most 8 rows,
// also as a short last block: 263 = 256 + 7) and its GEMM tiles.
namespace {
std::vector<float> one_key_dv(int64_t sq, int64_t d, bool zero_q) {
  const int64_t hq = 4, hkv = 2;
  std::vector<float> q(sq * hq * d), k(hkv * d), v(hkv * d), o(sq * hq * d), lse(hq * sq), dout(sq * hq * d),
      dq(q.size()), dk(k.size()), dv(v.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = zero_q ? 0.f : std::sin(0.37f * static_cast<float>(i)) * 3.f;
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.11f * static_cast<float>(i)) * 2.f;
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.07f * static_cast<float>(i) + 1.f);
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = std::cos(0.29f * static_cast<float>(i)) * 1.7f;
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_shape(plan, 1, sq, 1, hq, hkv, d, d) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_dtype(plan, FLASHATTN_DTYPE_FP32) == FLASHATTN_STATUS_SUCCESS);
  size_t wf = 0, wb = 0;
  REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &wf) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_BACKWARD, &wb) == FLASHATTN_STATUS_SUCCESS);
  std::vector<unsigned char> ws(wf > wb ? wf : wb);
  const flashattn_fwd_args_t fa = fwd_args(q.data(), k.data(), v.data(), o.data(), lse.data());
  REQUIRE(flashattn_fwd(plan, &fa, ws.data(), ws.size(), nullptr) == FLASHATTN_STATUS_SUCCESS);
  const flashattn_bwd_args_t ba =
      bwd_args(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(), dv.data());
  REQUIRE(flashattn_bwd(plan, &ba, ws.data(), ws.size(), nullptr) == FLASHATTN_STATUS_SUCCESS);
  flashattn_plan_destroy(plan);
  return dv;
}
}  // namespace

TEST_CASE("with one key the backward sees the forward's scores: dV does not depend on Q", "[numerics]") {
  for (int64_t sq : {1, 3, 8, 9, 70, 263})
    for (int64_t d : {8, 16, 17, 40, 64, 100, 128}) {
      INFO("sq=" << sq << " d=" << d);
      CHECK(one_key_dv(sq, d, false) == one_key_dv(sq, d, true));
    }
}

TEST_CASE("dropout p = 0 with a seed is bitwise identical to no dropout", "[numerics]") {
  HostMem mem;
  each_variant({FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_BF16},
               [&](const Config& c, uint64_t) { dropout_zero_is_off(c, mem, 500); });
}

TEST_CASE("dropout with p close to 1 (0.999 and the largest float below 1) is finite and matches the reference",
          "[numerics]") {
  HostMem mem;
  each_variant({FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_BF16}, [&](const Config& c, uint64_t) {
    for (float pd : {0.999f, nextafterf(1.f, 0.f)}) dropout_near_one(c, mem, kCpuTolerance, pd);
  });
}

// ---- 6. faults ---------------------------------------------------------------------------

TEST_CASE("after every kind of failed fwd/bwd call the same plan runs and gives a fresh plan's bits", "[faults]") {
  for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_FP16}) {
    Config c = base_config("faults", 21, 34, 16, t, 600);
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
                   CUstream_st* s = nullptr) {
      faults.push_back({what, want, flashattn_fwd(plan.p, &a, ws, n, s)});
    };
    auto bwd = [&](const char* what, flashattn_status_t want, flashattn_bwd_args_t a, void* ws, size_t n,
                   CUstream_st* s = nullptr) {
      faults.push_back({what, want, flashattn_bwd(plan.p, &a, ws, n, s)});
    };
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
  Config c = base_config("varlen faults", 1, 1, 16, FLASHATTN_DTYPE_BF16, 610);
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
      {"q not monotonic", {0, 5, 4, 14}, good_k},          {"k not monotonic", good_q, {0, 7, 6, 21}},
      {"q does not start at 0", {1, 5, 5, 14}, good_k},    {"q total exceeds total_q", {0, 5, 5, 15}, good_k},
      {"k total exceeds total_k", good_q, {0, 7, 10, 22}}, {"q length exceeds max seqlen_q", {0, 1, 1, 14}, good_k},
      {"negative offset", {0, -1, 5, 14}, good_k},
  };
  REQUIRE(good_q == std::vector<int32_t>({0, 5, 5, 14}));
  REQUIRE(good_k == std::vector<int32_t>({0, 7, 10, 21}));
  for (const Bad& bd : bads) {
    INFO(bd.what);
    flashattn_fwd_args_t a = fwd_args(q.data(), k.data(), v.data(), o.data(), lse.data());
    a.cu_seqlens_q = bd.cq.data();
    a.cu_seqlens_k = bd.ck.data();
    const flashattn_status_t sf = flashattn_fwd(plan.p, &a, wsf.data(), wf, nullptr);
    CHECK(sf == FLASHATTN_STATUS_INVALID_SEQLENS);
    flashattn_bwd_args_t b =
        bwd_args(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(), dv.data());
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

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FA_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FA_SANITIZED 1
#endif
#endif

// An allocation that fails inside the library: with the process's address-space limit set
// just above what it maps now, set_block_sparse cannot copy a 64 MiB layout. It returns
// OUT_OF_MEMORY with a message and keeps the plan as it was; once the limit is back the
// same plan takes the layout, and then a small problem, and runs it with a fresh plan's bits.
TEST_CASE("a failed host allocation returns OUT_OF_MEMORY and the plan stays usable", "[faults]") {
#ifdef FA_SANITIZED
  FA_SKIP_TEST("sanitizer allocators abort on a failed allocation instead of throwing");
#else
  const int64_t n = 8192;  // 1x1 blocks: an n x n layout of 64 MiB
  Plan plan;
  REQUIRE(flashattn_plan_set_shape(plan.p, 1, n, n, 1, 1, 8, 8) == FLASHATTN_STATUS_SUCCESS);
  const std::vector<uint8_t> layout(static_cast<size_t>(n * n), 1);  // allocated before the limit
  rlimit old{};
  REQUIRE(getrlimit(RLIMIT_AS, &old) == 0);
  long pages = 0;
  {
    FILE* f = fopen("/proc/self/statm", "r");
    REQUIRE(f != nullptr);
    REQUIRE(fscanf(f, "%ld", &pages) == 1);
    fclose(f);
  }
  rlimit tight = old;
  tight.rlim_cur = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + (rlim_t{16} << 20);
  if (old.rlim_cur != RLIM_INFINITY && old.rlim_cur < tight.rlim_cur) FA_SKIP_TEST("address-space limit already lower");
  REQUIRE(setrlimit(RLIMIT_AS, &tight) == 0);
  const flashattn_status_t st = flashattn_plan_set_block_sparse(plan.p, layout.data(), 1, n, n, 1, 1);
  const std::string msg = flashattn_last_error();
  REQUIRE(setrlimit(RLIMIT_AS, &old) == 0);
  INFO("set_block_sparse under the limit: " << flashattn_status_string(st) << ": " << msg);
  CHECK(st == FLASHATTN_STATUS_OUT_OF_MEMORY);
  CHECK(!msg.empty());
  CHECK(flashattn_plan_set_block_sparse(plan.p, layout.data(), 1, n, n, 1, 1) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_block_sparse(plan.p, nullptr, 0, 0, 0, 0, 0) == FLASHATTN_STATUS_SUCCESS);
  Config c = base_config("after out of memory", 21, 34, 16, FLASHATTN_DTYPE_FP32, 610);
  const Problem p = make_problem(c);
  REQUIRE(configure_plan(plan.p, p) == FLASHATTN_STATUS_SUCCESS);
  HostMem mem;
  require_same_bits(run_cpu(p), run_on_plan(plan.p, p, mem));
#endif
}

TEST_CASE("one query against 131072 keys matches the reference", "[limits]") {
  Config c = base_config("sq = 1, sk = 128k", 1, 131072, 8, FLASHATTN_DTYPE_FP32, 700);
  c.hq = c.hkv = 1;
  run_and_check_cpu(c);
  c.band = true;  // bottom-right causal: the single query sees every key
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wr = 0;
  c.wl = 100000;
  run_and_check_cpu(c);
}

TEST_CASE("131072 queries against one key match the reference", "[limits]") {
  Config c = base_config("sq = 128k, sk = 1", 131072, 1, 8, FLASHATTN_DTYPE_FP32, 710);
  c.hq = c.hkv = 1;
  run_and_check_cpu(c);
  c.band = true;  // bottom-right causal: only the last query sees the key
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wr = 0;
  run_and_check_cpu(c);
}

TEST_CASE("pointers aligned only to the element size give the same bits as 64-byte aligned ones", "[limits]") {
  for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP32}) {
    Config c = base_config("minimum alignment", 19, 27, 24, t, 720);
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
