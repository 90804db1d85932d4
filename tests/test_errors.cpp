// Every bad input gets its documented status, a message naming the argument, and changes
// nothing: setters leave the plan exactly as it was (checked by re-running the plan and
// comparing outputs bitwise), runs leave every output byte as it was (outputs are poisoned
// before the call), and out-parameters keep their values.
#include <math.h>
#include <stddef.h>
#include <string.h>

#include <cctype>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "harness.hpp"

using namespace fat;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

bool is_ident(char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; }

// Whether msg contains name as a whole identifier (so "q" does not match "seqlen_q").
bool mentions(const std::string& msg, const std::string& name) {
  for (size_t pos = msg.find(name); pos != std::string::npos; pos = msg.find(name, pos + 1)) {
    const bool left = pos == 0 || !is_ident(msg[pos - 1]);
    const bool right = pos + name.size() >= msg.size() || !is_ident(msg[pos + name.size()]);
    if (left && right) return true;
  }
  return false;
}

bool mentions_any(const std::string& msg, const std::vector<std::string>& names) {
  for (const std::string& n : names)
    if (mentions(msg, n)) return true;
  return false;
}

std::string status_name(flashattn_status_t s) { return flashattn_status_string(s); }

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : " | ") + x;
  return s;
}

// ---- setters ----------------------------------------------------------------------------
Config setter_config() {
  Config c;
  c.name = "setter fixture";
  c.batch = 2;
  c.sq = 9;
  c.sk = 11;
  c.hq = 4;
  c.hkv = 2;
  c.dqk = 16;
  c.dv = 8;
  c.dtype = FLASHATTN_DTYPE_FP32;
  c.layout = Layout::Mixed;
  c.scale = 0.3f;
  c.softcap = 4.f;
  c.band = true;
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wl = 5;
  c.wr = 0;
  c.bias = FLASHATTN_BIAS_ALIBI;
  c.p_drop = 0.2f;
  c.seed = 5;
  c.offset = 9;
  c.sparse = true;
  c.block_q = 4;
  c.block_k = 4;
  c.layout_heads = 4;
  c.density = 0.8;
  c.deterministic = true;
  c.data_seed = 77;
  return c;
}

struct SetterFixture {
  Problem p = make_problem(setter_config());
  flashattn_plan_t plan = nullptr;
  LibResult baseline;
  HostMem mem;
  SetterFixture() {
    REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(configure_plan(plan, p) == FLASHATTN_STATUS_SUCCESS);
    baseline = run_on_plan(plan, p, mem);
    REQUIRE(baseline.ok());
  }
  ~SetterFixture() { flashattn_plan_destroy(plan); }

  // The call must fail with `expected`, name one of `names`, and leave the plan unchanged.
  void expect(const std::string& what, flashattn_status_t expected, const std::vector<std::string>& names,
              const std::function<flashattn_status_t(flashattn_plan_t)>& call) {
    INFO("call: " << what);
    const flashattn_status_t st = call(plan);
    const std::string msg = flashattn_last_error();
    INFO("message: \"" << msg << "\", expected to name: " << join(names));
    CHECK(status_name(st) == status_name(expected));
    CHECK(mentions_any(msg, names));
    const LibResult now = run_on_plan(plan, p, mem);
    INFO("re-running the plan after the failed call: " << now.error);
    REQUIRE(now.ok());
    const bool unchanged = now.raw_o == baseline.raw_o && now.raw_lse == baseline.raw_lse &&
                           now.raw_dq == baseline.raw_dq && now.raw_dk == baseline.raw_dk &&
                           now.raw_dv == baseline.raw_dv;
    INFO("plan state unchanged (outputs bitwise equal to before)");
    CHECK(unchanged);
  }
};

}  // namespace

TEST_CASE("plan_create rejects bad arguments and leaves *plan untouched", "[errors][api]") {
  const flashattn_plan_t sentinel = reinterpret_cast<flashattn_plan_t>(static_cast<uintptr_t>(0xdead0));
  CHECK(status_name(flashattn_plan_create(nullptr, FLASHATTN_BACKEND_CPU, 0)) ==
        status_name(FLASHATTN_STATUS_NULL_POINTER));
  CHECK(mentions(flashattn_last_error(), "plan"));
  flashattn_plan_t plan = sentinel;
  CHECK(status_name(flashattn_plan_create(&plan, static_cast<flashattn_backend_t>(7), 0)) ==
        status_name(FLASHATTN_STATUS_INVALID_ENUM));
  CHECK(mentions(flashattn_last_error(), "backend"));
  CHECK(plan == sentinel);
  CHECK(status_name(flashattn_plan_create(&plan, static_cast<flashattn_backend_t>(-1), 0)) ==
        status_name(FLASHATTN_STATUS_INVALID_ENUM));
  CHECK(plan == sentinel);
  CHECK(status_name(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, -1)) ==
        status_name(FLASHATTN_STATUS_INVALID_VALUE));
  CHECK(mentions(flashattn_last_error(), "device"));
  CHECK(plan == sentinel);
}

TEST_CASE("plan_get_backend rejects NULL", "[errors][api]") {
  flashattn_backend_t b = static_cast<flashattn_backend_t>(55);
  CHECK(status_name(flashattn_plan_get_backend(nullptr, &b)) == status_name(FLASHATTN_STATUS_NULL_POINTER));
  CHECK(mentions(flashattn_last_error(), "plan"));
  CHECK(b == static_cast<flashattn_backend_t>(55));
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  CHECK(status_name(flashattn_plan_get_backend(plan, nullptr)) == status_name(FLASHATTN_STATUS_NULL_POINTER));
  CHECK(mentions(flashattn_last_error(), "backend"));
  flashattn_plan_destroy(plan);
}

TEST_CASE("every setter rejects a NULL plan", "[errors]") {
  const int64_t st[4] = {0, 0, 0, 1};
  const uint8_t layout[1] = {1};
  struct C {
    const char* what;
    flashattn_status_t st;
  };
  const C calls[] = {
      {"set_shape", flashattn_plan_set_shape(nullptr, 1, 1, 1, 1, 1, 8, 8)},
      {"set_dtype", flashattn_plan_set_dtype(nullptr, FLASHATTN_DTYPE_FP16)},
      {"set_strides", flashattn_plan_set_strides(nullptr, FLASHATTN_TENSOR_Q, st)},
      {"set_softmax_scale", flashattn_plan_set_softmax_scale(nullptr, 1.f)},
      {"set_algorithm", flashattn_plan_set_algorithm(nullptr, FLASHATTN_ALGORITHM_FLASH)},
      {"set_varlen", flashattn_plan_set_varlen(nullptr, 1, 1, 1)},
      {"set_deterministic", flashattn_plan_set_deterministic(nullptr, 1)},
      {"set_grad_accumulate", flashattn_plan_set_grad_accumulate(nullptr, 1)},
      {"set_band_mask", flashattn_plan_set_band_mask(nullptr, FLASHATTN_ALIGN_TOP_LEFT, -1, 0)},
      {"set_softcap", flashattn_plan_set_softcap(nullptr, 1.f)},
      {"set_bias", flashattn_plan_set_bias(nullptr, FLASHATTN_BIAS_NONE, nullptr)},
      {"set_alibi_batch_stride", flashattn_plan_set_alibi_batch_stride(nullptr, 4)},
      {"set_dropout", flashattn_plan_set_dropout(nullptr, 0.1f, 1, 2)},
      {"set_block_sparse", flashattn_plan_set_block_sparse(nullptr, layout, 1, 1, 1, 8, 8)},
  };
  for (const C& c : calls) {
    INFO(c.what);
    CHECK(status_name(c.st) == status_name(FLASHATTN_STATUS_NULL_POINTER));
  }
  // The message of the last one.
  CHECK(mentions(flashattn_last_error(), "plan"));
  size_t bytes = 77;
  CHECK(status_name(flashattn_plan_get_workspace_size(nullptr, FLASHATTN_PASS_FORWARD, &bytes)) ==
        status_name(FLASHATTN_STATUS_NULL_POINTER));
  CHECK(mentions(flashattn_last_error(), "plan"));
  CHECK(bytes == 77);
}

