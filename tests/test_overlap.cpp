// Memory a run writes (outputs, LSE, dBias, the workspace) must not share a byte with any
// other argument of the run (issue 14, F3), and a CPU workspace must be 16-byte aligned
// (F2). Every tensor of a run lives in one arena at chosen offsets; a case moves one
// pointer onto another tensor's bytes and checks that the run is refused with
// INVALID_ARGUMENT naming both, and that not one byte of the arena changed. Layouts that
// share no element (inputs aliasing each other, adjacent buffers, dQ/dK/dV interleaved in
// one packed dQKV buffer) keep working and give the same bits as separate buffers.
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "harness.hpp"

namespace {

// Shape of every case: fp32, GQA, sq != sk, head dims differ, so no two tensors have the
// same size by accident.
constexpr int64_t kB = 2, kSq = 5, kSk = 7, kHq = 2, kHkv = 1, kDqk = 8, kDv = 4;

struct Tensor {
  int64_t offset;  // in floats from the arena start (multiples of 4: 16-byte aligned)
  int64_t floats;
};

// One plan and an arena holding every argument of a forward and a backward run.
struct Arena {
  flashattn_plan_t plan = nullptr;
  bool varlen;
  std::vector<float> mem;
  std::map<std::string, Tensor> t;
  std::vector<int32_t> cuq = {0, 3, 5}, cuk = {0, 4, 6};  // varlen: total_k = 7 leaves 1 uncovered token
  size_t ws_fwd = 0, ws_bwd = 0;

  explicit Arena(flashattn_algorithm_t alg, bool varlen_mode = false, bool bias = false) : varlen(varlen_mode) {
    REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_shape(plan, kB, kSq, kSk, kHq, kHkv, kDqk, kDv) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_dtype(plan, FLASHATTN_DTYPE_FP32) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_algorithm(plan, alg) == FLASHATTN_STATUS_SUCCESS);
    if (varlen) REQUIRE(flashattn_plan_set_varlen(plan, 1, kB * kSq, kSk) == FLASHATTN_STATUS_SUCCESS);
    if (bias) {
      const int64_t bs[4] = {kHq * kSq * kSk, kSq * kSk, kSk, 1};
      REQUIRE(flashattn_plan_set_bias(plan, FLASHATTN_BIAS_TENSOR, bs) == FLASHATTN_STATUS_SUCCESS);
    }
    REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &ws_fwd) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_BACKWARD, &ws_bwd) == FLASHATTN_STATUS_SUCCESS);
    const int64_t tq = kB * kSq, tk = varlen ? kSk : kB * kSk;  // packed tokens in varlen mode
    int64_t at = 0;
    auto place = [&](const char* name, int64_t floats) {
      t[name] = Tensor{at, floats};
      at += (floats + 3) / 4 * 4 + 4;  // a gap of 16 bytes between tensors
    };
    place("q", tq * kHq * kDqk);
    place("k", tk * kHkv * kDqk);
    place("v", tk * kHkv * kDv);
    place("o", tq * kHq * kDv);
    place("lse", tq * kHq);
    place("dout", tq * kHq * kDv);
    place("dq", tq * kHq * kDqk);
    place("dk", tk * kHkv * kDqk);
    place("dv", tk * kHkv * kDv);
    place("bias", bias ? kB * kHq * kSq * kSk : 0);
    place("dbias", bias ? kB * kHq * kSq * kSk : 0);
    place("workspace", static_cast<int64_t>((std::max(ws_fwd, ws_bwd) + 3) / 4));
    mem.resize(static_cast<size_t>(at));
    std::mt19937 rng(14);
    std::normal_distribution<float> nd;
    for (float& x : mem) x = nd(rng);
  }
  ~Arena() { flashattn_plan_destroy(plan); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  float* at(const std::string& name, int64_t extra = 0) { return mem.data() + t.at(name).offset + extra; }
  float* end(const std::string& name) { return at(name, t.at(name).floats); }

  // The arguments both passes take, at their arena places.
  template <class Args>
  Args common_args(Args a, bool bias) {
    a.q = at("q");
    a.k = at("k");
    a.v = at("v");
    a.o = at("o");
    a.lse = at("lse");
    if (bias) a.bias = at("bias");
    if (varlen) a.cu_seqlens_q = cuq.data(), a.cu_seqlens_k = cuk.data();
    return a;
  }
  flashattn_fwd_args_t fwd_args(bool bias = false) {
    return common_args<flashattn_fwd_args_t>(FLASHATTN_FWD_ARGS_INIT, bias);
  }
  flashattn_bwd_args_t bwd_args(bool bias = false) {
    flashattn_bwd_args_t a = common_args<flashattn_bwd_args_t>(FLASHATTN_BWD_ARGS_INIT, bias);
    a.dout = at("dout");
    a.dq = at("dq");
    a.dk = at("dk");
    a.dv = at("dv");
    if (bias) a.dbias = at("dbias");
    return a;
  }
  flashattn_status_t fwd(const flashattn_fwd_args_t& a) {
    return flashattn_fwd(plan, &a, at("workspace"), ws_fwd, nullptr);
  }
  flashattn_status_t bwd(const flashattn_bwd_args_t& a) {
    return flashattn_bwd(plan, &a, at("workspace"), ws_bwd, nullptr);
  }
};

