#include "problem.hpp"

#include <cmath>

#include "cli.hpp"

namespace facli {

std::vector<OptSpec> shape_options() {
  return {
      {"--batch", OptSpec::kValue, "N", "sequences per batch (default 2)"},
      {"--seqlen-q", OptSpec::kValue, "N", "query length (default 256)"},
      {"--seqlen-k", OptSpec::kValue, "N", "key/value length (default: --seqlen-q)"},
      {"--heads-q", OptSpec::kValue, "N", "query heads (default 8)"},
      {"--heads-kv", OptSpec::kValue, "N", "key/value heads, dividing --heads-q (default: --heads-q)"},
      {"--head-dim", OptSpec::kValue, "D", "head dim of Q and K (default 64)"},
      {"--head-dim-v", OptSpec::kValue, "D", "head dim of V and O (default: --head-dim)"},
      {"--dtype", OptSpec::kValue, "fp16|bf16|fp32", "element type (default fp16)"},
      {"--layout", OptSpec::kValue, "bshd|bhsd", "memory order of every tensor (default bshd)"},
  };
}

std::vector<OptSpec> feature_options() {
  return {
      {"--causal", OptSpec::kOptionalValue, "top-left|bottom-right", "causal mask (default alignment top-left)"},
      {"--align", OptSpec::kValue, "top-left|bottom-right", "alignment of --window and --alibi (default top-left)"},
      {"--window", OptSpec::kValue, "L,R", "sliding window: keys i'-L..i'+R (negative = unbounded side)"},
      {"--softcap", OptSpec::kValue, "C", "softcap C > 0: s = C*tanh(s/C) (default 0 = off)"},
      {"--alibi", OptSpec::kOptionalValue, "symmetric", "ALiBi bias slope[h]*(j-i') (=symmetric: -slope*|i'-j|); slope[h] = 2^(-8(h+1)/heads_q)"},
      {"--dropout", OptSpec::kValue, "P", "dropout probability in [0, 1) (default 0)"},
      {"--seed", OptSpec::kValue, "S", "seed of the inputs, the dropout mask and the sparse layout (default 0)"},
      {"--block-sparse", OptSpec::kValue, "DENSITY", "random block-sparse layout, 128x128 blocks kept with probability DENSITY in (0, 1]"},
  };
}

std::vector<OptSpec> backend_options() {
  return {
      {"--backend", OptSpec::kValue, "cpu|cuda|auto", "backend (default auto: CUDA if usable, else CPU)"},
      {"--device", OptSpec::kValue, "N", "CUDA device ordinal (default 0)"},
      {"--algorithm", OptSpec::kValue, "flash|standard", "algorithm (default flash)"},
  };
}

flashattn_backend_t parse_backend(const Args& a, flashattn_backend_t def) {
  const std::string d = def == FLASHATTN_BACKEND_CPU ? "cpu" : def == FLASHATTN_BACKEND_CUDA ? "cuda" : "auto";
  const std::string s = a.get_choice("--backend", d, {"cpu", "cuda", "auto"});
  return s == "cpu" ? FLASHATTN_BACKEND_CPU : s == "cuda" ? FLASHATTN_BACKEND_CUDA : FLASHATTN_BACKEND_AUTO;
}

flashattn_dtype_t parse_dtype(const Args& a, flashattn_dtype_t def) {
  const std::string s = a.get_choice("--dtype", dtype_name(def), {"fp16", "bf16", "fp32"});
  return s == "fp16" ? FLASHATTN_DTYPE_FP16 : s == "bf16" ? FLASHATTN_DTYPE_BF16 : FLASHATTN_DTYPE_FP32;
}

static flashattn_mask_align_t parse_align_word(const std::string& flag, const std::string& s) {
  if (s == "top-left") return FLASHATTN_ALIGN_TOP_LEFT;
  if (s == "bottom-right") return FLASHATTN_ALIGN_BOTTOM_RIGHT;
  throw UsageError(flag + ": '" + s + "' is not one of top-left|bottom-right");
}

void parse_mask(const Args& a, Problem* p) {
  bool align_given = false;
  if (a.has("--align")) {
    p->align = parse_align_word("--align", a.raw("--align"));
    align_given = true;
  }
  if (a.has("--causal")) {
    p->causal = true;
    p->has_band = true;
    p->window_left = -1;
    p->window_right = 0;
    const std::string v = a.raw("--causal");
    if (!v.empty()) {
      const flashattn_mask_align_t al = parse_align_word("--causal", v);
      if (align_given && al != p->align)
        throw UsageError("--causal=" + v + " contradicts --align " + a.raw("--align"));
      p->align = al;
    }
  }
  if (a.has("--window")) {
    const std::string s = a.raw("--window");
    const size_t comma = s.find(',');
    int64_t l = 0, r = 0;
    if (comma == std::string::npos || !parse_int(s.substr(0, comma), &l) || !parse_int(s.substr(comma + 1), &r))
      throw UsageError("--window: '" + s + "' is not L,R (two integers, negative = unbounded)");
    if (l < 0 && r < 0 && !p->causal)
      throw UsageError("--window " + s + " has both sides unbounded: that is no mask (omit --window)");
    if (p->causal) {
      if (r > 0) throw UsageError("--window " + s + ": right window " + std::to_string(r) + " contradicts --causal (right window 0)");
      r = 0;
    }
    p->has_band = true;
    p->window_left = l < 0 ? -1 : l;
    p->window_right = r < 0 ? -1 : r;
  }
}

const char* backend_name(flashattn_backend_t b) {
  switch (b) {
    case FLASHATTN_BACKEND_AUTO: return "auto";
    case FLASHATTN_BACKEND_CPU: return "cpu";
    case FLASHATTN_BACKEND_CUDA: return "cuda";
    default: break;
  }
  return "?";
}

const char* algorithm_name(flashattn_algorithm_t a) {
  return a == FLASHATTN_ALGORITHM_STANDARD ? "standard" : "flash";
}

double Problem::scale() const { return 1.0 / std::sqrt(static_cast<double>(head_dim)); }

void Problem::make_derived() {
  alibi_slopes.clear();
  if (alibi != FLASHATTN_BIAS_NONE) {
    // The geometric sequence of the ALiBi paper, 2^(-8(h+1)/H), used for any H.
    for (int64_t h = 0; h < heads_q; ++h)
      alibi_slopes.push_back(static_cast<float>(std::exp2(-8.0 * static_cast<double>(h + 1) / heads_q)));
  }
  layout_blocks.clear();
  if (block_sparse > 0.0) {
    const size_t n = static_cast<size_t>(heads_q * row_blocks() * col_blocks());
    layout_blocks.resize(n);
    for (size_t i = 0; i < n; ++i) layout_blocks[i] = random_uniform(seed, 0xB10C, i) < block_sparse ? 1 : 0;
  }
}

std::string Problem::describe() const {
  std::string s = strf("shape: batch=%lld seqlen_q=%lld seqlen_k=%lld heads_q=%lld heads_kv=%lld head_dim=%lld head_dim_v=%lld dtype=%s layout=%s\n",
                       (long long)batch, (long long)seqlen_q, (long long)seqlen_k, (long long)heads_q,
                       (long long)heads_kv, (long long)head_dim, (long long)head_dim_v, dtype_name(dtype),
                       layout_name(layout));
  const char* al = align == FLASHATTN_ALIGN_TOP_LEFT ? "top-left" : "bottom-right";
  std::string mask = "none";
  if (has_band) {
    auto w = [](int64_t x) { return x < 0 ? std::string("inf") : std::to_string(x); };
    mask = causal && window_left < 0 ? strf("causal(%s)", al)
                                     : strf("window(left=%s,right=%s,%s)", w(window_left).c_str(), w(window_right).c_str(), al);
  }
  s += strf("options: scale=%.6g mask=%s softcap=%g alibi=%s dropout=%g seed=%llu block-sparse=%s",
            scale(), mask.c_str(), static_cast<double>(softcap),
            alibi == FLASHATTN_BIAS_NONE ? "off" : alibi == FLASHATTN_BIAS_ALIBI ? "on" : "symmetric",
            static_cast<double>(dropout), static_cast<unsigned long long>(seed),
            block_sparse > 0 ? strf("%g(block %lld)", block_sparse, (long long)kSparseBlock).c_str() : "off");
  if (alibi != FLASHATTN_BIAS_NONE && !has_band) s += strf(" align=%s", al);
  return s;
}

Plan::Plan(flashattn_backend_t backend, int device) {
  lib_check(flashattn_plan_create(&plan_, backend, device), "flashattn_plan_create");
}

flashattn_backend_t Plan::backend() const {
  flashattn_backend_t b = FLASHATTN_BACKEND_AUTO;
  lib_check(flashattn_plan_get_backend(plan_, &b), "flashattn_plan_get_backend");
  return b;
}

void configure_plan(flashattn_plan_t plan, const Problem& p, flashattn_algorithm_t algorithm) {
  lib_check(flashattn_plan_set_shape(plan, p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim,
                                     p.head_dim_v),
            "flashattn_plan_set_shape");
  lib_check(flashattn_plan_set_dtype(plan, p.dtype), "flashattn_plan_set_dtype");
  if (p.layout != Layout::kBSHD) {
    const int64_t dq = p.head_dim, dv = p.head_dim_v;
    struct {
      flashattn_tensor_t t;
      int64_t s, h, d;
    } tensors[] = {{FLASHATTN_TENSOR_Q, p.seqlen_q, p.heads_q, dq},   {FLASHATTN_TENSOR_K, p.seqlen_k, p.heads_kv, dq},
                   {FLASHATTN_TENSOR_V, p.seqlen_k, p.heads_kv, dv},  {FLASHATTN_TENSOR_O, p.seqlen_q, p.heads_q, dv},
                   {FLASHATTN_TENSOR_DO, p.seqlen_q, p.heads_q, dv},  {FLASHATTN_TENSOR_DQ, p.seqlen_q, p.heads_q, dq},
                   {FLASHATTN_TENSOR_DK, p.seqlen_k, p.heads_kv, dq}, {FLASHATTN_TENSOR_DV, p.seqlen_k, p.heads_kv, dv}};
    for (const auto& t : tensors) {
      int64_t st[4];
      layout_strides(p.layout, p.batch, t.s, t.h, t.d, st);
      lib_check(flashattn_plan_set_strides(plan, t.t, st), "flashattn_plan_set_strides");
    }
  }
  lib_check(flashattn_plan_set_algorithm(plan, algorithm), "flashattn_plan_set_algorithm");
  if (p.has_band || p.alibi != FLASHATTN_BIAS_NONE)
    lib_check(flashattn_plan_set_band_mask(plan, p.align, p.has_band ? p.window_left : -1,
                                           p.has_band ? p.window_right : -1),
              "flashattn_plan_set_band_mask");
  if (p.softcap > 0.f) lib_check(flashattn_plan_set_softcap(plan, p.softcap), "flashattn_plan_set_softcap");
  if (p.alibi != FLASHATTN_BIAS_NONE) lib_check(flashattn_plan_set_bias(plan, p.alibi, nullptr), "flashattn_plan_set_bias");
  if (p.dropout > 0.f) lib_check(flashattn_plan_set_dropout(plan, p.dropout, p.seed, 0), "flashattn_plan_set_dropout");
  if (!p.layout_blocks.empty())
    lib_check(flashattn_plan_set_block_sparse(plan, p.layout_blocks.data(), p.heads_q, p.row_blocks(), p.col_blocks(),
                                              Problem::kSparseBlock, Problem::kSparseBlock),
              "flashattn_plan_set_block_sparse");
}

}  // namespace facli