TEST_CASE("set_shape rejects bad dimensions and leaves the plan unchanged", "[errors]") {
  SetterFixture f;
  using S = flashattn_status_t;
  const S shape = FLASHATTN_STATUS_INVALID_SHAPE;
  f.expect("batch=0", shape, {"batch"},
           [](flashattn_plan_t p) { return flashattn_plan_set_shape(p, 0, 9, 11, 4, 2, 16, 8); });
  f.expect("batch=-3", shape, {"batch"},
           [](flashattn_plan_t p) { return flashattn_plan_set_shape(p, -3, 9, 11, 4, 2, 16, 8); });
  f.expect("seqlen_q=0", shape, {"seqlen_q"},
           [](flashattn_plan_t p) { return flashattn_plan_set_shape(p, 2, 0, 11, 4, 2, 16, 8); });
  f.expect("seqlen_k=-1", shape, {"seqlen_k"},
           [](flashattn_plan_t p) { return flashattn_plan_set_shape(p, 2, 9, -1, 4, 2, 16, 8); });
  f.expect("heads_q=0", shape, {"heads_q"},
           [](flashattn_plan_t p) { return flashattn_plan_set_shape(p, 2, 9, 11, 0, 2, 16, 8); });
  f.expect("heads_kv=0", shape, {"heads_kv"},
           [](flashattn_plan_t p) { return flashattn_plan_set_shape(p, 2, 9, 11, 4, 0, 16, 8); });
  f.expect("heads_kv=-2", shape, {"heads_kv"},
           [](flashattn_plan_t p) { return flashattn_plan_set_shape(p, 2, 9, 11, 4, -2, 16, 8); });
  f.expect("head_dim_qk=0", shape, {"head_dim_qk"},
           [](flashattn_plan_t p) { return flashattn_plan_set_shape(p, 2, 9, 11, 4, 2, 0, 8); });
  f.expect("head_dim_qk=257", shape, {"head_dim_qk"}, [](flashattn_plan_t p) {
    return flashattn_plan_set_shape(p, 2, 9, 11, 4, 2, FLASHATTN_MAX_HEAD_DIM + 1, 8);
  });
  f.expect("head_dim_v=-8", shape, {"head_dim_v"},
           [](flashattn_plan_t p) { return flashattn_plan_set_shape(p, 2, 9, 11, 4, 2, 16, -8); });
  f.expect("head_dim_v=1000", shape, {"head_dim_v"},
           [](flashattn_plan_t p) { return flashattn_plan_set_shape(p, 2, 9, 11, 4, 2, 16, 1000); });
  f.expect("heads_q=6 heads_kv=4", FLASHATTN_STATUS_INVALID_HEADS, {"heads_q", "heads_kv"},
           [](flashattn_plan_t p) { return flashattn_plan_set_shape(p, 2, 9, 11, 6, 4, 16, 8); });
  f.expect("heads_q=2 heads_kv=4", FLASHATTN_STATUS_INVALID_HEADS, {"heads_q", "heads_kv"},
           [](flashattn_plan_t p) { return flashattn_plan_set_shape(p, 2, 9, 11, 2, 4, 16, 8); });
  // The fixture has a 4x4 block-sparse layout for 9x11: a new seqlen_q needs more row blocks.
  f.expect("shape that the block-sparse layout does not fit", FLASHATTN_STATUS_INVALID_LAYOUT,
           {"layout", "seqlen_q", "num_row_blocks", "block_q"},
           [](flashattn_plan_t p) { return flashattn_plan_set_shape(p, 2, 30, 11, 4, 2, 16, 8); });
}

TEST_CASE("set_dtype set_algorithm set_band_mask set_bias reject unknown enum values", "[errors]") {
  SetterFixture f;
  const flashattn_status_t e = FLASHATTN_STATUS_INVALID_ENUM;
  f.expect("dtype=9", e, {"dtype"},
           [](flashattn_plan_t p) { return flashattn_plan_set_dtype(p, static_cast<flashattn_dtype_t>(9)); });
  f.expect("dtype=-1", e, {"dtype"},
           [](flashattn_plan_t p) { return flashattn_plan_set_dtype(p, static_cast<flashattn_dtype_t>(-1)); });
  f.expect("algorithm=4", e, {"algorithm"},
           [](flashattn_plan_t p) { return flashattn_plan_set_algorithm(p, static_cast<flashattn_algorithm_t>(4)); });
  f.expect("align=5", e, {"align"}, [](flashattn_plan_t p) {
    return flashattn_plan_set_band_mask(p, static_cast<flashattn_mask_align_t>(5), -1, 0);
  });
  f.expect("bias kind=9", e, {"kind", "bias"},
           [](flashattn_plan_t p) { return flashattn_plan_set_bias(p, static_cast<flashattn_bias_t>(9), nullptr); });
  f.expect("dtype=MAX_ENUM", e, {"dtype"},
           [](flashattn_plan_t p) { return flashattn_plan_set_dtype(p, FLASHATTN_DTYPE_MAX_ENUM); });
  f.expect("algorithm=MAX_ENUM", e, {"algorithm"},
           [](flashattn_plan_t p) { return flashattn_plan_set_algorithm(p, FLASHATTN_ALGORITHM_MAX_ENUM); });
  f.expect("align=MAX_ENUM", e, {"align"},
           [](flashattn_plan_t p) { return flashattn_plan_set_band_mask(p, FLASHATTN_ALIGN_MAX_ENUM, -1, 0); });
  f.expect("bias kind=MAX_ENUM", e, {"kind", "bias"},
           [](flashattn_plan_t p) { return flashattn_plan_set_bias(p, FLASHATTN_BIAS_MAX_ENUM, nullptr); });
  f.expect("tensor=MAX_ENUM", e, {"tensor"}, [](flashattn_plan_t p) {
    const int64_t st[4] = {100, 10, 1000, 1};
    return flashattn_plan_set_strides(p, FLASHATTN_TENSOR_MAX_ENUM, st);
  });
  f.expect("tensor=42", e, {"tensor"}, [](flashattn_plan_t p) {
    const int64_t st[4] = {100, 10, 1000, 1};
    return flashattn_plan_set_strides(p, static_cast<flashattn_tensor_t>(42), st);
  });
}