// The run is refused with INVALID_ARGUMENT, the message names both arguments, and the
// arena (every input, output and the workspace) and `extra` are bit for bit what they were.
void expect_refused(Arena& a, const std::function<flashattn_status_t()>& run, const std::string& first,
                    const std::string& second, const std::vector<float>& extra = {}) {
  const std::vector<float> before = a.mem, extra_before = extra;
  const flashattn_status_t st = run();
  const std::string msg = flashattn_last_error();
  INFO(first << " vs " << second << ": " << flashattn_status_string(st) << ": " << msg);
  CHECK(st == FLASHATTN_STATUS_INVALID_ARGUMENT);
  CHECK(msg.find(first + "=") != std::string::npos);
  CHECK(msg.find(second + "=") != std::string::npos);
  CHECK(memcmp(before.data(), a.mem.data(), before.size() * sizeof(float)) == 0);
  CHECK(extra == extra_before);
}

// A buffer of its own for tensor `onto` (a copy of its data 64 floats in) with room for an
// output placed `shift` floats from it, so that the output overlaps nothing else.
struct Spot {
  std::vector<float> buf;
  float* target;
  float* output;
  Spot(Arena& a, const char* onto, int64_t shift) : buf(static_cast<size_t>(a.t.at(onto).floats + 512)) {
    target = buf.data() + 64;
    memcpy(target, a.at(onto), static_cast<size_t>(a.t.at(onto).floats) * sizeof(float));
    output = target + shift;
  }
};

}  // namespace

TEST_CASE("overlap: forward outputs that overlap an input or each other are refused", "[overlap][fwd]") {
  for (flashattn_algorithm_t alg : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
    INFO("algorithm " << alg);
    Arena a(alg);
    REQUIRE(a.fwd(a.fwd_args()) == FLASHATTN_STATUS_SUCCESS);  // the fixture itself is fine
    struct Case {
      const char* out;   // argument moved
      const char* onto;  // argument whose bytes it is moved onto
      int64_t shift;     // floats past the start of `onto` (negative: before it)
    } cases[] = {{"o", "k", 0}, {"o", "q", 4}, {"o", "v", -4}, {"o", "lse", 0}, {"lse", "q", 0}, {"lse", "o", 8}};
    for (const Case& c : cases) {
      flashattn_fwd_args_t args = a.fwd_args();
      Spot spot(a, c.onto, c.shift);
      const std::string out = c.out, onto = c.onto;
      if (onto == "k") args.k = spot.target;
      if (onto == "q") args.q = spot.target;
      if (onto == "v") args.v = spot.target;
      if (onto == "o") args.o = spot.target;
      if (onto == "lse") args.lse = spot.target;
      if (out == "o") args.o = spot.output;
      if (out == "lse") args.lse = spot.output;
      expect_refused(
          a, [&] { return a.fwd(args); }, "args." + out, "args." + onto, spot.buf);
    }
    // One shared element at the end of k is enough.
    flashattn_fwd_args_t args = a.fwd_args();
    args.o = a.end("k") - 1;
    expect_refused(
        a, [&] { return a.fwd(args); }, "args.o", "args.k");
  }
}