TEST_CASE("scalar setters reject out-of-range values", "[errors]") {
  SetterFixture f;
  const flashattn_status_t v = FLASHATTN_STATUS_INVALID_VALUE;
  for (float s : {-1.f, -0.5f, kNaN, kInf, -kInf}) {
    f.expect("scale=" + std::to_string(s), v, {"scale", "softmax_scale"},
             [s](flashattn_plan_t p) { return flashattn_plan_set_softmax_scale(p, s); });
    f.expect("softcap=" + std::to_string(s), v, {"softcap"},
             [s](flashattn_plan_t p) { return flashattn_plan_set_softcap(p, s); });
  }
  for (float pd : {-0.1f, 1.0f, 1.5f, kNaN, kInf, -kInf})
    f.expect("dropout p=" + std::to_string(pd), v, {"p", "dropout", "dropout_p"},
             [pd](flashattn_plan_t p) { return flashattn_plan_set_dropout(p, pd, 1, 2); });
  f.expect("varlen total_q=-1", FLASHATTN_STATUS_INVALID_SHAPE, {"total_q"},
           [](flashattn_plan_t p) { return flashattn_plan_set_varlen(p, 1, -1, 5); });
  f.expect("varlen total_k=-7", FLASHATTN_STATUS_INVALID_SHAPE, {"total_k"},
           [](flashattn_plan_t p) { return flashattn_plan_set_varlen(p, 1, 5, -7); });
}

TEST_CASE("set_strides rejects bad strides", "[errors]") {
  SetterFixture f;
  const flashattn_status_t s = FLASHATTN_STATUS_INVALID_STRIDE;
  const std::vector<std::string> names = {"strides", "stride"};
  f.expect("strides=NULL", FLASHATTN_STATUS_NULL_POINTER, {"strides"},
           [](flashattn_plan_t p) { return flashattn_plan_set_strides(p, FLASHATTN_TENSOR_K, nullptr); });
  for (int t = 0; t < 8; ++t) {
    const flashattn_tensor_t tensor = static_cast<flashattn_tensor_t>(t);
    f.expect("negative batch stride, tensor " + std::to_string(t), s, names, [tensor](flashattn_plan_t p) {
      const int64_t st[4] = {-1000, 64, 16, 1};
      return flashattn_plan_set_strides(p, tensor, st);
    });
    f.expect("negative seq stride, tensor " + std::to_string(t), s, names, [tensor](flashattn_plan_t p) {
      const int64_t st[4] = {1000, -64, 16, 1};
      return flashattn_plan_set_strides(p, tensor, st);
    });
    f.expect("dim stride 2, tensor " + std::to_string(t), s, names, [tensor](flashattn_plan_t p) {
      const int64_t st[4] = {4000, 256, 32, 2};
      return flashattn_plan_set_strides(p, tensor, st);
    });
    f.expect("dim stride 0, tensor " + std::to_string(t), s, names, [tensor](flashattn_plan_t p) {
      const int64_t st[4] = {4000, 256, 32, 0};
      return flashattn_plan_set_strides(p, tensor, st);
    });
  }
}

TEST_CASE("set_bias rejects bad strides and argument mixes", "[errors]") {
  SetterFixture f;
  f.expect("TENSOR without strides", FLASHATTN_STATUS_NULL_POINTER, {"strides"},
           [](flashattn_plan_t p) { return flashattn_plan_set_bias(p, FLASHATTN_BIAS_TENSOR, nullptr); });
  f.expect("TENSOR with k stride 2", FLASHATTN_STATUS_INVALID_STRIDE, {"strides", "stride"}, [](flashattn_plan_t p) {
    const int64_t st[4] = {1000, 200, 22, 2};
    return flashattn_plan_set_bias(p, FLASHATTN_BIAS_TENSOR, st);
  });
  f.expect("TENSOR with a negative stride", FLASHATTN_STATUS_INVALID_STRIDE, {"strides", "stride"},
           [](flashattn_plan_t p) {
             const int64_t st[4] = {1000, -200, 11, 1};
             return flashattn_plan_set_bias(p, FLASHATTN_BIAS_TENSOR, st);
           });
  for (auto kind : {FLASHATTN_BIAS_NONE, FLASHATTN_BIAS_ALIBI, FLASHATTN_BIAS_ALIBI_SYMMETRIC})
    f.expect("strides for a kind that takes none (" + std::to_string(kind) + ")", FLASHATTN_STATUS_INVALID_ARGUMENT,
             {"strides"}, [kind](flashattn_plan_t p) {
               const int64_t st[4] = {0, 0, 11, 1};
               return flashattn_plan_set_bias(p, kind, st);
             });
}

TEST_CASE("set_alibi_batch_stride rejects bad strides and plans without ALiBi", "[errors]") {
  SetterFixture f;  // ALiBi, batch 2, heads_q 4
  f.expect("batch_stride=-1", FLASHATTN_STATUS_INVALID_STRIDE, {"batch_stride"},
           [](flashattn_plan_t p) { return flashattn_plan_set_alibi_batch_stride(p, -1); });
  f.expect("batch_stride=INT64_MIN", FLASHATTN_STATUS_INVALID_STRIDE, {"batch_stride"}, [](flashattn_plan_t p) {
    return flashattn_plan_set_alibi_batch_stride(p, std::numeric_limits<int64_t>::min());
  });
  f.expect("batch_stride=2^62 (the slopes would span more than 2^63-1 bytes)", FLASHATTN_STATUS_INVALID_STRIDE,
           {"batch_stride"},
           [](flashattn_plan_t p) { return flashattn_plan_set_alibi_batch_stride(p, int64_t{1} << 62); });
  for (auto kind : {FLASHATTN_BIAS_NONE, FLASHATTN_BIAS_TENSOR}) {
    INFO("bias kind " << kind);
    flashattn_plan_t plan = nullptr;
    REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_shape(plan, 2, 9, 11, 4, 2, 16, 8) == FLASHATTN_STATUS_SUCCESS);
    const int64_t st[4] = {0, 0, 11, 1};
    REQUIRE(flashattn_plan_set_bias(plan, kind, kind == FLASHATTN_BIAS_TENSOR ? st : nullptr) ==
            FLASHATTN_STATUS_SUCCESS);
    CHECK(status_name(flashattn_plan_set_alibi_batch_stride(plan, 4)) ==
          status_name(FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS));
    CHECK(mentions(flashattn_last_error(), "batch_stride"));
    flashattn_plan_destroy(plan);
  }
}

TEST_CASE("set_shape rejects a shape under which the ALiBi batch stride overflows", "[errors]") {
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_shape(plan, 2, 9, 11, 4, 2, 16, 8) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_bias(plan, FLASHATTN_BIAS_ALIBI, nullptr) == FLASHATTN_STATUS_SUCCESS);
  // (2 - 1) * 2^60 + 4 floats fit in 2^63-1 bytes; (3 - 1) * 2^60 floats do not.
  REQUIRE(flashattn_plan_set_alibi_batch_stride(plan, int64_t{1} << 60) == FLASHATTN_STATUS_SUCCESS);
  CHECK(status_name(flashattn_plan_set_shape(plan, 3, 9, 11, 4, 2, 16, 8)) ==
        status_name(FLASHATTN_STATUS_INVALID_STRIDE));
  CHECK(mentions(flashattn_last_error(), "batch_stride"));
  CHECK(flashattn_plan_set_shape(plan, 2, 9, 11, 4, 2, 16, 16) == FLASHATTN_STATUS_SUCCESS);
  flashattn_plan_destroy(plan);
}

TEST_CASE("set_block_sparse rejects layouts of the wrong size", "[errors]") {
  SetterFixture f;  // seqlen 9 x 11, heads_q 4
  const flashattn_status_t L = FLASHATTN_STATUS_INVALID_LAYOUT;
  static const std::vector<uint8_t> layout(4 * 9 * 11 * 4, 1);
  const uint8_t* lp = layout.data();
  f.expect("layout_heads=3", L, {"layout_heads"},
           [lp](flashattn_plan_t p) { return flashattn_plan_set_block_sparse(p, lp, 3, 3, 3, 4, 4); });
  f.expect("layout_heads=0", L, {"layout_heads"},
           [lp](flashattn_plan_t p) { return flashattn_plan_set_block_sparse(p, lp, 0, 3, 3, 4, 4); });
  f.expect("layout_heads=8", L, {"layout_heads"},
           [lp](flashattn_plan_t p) { return flashattn_plan_set_block_sparse(p, lp, 8, 3, 3, 4, 4); });
  f.expect("num_row_blocks=4 (ceil(9/4)=3)", L, {"num_row_blocks"},
           [lp](flashattn_plan_t p) { return flashattn_plan_set_block_sparse(p, lp, 1, 4, 3, 4, 4); });
  f.expect("num_col_blocks=2 (ceil(11/4)=3)", L, {"num_col_blocks"},
           [lp](flashattn_plan_t p) { return flashattn_plan_set_block_sparse(p, lp, 1, 3, 2, 4, 4); });
  f.expect("block_q=0", L, {"block_q"},
           [lp](flashattn_plan_t p) { return flashattn_plan_set_block_sparse(p, lp, 1, 3, 3, 0, 4); });
  f.expect("block_k=0", L, {"block_k"},
           [lp](flashattn_plan_t p) { return flashattn_plan_set_block_sparse(p, lp, 1, 3, 3, 4, 0); });
  f.expect("block_q=-4", L, {"block_q"},
           [lp](flashattn_plan_t p) { return flashattn_plan_set_block_sparse(p, lp, 1, 3, 3, -4, 4); });
}

TEST_CASE("workspace query rejects bad arguments and leaves *bytes untouched", "[errors]") {
  SetterFixture f;
  size_t bytes = 4242;
  CHECK(status_name(flashattn_plan_get_workspace_size(f.plan, static_cast<flashattn_pass_t>(3), &bytes)) ==
        status_name(FLASHATTN_STATUS_INVALID_ENUM));
  CHECK(mentions(flashattn_last_error(), "pass"));
  CHECK(bytes == 4242);
  CHECK(status_name(flashattn_plan_get_workspace_size(f.plan, FLASHATTN_PASS_FORWARD, nullptr)) ==
        status_name(FLASHATTN_STATUS_NULL_POINTER));
  CHECK(mentions(flashattn_last_error(), "bytes"));
  flashattn_plan_t fresh = nullptr;
  REQUIRE(flashattn_plan_create(&fresh, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  CHECK(status_name(flashattn_plan_get_workspace_size(fresh, FLASHATTN_PASS_BACKWARD, &bytes)) ==
        status_name(FLASHATTN_STATUS_PLAN_INCOMPLETE));
  CHECK(mentions_any(flashattn_last_error(), {"shape", "plan", "set_shape", "flashattn_plan_set_shape"}));
  CHECK(bytes == 4242);
  flashattn_plan_destroy(fresh);
}

TEST_CASE("setters that need a shape report PLAN_INCOMPLETE", "[errors]") {
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  const int64_t st[4] = {64, 16, 8, 1};
  CHECK(status_name(flashattn_plan_set_strides(plan, FLASHATTN_TENSOR_Q, st)) ==
        status_name(FLASHATTN_STATUS_PLAN_INCOMPLETE));
  CHECK(mentions_any(flashattn_last_error(), {"shape", "plan", "set_shape", "flashattn_plan_set_shape"}));
  const uint8_t layout[1] = {1};
  CHECK(status_name(flashattn_plan_set_block_sparse(plan, layout, 1, 1, 1, 8, 8)) ==
        status_name(FLASHATTN_STATUS_PLAN_INCOMPLETE));
  CHECK(mentions_any(flashattn_last_error(), {"shape", "plan", "set_shape", "flashattn_plan_set_shape"}));
  flashattn_plan_destroy(plan);
}

// ---- runs -----------------------------------------------------------------------------------
namespace {

// Host buffers for one plan, with poisoning and the untouched check.
struct RunFixture {
  Config c;
  Problem p;
  flashattn_plan_t plan = nullptr;
  size_t es;
  std::vector<unsigned char> q, k, v, o, lse, bias, dout, dq, dk, dv, dbias, ws;
  std::vector<float> slopes;
  std::vector<int32_t> cuq, cuk;
  size_t ws_fwd = 0, ws_bwd = 0;

  explicit RunFixture(const Config& cfg) : c(cfg), p(make_problem(cfg)) {
    es = dtype_size(c.dtype);
    REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(configure_plan(plan, p) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &ws_fwd) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_BACKWARD, &ws_bwd) == FLASHATTN_STATUS_SUCCESS);
    const size_t tq = static_cast<size_t>(p.spec.total_q()), tk = static_cast<size_t>(p.spec.total_k());
    auto fill = [&](std::vector<unsigned char>& b, const std::vector<double>& x) {
      b.resize(x.size() * es + 64);  // slack so a misaligned pointer stays in bounds
      for (size_t n = 0; n < x.size(); ++n) store_elem(c.dtype, &b[n * es], x[n]);
    };
    fill(q, p.in.q);
    fill(k, p.in.k);
    fill(v, p.in.v);
    fill(dout, p.in.dout);
    o.resize(tq * c.hq * c.dv * es + 64);
    lse.resize(tq * c.hq * 4 + 64);
    dq.resize(q.size());
    dk.resize(k.size());
    dv.resize(v.size());
    if (c.bias == FLASHATTN_BIAS_TENSOR) {
      bias.assign(p.bias_elems * es + 64, 0);
      dbias.resize(bias.size());
    } else {
      dbias.resize(static_cast<size_t>(c.batch * c.hq * c.sq * c.sk) * es + 64);
    }
    slopes.assign(p.slopes.begin(), p.slopes.end());
    cuq = p.cu_q;
    cuk = p.cu_k;
    ws.resize(std::max(ws_fwd, ws_bwd) + 64);
    (void)tk;
  }
  ~RunFixture() { flashattn_plan_destroy(plan); }

  flashattn_fwd_args_t fwd_args() {
    flashattn_fwd_args_t a = FLASHATTN_FWD_ARGS_INIT;
    a.q = q.data();
    a.k = k.data();
    a.v = v.data();
    a.o = o.data();
    a.lse = reinterpret_cast<float*>(lse.data());
    if (c.bias == FLASHATTN_BIAS_TENSOR) a.bias = bias.data();
    if (!slopes.empty()) a.alibi_slopes = slopes.data();
    if (p.varlen) {
      a.cu_seqlens_q = cuq.data();
      a.cu_seqlens_k = cuk.data();
    }
    return a;
  }
  flashattn_bwd_args_t bwd_args() {
    flashattn_bwd_args_t a = FLASHATTN_BWD_ARGS_INIT;
    a.q = q.data();
    a.k = k.data();
    a.v = v.data();
    a.o = o.data();
    a.lse = reinterpret_cast<const float*>(lse.data());
    a.dout = dout.data();
    a.dq = dq.data();
    a.dk = dk.data();
    a.dv = dv.data();
    if (c.bias == FLASHATTN_BIAS_TENSOR) {
      a.bias = bias.data();
      a.dbias = dbias.data();
    }
    if (!slopes.empty()) a.alibi_slopes = slopes.data();
    if (p.varlen) {
      a.cu_seqlens_q = cuq.data();
      a.cu_seqlens_k = cuk.data();
    }
    return a;
  }
  // Runs a valid forward so O and LSE hold real values for the backward.
  void forward_ok() {
    flashattn_fwd_args_t a = fwd_args();
    REQUIRE(flashattn_fwd(plan, &a, ws.data(), ws.size(), nullptr) == FLASHATTN_STATUS_SUCCESS);
  }
  void poison_fwd_outputs() {
    std::fill(o.begin(), o.end(), kPoison);
    std::fill(lse.begin(), lse.end(), kPoison);
  }
  void poison_bwd_outputs() {
    for (auto* b : {&dq, &dk, &dv, &dbias}) std::fill(b->begin(), b->end(), kPoison);
  }
  static bool all_poison(const std::vector<unsigned char>& b) {
    for (unsigned char x : b)
      if (x != kPoison) return false;
    return true;
  }
  bool fwd_outputs_untouched() const { return all_poison(o) && all_poison(lse); }
  bool bwd_outputs_untouched() const { return all_poison(dq) && all_poison(dk) && all_poison(dv) && all_poison(dbias); }

  void expect_fwd(const std::string& what, flashattn_status_t expected, const std::vector<std::string>& names,
                  const std::function<flashattn_status_t(RunFixture&, flashattn_fwd_args_t&)>& call) {
    INFO("forward: " << what << " [" << describe(p.cfg) << "]");
    flashattn_fwd_args_t a = fwd_args();
    poison_fwd_outputs();
    const flashattn_status_t st = call(*this, a);
    const std::string msg = flashattn_last_error();
    INFO("message: \"" << msg << "\", expected to name: " << join(names));
    CHECK(status_name(st) == status_name(expected));
    CHECK(mentions_any(msg, names));
    CHECK(fwd_outputs_untouched());
  }
  void expect_bwd(const std::string& what, flashattn_status_t expected, const std::vector<std::string>& names,
                  const std::function<flashattn_status_t(RunFixture&, flashattn_bwd_args_t&)>& call) {
    INFO("backward: " << what << " [" << describe(p.cfg) << "]");
    forward_ok();
    flashattn_bwd_args_t a = bwd_args();
    poison_bwd_outputs();
    const std::vector<unsigned char> o_before = o, lse_before = lse;
    const flashattn_status_t st = call(*this, a);
    const std::string msg = flashattn_last_error();
    INFO("message: \"" << msg << "\", expected to name: " << join(names));
    CHECK(status_name(st) == status_name(expected));
    CHECK(mentions_any(msg, names));
    CHECK(bwd_outputs_untouched());
    CHECK(o == o_before);
    CHECK(lse == lse_before);
  }
  flashattn_status_t fwd(flashattn_fwd_args_t& a) { return flashattn_fwd(plan, &a, ws.data(), ws.size(), nullptr); }
  flashattn_status_t bwd(flashattn_bwd_args_t& a) { return flashattn_bwd(plan, &a, ws.data(), ws.size(), nullptr); }
};

Config run_config() {
  Config c;
  c.name = "run fixture";
  c.batch = 2;
  c.sq = 9;
  c.sk = 11;
  c.hq = 4;
  c.hkv = 2;
  c.dqk = 16;
  c.dv = 8;
  c.dtype = FLASHATTN_DTYPE_FP16;
  c.band = true;
  c.wr = 0;
  c.bias = FLASHATTN_BIAS_TENSOR;
  c.bias_bcast[0] = true;
  c.data_seed = 99;
  return c;
}

using FwdCall = std::function<flashattn_status_t(RunFixture&, flashattn_fwd_args_t&)>;
using BwdCall = std::function<flashattn_status_t(RunFixture&, flashattn_bwd_args_t&)>;

}  // namespace