TEST_CASE("overlap: backward gradients that overlap an input or each other are refused", "[overlap][bwd]") {
  for (flashattn_algorithm_t alg : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
    INFO("algorithm " << alg);
    Arena a(alg);
    REQUIRE(a.bwd(a.bwd_args()) == FLASHATTN_STATUS_SUCCESS);
    struct Case {
      const char* out;
      const char* onto;
      int64_t shift;
    } cases[] = {{"dq", "k", 0},  {"dk", "q", 0},   {"dv", "dout", 0}, {"dq", "dk", 0}, {"dk", "dv", 4},
                 {"dv", "dq", 8}, {"dq", "lse", 0}, {"dq", "o", -4},   {"dk", "v", 12}};
    for (const Case& c : cases) {
      flashattn_bwd_args_t args = a.bwd_args();
      Spot spot(a, c.onto, c.shift);
      const std::string out = c.out, onto = c.onto;
      const struct {
        const char* name;
        const void** in;
        void** out;
      } slots[] = {{"q", &args.q, nullptr},   {"k", &args.k, nullptr},       {"v", &args.v, nullptr},
                   {"o", &args.o, nullptr},   {"dout", &args.dout, nullptr}, {"dq", nullptr, &args.dq},
                   {"dk", nullptr, &args.dk}, {"dv", nullptr, &args.dv}};
      for (const auto& sl : slots) {
        if (onto == sl.name) sl.in ? (void)(*sl.in = spot.target) : (void)(*sl.out = spot.target);
        if (out == sl.name) *sl.out = spot.output;
      }
      if (onto == "lse") args.lse = spot.target;
      expect_refused(
          a, [&] { return a.bwd(args); }, "args." + out, "args." + onto, spot.buf);
    }
  }
}

TEST_CASE("overlap: the workspace may not overlap any argument", "[overlap][fwd][bwd]") {
  Arena a(FLASHATTN_ALGORITHM_STANDARD);
  REQUIRE(a.ws_fwd > 0);
  const flashattn_fwd_args_t f = a.fwd_args();
  expect_refused(
      a, [&] { return flashattn_fwd(a.plan, &f, a.at("o"), a.ws_fwd, nullptr); }, "workspace", "args.o");
  expect_refused(
      a, [&] { return flashattn_fwd(a.plan, &f, a.at("q", 4), a.ws_fwd, nullptr); }, "workspace", "args.q");
  const flashattn_bwd_args_t b = a.bwd_args();
  expect_refused(
      a, [&] { return flashattn_bwd(a.plan, &b, a.at("dout"), a.ws_bwd, nullptr); }, "workspace", "args.dout");
}

TEST_CASE("overlap: dbias may not overlap the bias or the gradients", "[overlap][bwd]") {
  Arena a(FLASHATTN_ALGORITHM_FLASH, false, true);
  REQUIRE(a.bwd(a.bwd_args(true)) == FLASHATTN_STATUS_SUCCESS);
  flashattn_bwd_args_t args = a.bwd_args(true);
  args.dbias = a.at("bias", 4);
  expect_refused(
      a, [&] { return a.bwd(args); }, "args.dbias", "args.bias");
  args = a.bwd_args(true);
  args.dbias = a.at("dv");
  expect_refused(
      a, [&] { return a.bwd(args); }, "args.dbias", "args.dv");
}

TEST_CASE("overlap: varlen extents cover every packed token and the offsets", "[overlap][varlen]") {
  Arena a(FLASHATTN_ALGORITHM_FLASH, true);
  REQUIRE(a.bwd(a.bwd_args()) == FLASHATTN_STATUS_SUCCESS);
  // Token 6 of k is past cu_seqlens_k[batch] = 6 (no sequence reads it) but is part of k.
  flashattn_bwd_args_t args = a.bwd_args();
  args.dq = a.end("k") - kDqk;
  expect_refused(
      a, [&] { return a.bwd(args); }, "args.dq", "args.k");
  // dk covers every packed token too: the backward zeroes the uncovered one.
  args = a.bwd_args();
  args.dk = a.end("dq") - 4;
  expect_refused(
      a, [&] { return a.bwd(args); }, "args.dk", "args.dq");
  // The offsets themselves are inputs.
  args = a.bwd_args();
  args.dv = reinterpret_cast<float*>(a.cuk.data());
  expect_refused(
      a, [&] { return a.bwd(args); }, "args.dv", "args.cu_seqlens_k");
}

TEST_CASE("overlap: inputs may alias each other and buffers may touch", "[overlap][fwd][bwd]") {
  Arena a(FLASHATTN_ALGORITHM_FLASH);
  // k and v the same buffer (v's head dim is smaller, so it reads a prefix of each row's
  // stride... here both contiguous: v reads the first kSk*kDv floats of k).
  flashattn_fwd_args_t f = a.fwd_args();
  f.v = f.k;
  CHECK(a.fwd(f) == FLASHATTN_STATUS_SUCCESS);
  // o starting right after the last byte of q (no gap).
  std::vector<float> qo(static_cast<size_t>(a.t.at("q").floats + a.t.at("o").floats));
  memcpy(qo.data(), a.at("q"), static_cast<size_t>(a.t.at("q").floats) * sizeof(float));
  f = a.fwd_args();
  f.q = qo.data();
  f.o = qo.data() + a.t.at("q").floats;
  CHECK(a.fwd(f) == FLASHATTN_STATUS_SUCCESS);
  flashattn_bwd_args_t b = a.bwd_args();
  b.dk = a.end("dq");  // dk right after dq
  b.q = b.k;           // q reads k's bytes (inputs only)
  CHECK(a.bwd(b) == FLASHATTN_STATUS_SUCCESS);
}

// Q, K, V in one packed [B, S, 3, H, D] buffer and dQ, dK, dV in another: the byte ranges of
// the three gradients interleave but share no element, so the run is accepted, and gives
// the bits of the same problem with separate contiguous gradients.
TEST_CASE("overlap: dQ, dK, dV interleaved in one packed dQKV buffer", "[overlap][bwd]") {
  const int64_t b = 2, s = 6, h = 2, d = 8;
  const int64_t packed[4] = {s * 3 * h * d, 3 * h * d, d, 1};
  std::vector<float> qkv(static_cast<size_t>(b * s * 3 * h * d)), o(static_cast<size_t>(b * s * h * d)), dout(o.size()),
      lse(static_cast<size_t>(b * h * s));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (float& x : qkv) x = nd(rng);
  for (float& x : dout) x = nd(rng);
  // Returns the backward's status (its message in `message`); dk_shift moves dK by that many floats.
  std::string message;
  auto run = [&](bool packed_grads, int64_t dk_shift, std::vector<float>& grads) {
    flashattn_plan_t plan = nullptr;
    REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_shape(plan, b, s, s, h, h, d, d) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_dtype(plan, FLASHATTN_DTYPE_FP32) == FLASHATTN_STATUS_SUCCESS);
    for (flashattn_tensor_t t : {FLASHATTN_TENSOR_Q, FLASHATTN_TENSOR_K, FLASHATTN_TENSOR_V})
      REQUIRE(flashattn_plan_set_strides(plan, t, packed) == FLASHATTN_STATUS_SUCCESS);
    if (packed_grads)
      for (flashattn_tensor_t t : {FLASHATTN_TENSOR_DQ, FLASHATTN_TENSOR_DK, FLASHATTN_TENSOR_DV})
        REQUIRE(flashattn_plan_set_strides(plan, t, packed) == FLASHATTN_STATUS_SUCCESS);
    size_t wf = 0, wb = 0;
    REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &wf) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_BACKWARD, &wb) == FLASHATTN_STATUS_SUCCESS);
    std::vector<float> ws((std::max(wf, wb) + 3) / 4);
    flashattn_fwd_args_t f = FLASHATTN_FWD_ARGS_INIT;
    f.q = qkv.data();
    f.k = qkv.data() + h * d;
    f.v = qkv.data() + 2 * h * d;
    f.o = o.data();
    f.lse = lse.data();
    REQUIRE(flashattn_fwd(plan, &f, ws.data(), wf, nullptr) == FLASHATTN_STATUS_SUCCESS);
    grads.assign(qkv.size(), 0.f);
    const int64_t one = packed_grads ? h * d : b * s * h * d;  // offset between dQ, dK and dV
    flashattn_bwd_args_t a = FLASHATTN_BWD_ARGS_INIT;
    a.q = f.q;
    a.k = f.k;
    a.v = f.v;
    a.o = o.data();
    a.lse = lse.data();
    a.dout = dout.data();
    a.dq = grads.data();
    a.dk = grads.data() + one + dk_shift;
    a.dv = grads.data() + 2 * one;
    const flashattn_status_t st = flashattn_bwd(plan, &a, ws.data(), wb, nullptr);
    message = flashattn_last_error();
    flashattn_plan_destroy(plan);
    return st;
  };
  std::vector<float> packed_out, separate_out, clash;
  REQUIRE(run(true, 0, packed_out) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(run(false, 0, separate_out) == FLASHATTN_STATUS_SUCCESS);
  // The same layouts with dK one head earlier: its first head is dQ's second.
  CHECK(run(true, -d, clash) == FLASHATTN_STATUS_INVALID_ARGUMENT);
  INFO(message);
  CHECK(message.find("args.dk=") != std::string::npos);
  CHECK(message.find("args.dq=") != std::string::npos);
  CHECK(std::all_of(clash.begin(), clash.end(), [](float x) { return x == 0.f; }));
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t si = 0; si < s; ++si)
      for (int64_t g = 0; g < 3; ++g)
        for (int64_t e = 0; e < h * d; ++e) {
          const float x = packed_out[static_cast<size_t>(((bi * s + si) * 3 + g) * h * d + e)];
          const float y = separate_out[static_cast<size_t>(g * b * s * h * d + (bi * s + si) * h * d + e)];
          REQUIRE(memcmp(&x, &y, sizeof x) == 0);
        }
}