TEST_CASE("the run fixture itself succeeds (so failures below are due to the one bad input)", "[errors]") {
  RunFixture f(run_config());
  flashattn_fwd_args_t a = f.fwd_args();
  f.poison_fwd_outputs();
  CHECK(f.fwd(a) == FLASHATTN_STATUS_SUCCESS);
  CHECK(std::string(flashattn_last_error()) == "");
  CHECK_FALSE(f.fwd_outputs_untouched());
  flashattn_bwd_args_t b = f.bwd_args();
  f.poison_bwd_outputs();
  CHECK(f.bwd(b) == FLASHATTN_STATUS_SUCCESS);
  CHECK_FALSE(RunFixture::all_poison(f.dq));
  CHECK_FALSE(RunFixture::all_poison(f.dbias));
}

TEST_CASE("forward rejects NULL and missing pointers and writes nothing", "[errors][fwd]") {
  RunFixture f(run_config());
  const flashattn_status_t N = FLASHATTN_STATUS_NULL_POINTER;
  f.expect_fwd("plan=NULL", N, {"plan"}, [](RunFixture& x, flashattn_fwd_args_t& a) {
    return flashattn_fwd(nullptr, &a, x.ws.data(), x.ws.size(), nullptr);
  });
  f.expect_fwd("args=NULL", N, {"args"}, [](RunFixture& x, flashattn_fwd_args_t&) {
    return flashattn_fwd(x.plan, nullptr, x.ws.data(), x.ws.size(), nullptr);
  });
  f.expect_fwd("q=NULL", N, {"q"}, [](RunFixture& x, flashattn_fwd_args_t& a) {
    a.q = nullptr;
    return x.fwd(a);
  });
  f.expect_fwd("k=NULL", N, {"k"}, [](RunFixture& x, flashattn_fwd_args_t& a) {
    a.k = nullptr;
    return x.fwd(a);
  });
  f.expect_fwd("v=NULL", N, {"v"}, [](RunFixture& x, flashattn_fwd_args_t& a) {
    a.v = nullptr;
    return x.fwd(a);
  });
  f.expect_fwd("o=NULL", N, {"o"}, [](RunFixture& x, flashattn_fwd_args_t& a) {
    a.o = nullptr;
    return x.fwd(a);
  });
  f.expect_fwd("bias=NULL with a bias tensor", N, {"bias"}, [](RunFixture& x, flashattn_fwd_args_t& a) {
    a.bias = nullptr;
    return x.fwd(a);
  });
}

TEST_CASE("backward rejects NULL and missing pointers and writes nothing", "[errors][bwd]") {
  RunFixture f(run_config());
  const flashattn_status_t N = FLASHATTN_STATUS_NULL_POINTER;
  f.expect_bwd("plan=NULL", N, {"plan"}, [](RunFixture& x, flashattn_bwd_args_t& a) {
    return flashattn_bwd(nullptr, &a, x.ws.data(), x.ws.size(), nullptr);
  });
  f.expect_bwd("args=NULL", N, {"args"}, [](RunFixture& x, flashattn_bwd_args_t&) {
    return flashattn_bwd(x.plan, nullptr, x.ws.data(), x.ws.size(), nullptr);
  });
  f.expect_bwd("q=NULL", N, {"q"}, [](RunFixture& x, flashattn_bwd_args_t& a) {
    a.q = nullptr;
    return x.bwd(a);
  });
  f.expect_bwd("k=NULL", N, {"k"}, [](RunFixture& x, flashattn_bwd_args_t& a) {
    a.k = nullptr;
    return x.bwd(a);
  });
  f.expect_bwd("v=NULL", N, {"v"}, [](RunFixture& x, flashattn_bwd_args_t& a) {
    a.v = nullptr;
    return x.bwd(a);
  });
  f.expect_bwd("o=NULL", N, {"o"}, [](RunFixture& x, flashattn_bwd_args_t& a) {
    a.o = nullptr;
    return x.bwd(a);
  });
  f.expect_bwd("lse=NULL", N, {"lse"}, [](RunFixture& x, flashattn_bwd_args_t& a) {
    a.lse = nullptr;
    return x.bwd(a);
  });
  f.expect_bwd("dout=NULL", N, {"dout"}, [](RunFixture& x, flashattn_bwd_args_t& a) {
    a.dout = nullptr;
    return x.bwd(a);
  });
  f.expect_bwd("dq=NULL", N, {"dq"}, [](RunFixture& x, flashattn_bwd_args_t& a) {
    a.dq = nullptr;
    return x.bwd(a);
  });
  f.expect_bwd("dk=NULL", N, {"dk"}, [](RunFixture& x, flashattn_bwd_args_t& a) {
    a.dk = nullptr;
    return x.bwd(a);
  });
  f.expect_bwd("dv=NULL", N, {"dv"}, [](RunFixture& x, flashattn_bwd_args_t& a) {
    a.dv = nullptr;
    return x.bwd(a);
  });
  f.expect_bwd("bias=NULL with a bias tensor", N, {"bias"}, [](RunFixture& x, flashattn_bwd_args_t& a) {
    a.bias = nullptr;
    return x.bwd(a);
  });
}

TEST_CASE("runs reject struct_size too small", "[errors][fwd][bwd]") {
  RunFixture f(run_config());
  const flashattn_status_t S = FLASHATTN_STATUS_INVALID_STRUCT_SIZE;
  f.expect_fwd("struct_size=0", S, {"struct_size"}, [](RunFixture& x, flashattn_fwd_args_t& a) {
    a.struct_size = 0;
    return x.fwd(a);
  });
  f.expect_fwd("struct_size=4", S, {"struct_size"}, [](RunFixture& x, flashattn_fwd_args_t& a) {
    a.struct_size = 4;
    return x.fwd(a);
  });
  f.expect_fwd("struct_size without o", S, {"struct_size"}, [](RunFixture& x, flashattn_fwd_args_t& a) {
    a.struct_size = offsetof(flashattn_fwd_args_t, o);
    return x.fwd(a);
  });
  f.expect_bwd("struct_size=0", S, {"struct_size"}, [](RunFixture& x, flashattn_bwd_args_t& a) {
    a.struct_size = 0;
    return x.bwd(a);
  });
  f.expect_bwd("struct_size without dv", S, {"struct_size"}, [](RunFixture& x, flashattn_bwd_args_t& a) {
    a.struct_size = offsetof(flashattn_bwd_args_t, dv);
    return x.bwd(a);
  });
}

TEST_CASE("runs reject a stream on the CPU backend", "[errors][fwd][bwd]") {
  RunFixture f(run_config());
  struct CUstream_st* fake = reinterpret_cast<struct CUstream_st*>(static_cast<uintptr_t>(0x1000));
  f.expect_fwd("stream non-NULL", FLASHATTN_STATUS_INVALID_ARGUMENT, {"stream"},
               [fake](RunFixture& x, flashattn_fwd_args_t& a) {
                 return flashattn_fwd(x.plan, &a, x.ws.data(), x.ws.size(), fake);
               });
  f.expect_bwd("stream non-NULL", FLASHATTN_STATUS_INVALID_ARGUMENT, {"stream"},
               [fake](RunFixture& x, flashattn_bwd_args_t& a) {
                 return flashattn_bwd(x.plan, &a, x.ws.data(), x.ws.size(), fake);
               });
}

TEST_CASE("runs reject misaligned tensor pointers", "[errors][fwd][bwd]") {
  RunFixture f(run_config());  // fp16: 2-byte elements
  const flashattn_status_t M = FLASHATTN_STATUS_MISALIGNED_POINTER;
  f.expect_fwd("q misaligned", M, {"q"}, [](RunFixture& x, flashattn_fwd_args_t& a) {
    a.q = x.q.data() + 1;
    return x.fwd(a);
  });
  f.expect_fwd("o misaligned", M, {"o"}, [](RunFixture& x, flashattn_fwd_args_t& a) {
    a.o = x.o.data() + 1;
    return x.fwd(a);
  });
  f.expect_bwd("dk misaligned", M, {"dk"}, [](RunFixture& x, flashattn_bwd_args_t& a) {
    a.dk = x.dk.data() + 1;
    return x.bwd(a);
  });
  f.expect_bwd("lse misaligned", M, {"lse"}, [](RunFixture& x, flashattn_bwd_args_t& a) {
    a.lse = reinterpret_cast<const float*>(x.lse.data() + 2);
    return x.bwd(a);
  });
}