// Interleaved gradients that do share an element (dK one row of dQ off), or whose strides
// differ so that the library cannot tell, are refused.
TEST_CASE("overlap: interleaved outputs that share an element, or whose layouts differ", "[overlap][bwd]") {
  Arena a(FLASHATTN_ALGORITHM_FLASH);
  // dQ rows with a gap of one row after each; dK's rows sit in those gaps.
  const int64_t dq_strides[4] = {kSq * 2 * kHq * kDqk, 2 * kHq * kDqk, kDqk, 1};
  const int64_t dk_strides[4] = {kSk * 2 * kHq * kDqk, 2 * kHq * kDqk, kDqk, 1};
  REQUIRE(flashattn_plan_set_strides(a.plan, FLASHATTN_TENSOR_DQ, dq_strides) == FLASHATTN_STATUS_SUCCESS);
  std::vector<float> big(static_cast<size_t>(kB * kSk * 2 * kHq * kDqk + 64));
  flashattn_bwd_args_t args = a.bwd_args();
  args.dq = big.data();
  REQUIRE(a.bwd(args) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_strides(a.plan, FLASHATTN_TENSOR_DK, dk_strides) == FLASHATTN_STATUS_SUCCESS);
  auto refused = [&](float* dk, const char* why) {
    flashattn_bwd_args_t args = a.bwd_args();
    args.dq = big.data();
    args.dk = dk;
    const std::vector<float> before = big;
    const flashattn_status_t st = a.bwd(args);
    const std::string msg = flashattn_last_error();
    INFO(why << ": " << msg);
    CHECK(st == FLASHATTN_STATUS_INVALID_ARGUMENT);
    CHECK(msg.find("args.dk=") != std::string::npos);
    CHECK(msg.find("args.dq=") != std::string::npos);
    CHECK(memcmp(before.data(), big.data(), big.size() * sizeof(float)) == 0);
  };
  // dK's first row is dQ's second head.
  refused(big.data() + kDqk, "dk on dq's second head");
  // Every dK row inside a gap of dQ, but the batch strides differ: not provably disjoint.
  refused(big.data() + kHq * kDqk, "dk in the gaps of dq, other batch stride");
}

TEST_CASE("alignment: a CPU workspace must be 16-byte aligned", "[alignment][fwd][bwd]") {
  Arena a(FLASHATTN_ALGORITHM_STANDARD);
  REQUIRE(a.ws_fwd > 0);
  std::vector<float> ws((std::max(a.ws_fwd, a.ws_bwd) + 64) / 4);
  char* base = reinterpret_cast<char*>(ws.data());
  REQUIRE(reinterpret_cast<uintptr_t>(base) % 16 == 0);
  const flashattn_fwd_args_t f = a.fwd_args();
  const flashattn_bwd_args_t b = a.bwd_args();
  for (size_t off : {size_t(1), size_t(2), size_t(4), size_t(8)}) {
    const std::vector<float> before = a.mem;
    char addr[32];
    snprintf(addr, sizeof addr, "%p", static_cast<void*>(base + off));
    flashattn_status_t st = flashattn_fwd(a.plan, &f, base + off, a.ws_fwd, nullptr);
    std::string msg = flashattn_last_error();
    INFO("offset " << off << ": " << msg);
    CHECK(st == FLASHATTN_STATUS_MISALIGNED_POINTER);
    CHECK(msg.find("workspace=") != std::string::npos);
    CHECK(msg.find(addr) != std::string::npos);
    CHECK(msg.find("16") != std::string::npos);
    st = flashattn_bwd(a.plan, &b, base + off, a.ws_bwd, nullptr);
    CHECK(st == FLASHATTN_STATUS_MISALIGNED_POINTER);
    CHECK(memcmp(before.data(), a.mem.data(), before.size() * sizeof(float)) == 0);
  }
  CHECK(flashattn_fwd(a.plan, &f, base + 16, a.ws_fwd, nullptr) == FLASHATTN_STATUS_SUCCESS);
  CHECK(flashattn_bwd(a.plan, &b, base + 16, a.ws_bwd, nullptr) == FLASHATTN_STATUS_SUCCESS);
}