TEST_CASE("runs without a shape report PLAN_INCOMPLETE", "[errors][fwd][bwd]") {
  RunFixture f(run_config());
  flashattn_plan_t fresh = nullptr;
  REQUIRE(flashattn_plan_create(&fresh, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  const std::vector<std::string> names = {"shape", "plan", "set_shape", "flashattn_plan_set_shape"};
  f.expect_fwd("fresh plan", FLASHATTN_STATUS_PLAN_INCOMPLETE, names, [fresh](RunFixture& x, flashattn_fwd_args_t& a) {
    return flashattn_fwd(fresh, &a, x.ws.data(), x.ws.size(), nullptr);
  });
  f.expect_bwd("fresh plan", FLASHATTN_STATUS_PLAN_INCOMPLETE, names, [fresh](RunFixture& x, flashattn_bwd_args_t& a) {
    return flashattn_bwd(fresh, &a, x.ws.data(), x.ws.size(), nullptr);
  });
  flashattn_plan_destroy(fresh);
}

TEST_CASE("runs reject a NULL or too small workspace", "[errors][fwd][bwd]") {
  Config c = run_config();
  c.algorithm = FLASHATTN_ALGORITHM_STANDARD;  // materializes S and P: needs a workspace
  RunFixture f(c);
  REQUIRE(f.ws_fwd > 0);
  REQUIRE(f.ws_bwd > 0);
  const flashattn_status_t W = FLASHATTN_STATUS_WORKSPACE_TOO_SMALL;
  const std::vector<std::string> names = {"workspace", "workspace_bytes"};
  f.expect_fwd("workspace=NULL", W, names, [](RunFixture& x, flashattn_fwd_args_t& a) {
    return flashattn_fwd(x.plan, &a, nullptr, x.ws_fwd, nullptr);
  });
  f.expect_fwd("workspace one byte short", W, names, [](RunFixture& x, flashattn_fwd_args_t& a) {
    return flashattn_fwd(x.plan, &a, x.ws.data(), x.ws_fwd - 1, nullptr);
  });
  f.expect_fwd("workspace_bytes=0", W, names, [](RunFixture& x, flashattn_fwd_args_t& a) {
    return flashattn_fwd(x.plan, &a, x.ws.data(), 0, nullptr);
  });
  f.expect_bwd("workspace=NULL", W, names, [](RunFixture& x, flashattn_bwd_args_t& a) {
    return flashattn_bwd(x.plan, &a, nullptr, x.ws_bwd, nullptr);
  });
  f.expect_bwd("workspace one byte short", W, names, [](RunFixture& x, flashattn_bwd_args_t& a) {
    return flashattn_bwd(x.plan, &a, x.ws.data(), x.ws_bwd - 1, nullptr);
  });
}

TEST_CASE("ALiBi runs need slopes", "[errors][fwd][bwd]") {
  Config c = run_config();
  c.bias = FLASHATTN_BIAS_ALIBI;
  RunFixture f(c);
  f.expect_fwd("alibi_slopes=NULL", FLASHATTN_STATUS_NULL_POINTER, {"alibi_slopes"},
               [](RunFixture& x, flashattn_fwd_args_t& a) {
                 a.alibi_slopes = nullptr;
                 return x.fwd(a);
               });
  f.expect_bwd("alibi_slopes=NULL", FLASHATTN_STATUS_NULL_POINTER, {"alibi_slopes"},
               [](RunFixture& x, flashattn_bwd_args_t& a) {
                 a.alibi_slopes = nullptr;
                 return x.bwd(a);
               });
}

TEST_CASE("per-(batch, head) ALiBi slopes overlapping an output are rejected by their full extent",
          "[errors][fwd][bwd]") {
  Config c = run_config();  // batch 2, heads_q 4
  c.bias = FLASHATTN_BIAS_ALIBI;
  c.alibi_batch_stride = 6;  // slopes span (6 + 4) floats = 40 bytes
  RunFixture f(c);
  // Slopes at the start of O's buffer and O 16 bytes (4 floats: one row of slopes) later:
  // only the second sequence's slopes reach into O.
  const std::vector<std::string> names = {"alibi_slopes"};
  f.expect_fwd("slopes rows reaching into O", FLASHATTN_STATUS_INVALID_ARGUMENT, names,
               [](RunFixture& x, flashattn_fwd_args_t& a) {
                 a.alibi_slopes = reinterpret_cast<const float*>(x.o.data());
                 a.o = x.o.data() + 16;
                 return x.fwd(a);
               });
  f.expect_bwd("slopes rows reaching into dQ", FLASHATTN_STATUS_INVALID_ARGUMENT, names,
               [](RunFixture& x, flashattn_bwd_args_t& a) {
                 a.alibi_slopes = reinterpret_cast<const float*>(x.dq.data());
                 a.dq = x.dq.data() + 16;
                 return x.bwd(a);
               });
  {  // control: one row of slopes at the same place does not reach O
    Config one = c;
    one.alibi_batch_stride = 0;
    RunFixture g(one);
    flashattn_fwd_args_t a = g.fwd_args();
    a.alibi_slopes = reinterpret_cast<const float*>(g.o.data());
    a.o = g.o.data() + 16;
    CHECK(g.fwd(a) == FLASHATTN_STATUS_SUCCESS);
  }
  f.expect_fwd("misaligned slopes", FLASHATTN_STATUS_MISALIGNED_POINTER, names,
               [](RunFixture& x, flashattn_fwd_args_t& a) {
                 a.alibi_slopes = reinterpret_cast<const float*>(reinterpret_cast<const char*>(x.slopes.data()) + 2);
                 return x.fwd(a);
               });
}

TEST_CASE("dbias without a bias tensor is rejected", "[errors][bwd]") {
  for (auto kind : {FLASHATTN_BIAS_NONE, FLASHATTN_BIAS_ALIBI}) {
    Config c = run_config();
    c.bias = kind;
    RunFixture f(c);
    INFO("bias kind " << kind);
    f.forward_ok();
    flashattn_bwd_args_t a = f.bwd_args();
    a.dbias = f.dbias.data();
    f.poison_bwd_outputs();
    const flashattn_status_t st = f.bwd(a);
    const std::string msg = flashattn_last_error();
    INFO("status " << status_name(st) << ", message \"" << msg << "\"");
    CHECK((st == FLASHATTN_STATUS_INVALID_ARGUMENT || st == FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS));
    CHECK(mentions(msg, "dbias"));
    CHECK(f.bwd_outputs_untouched());
  }
}

TEST_CASE("varlen runs reject missing or bad cu_seqlens", "[errors][fwd][bwd]") {
  Config c = run_config();
  c.bias = FLASHATTN_BIAS_NONE;
  c.seqlens_q = {4, 0, 5};
  c.seqlens_k = {6, 3, 2};  // totals 9 and 11, max lengths 9 and 11 (from run_config)
  RunFixture f(c);
  const flashattn_status_t I = FLASHATTN_STATUS_INVALID_SEQLENS;
  f.expect_fwd("cu_seqlens_q=NULL", FLASHATTN_STATUS_NULL_POINTER, {"cu_seqlens_q"},
               [](RunFixture& x, flashattn_fwd_args_t& a) {
                 a.cu_seqlens_q = nullptr;
                 return x.fwd(a);
               });
  f.expect_fwd("cu_seqlens_k=NULL", FLASHATTN_STATUS_NULL_POINTER, {"cu_seqlens_k"},
               [](RunFixture& x, flashattn_fwd_args_t& a) {
                 a.cu_seqlens_k = nullptr;
                 return x.fwd(a);
               });
  f.expect_bwd("cu_seqlens_q=NULL", FLASHATTN_STATUS_NULL_POINTER, {"cu_seqlens_q"},
               [](RunFixture& x, flashattn_bwd_args_t& a) {
                 a.cu_seqlens_q = nullptr;
                 return x.bwd(a);
               });
  struct Bad {
    const char* what;
    bool on_q;
    std::vector<int32_t> cu;
  };
  const Bad bad[] = {
      {"cu_seqlens_q not starting at 0", true, {1, 4, 4, 9}},  {"cu_seqlens_q decreasing", true, {0, 4, 3, 9}},
      {"cu_seqlens_q exceeding total_q", true, {0, 4, 4, 10}}, {"cu_seqlens_k not starting at 0", false, {2, 6, 9, 11}},
      {"cu_seqlens_k decreasing", false, {0, 6, 5, 11}},       {"cu_seqlens_k exceeding total_k", false, {0, 6, 9, 12}},
  };
  for (const Bad& b : bad) {
    const std::string name = b.on_q ? "cu_seqlens_q" : "cu_seqlens_k";
    const std::vector<int32_t> cu = b.cu;
    const bool on_q = b.on_q;
    f.expect_fwd(b.what, I, {name, "cu_seqlens"}, [cu, on_q](RunFixture& x, flashattn_fwd_args_t& a) {
      (on_q ? a.cu_seqlens_q : a.cu_seqlens_k) = cu.data();
      return x.fwd(a);
    });
    f.expect_bwd(b.what, I, {name, "cu_seqlens"}, [cu, on_q](RunFixture& x, flashattn_bwd_args_t& a) {
      (on_q ? a.cu_seqlens_q : a.cu_seqlens_k) = cu.data();
      return x.bwd(a);
    });
  }
  // A sequence longer than the plan's maximum length: plan with max seqlen_q 5, seqlen_k 6.
  Config m = c;
  m.sq = 5;
  m.sk = 6;
  RunFixture g(m);
  const std::vector<int32_t> long_q = {0, 2, 8, 9};   // sequence 1 has 6 > 5 queries
  const std::vector<int32_t> long_k = {0, 1, 2, 11};  // sequence 2 has 9 > 6 keys
  g.expect_fwd("a query sequence longer than seqlen_q", I, {"cu_seqlens_q", "seqlen_q", "cu_seqlens"},
               [long_q](RunFixture& x, flashattn_fwd_args_t& a) {
                 a.cu_seqlens_q = long_q.data();
                 return x.fwd(a);
               });
  g.expect_fwd("a key sequence longer than seqlen_k", I, {"cu_seqlens_k", "seqlen_k", "cu_seqlens"},
               [long_k](RunFixture& x, flashattn_fwd_args_t& a) {
                 a.cu_seqlens_k = long_k.data();
                 return x.fwd(a);
               });
  g.expect_bwd("a key sequence longer than seqlen_k", I, {"cu_seqlens_k", "seqlen_k", "cu_seqlens"},
               [long_k](RunFixture& x, flashattn_bwd_args_t& a) {
                 a.cu_seqlens_k = long_k.data();
                 return x.bwd(a);
               });
}

TEST_CASE("output strides that make an output alias itself are rejected", "[errors][fwd][bwd]") {
  // Either set_strides rejects them (the shape is known), or the run does ("checked against
  // the shape at each run"); in both cases INVALID_STRIDE and nothing written.
  struct A {
    const char* what;
    flashattn_tensor_t t;
    int64_t st[4];
  };
  // run_config: batch 2, seqlen_q 9, seqlen_k 11, heads_q 4, heads_kv 2, dqk 16, dv 8.
  const A cases[] = {
      {"O seq stride 0", FLASHATTN_TENSOR_O, {9 * 32, 0, 8, 1}},
      {"O heads overlapping (head stride 1)", FLASHATTN_TENSOR_O, {9 * 32, 32, 1, 1}},
      {"O batch stride 0", FLASHATTN_TENSOR_O, {0, 32, 8, 1}},
      {"O seq overlapping heads (seq stride 8)", FLASHATTN_TENSOR_O, {9 * 32, 8, 8, 1}},
      {"dQ head stride 8 < head_dim_qk 16", FLASHATTN_TENSOR_DQ, {9 * 64, 64, 8, 1}},
      {"dK batch stride 0", FLASHATTN_TENSOR_DK, {0, 32, 16, 1}},
      {"dV seq stride 0", FLASHATTN_TENSOR_DV, {11 * 16, 0, 8, 1}},
  };
  for (const A& c : cases) {
    INFO(c.what);
    RunFixture f(run_config());
    const flashattn_status_t st = flashattn_plan_set_strides(f.plan, c.t, c.st);
    if (st != FLASHATTN_STATUS_SUCCESS) {
      CHECK(status_name(st) == status_name(FLASHATTN_STATUS_INVALID_STRIDE));
      CHECK(mentions_any(flashattn_last_error(), {"strides", "stride"}));
      continue;
    }
    if (c.t == FLASHATTN_TENSOR_O)
      f.expect_fwd(c.what, FLASHATTN_STATUS_INVALID_STRIDE, {"strides", "stride"},
                   [](RunFixture& x, flashattn_fwd_args_t& a) { return x.fwd(a); });
    else
      f.expect_bwd(c.what, FLASHATTN_STATUS_INVALID_STRIDE, {"strides", "stride"},
                   [](RunFixture& x, flashattn_bwd_args_t& a) { return x.bwd(a); });
  }
}

TEST_CASE("strides valid in varlen mode are re-checked when varlen is turned off", "[errors][fwd]") {
  Config c = run_config();
  c.bias = FLASHATTN_BIAS_NONE;
  RunFixture f(c);  // batch 2
  REQUIRE(flashattn_plan_set_varlen(f.plan, 1, 18, 22) == FLASHATTN_STATUS_SUCCESS);
  const int64_t st[4] = {0, 32, 8, 1};  // batch stride ignored in varlen mode
  REQUIRE(flashattn_plan_set_strides(f.plan, FLASHATTN_TENSOR_O, st) == FLASHATTN_STATUS_SUCCESS);
  const flashattn_status_t off = flashattn_plan_set_varlen(f.plan, 0, 0, 0);
  if (off != FLASHATTN_STATUS_SUCCESS) {
    CHECK(status_name(off) == status_name(FLASHATTN_STATUS_INVALID_STRIDE));
    return;
  }
  f.expect_fwd("O batch stride 0 with batch 2 after leaving varlen mode", FLASHATTN_STATUS_INVALID_STRIDE,
               {"strides", "stride"}, [](RunFixture& x, flashattn_fwd_args_t& a) { return x.fwd(a); });
}

TEST_CASE("error messages name the argument and its value", "[errors]") {
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_shape(plan, 2, 9, 11, 4, 2, 16, 8) == FLASHATTN_STATUS_SUCCESS);
  struct M {
    const char* name;
    const char* value;
  };
  const int64_t bad_dim[4] = {100, 10, 1000, 3};
  const uint8_t layout[64] = {1};
  size_t bytes = 0;
  flashattn_plan_t other = nullptr;
  const M cases[] = {
      {"batch", "-5"},  {"head_dim_qk", "257"}, {"head_dim_v", "999"}, {"dtype", "9"},        {"tensor", "42"},
      {"align", "5"},   {"algorithm", "4"},     {"total_q", "-3"},     {"layout_heads", "3"}, {"pass", "3"},
      {"backend", "7"}, {"device", "-2"},       {"softcap", "-2"},     {"scale", "-4"},
  };
  const std::vector<std::pair<M, std::function<flashattn_status_t()>>> calls = {
      {cases[0], [&] { return flashattn_plan_set_shape(plan, -5, 9, 11, 4, 2, 16, 8); }},
      {cases[1], [&] { return flashattn_plan_set_shape(plan, 2, 9, 11, 4, 2, 257, 8); }},
      {cases[2], [&] { return flashattn_plan_set_shape(plan, 2, 9, 11, 4, 2, 16, 999); }},
      {cases[3], [&] { return flashattn_plan_set_dtype(plan, static_cast<flashattn_dtype_t>(9)); }},
      {cases[4], [&] { return flashattn_plan_set_strides(plan, static_cast<flashattn_tensor_t>(42), bad_dim); }},
      {cases[5], [&] { return flashattn_plan_set_band_mask(plan, static_cast<flashattn_mask_align_t>(5), -1, 0); }},
      {cases[6], [&] { return flashattn_plan_set_algorithm(plan, static_cast<flashattn_algorithm_t>(4)); }},
      {cases[7], [&] { return flashattn_plan_set_varlen(plan, 1, -3, 4); }},
      {cases[8], [&] { return flashattn_plan_set_block_sparse(plan, layout, 3, 1, 1, 16, 16); }},
      {cases[9], [&] { return flashattn_plan_get_workspace_size(plan, static_cast<flashattn_pass_t>(3), &bytes); }},
      {cases[10], [&] { return flashattn_plan_create(&other, static_cast<flashattn_backend_t>(7), 0); }},
      {cases[11], [&] { return flashattn_plan_create(&other, FLASHATTN_BACKEND_CPU, -2); }},
      {cases[12], [&] { return flashattn_plan_set_softcap(plan, -2.f); }},
      {cases[13], [&] { return flashattn_plan_set_softmax_scale(plan, -4.f); }},
  };
  for (const auto& c : calls) {
    const flashattn_status_t st = c.second();
    const std::string msg = flashattn_last_error();
    INFO("argument " << c.first.name << " = " << c.first.value << ": status " << flashattn_status_string(st)
                     << ", message \"" << msg << "\"");
    CHECK(st != FLASHATTN_STATUS_SUCCESS);
    CHECK(mentions(msg, c.first.name));
    CHECK(msg.find(c.first.value) != std::string::npos);
  }
  CHECK(other == nullptr);
  flashattn_plan_destroy(plan);
}
